"""The OpenAI Agents SDK adapter, with the real SDK (openai-agents 0.24), a scripted model
(agents.testing.ScriptedModel: no LLM, no network), a real nats-server and fuseboxd."""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig, function_tool, set_tracing_disabled
from agents.testing import (
    ModelCall,
    ModelStep,
    ScriptedModel,
    assistant_message,
    function_call,
)
from agents.usage import Usage as AgentsUsage
from fusebox_guard import Fusebox, GateOnError, RunStopped
from fusebox_guard.adapters.openai_agents import OpenAIAgentsGuard
from fusebox_guard.types import to_text
from support.guard import (
    PAGES,
    RUNAWAY_EXECUTIONS,
    TENANT,
    ToolLog,
    assert_closed,
    bare_nats,
    fresh_run,
    fusebox_cancel,
    list_issues_output,
    open_page_output,
    run_status,
    search_output,
    send_email_output,
)
from support.scenarios import Call, next_calls, op_key_for
from support.shapes import CELLS, SHAPES, Read, assert_cell, call_of, shaped
from support.stack import Stack
from support.sub_agents import (
    DELEGATE,
    FOUND,
    RUNAWAY_SEARCHES,
    lead_calls,
    researcher_answer,
    researcher_calls,
    topic_of,
)
from support.trees import children, tree

set_tracing_disabled(True)
MCP_SERVER = Path(__file__).resolve().parents[1] / "support/mcp_search_server.py"


def scripted(scenario: str) -> ScriptedModel:
    turns = itertools.count()

    def respond(call: ModelCall) -> Any:
        turn = next(turns)
        calls = next_calls(scenario, turn)
        if calls is None:
            return [assistant_message("done")]
        return [
            function_call(tool, args, call_id=f"call_{turn}_{k}")
            for k, (tool, args) in enumerate(calls)
        ]

    model = ScriptedModel([ModelStep.respond(respond) for _ in range(100)])
    model.set_default_usage(AgentsUsage(requests=1, input_tokens=120, output_tokens=30))
    return model


def make_agent(
    model: ScriptedModel, log: ToolLog, on_tool: Any = None, search_shape: str | None = None
) -> Agent[Any]:
    """The scenario's agent; `search_shape`: `search` returns that shape of `SHAPES`."""

    @function_tool
    def search(query: str) -> Any:
        """Search the web."""
        log.calls.append(("search", query))
        if on_tool is not None:
            on_tool(len(log.calls))
        return search_output(query) if search_shape is None else shaped(search_shape)

    @function_tool
    def open_page(url: str) -> dict[str, Any]:
        """Open a page."""
        log.calls.append(("open_page", url))
        return open_page_output(url)

    @function_tool
    def list_issues(page: int) -> dict[str, Any]:
        """List one page of issues."""
        log.calls.append(("list_issues", page))
        return list_issues_output(page)

    @function_tool
    def send_email(to: str, incident: str) -> dict[str, Any]:
        """Notify someone about an incident."""
        log.calls.append(("send_email", to))
        return send_email_output(to)

    return Agent(
        name="researcher",
        model=model,
        tools=[search, open_page, list_issues, send_email],
    )


def assert_history_valid(model: ScriptedModel) -> None:
    """Every function call the model saw in its input has an output for its call id."""
    for call in model.calls:
        items = call.input if isinstance(call.input, list) else []
        asked = {i["call_id"] for i in map(_as_dict, items) if i.get("type") == "function_call"}
        answered = {
            i["call_id"] for i in map(_as_dict, items) if i.get("type") == "function_call_output"
        }
        assert asked <= answered, f"unanswered call ids: {asked - answered}"


def _as_dict(item: Any) -> dict[str, Any]:
    return item if isinstance(item, dict) else item.model_dump()


async def guarded(stack: Stack, scenario: str, **kw: Any) -> tuple[Any, OpenAIAgentsGuard]:
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT, **kw)
    run = await fb.start_run(fresh_run(f"oai-{scenario}"), agent="researcher")
    return fb, OpenAIAgentsGuard(run, op_key=op_key_for(run.id))


