"""The Claude Agent SDK adapter, with the real SDK (claude-agent-sdk 0.2.184) driving its
bundled Claude Code CLI offline against the scripted model API stand-in, and a real
nats-server and fuseboxd. The tools are in-process SDK MCP tools that log what they
really executed."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk import (
    AgentDefinition,
    ClaudeAgentOptions,
    ClaudeSDKClient,
    ResultMessage,
    create_sdk_mcp_server,
    tool,
)
from fusebox_guard import Fusebox, GateOnError, RunStopped, TerminalState
from fusebox_guard.adapters.claude_agent_sdk import ClaudeAgentGuard
from support.claude_code import fusebox
from support.fake_anthropic import (
    FakeAnthropic,
    ToolResult,
    Turn,
    is_after_compaction,
    text,
    tool_uses,
)
from support.guard import (
    PAGES,
    RUNAWAY_EXECUTIONS,
    TENANT,
    ToolLog,
    assert_closed,
    bare_nats,
    fresh_run,
    list_issues_output,
    open_page_output,
    run_status,
    search_output,
    send_email_output,
)
from support.scenarios import next_calls, op_key_for
from support.shapes import CELLS, Read, assert_cell, shaped
from support.stack import Stack
from support.sub_agents import (
    FOUND,
    RUNAWAY_SEARCHES,
    lead_calls,
    researcher_answer,
    researcher_calls,
    topic_of,
)
from support.trees import children, tree

pytestmark = pytest.mark.asyncio

SERVER = "tools"
PREFIX = f"mcp__{SERVER}__"
TOOLS = ["search", "open_page", "list_issues", "send_email"]


def make_server(log: ToolLog, on_tool: Any = None, search_shape: str | None = None) -> Any:
    """The scenario tools; `search_shape`: `search` returns that shape of `SHAPES`."""

    def ran(name: str, args: dict[str, Any], output: Any) -> dict[str, Any]:
        log.calls.append((name, args))
        if on_tool is not None:
            on_tool(log)
        return {"content": [{"type": "text", "text": json.dumps(output)}]}

    @tool("search", "Search the web", {"query": str})
    async def search(args: dict[str, Any]) -> dict[str, Any]:
        if search_shape is not None:
            log.calls.append(("search", args))
            return mcp_result(shaped(search_shape))
        return ran("search", args, search_output(args["query"]))

    @tool("open_page", "Open a web page", {"url": str})
    async def open_page(args: dict[str, Any]) -> dict[str, Any]:
        return ran("open_page", args, open_page_output(args["url"]))

    @tool("list_issues", "List issues, one page at a time", {"page": int})
    async def list_issues(args: dict[str, Any]) -> dict[str, Any]:
        return ran("list_issues", args, list_issues_output(int(args["page"])))

    @tool("send_email", "Send an email", {"to": str, "incident": str})
    async def send_email(args: dict[str, Any]) -> dict[str, Any]:
        return ran("send_email", args, send_email_output(args["to"]))

    return create_sdk_mcp_server(SERVER, tools=[search, open_page, list_issues, send_email])


def mcp_result(value: Any) -> dict[str, Any]:
    """An SDK MCP tool's result for a value of `SHAPES`: MCP results are content blocks,
    so a string is a text block, content blocks are themselves, nothing is no block,
    and any other value is a text block of its JSON."""
    if value is None:
        return {"content": []}
    if isinstance(value, str):
        return {"content": [{"type": "text", "text": value}]}
    if isinstance(value, list) and all(isinstance(v, dict) and "type" in v for v in value):
        return {"content": value}
    return {"content": [{"type": "text", "text": json.dumps(value)}]}


def scripted(scenario: str) -> FakeAnthropic:
    """The shared scenario script, turn by turn, as Claude tool uses."""

    def respond(body: dict[str, Any]) -> Turn:
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        calls = next_calls(scenario, turn)
        if calls is None:
            return text("done")
        return tool_uses(*((PREFIX + name, args) for name, args in calls))

    return FakeAnthropic(respond=respond)


def options(api: FakeAnthropic, tmp_path: Path, server: Any) -> ClaudeAgentOptions:
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    return ClaudeAgentOptions(
        mcp_servers={SERVER: server},
        allowed_tools=[PREFIX + name for name in TOOLS],
        tools=[],
        env=api.env(home),
        cwd=str(work),
        max_turns=100,
    )


def unanswered_tool_uses(api: FakeAnthropic) -> list[str]:
    """Tool use ids of the last request's history without a tool result."""
    history = api.message_requests()[-1]["messages"]
    asked = [
        block["id"]
        for message in history
        if message["role"] == "assistant" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_use"
    ]
    answered = {r.tool_use_id for r in api.tool_results()}
    # The last assistant turn may be the refused one that ended the session.
    return [call for call in asked[:-1] if call not in answered]


