"""The real Claude Code (the CLI in the claude-agent-sdk wheel) with HTTP hooks to
`fusebox hook serve`, installed as docs/agents/claude-code.md tells a user
(`--print-settings --http URL`, `onFailure: "block"`), in front of a real fuseboxd: no
process per tool call, and closed on failure — for calls: a prompt is never blocked by
an endpoint that cannot answer.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from support.claude_code import fusebox, run_claude
from support.fake_anthropic import FakeAnthropic, Turn, text, tool_use
from support.guard import RUNAWAY_EXECUTIONS, TENANT, free_port, prompt_events
from support.stack import Stack


class Endpoint:
    """A running `fusebox hook serve`."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str) -> None:
        self.proc = proc
        self.url = url

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


@contextmanager
def endpoint(
    stack: Stack, state: Path, *flags: str, listen: str = "127.0.0.1"
) -> Iterator[Endpoint]:
    port = free_port()
    proc = subprocess.Popen(
        [
            str(stack.bin("fusebox")),
            "hook",
            "serve",
            "--listen",
            f"{listen}:{port}",
            "--nats-url",
            stack.nats_url,
            "--tenant",
            TENANT,
            "--state-dir",
            str(state),
            *flags,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert proc.poll() is None, "fusebox hook serve exited"
                assert time.monotonic() < deadline, "fusebox hook serve did not listen"
                time.sleep(0.05)
        yield Endpoint(proc, f"http://127.0.0.1:{port}/claude-code")
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)


def http_settings(stack: Stack, url: str, *flags: str) -> dict[str, Any]:
    """The docs' setup step: `--print-settings --http URL` (its SessionStart is the
    command hook, which needs the connection flags)."""
    printed = subprocess.run(
        [
            str(stack.bin("fusebox")),
            "hook",
            "claude-code",
            "--print-settings",
            "--http",
            url,
            "--nats-url",
            stack.nats_url,
            "--tenant",
            TENANT,
            *flags,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    settings: dict[str, Any] = json.loads(printed.stdout)
    return settings


class Workspace:
    def __init__(self, root: Path) -> None:
        self.home = root / "home"
        self.cwd = root / "work"
        self.state = root / "state"
        self.home.mkdir()
        self.cwd.mkdir()
        self.ledger = root / "executed.txt"

    def bash(self, command: str) -> Turn:
        return tool_use("Bash", {"command": f"echo x >> {self.ledger}; {command}"})

    def executions(self) -> int:
        return len(self.ledger.read_text().splitlines()) if self.ledger.exists() else 0

    def session_id(self) -> str:
        transcripts = list((self.home / ".claude" / "projects").glob("*/*.jsonl"))
        assert len(transcripts) == 1, transcripts
        return transcripts[0].stem


def claude(
    ws: Workspace, api: FakeAnthropic, settings: dict[str, Any], **env: str
) -> dict[str, Any]:
    run = run_claude(
        api, "do the task", home=ws.home, cwd=ws.cwd, settings=settings, env=env or None
    )
    return run.result()


def run_status(stack: Stack, run: str) -> dict[str, Any]:
    status: dict[str, Any] = json.loads(fusebox(stack, "run", f"{TENANT}/{run}", "--json"))
    return status


def refused(api: FakeAnthropic) -> list[str]:
    return [r.content for r in api.tool_results() if "fusebox:" in r.content]


def test_runaway_loop_is_stopped_over_http(stack: Stack, tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    with endpoint(stack, ws.state) as ep:
        settings = http_settings(stack, ep.url)
        with FakeAnthropic(forever=ws.bash("cat status.txt || echo running")) as api:
            result = claude(ws, api, settings)
            denials = refused(api)

    assert ws.executions() == RUNAWAY_EXECUTIONS
    assert result["terminal_reason"] == "hook_stopped", result
    assert all("already ran" in d for d in denials), denials
    status = run_status(stack, result["session_id"])["summary"]
    assert status["open"] is False and status["agent"] == "claude-code", status


def test_twelve_distinct_calls_run_untouched_over_http(stack: Stack, tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    with endpoint(stack, ws.state) as ep:
        settings = http_settings(stack, ep.url)
        pages = [ws.bash(f"echo page {n}") for n in range(1, 13)]
        with FakeAnthropic([*pages, text("read all twelve pages")]) as api:
            result = claude(ws, api, settings)
            results = api.tool_results()

    assert ws.executions() == 12
    assert result["result"] == "read all twelve pages"
    assert result["permission_denials"] == []
    assert not any("fusebox" in r.content for r in results)
    assert run_status(stack, result["session_id"])["summary"]["steps"] == 12
    # The prompt reached the daemon over HTTP too.
    [prompt] = prompt_events(stack, TENANT, result["session_id"])
    assert prompt["id"].startswith("cc-prompt-"), prompt


def test_operator_cancel_refuses_the_next_call_over_http(stack: Stack, tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    with endpoint(stack, ws.state) as ep:
        settings = http_settings(stack, ep.url)

        def respond(body: dict[str, Any]) -> Turn:
            turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
            if turn == 2:
                fusebox(stack, "cancel", f"{TENANT}/{ws.session_id()}", "--reason", "wrong")
            return ws.bash(f"echo step {turn}")

        with FakeAnthropic(respond=respond) as api:
            result = claude(ws, api, settings)

    assert ws.executions() == 2
    assert result["terminal_reason"] == "hook_stopped", result


def test_endpoint_killed_mid_session_blocks_the_next_call(stack: Stack, tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    with endpoint(stack, ws.state) as ep:
        settings = http_settings(stack, ep.url)

        def respond(body: dict[str, Any]) -> Turn:
            turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
            if turn == 2 and ep.proc.poll() is None:
                ep.kill()  # the endpoint dies between two calls
            return ws.bash(f"echo step {turn}") if turn < 4 else text("gave up")

        with FakeAnthropic(respond=respond) as api:
            result = claude(ws, api, settings)
            results = api.tool_results()

    # Two calls ran; every call after the kill was blocked by onFailure, never run.
    assert ws.executions() == 2, results
    assert len(results) == 4, results
    assert result["result"] == "gave up", result


def test_an_endpoint_that_is_down_blocks_the_calls_not_the_prompt(
    stack: Stack, tmp_path: Path
) -> None:
    ws = Workspace(tmp_path)
    with endpoint(stack, ws.state) as ep:
        settings = http_settings(stack, ep.url)
        ep.kill()
        with FakeAnthropic([ws.bash("echo one"), text("gave up")]) as api:
            result = claude(ws, api, settings)
            served = api.turns_served()

    # The prompt went on to the model; the call it asked for was blocked (onFailure).
    assert served == 2 and result["result"] == "gave up", result
    assert ws.executions() == 0


def test_a_non_loopback_endpoint_refuses_a_call_without_the_token(
    stack: Stack, tmp_path: Path
) -> None:
    ws = Workspace(tmp_path)
    token = "pytest-" + os.urandom(16).hex()
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TENANT} {token}\n")
    with endpoint(stack, ws.state, "--tokens", str(tokens), listen="0.0.0.0") as ep:
        bare = http_settings(stack, ep.url)
        with FakeAnthropic([ws.bash("echo one"), text("gave up")]) as api:
            claude(ws, api, bare)
        assert ws.executions() == 0

        with_token = http_settings(stack, ep.url, "--token-env", "FUSEBOX_HOOK_TOKEN")
        with FakeAnthropic([ws.bash("echo two"), text("done")]) as api:
            claude(ws, api, with_token, FUSEBOX_HOOK_TOKEN=token)
        assert ws.executions() == 1


def test_a_sub_agent_is_a_child_run_over_http(stack: Stack, tmp_path: Path) -> None:
    # SubagentStart and SubagentStop reach the endpoint too (2.1.327 sends them over
    # HTTP): the sub-agent's run is a child of the session's; its loop is stopped there,
    # which ends the sub-agent alone, and the main agent reads why and finishes.
    ws = Workspace(tmp_path)
    sub_prompt = "SUB-AGENT: look around"

    def respond(body: dict[str, Any]) -> Turn:
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if sub_prompt in json.dumps(body["messages"][:1]):
            return ws.bash("cat status.txt || echo running")
        task = {"description": "Look around", "prompt": sub_prompt, "run_in_background": False}
        return [tool_use("Agent", task), text("done")][min(turn, 1)]

    with endpoint(stack, ws.state) as ep:
        settings = http_settings(stack, ep.url)
        with FakeAnthropic(respond=respond) as api:
            run = run_claude(
                api,
                "do the task",
                home=ws.home,
                cwd=ws.cwd,
                settings=settings,
                allowed_tools=("Bash", "Agent"),
            )
            result = run.result()
            main_read = json.dumps(api.message_requests()[-1])

    assert ws.executions() == RUNAWAY_EXECUTIONS
    assert result["terminal_reason"] == "completed" and result["result"] == "done", result
    assert "the guard stopped sub-agent" in main_read, main_read[-3000:]
    session = result["session_id"]
    [child] = run_status(stack, session)["tree"]["children"]
    assert child["terminal_state"] == "STOPPED_LOOP_GUARD", child
    sub = run_status(stack, child["run"])
    assert sub["tree"]["parent"] == session and sub["summary"]["agent"] == "claude-code", sub
    assert sub["summary"]["steps"] == RUNAWAY_EXECUTIONS, sub
    assert run_status(stack, session)["summary"]["terminal_state"] == "COMPLETED"