@pytest.mark.asyncio
async def test_runaway_is_stopped_after_the_same_executions_as_the_rust_demo(
    stack: Stack,
) -> None:
    fb, guard = await guarded(stack, "runaway")
    model, log = scripted("runaway"), ToolLog()
    agent = guard.protect(make_agent(model, log))
    with pytest.raises(RunStopped) as stopped:
        await guard.run_agent(agent, "weather in tokyo?", max_turns=100, run_config=RunConfig())
    assert log.count("search") == RUNAWAY_EXECUTIONS
    assert stopped.value.report is not None
    assert stopped.value.report.state_name == "STOPPED_LOOP_GUARD"
    assert guard.run.stopped is not None
    # What the model read: the warning with the last executed result, then the blocks'
    # messages.
    read = [
        str(i["output"])
        for i in map(_as_dict, model.calls[-1].input)
        if i.get("type") == "function_call_output"
    ]
    assert "[fusebox warning]" in read[RUNAWAY_EXECUTIONS - 1]
    assert read[RUNAWAY_EXECUTIONS].startswith("fusebox blocked search")
    assert_history_valid(model)
    await fb.close()


#: One runaway per shape, read by that shape's three cells of the table: (run id,
#: what was read, the error other than the guard's stop that ended it, if any).
_runaways: dict[str, tuple[str, Read, BaseException | None]] = {}


async def shaped_runaway(stack: Stack, shape: str) -> tuple[str, Read, BaseException | None]:
    if shape not in _runaways:
        fb, guard = await guarded(stack, f"shape-{shape}")
        model, log = scripted("runaway"), ToolLog()
        agent = guard.protect(make_agent(model, log, search_shape=shape))
        state, error = None, None
        try:
            await guard.run_agent(agent, "weather in tokyo?", max_turns=100)
        except RunStopped as stop:
            state = stop.report.state_name if stop.report is not None else None
        except Exception as err:  # the cell says what it was
            error = err
        texts = [
            str(i["output"])
            for i in map(_as_dict, model.calls[-1].input)
            if i.get("type") == "function_call_output"
        ]
        # The SDK's tripwire ends Runner.run at the stopped call: no model reads it.
        read = Read(texts, log.count("search"), state, model_reads_stop=False)
        _runaways[shape] = (guard.run.id, read, error)
        await fb.close()
    return _runaways[shape]


@pytest.mark.asyncio
@pytest.mark.parametrize(("shape", "decision"), CELLS)
async def test_every_result_shape_through_a_warn_a_block_and_a_stop(
    stack: Stack, shape: str, decision: str
) -> None:
    """Issue 49 §1 across result shapes: the warned call's output is the tool's value as
    text, then the warning, whatever the tool returned; a block is the guard's words;
    a stop is `RunStopped` and the daemon's STOPPED_LOOP_GUARD."""
    run_id, read, error = await shaped_runaway(stack, shape)
    assert error is None, error
    await asyncio.to_thread(assert_cell, stack, run_id, shape, decision, read)
    if decision == "warn":
        value, _, warning = call_of("warn", read).partition("\n\n[fusebox warning] ")
        assert value == to_text(SHAPES[shape]) and warning, read


@pytest.mark.asyncio
async def test_ping_pong_is_stopped(stack: Stack) -> None:
    fb, guard = await guarded(stack, "ping_pong")
    model, log = scripted("ping_pong"), ToolLog()
    agent = guard.protect(make_agent(model, log))
    with pytest.raises(RunStopped) as stopped:
        await guard.run_agent(agent, "go", max_turns=100)
    assert stopped.value.report is not None
    assert len(log.calls) < 20
    assert_history_valid(model)
    await fb.close()


@pytest.mark.asyncio
async def test_pagination_of_twelve_pages_finishes_untouched(stack: Stack) -> None:
    fb, guard = await guarded(stack, "pagination")
    model, log = scripted("pagination"), ToolLog()
    agent = guard.protect(make_agent(model, log))
    result = await guard.run_agent(agent, "list all issues", max_turns=100)
    assert result.final_output == "done"
    assert [a for t, a in log.calls if t == "list_issues"] == list(range(1, PAGES + 1))
    assert guard.run.stopped is None
    assert_history_valid(model)
    # Each model response's usage reached the daemon as a model_turn (120 in + 30 out).
    counters = (await asyncio.to_thread(run_status, stack, guard.run.id))["counters"]
    assert counters["model_turns"] == PAGES + 1
    assert counters["tokens"] == (PAGES + 1) * 150
    assert counters["steps"] == PAGES and counters["calls_refused"] == 0
    await asyncio.to_thread(assert_closed, stack, guard.run.id, "completed")
    await fb.close()


@pytest.mark.asyncio
async def test_an_agent_that_fails_closes_its_run_as_failed(stack: Stack) -> None:
    from agents.exceptions import MaxTurnsExceeded

    fb, guard = await guarded(stack, "pagination")
    agent = guard.protect(make_agent(scripted("pagination"), ToolLog()))
    with pytest.raises(MaxTurnsExceeded):
        await guard.run_agent(agent, "list all issues", max_turns=2)
    await asyncio.to_thread(assert_closed, stack, guard.run.id, "failed: MaxTurnsExceeded")
    await fb.close()


