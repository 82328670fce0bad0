"""`fusebox mcp` in front of an MCP server written for the tests (Python `mcp` SDK),
driven by the SDK's real client: scripted agent loops against the session's fuseboxd."""

from __future__ import annotations

import json
import pathlib
import socket
import time
from typing import Any

import anyio
import nats
import pytest
from gateway import (
    TENANT,
    counting_server,
    direct,
    executions,
    fresh_run,
    fusebox_bin,
    gateway,
    session,
    text,
)
from mcp import StdioServerParameters
from mcp.types import CallToolResult
from support.stack import Stack, start_stack

STOPPED = "fusebox stopped this run"


@pytest.fixture
def count_file(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "executions.jsonl"


def env(count_file: pathlib.Path) -> dict[str, str]:
    return {"COUNT_FILE": str(count_file)}


async def test_a_runaway_read_is_stopped_and_stays_stopped(
    stack: Stack, count_file: pathlib.Path
) -> None:
    async with session(gateway(stack, counting_server(), env=env(count_file))) as client:
        answers = []
        for _ in range(40):
            result = await client.call_tool("search", {"query": "the same thing"})
            answers.append(result)
            if STOPPED in text(result):
                break
        assert STOPPED in text(answers[-1]), [text(a) for a in answers]
        assert answers[-1].is_error
        # Warn before block before stop: a warning rides on a result the tool really
        # gave; a block is an error result with the guard's message.
        warned = [a for a in answers if "fusebox warning" in text(a)]
        assert warned and not warned[0].is_error and "no results for" in text(warned[0])
        assert any(a.is_error and "fusebox blocked this call" in text(a) for a in answers)
        ran = len(executions(count_file, "search"))
        assert ran < len(answers), "refused calls never reach the server"
        # Stop ends the session's calls: any tool, any arguments, refused the same way.
        later: list[tuple[str, dict[str, Any]]] = [
            ("search", {"query": "something new"}),
            ("list_page", {"page": 0}),
        ]
        for tool, args in later:
            refused = await client.call_tool(tool, args)
            assert refused.is_error and STOPPED in text(refused)
        assert len(executions(count_file)) == ran


async def test_a_legitimate_listing_finishes(stack: Stack, count_file: pathlib.Path) -> None:
    async with session(gateway(stack, counting_server(), env=env(count_file))) as client:
        for page in range(5):
            result = await client.call_tool("list_page", {"page": page})
            assert not result.is_error, text(result)
            assert f"item-{page * 10}" in text(result)
            assert "fusebox" not in text(result)
    assert [e["args"]["page"] for e in executions(count_file, "list_page")] == [
        0,
        1,
        2,
        3,
        4,
    ]


async def test_the_same_write_with_one_op_key_is_done_once(
    stack: Stack, count_file: pathlib.Path
) -> None:
    params = gateway(
        stack,
        counting_server(),
        "--op-key",
        "send_email=message_id",
        env=env(count_file),
    )
    async with session(params) as client:
        email = {"message_id": "m-42", "to": "ops@example.com", "body": "disk full"}
        first = await client.call_tool("send_email", email)
        assert not first.is_error and "sent m-42" in text(first)
        # A retry gets the stored result; repeating it more is a loop of its own, which
        # the guard refuses (never runs) like any other repeat.
        again = await client.call_tool("send_email", email)
        assert not again.is_error, text(again)
        assert "sent m-42" in text(again), "the stored result is the answer"
        other = await client.call_tool("send_email", {**email, "message_id": "m-43"})
        assert "sent m-43" in text(other)
    assert [e["args"]["message_id"] for e in executions(count_file, "send_email")] == [
        "m-42",
        "m-43",
    ]


def export_gateway(
    stack: Stack, count_file: pathlib.Path, tmp_path: pathlib.Path
) -> StdioServerParameters:
    """The gateway with `export_report` keyed by its report_id, and results of keyed
    calls sent whole up to 100 000 bytes."""
    config = tmp_path / "gateway.toml"
    config.write_text(
        'max_stored_result_bytes = 100000\n[tools.export_report]\nop_key_arg = "report_id"\n'
    )
    return gateway(stack, counting_server(), "--config", str(config), env=env(count_file))


async def test_a_repeated_operation_gets_its_large_result_or_where_it_is(
    stack: Stack, count_file: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """Large results of op_key operations (issue 25 §3): up to the gateway's
    `max_stored_result_bytes` a repeat gets the whole stored result (here 46 KB, past the
    32 KiB a result otherwise travels whole); past it, a note that the operation completed
    and where its result is — never the hash as if it were the result."""
    # The test stack's config with the shipped max_event_bytes (1 MiB) instead of 8 KiB.
    config = tmp_path / "fusebox.toml"
    small = stack.config.read_text()
    assert "max_event_bytes = 8192" in small
    config.write_text(small.replace("max_event_bytes = 8192", "max_event_bytes = 1048576"))
    with start_stack("--config", str(config)) as roomy:
        async with session(export_gateway(roomy, count_file, tmp_path)) as client:
            stored = {"report_id": "q3", "rows": 2000}  # ~46 KB of JSON
            first = await client.call_tool("export_report", stored)
            assert not first.is_error and "q3 row 001999" in text(first)
            again = await client.call_tool("export_report", stored)
            assert not again.is_error, text(again)
            assert "already completed" in text(again)
            assert "q3 row 001999" in text(again), "the stored result is the answer"

            elsewhere = {"report_id": "year", "rows": 8000}  # ~150 KB: past the bound
            first = await client.call_tool("export_report", elsewhere)
            assert "year row 007999" in text(first)
            assert_told_where(await client.call_tool("export_report", elsewhere))
    assert [e["args"]["report_id"] for e in executions(count_file, "export_report")] == [
        "q3",
        "year",
    ]


async def test_a_result_the_daemon_finds_too_large_still_completes_its_operation(
    stack: Stack, count_file: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """Within the gateway's bound but past the daemon's `max_event_bytes` (8 KiB in the
    test stack): the result is sent again as its hash, so the op_key completes (and is
    never run twice) instead of staying in flight."""
    async with session(export_gateway(stack, count_file, tmp_path)) as client:
        report = {"report_id": f"big-{fresh_run()}", "rows": 2000}
        first = await client.call_tool("export_report", report)
        assert not first.is_error and "row 001999" in text(first)
        assert_told_where(await client.call_tool("export_report", report))
    assert len(executions(count_file, "export_report")) == 1


def assert_told_where(again: CallToolResult) -> None:
    """No result to give (none is passed off as the tool's): an error result whose note
    says the operation completed, and where its result came from."""
    note = text(again)
    assert again.is_error, note
    assert "already completed" in note and "too large to store" in note, note
    assert "run " in note and "call " in note and "SHA-256" in note, note
    assert "row 0" not in note and again.structured_content is None


async def test_a_stop_answered_to_a_result_refuses_the_next_call(
    stack: Stack, count_file: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """A result that closes the run (the third failure, past `max_tool_errors = 2`) is
    reported without the gateway waiting for its answer; still the call right after it
    is refused with that stop, never reaches the server, and the stop is on the kill
    switch."""
    config = tmp_path / "fusebox.toml"
    shipped = stack.config.read_text()
    assert "max_tool_errors = 50" in shipped
    config.write_text(shipped.replace("max_tool_errors = 50", "max_tool_errors = 2"))
    with start_stack("--config", str(config)) as strict:
        watcher = await nats.connect(strict.nats_url)
        stops = await watcher.subscribe(f"fusebox.stop.{TENANT}.>")
        async with session(gateway(strict, counting_server(), env=env(count_file))) as client:
            for attempt in range(3):
                failed = await client.call_tool("fail", {"reason": f"disk {attempt}"})
                assert failed.is_error and STOPPED not in text(failed), text(failed)
            refused = await client.call_tool("list_page", {"page": 0})
            assert refused.is_error and STOPPED in text(refused), text(refused)
            assert "tool_error_limit" in text(refused), text(refused)
        stop = await stops.next_msg(timeout=10)
        kept = await watcher.request(f"$JS.API.DIRECT.GET.FUSEBOX_STOPS.{stop.subject}", b"")
        await watcher.close()
    assert b"tool_error_limit" in stop.data and kept.data == stop.data
    assert [e["tool"] for e in executions(count_file)] == ["fail", "fail", "fail"]


async def test_an_operator_cancel_ends_the_session(stack: Stack, count_file: pathlib.Path) -> None:
    run = fresh_run()
    params = gateway(stack, counting_server(), "--run", run, env=env(count_file))
    async with session(params) as client:
        assert not (await client.call_tool("list_page", {"page": 0})).is_error
        await anyio.run_process(
            [
                fusebox_bin(stack),
                "cancel",
                f"{TENANT}/{run}",
                "--nats-url",
                stack.nats_url,
            ],
            check=True,
        )
        refused = await client.call_tool("list_page", {"page": 1})
        assert refused.is_error and STOPPED in text(refused) and "CANCELLED" in text(refused), text(
            refused
        )
    assert [e["args"]["page"] for e in executions(count_file, "list_page")] == [0]


async def test_a_session_named_a_child_ends_with_its_parent(
    stack: Stack, count_file: pathlib.Path
) -> None:
    """`--parent-run`: the session's run joins the tree of the agent that started the
    gateway, so a cancel of that run ends the session too (issue 45)."""
    parent = fresh_run()
    client = await nats.connect(stack.nats_url)
    try:
        started = {
            "v": 1,
            "id": f"{parent}-start",
            "tenant": TENANT,
            "run": parent,
            "ts_ms": int(time.time() * 1000),
            "type": "run_started",
        }
        await client.request(
            f"fusebox.gate.{TENANT}.{parent}", json.dumps(started).encode(), timeout=5
        )
    finally:
        await client.close()
    params = gateway(stack, counting_server(), "--parent-run", parent, env=env(count_file))
    async with session(params) as session_client:
        assert not (await session_client.call_tool("list_page", {"page": 0})).is_error
        await anyio.run_process(
            [fusebox_bin(stack), "cancel", f"{TENANT}/{parent}", "--nats-url", stack.nats_url],
            check=True,
        )
        refused = await session_client.call_tool("list_page", {"page": 1})
        assert refused.is_error and STOPPED in text(refused), text(refused)
        assert "ancestor_stopped" in text(refused) or parent in text(refused), text(refused)
    assert [e["args"]["page"] for e in executions(count_file, "list_page")] == [0]


def unused_nats_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"nats://127.0.0.1:{probe.getsockname()[1]}"


async def test_guard_down_gives_error_results_not_hangs(
    stack: Stack, count_file: pathlib.Path
) -> None:
    params = gateway(
        stack,
        counting_server(),
        "--gate-timeout",
        "500ms",
        nats_url=unused_nats_url(),
        env=env(count_file),
    )
    with anyio.fail_after(30):
        async with session(params) as client:
            for _ in range(3):
                result = await client.call_tool("list_page", {"page": 0})
                assert result.is_error and "guard did not answer" in text(result), text(result)
            # Everything else still works: only tools/call is gated.
            assert len((await client.list_tools()).tools) > 0
    assert executions(count_file) == []


async def test_guard_down_with_allow_runs_the_call_and_says_so(
    stack: Stack, count_file: pathlib.Path
) -> None:
    params = gateway(
        stack,
        counting_server(),
        "--gate-timeout",
        "500ms",
        "--on-guard-error",
        "allow",
        nats_url=unused_nats_url(),
        env=env(count_file),
    )
    with anyio.fail_after(30):
        async with session(params) as client:
            result = await client.call_tool("list_page", {"page": 0})
    assert not result.is_error
    assert "item-0" in text(result) and "ran unguarded" in text(result)
    assert len(executions(count_file, "list_page")) == 1


async def test_upstream_killed_mid_session_gives_a_clear_error(
    stack: Stack, count_file: pathlib.Path
) -> None:
    with anyio.fail_after(30):
        async with session(gateway(stack, counting_server(), env=env(count_file))) as client:
            assert not (await client.call_tool("list_page", {"page": 0})).is_error
            crashed = await client.call_tool("crash", {})
            assert crashed.is_error and "upstream MCP server" in text(crashed), text(crashed)
            after = await client.call_tool("list_page", {"page": 1})
            assert after.is_error and "upstream MCP server" in text(after), text(after)
    assert [e["tool"] for e in executions(count_file)] == ["list_page", "crash"]


async def test_upstream_garbage_and_silence_give_answers_not_hangs(
    stack: Stack, count_file: pathlib.Path
) -> None:
    params = gateway(stack, counting_server(), "--upstream-timeout", "2s", env=env(count_file))
    with anyio.fail_after(30):
        async with session(params) as client:
            # A line that is not JSON-RPC is skipped; the real answer after it arrives.
            garbled = await client.call_tool("garble", {})
            assert not garbled.is_error and "answered after the garbage" in text(garbled)
            silent = await client.call_tool("hang", {})
            assert silent.is_error and "upstream MCP server" in text(silent), text(silent)
            # The session goes on.
            assert not (await client.call_tool("list_page", {"page": 0})).is_error
    assert [e["tool"] for e in executions(count_file)] == [
        "garble",
        "hang",
        "list_page",
    ]


async def test_a_failing_tool_is_reported_as_a_failure(
    stack: Stack, count_file: pathlib.Path
) -> None:
    # isError results are failures to the guard, never progress: retrying the same
    # failing call is a loop it stops.
    async with session(gateway(stack, counting_server(), env=env(count_file))) as client:
        first = await client.call_tool("fail", {"reason": "disk"})
        assert first.is_error and "fusebox" not in text(first), "the tool's own error, forwarded"
        answers = [text(first)]
        for _ in range(30):
            answers.append(text(await client.call_tool("fail", {"reason": "disk"})))
            if STOPPED in answers[-1]:
                break
        assert STOPPED in answers[-1], answers
    assert len(executions(count_file, "fail")) < len(answers)


def dump(value: Any) -> Any:
    return value.model_dump(mode="json", exclude_none=True, by_alias=True)


async def observe(client: Any) -> dict[str, Any]:
    """Everything a session shows that is not gated, and one executed tool call with
    its progress notifications."""
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    slow = await client.call_tool("slow", {"steps": 3}, progress_callback=on_progress)
    return {
        "initialize": dump(client.initialize_result),
        "tools": dump(await client.list_tools()),
        "resources": dump(await client.list_resources()),
        "templates": dump(await client.list_resource_templates()),
        "read": dump(await client.read_resource("memo://readme")),
        "read_template": dump(await client.read_resource("memo://notes/today")),
        "prompts": dump(await client.list_prompts()),
        "prompt": dump(await client.get_prompt("greet", {"name": "Ada"})),
        "ping": dump(await client.send_ping()),
        "call": dump(slow),
        "progress": progress,
    }


async def test_everything_but_tools_call_passes_through_equivalent(
    stack: Stack, count_file: pathlib.Path
) -> None:
    async with session(direct(counting_server(), env=env(count_file))) as client:
        without = await observe(client)
    async with session(gateway(stack, counting_server(), env=env(count_file))) as client:
        through = await observe(client)
    assert len(without["progress"]) == 3
    for key in without:
        assert through[key] == without[key], key