async def guarded(
    stack: Stack, scenario: str, tmp_path: Path, **kw: Any
) -> tuple[ClaudeAgentGuard, FakeAnthropic, ToolLog]:
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    run = await fb.start_run(fresh_run(f"cas-{scenario}"), agent="claude-agent", **kw)
    return ClaudeAgentGuard(run), scripted(scenario), ToolLog()


async def test_runaway_is_stopped_after_the_same_executions_as_the_rust_demo(
    stack: Stack, tmp_path: Path
) -> None:
    guard, api, log = await guarded(stack, "runaway", tmp_path)
    with api, pytest.raises(RunStopped) as stopped:
        await guard.run_agent("weather in tokyo?", options(api, tmp_path, make_server(log)))
    assert log.count("search") == RUNAWAY_EXECUTIONS
    assert stopped.value.report is not None
    assert stopped.value.report.terminal_state == TerminalState.STOPPED_LOOP_GUARD
    assert unanswered_tool_uses(api) == []
    refused = [r for r in api.tool_results() if r.is_error]
    assert refused and all("fusebox" in r.content for r in refused), refused


def read_per_call(api: FakeAnthropic) -> list[str]:
    """What the model read for each call, in order, from the last request: the call's
    tool_result, then the text blocks the CLI sent beside it (a hook's additional
    context), each without the CLI's own reminders."""
    texts = []
    for message in api.message_requests()[-1]["messages"]:
        blocks = message["content"] if message["role"] == "user" else []
        blocks = blocks if isinstance(blocks, list) else []
        results = [b for b in blocks if b.get("type") == "tool_result"]
        beside = [str(b["text"]) for b in blocks if b.get("type") == "text"]
        for result in results:
            content = result.get("content")
            parts = content if isinstance(content, list) else [{"text": content or ""}]
            text = "\n".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))
            text = "\n".join([text, *beside])
            texts.append(without_reminders(text))
    return texts


def without_reminders(text: str) -> str:
    """`text` without the CLI's token-count reminders, which it adds to some results
    and not others."""
    return re.sub(
        r"\s*<system-reminder>\s*<total_tokens>.*?</system-reminder>", "", text, flags=re.S
    )


#: One runaway per shape, read by that shape's three cells of the table (the CLI is
#: slow to start: one run per shape, not per cell).
_runaways: dict[str, tuple[str, Read, list[str]]] = {}


async def shaped_runaway(stack: Stack, shape: str, tmp_path: Path) -> tuple[str, Read, list[str]]:
    if shape not in _runaways:
        guard, api, log = await guarded(stack, "runaway", tmp_path)
        state = None
        with api:
            try:
                server = make_server(log, search_shape=shape)
                await guard.run_agent("weather in tokyo?", options(api, tmp_path, server))
            except RunStopped as stop:
                state = stop.report.state_name if stop.report is not None else None
        assert unanswered_tool_uses(api) == []
        texts = read_per_call(api)
        # `continue: false` ends the session at the stopped call: no model reads it.
        read = Read(
            texts, log.count("search"), state, model_reads_stop=False, tool=f"{PREFIX}search"
        )
        _runaways[shape] = (guard.run.id, read, [r.content for r in api.tool_results()])
    return _runaways[shape]