@pytest.mark.asyncio
async def test_side_effect_with_one_op_key_runs_once_across_a_retry(stack: Stack) -> None:
    fb, guard = await guarded(stack, "retry_side_effect")
    model, log = scripted("retry_side_effect"), ToolLog()
    agent = guard.protect(make_agent(model, log))
    result = await guard.run_agent(agent, "notify on-call", max_turns=100)
    assert result.final_output == "done"
    assert log.count("send_email") == 1
    # The retry was answered with the stored result, under the retry's own call id.
    last_input = [_as_dict(i) for i in model.calls[-1].input]
    outputs = {
        i["call_id"]: i["output"] for i in last_input if i.get("type") == "function_call_output"
    }
    assert '"sent": true' in str(outputs["call_1_0"]).lower().replace("'", '"')
    assert_history_valid(model)
    await fb.close()


@pytest.mark.asyncio
async def test_fusebox_cancel_from_another_process_ends_the_run_at_its_next_step(
    stack: Stack,
) -> None:
    fb, guard = await guarded(stack, "pagination")
    model, log = scripted("pagination"), ToolLog()
    run_id = guard.run.id
    cancelled = asyncio.Event()

    def cancel_at(executions: int) -> None:
        if executions == 3:
            fusebox_cancel(stack, run_id)
            cancelled.set()

    # Cancel inside the 3rd execution of a legit run: the agent must not take another step.
    agent = make_agent(model, log, on_tool=None)
    agent.tools = [t for t in agent.tools if t.name != "list_issues"]

    @function_tool
    def list_issues(page: int) -> dict[str, Any]:
        """List one page of issues."""
        log.calls.append(("list_issues", page))
        cancel_at(len(log.calls))
        return list_issues_output(page)

    agent.tools.append(list_issues)
    guard.protect(agent)
    with pytest.raises(RunStopped) as stopped:
        await guard.run_agent(agent, "list all issues", max_turns=100)
    assert cancelled.is_set()
    assert log.count("list_issues") == 3
    assert stopped.value.report is not None
    assert stopped.value.report.state_name == "CANCELLED"
    await fb.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("policy", [GateOnError.DENY, GateOnError.ALLOW])
async def test_daemon_down(policy: GateOnError) -> None:
    with bare_nats() as url:
        fb = await Fusebox.connect(url, tenant=TENANT, gate_on_error=policy, timeout_s=0.5)
        run = await fb.start_run(fresh_run("oai-down"), agent="researcher")
        guard = OpenAIAgentsGuard(run)
        model, log = scripted("one_search"), ToolLog()
        agent = guard.protect(make_agent(model, log))
        result = await guard.run_agent(agent, "weather?", max_turns=10)
        assert result.final_output == "done"
        tool_outputs = [
            i
            for i in map(_as_dict, model.calls[-1].input)
            if i.get("type") == "function_call_output"
        ]
        if policy is GateOnError.DENY:
            assert log.count("search") == 0
            assert "no fuseboxd is listening" in str(tool_outputs[0]["output"])
            assert "did not run" in str(tool_outputs[0]["output"])
        else:
            assert log.count("search") == 1
        assert_history_valid(model)
        await fb.close()


@pytest.mark.asyncio
async def test_parallel_calls_are_each_gated_and_siblings_refused_after_a_stop(
    stack: Stack,
) -> None:
    fb, guard = await guarded(stack, "parallel_runaway")
    model, log = scripted("parallel_runaway"), ToolLog()
    agent = guard.protect(make_agent(model, log))
    with pytest.raises(RunStopped):
        await guard.run_agent(agent, "go", max_turns=100)
    # Each call of each turn asked the gate; no execution after the stop.
    assert log.count("search") == RUNAWAY_EXECUTIONS
    assert guard.run.stopped is not None
    gate = await guard.run.tool_call("search", {"query": "weather tokyo"})
    assert gate.stopped and not gate.may_run
    await fb.close()


@pytest.mark.asyncio
async def test_mcp_tools_of_the_agent_are_gated_too(stack: Stack, tmp_path: Any) -> None:
    from agents.mcp import MCPServerStdio

    tool_log = tmp_path / "mcp-calls.log"
    tool_log.write_text("")
    script = MCP_SERVER
    fb, guard = await guarded(stack, "runaway")
    model = scripted("runaway")
    params = {
        "command": sys.executable,
        "args": [str(script)],
        "env": {**os.environ, "FUSEBOX_TEST_TOOL_LOG": str(tool_log)},
    }
    async with MCPServerStdio(params=params, name="search-server") as server:  # type: ignore[arg-type]
        agent = guard.protect(Agent(name="researcher", model=model, mcp_servers=[server]))
        with pytest.raises(RunStopped):
            await guard.run_agent(agent, "weather in tokyo?", max_turns=100)
    assert len(tool_log.read_text().splitlines()) == RUNAWAY_EXECUTIONS
    assert_history_valid(model)
    await fb.close()


# --- sub-agents: Agent.as_tool and handoffs are child runs -------------------------------


def playing(script: Callable[[list[dict[str, Any]]], list[Call] | str]) -> ScriptedModel:
    """A scripted model answering what `script` says for each call's input items."""

    def respond(call: ModelCall) -> Any:
        items = [_as_dict(i) for i in call.input] if isinstance(call.input, list) else []
        if not items:
            items = [{"role": "user", "content": str(call.input)}]
        answer = script(items)
        if isinstance(answer, str):
            return [assistant_message(answer)]
        turn = sum(1 for i in items if i.get("type") == "function_call")
        return [function_call(n, a, call_id=f"{n}_{turn}") for n, a in answer]

    return ScriptedModel([ModelStep.respond(respond) for _ in range(100)])


def _turn(items: list[dict[str, Any]]) -> int:
    return sum(1 for i in items if i.get("type") == "function_call")


def lead_script(items: list[dict[str, Any]]) -> list[Call] | str:
    calls = lead_calls(_turn(items))
    # An agent tool takes its task as `input`.
    return [(n, {"input": a["topic"]}) for n, a in calls] if calls else "done"


def researcher_script(items: list[dict[str, Any]]) -> list[Call] | str:
    topic = topic_of(items[0].get("content"))
    return researcher_calls(topic, _turn(items)) or researcher_answer(topic)


async def lead_run(
    stack: Stack, policy: dict[str, Any] | None = None
) -> tuple[OpenAIAgentsGuard, ScriptedModel, ToolLog]:
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    run = await fb.start_run(fresh_run("oai-lead"), agent="lead", policy=policy)
    guard, log = OpenAIAgentsGuard(run), ToolLog()
    researcher = make_agent(playing(researcher_script), log)
    lead_model = playing(lead_script)
    research = researcher.as_tool(tool_name=DELEGATE, tool_description="Research a topic.")
    lead = guard.protect(Agent(name="lead", model=lead_model, tools=[research]))
    result = await guard.run_agent(lead, "weather report", max_turns=20)
    assert result.final_output == "done"
    await fb.close()
    return guard, lead_model, log


def lead_read(model: ScriptedModel) -> dict[str, str]:
    return {
        i["call_id"]: str(i["output"])
        for i in map(_as_dict, model.calls[-1].input)
        if i.get("type") == "function_call_output"
    }


@pytest.mark.asyncio
async def test_an_agent_tool_is_a_child_run_and_its_stop_is_the_tools_output(
    stack: Stack,
) -> None:
    guard, lead_model, log = await lead_run(stack)
    read = lead_read(lead_model)
    assert read[f"{DELEGATE}_0"] == FOUND
    assert read[f"{DELEGATE}_1"].startswith("fusebox stopped the sub-agent researcher")
    assert "consecutive_blocks" in read[f"{DELEGATE}_1"]
    assert log.count("search") == 1 + RUNAWAY_SEARCHES
    nodes = await tree(stack, guard.run.id)
    first, second = children(nodes, guard.run.id)
    assert first.agent == second.agent == "researcher"
    assert first.executed == ["search"] and first.stop_reason == "completed"
    assert second.stop_reason == "consecutive_blocks"
    assert len(second.executed) == RUNAWAY_SEARCHES
    assert nodes[guard.run.id].executed == [DELEGATE, DELEGATE]
    # The researchers' model turns are their own runs' (the agent hooks report them).
    status = await asyncio.to_thread(run_status, stack, first.run)
    assert status["counters"]["model_turns"] == 2
    await asyncio.to_thread(assert_closed, stack, guard.run.id, "completed")