@pytest.mark.parametrize(("shape", "decision"), CELLS)
async def test_every_result_shape_through_a_warn_a_block_and_a_stop(
    stack: Stack, tmp_path: Path, shape: str, decision: str
) -> None:
    """Issue 49 §1 across result shapes (an MCP tool's content: a text block, JSON text,
    content blocks, no block): the warning is the hook's additional context beside the
    result, which stays what the tool returned; a block is the guard's words; a stop
    is `RunStopped` and the daemon's STOPPED_LOOP_GUARD."""
    run_id, read, results = await shaped_runaway(stack, shape, tmp_path)
    await asyncio.to_thread(assert_cell, stack, run_id, shape, decision, read)
    if decision == "warn":
        first, warned = (without_reminders(results[i]) for i in (0, RUNAWAY_EXECUTIONS - 1))
        assert warned == first and "fusebox" not in warned, results


async def test_ping_pong_is_stopped(stack: Stack, tmp_path: Path) -> None:
    guard, api, log = await guarded(stack, "ping_pong", tmp_path)
    with api, pytest.raises(RunStopped) as stopped:
        await guard.run_agent("weather in tokyo?", options(api, tmp_path, make_server(log)))
    assert stopped.value.report is not None
    assert "ping_pong" in " ".join(stopped.value.report.fired_guards)
    assert log.count("search") + log.count("open_page") < 12


async def test_pagination_of_twelve_pages_finishes_untouched(stack: Stack, tmp_path: Path) -> None:
    guard, api, log = await guarded(stack, "pagination", tmp_path)
    with api:
        result = await guard.run_agent("list all issues", options(api, tmp_path, make_server(log)))
    assert log.count("list_issues") == PAGES
    assert isinstance(result, ResultMessage) and result.result == "done"
    assert guard.run.stopped is None
    assert not any("fusebox" in r.content for r in api.tool_results())
    await asyncio.to_thread(assert_closed, stack, guard.run.id, "completed")


async def test_an_agent_that_fails_closes_its_run_as_failed(stack: Stack, tmp_path: Path) -> None:
    guard, api, log = await guarded(stack, "pagination", tmp_path)
    opts = dataclasses.replace(options(api, tmp_path, make_server(log)), max_turns=2)
    with api:
        result = await guard.run_agent("list all issues", opts)
    # The CLI ends a session out of turns with an error result, not an exception.
    assert result is not None and result.is_error, result
    await asyncio.to_thread(assert_closed, stack, guard.run.id, "failed: AgentFailed")


async def test_side_effect_with_one_op_key_runs_once_across_a_retry(
    stack: Stack, tmp_path: Path
) -> None:
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    run_id = fresh_run("cas-email")
    run = await fb.start_run(run_id, agent="claude-agent")
    op_key = op_key_for(run_id)
    guard = ClaudeAgentGuard(run, op_key=lambda t, a: op_key(t.removeprefix(PREFIX), a))
    log = ToolLog()
    with scripted("retry_side_effect") as api:
        await guard.run_agent("page on-call", options(api, tmp_path, make_server(log)))
        results = api.tool_results()
    assert log.count("send_email") == 1
    assert len(results) == 2
    # The retry was answered with the stored result (the MCP tool's content), under its
    # own call id, and the tool did not run again.
    assert results[1].is_error and 'sent\\": true' in results[1].content, results[1]
    assert unanswered_tool_uses(api) == []


async def test_fusebox_cancel_from_another_process_ends_the_run_at_its_next_step(
    stack: Stack, tmp_path: Path
) -> None:
    guard, api, log = await guarded(stack, "pagination", tmp_path)

    def cancel_at_third(log: ToolLog) -> None:
        if log.count("list_issues") == 3:
            fusebox(stack, "cancel", f"{TENANT}/{guard.run.id}", "--reason", "wrong project")

    with api, pytest.raises(RunStopped) as stopped:
        await guard.run_agent(
            "list all issues", options(api, tmp_path, make_server(log, cancel_at_third))
        )
    assert log.count("list_issues") == 3
    assert stopped.value.report is not None
    assert stopped.value.report.terminal_state == TerminalState.CANCELLED