@pytest.mark.asyncio
async def test_an_agent_tool_past_the_caps_does_not_run_and_the_lead_reads_why(
    stack: Stack,
) -> None:
    _, lead_model, log = await lead_run(stack, policy={"max_children": 1})
    refused = lead_read(lead_model)[f"{DELEGATE}_1"]
    assert "spawn_limit" in refused, refused
    assert log.count("search") == 1  # the second researcher never ran


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("worker_does", "searches", "worker_ends", "root_status"),
    [
        ("one_search", 1, "completed", "completed"),
        (
            "runaway",
            RUNAWAY_EXECUTIONS,
            "consecutive_blocks",
            "failed: SubAgentStopped: sub-agent worker was stopped",
        ),
    ],
    ids=["answers", "runs_away"],
)
async def test_a_handoff_is_a_child_run(
    stack: Stack, worker_does: str, searches: int, worker_ends: str, root_status: str
) -> None:
    """A handoff gives the conversation to the other agent for good: its calls are a
    child run's, and its stop ends `Runner.run` (there is nobody to hand a result to),
    the run above closed as failed, saying which sub-agent was stopped."""
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    run = await fb.start_run(fresh_run("oai-handoff"), agent="triage")
    guard, log = OpenAIAgentsGuard(run), ToolLog()
    worker = make_agent(scripted(worker_does), log)
    worker.name = "worker"
    triage_model = playing(lambda items: [("transfer_to_worker", {})] if _turn(items) == 0 else "?")
    triage = guard.protect(Agent(name="triage", model=triage_model, handoffs=[worker]))
    try:
        result = await guard.run_agent(triage, "go", max_turns=100)
        assert result.final_output == "done"
    except RunStopped as stopped:
        assert stopped.report is not None and stopped.report.reason == worker_ends
    assert log.count("search") == searches
    nodes = await tree(stack, run.id)
    (child,) = children(nodes, run.id)
    assert child.agent == "worker" and child.stop_reason == worker_ends
    assert nodes[run.id].calls == []  # the handoff itself is no tool call
    await asyncio.to_thread(assert_closed, stack, run.id, root_status)
    await fb.close()


# --- reservations: a model call is asked before the model runs ----------------------------

RESEARCH_TOKENS = 300  # each researcher's response: 250 in, 50 out


def searching(items: list[dict[str, Any]]) -> list[Call] | str:
    """A researcher that searches on, one new query a turn, until its fourth turn."""
    topic = str(items[0].get("content"))
    turn = _turn(items)
    return [("search", {"query": f"{topic} {turn}"})] if turn < 4 else f"found {topic}"


@pytest.mark.asyncio
async def test_a_model_call_past_the_roots_token_budget_never_reaches_the_model(
    stack: Stack,
) -> None:
    """Two researchers of one lead, run at once, under the lead's 1000 tokens. Each
    first call reserves nothing (no turn yet to take a mean from): 600 spent. From then
    on each call reserves its run's mean, 300: one more fits (900), and every call after
    it is refused before the model is called, in whatever order the two ask. Without
    the reservation both second calls would run (1200) and the budget be seen crossed
    only after."""
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    run = await fb.start_run(fresh_run("oai-reserve"), agent="lead", policy={"max_tokens": 1000})
    guard, log = OpenAIAgentsGuard(run), ToolLog()
    researcher_model = playing(searching)
    researcher_model.set_default_usage(AgentsUsage(requests=1, input_tokens=250, output_tokens=50))
    researcher = make_agent(researcher_model, log)
    lead_model = ScriptedModel(
        [
            # Two calls of the agent tool in one response: the SDK runs them at once.
            ModelStep.respond(
                lambda call: [
                    function_call("research", {"input": topic}, call_id=f"research_{topic}")
                    for topic in ("alpha", "beta")
                ]
            ),
            ModelStep.respond(lambda call: [assistant_message("done")]),
        ]
    )
    research = researcher.as_tool(tool_name="research", tool_description="Research a topic.")
    lead = guard.protect(Agent(name="lead", model=lead_model, tools=[research]))
    result = await guard.run_agent(lead, "weather report", max_turns=20)
    assert result.final_output == "done"
    assert len(researcher_model.calls) == 3, [c.input for c in researcher_model.calls]
    nodes = await tree(stack, run.id)
    first, second = children(nodes, run.id)
    assert {first.stop_reason, second.stop_reason} == {"tree_budget"}
    status = await asyncio.to_thread(run_status, stack, run.id)
    assert status["tree"]["below"]["tokens"] == 3 * RESEARCH_TOKENS
    # What the lead's model read: each researcher was stopped for the tree's budget.
    read = " ".join(lead_read(lead_model).values())
    assert read.count("no room for this model call") == 2, read
    await fb.close()