async def test_usage_reaches_the_token_budget(stack: Stack, tmp_path: Path) -> None:
    # 150 tokens a turn (the stand-in's usage): the fourth turn crosses 500. Usage comes
    # with the streamed messages, beside the hooks: the call of the crossing turn may run
    # before its usage arrives; the one after it never does.
    guard, api, log = await guarded(stack, "pagination", tmp_path, policy={"max_tokens": 500})
    with api, pytest.raises(RunStopped) as stopped:
        await guard.run_agent("list all issues", options(api, tmp_path, make_server(log)))
    assert stopped.value.report is not None
    assert stopped.value.report.reason == "token_budget"
    assert log.count("list_issues") in (3, 4)


@pytest.mark.parametrize("policy", [GateOnError.DENY, GateOnError.ALLOW])
async def test_daemon_down(tmp_path: Path, policy: GateOnError) -> None:
    log = ToolLog()
    with bare_nats() as url:
        fb = await Fusebox.connect(url, tenant=TENANT, gate_on_error=policy, timeout_s=0.5)
        run = await fb.start_run(fresh_run("cas-down"), agent="claude-agent")
        guard = ClaudeAgentGuard(run)
        with scripted("one_search") as api:
            await guard.run_agent("weather?", options(api, tmp_path, make_server(log)))
            results = api.tool_results()
    assert len(results) == 1
    if policy is GateOnError.DENY:
        assert log.count("search") == 0
        assert results[0].is_error
        assert "could not be asked" in results[0].content
        assert "no fuseboxd is listening" in results[0].content
    else:
        assert log.count("search") == 1
        assert not results[0].is_error


async def test_parallel_calls_are_each_gated_and_siblings_refused_after_a_stop(
    stack: Stack, tmp_path: Path
) -> None:
    guard, api, log = await guarded(stack, "parallel_runaway", tmp_path)
    with api, pytest.raises(RunStopped):
        await guard.run_agent("weather in tokyo?", options(api, tmp_path, make_server(log)))
    assert log.count("search") <= RUNAWAY_EXECUTIONS + 2
    assert unanswered_tool_uses(api) == []


async def test_a_loop_that_goes_on_after_a_compaction_is_stopped(
    stack: Stack, tmp_path: Path
) -> None:
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    run = await fb.start_run(fresh_run("cas-compact"), agent="claude-agent")
    guard = ClaudeAgentGuard(run)
    log = ToolLog()
    search = (PREFIX + "search", {"query": "weather tokyo"})
    page = (PREFIX + "open_page", {"url": "https://jma.go.jp"})

    def respond(body: dict[str, Any]) -> Turn:
        # A page read before the compaction; after it, the same search for ever.
        if is_after_compaction(body):
            return tool_uses(search)
        done = any(m["role"] == "assistant" for m in body["messages"])
        return text("found it") if done else tool_uses(page)

    with FakeAnthropic(respond=respond) as api:
        opts = guard.protect(options(api, tmp_path, make_server(log)))
        async with ClaudeSDKClient(opts) as client:
            guard.attach(client)
            for prompt in ("weather in tokyo?", "/compact", "and again?"):
                await client.query(prompt)
                async for message in client.receive_response():
                    await guard.observe(message)
                if guard.run.stopped is not None:
                    break
            await guard.detach()

    report = guard.run.stopped
    assert report is not None
    # The search after the compaction was never seen before it; the third identical call
    # in a row after a compaction is the loop, refused before it runs.
    assert report.terminal_state is TerminalState.STOPPED_LOOP_GUARD, report
    assert report.reason == "compaction_loop_persisted", report
    assert log.count("open_page") == 1
    assert log.count("search") == 2


# --- sub-agents (`agents`, started by the Agent tool) are child runs ----------------------

#: In the researcher's system prompt: how the stand-in tells its requests apart.
RESEARCHER = "You are the researcher sub-agent."


def delegation() -> FakeAnthropic:
    """The lead starts the researcher twice (in the foreground), then answers; the
    researcher plays the shared sub-agent script for the topic it was given."""

    def respond(body: dict[str, Any]) -> Turn:
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if RESEARCHER in json.dumps(body.get("system")):
            topic = topic_of(json.dumps(body["messages"][0]["content"]))
            calls = researcher_calls(topic, turn)
            if calls is None:
                return text(researcher_answer(topic))
            return tool_uses(*((PREFIX + name, args) for name, args in calls))
        calls = lead_calls(turn)
        if calls is None:
            return text("done")
        return tool_uses(
            *(
                (
                    "Agent",
                    {
                        "subagent_type": "researcher",
                        "description": f"research {args['topic']}",
                        "prompt": args["topic"],
                        "run_in_background": False,
                    },
                )
                for _, args in calls
            )
        )

    return FakeAnthropic(respond=respond)


def lead_options(api: FakeAnthropic, tmp_path: Path, server: Any) -> ClaudeAgentOptions:
    researcher = AgentDefinition(
        description="Researches one topic", prompt=RESEARCHER, tools=[PREFIX + "search"]
    )
    return dataclasses.replace(
        options(api, tmp_path, server),
        tools=["Agent"],
        allowed_tools=[*(PREFIX + name for name in TOOLS), "Agent"],
        agents={"researcher": researcher},
    )


def lead_read(api: FakeAnthropic) -> list[ToolResult]:
    """What the lead read as its Agent calls' results, in order."""
    lead = [b for b in api.message_requests() if RESEARCHER not in json.dumps(b.get("system"))]
    agent_calls = [
        block["id"]
        for message in lead[-1]["messages"]
        if message["role"] == "assistant" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_use"
    ]
    results = {r.tool_use_id: r for r in api.tool_results()}
    return [results[call] for call in agent_calls]


async def lead_session(
    stack: Stack, tmp_path: Path, **start: Any
) -> tuple[ClaudeAgentGuard, FakeAnthropic, ToolLog]:
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    guard = ClaudeAgentGuard(await fb.start_run(fresh_run("cas-lead"), agent="lead", **start))
    log = ToolLog()
    with delegation() as api:
        opts = lead_options(api, tmp_path, make_server(log))
        result = await guard.run_agent("weather report", opts)
    assert isinstance(result, ResultMessage) and result.result == "done", result
    return guard, api, log


async def test_a_sub_agent_is_a_child_run_and_its_stop_is_its_report(
    stack: Stack, tmp_path: Path
) -> None:
    guard, api, log = await lead_session(stack, tmp_path)
    found, stopped = lead_read(api)
    assert FOUND in found.content and "fusebox" not in found.content
    # The stop is what the lead reads as the sub-agent's report.
    assert "fusebox stopped the sub-agent researcher" in stopped.content, stopped
    assert "consecutive_blocks" in stopped.content
    assert log.count("search") == 1 + RUNAWAY_SEARCHES
    nodes = await tree(stack, guard.run.id)
    first, second = children(nodes, guard.run.id)
    assert first.agent == second.agent == "researcher"
    assert first.executed == [PREFIX + "search"] and first.stop_reason == "completed"
    assert second.stop_reason == "consecutive_blocks"
    assert len(second.executed) == RUNAWAY_SEARCHES
    assert nodes[guard.run.id].executed == ["Agent", "Agent"]
    # The sub-agent's model turns (its messages name the Agent call) are its own: those
    # the CLI streams (a foreground sub-agent's last one comes only as the call's result).
    status = await asyncio.to_thread(run_status, stack, first.run)
    assert status["counters"]["model_turns"] >= 1
    await asyncio.to_thread(assert_closed, stack, guard.run.id, "completed")


async def test_a_sub_agent_past_the_caps_does_not_start_and_the_lead_reads_why(
    stack: Stack, tmp_path: Path
) -> None:
    _, api, log = await lead_session(stack, tmp_path, policy={"max_children": 1})
    refused = lead_read(api)[1]
    assert refused.is_error and "spawn_limit" in refused.content, refused
    assert log.count("search") == 1  # the second researcher never started
