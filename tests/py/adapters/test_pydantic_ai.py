"""The Pydantic AI capability, with the real package (pydantic-ai-slim 2.66), its own
scripted model (`FunctionModel`: no LLM, no network), a real nats-server and fuseboxd;
every scenario sync (SyncFusebox, `run_sync`) and async (Fusebox, `await run`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from fusebox_guard import Fusebox, GateOnError, RunStopped, SyncFusebox
from fusebox_guard.adapters.pydantic_ai import FuseboxCapability
from fusebox_guard.types import to_text
from pydantic import BaseModel
from pydantic_ai import Agent, ModelMessage, ModelResponse, TextPart, Tool, ToolCallPart
from pydantic_ai.messages import (
    BinaryContent,
    ModelRequest,
    ToolReturn,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage, UsageLimits
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
from support.scenarios import next_calls, op_key_for
from support.shapes import CELLS, DECISIONS, SHAPES, Read, assert_cell, call_of, shaped
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

MODES = ["sync", "async"]

#: What the scripted model reports per response: 150 input tokens (100 of them cache
#: reads) and 25 output, 175 in the contract's sum.
USAGE = RequestUsage(input_tokens=150, output_tokens=25, cache_read_tokens=100)


class Forecast(BaseModel):
    city: str
    sky: str


#: What only Pydantic AI's tools return (the table's own rows beside `SHAPES`): its
#: `ToolReturn`, multimodal content, a Pydantic model.
RICH: dict[str, Callable[[], Any]] = {
    "tool_return": lambda: ToolReturn(
        return_value={"hits": ["jma.go.jp"]}, content="see jma.go.jp"
    ),
    "image": lambda: BinaryContent(data=b"\x89PNG\r\n\x1a\n", media_type="image/png"),
    "model": lambda: Forecast(city="Tokyo", sky="sunny"),
}


@dataclass
class Script:
    """The shared scenario as a `FunctionModel`: turn N = the responses so far."""

    scenario: str
    seen: list[list[ModelMessage]] = field(default_factory=list)

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.seen.append(list(messages))
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        calls = next_calls(self.scenario, turn)
        if calls is None:
            return ModelResponse(parts=[TextPart("done")], usage=USAGE)
        parts = [
            ToolCallPart(name, args, tool_call_id=f"call_{turn}_{k}")
            for k, (name, args) in enumerate(calls)
        ]
        return ModelResponse(parts=list(parts), usage=USAGE)

    def returns(self) -> dict[str, ToolReturnPart]:
        """What the model read last, per call id."""
        last = self.seen[-1] if self.seen else []
        return {
            part.tool_call_id: part
            for m in last
            if isinstance(m, ModelRequest)
            for part in m.parts
            if isinstance(part, ToolReturnPart)
        }


def make_tools(
    log: ToolLog,
    on_tool: Callable[[int], None] | None = None,
    search_shape: str | None = None,
) -> list[Tool[Any]]:
    """The scenario tools; `search_shape`: `search` returns that shape of `SHAPES`."""

    def ran(name: str, arg: Any) -> None:
        log.calls.append((name, arg))
        if on_tool is not None:
            on_tool(len(log.calls))

    def search(query: str) -> Any:
        """Search the web."""
        ran("search", query)
        if search_shape in RICH:
            return RICH[search_shape]()
        return search_output(query) if search_shape is None else shaped(search_shape)

    def open_page(url: str) -> dict[str, Any]:
        """Open a page."""
        ran("open_page", url)
        return open_page_output(url)

    def list_issues(page: int) -> dict[str, Any]:
        """List one page of issues."""
        ran("list_issues", page)
        return list_issues_output(page)

    def send_email(to: str, incident: str) -> dict[str, Any]:
        """Notify someone about an incident."""
        ran("send_email", to)
        return send_email_output(to)

    return [Tool(f, takes_ctx=False) for f in (search, open_page, list_issues, send_email)]


@dataclass
class Outcome:
    run_id: str
    script: Script
    output: str | None = None
    stopped: RunStopped | None = None
    error: Exception | None = None


def drive(
    url: str,
    scenario: str,
    mode: str,
    log: ToolLog,
    *,
    run_id: str | None = None,
    ledger_of: str | None = None,
    policy: dict[str, Any] | None = None,
    on_tool: Callable[[str], Callable[[int], None]] | None = None,
    usage_limits: UsageLimits | None = None,
    search_shape: str | None = None,
    **connect: Any,
) -> Outcome:
    """Runs the scenario's agent behind a run; what it answered, or how it ended.
    `ledger_of`: the run whose op_keys its side effects use (default: its own)."""
    run_id = run_id or fresh_run(f"pai-{mode}-{scenario}")
    script = Script(scenario)
    outcome = Outcome(run_id, script)
    tools = make_tools(log, on_tool(run_id) if on_tool else None, search_shape)

    def agent(guard: FuseboxCapability) -> Agent[None, str]:
        return Agent(FunctionModel(script.respond), tools=tools, capabilities=[guard])

    def ended(err: Exception) -> None:
        if isinstance(err, RunStopped):
            outcome.stopped = err
        else:
            outcome.error = err

    if mode == "sync":
        with SyncFusebox.connect(url, tenant=TENANT, **connect) as fb:
            guard = FuseboxCapability(
                fb.start_run(run_id, policy=policy), op_key=op_key_for(ledger_of or run_id)
            )
            try:
                outcome.output = guard.run_agent_sync(
                    agent(guard), "go", usage_limits=usage_limits
                ).output
            except Exception as err:
                ended(err)
        return outcome

    async def main() -> None:
        async with await Fusebox.connect(url, tenant=TENANT, **connect) as afb:
            run = await afb.start_run(run_id, policy=policy)
            guard = FuseboxCapability(run, op_key=op_key_for(ledger_of or run_id))
            try:
                result = await guard.run_agent(agent(guard), "go", usage_limits=usage_limits)
                outcome.output = result.output
            except Exception as err:
                ended(err)
            await run.close()

    asyncio.run(main())
    return outcome


def assert_history_valid(messages: list[ModelMessage]) -> None:
    """Every tool call id of the history is answered (a dangling one makes the provider
    refuse the history when it is sent again)."""
    asked = {c.tool_call_id for m in messages if isinstance(m, ModelResponse) for c in m.tool_calls}
    answered = {
        p.tool_call_id
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    }
    assert asked <= answered, f"unanswered call ids: {asked - answered}"


def contents(outcome: Outcome) -> list[str]:
    """Every tool result the model read, in order."""
    return [str(part.content) for part in outcome.script.returns().values()]


@pytest.mark.parametrize("mode", MODES)
def test_runaway_is_stopped_after_the_same_executions_as_the_rust_demo(
    stack: Stack, mode: str
) -> None:
    log = ToolLog()
    outcome = drive(stack.nats_url, "runaway", mode, log)
    assert log.count("search") == RUNAWAY_EXECUTIONS
    assert outcome.stopped is not None, outcome
    report = outcome.stopped.report
    assert report is not None and report.state_name == "STOPPED_LOOP_GUARD"
    # The history up to the stop is kept: the warning with the last executed result,
    # then the blocks' messages, as failed results. Not retries: a tool has 1 retry by
    # default, so two blocks in a row would have ended the run with an error.
    history = outcome.stopped.history
    returns = [
        part
        for m in history
        if isinstance(m, ModelRequest)
        for part in m.parts
        if isinstance(part, ToolReturnPart)
    ]
    assert "[fusebox warning]" in str(returns[RUNAWAY_EXECUTIONS - 1].content)
    blocked = returns[RUNAWAY_EXECUTIONS]
    assert str(blocked.content).startswith("fusebox blocked search"), blocked
    assert blocked.outcome == "failed", blocked
    assert "fusebox stopped this run" in str(returns[-1].content)
    assert_history_valid(history)


#: One runaway per (mode, shape), read by that shape's three cells of the table.
_runaways: dict[tuple[str, str], tuple[Outcome, Read, list[ToolReturnPart]]] = {}


def shaped_runaway(
    stack: Stack, mode: str, shape: str
) -> tuple[Outcome, Read, list[ToolReturnPart]]:
    """The runaway with `search` returning `shape`: what was read per call (its result,
    then what was sent beside it as user content), and each call's result part."""
    if (mode, shape) not in _runaways:
        log = ToolLog()
        outcome = drive(stack.nats_url, "runaway", mode, log, search_shape=shape)
        stopped = outcome.stopped
        texts, results = [], []
        for m in stopped.history if stopped is not None else []:
            if not isinstance(m, ModelRequest):
                continue
            beside = [
                p.content if isinstance(p.content, str) else "\n".join(map(str, p.content))
                for p in m.parts
                if isinstance(p, UserPromptPart)
            ]
            for part in m.parts:
                if isinstance(part, ToolReturnPart):
                    results.append(part)
                    texts.append("\n".join([str(part.content), *beside]))
        state = stopped.report.state_name if stopped and stopped.report else None
        read = Read(texts, log.count("search"), state)
        _runaways[(mode, shape)] = (outcome, read, results)
    return _runaways[(mode, shape)]


@pytest.mark.parametrize(("shape", "decision"), CELLS)
@pytest.mark.parametrize("mode", MODES)
def test_every_result_shape_through_a_warn_a_block_and_a_stop(
    stack: Stack, mode: str, shape: str, decision: str
) -> None:
    """Issue 49 §1 across result shapes: a warned result is what the model reads as text
    (the tool's value, as Pydantic AI serialises it, then the warning), whatever the
    tool returned; a block and a stop are the guard's words."""
    outcome, read, _ = shaped_runaway(stack, mode, shape)
    assert outcome.error is None, outcome.error
    assert_cell(stack, outcome.run_id, shape, decision, read)
    if decision == "warn":
        value, _, warning = call_of("warn", read).partition("\n\n[fusebox warning] ")
        assert value == to_text(SHAPES[shape]) and warning, read


@pytest.mark.parametrize(("shape", "decision"), [(s, d) for s in RICH for d in DECISIONS])
@pytest.mark.parametrize("mode", MODES)
def test_pydantic_ais_own_results_keep_their_form_through_a_warn_a_block_and_a_stop(
    stack: Stack, mode: str, shape: str, decision: str
) -> None:
    """The table's rows only Pydantic AI has: a `ToolReturn`, an image, a model. As text
    they would be their repr (the image lost); warned, the result the model reads is
    the same as when not warned, and the warning comes beside it as user content."""
    outcome, read, results = shaped_runaway(stack, mode, shape)
    assert outcome.error is None, outcome.error
    assert_cell(stack, outcome.run_id, shape, decision, read)
    if decision == "warn":
        first, warned = results[0], results[RUNAWAY_EXECUTIONS - 1]
        assert warned.content == first.content, warned
        assert "[fusebox warning] " in call_of("warn", read), read
        if shape == "tool_return":  # its own content first, then the warning
            assert "see jma.go.jp\n[fusebox warning] " in call_of("warn", read), read


@pytest.mark.parametrize("mode", MODES)
def test_ping_pong_is_stopped(stack: Stack, mode: str) -> None:
    log = ToolLog()
    outcome = drive(stack.nats_url, "ping_pong", mode, log)
    assert outcome.stopped is not None, outcome
    assert outcome.stopped.report is not None
    assert "ping_pong" in " ".join(outcome.stopped.report.fired_guards)
    assert len(log.calls) < 12


@pytest.mark.parametrize("mode", MODES)
def test_pagination_of_twelve_pages_finishes_untouched_and_closes_its_run(
    stack: Stack, mode: str
) -> None:
    log = ToolLog()
    outcome = drive(stack.nats_url, "pagination", mode, log)
    assert outcome.output == "done", outcome
    assert [a for t, a in log.calls if t == "list_issues"] == list(range(1, PAGES + 1))
    assert all("fusebox" not in text for text in contents(outcome))
    # Each response's usage reached the daemon as a model_turn.
    counters = run_status(stack, outcome.run_id)["counters"]
    assert counters["model_turns"] == PAGES + 1
    assert counters["tokens"] == (PAGES + 1) * 175
    assert counters["steps"] == PAGES and counters["calls_refused"] == 0
    assert_closed(stack, outcome.run_id, "completed")


@pytest.mark.parametrize("mode", MODES)
def test_an_agent_that_fails_closes_its_run_as_failed(stack: Stack, mode: str) -> None:
    from pydantic_ai.exceptions import UsageLimitExceeded

    outcome = drive(
        stack.nats_url, "pagination", mode, ToolLog(), usage_limits=UsageLimits(request_limit=2)
    )
    assert isinstance(outcome.error, UsageLimitExceeded), outcome
    assert_closed(stack, outcome.run_id, "failed: UsageLimitExceeded")


@pytest.mark.parametrize("mode", MODES)
def test_side_effect_with_one_op_key_runs_once_across_a_retry_and_two_runs(
    stack: Stack, mode: str
) -> None:
    log = ToolLog()
    run_id = fresh_run(f"pai-{mode}-email")
    first = drive(stack.nats_url, "retry_side_effect", mode, log, run_id=run_id)
    # The same op_keys from a second run (a restarted worker): the ledger outlives runs.
    second = drive(
        stack.nats_url, "retry_side_effect", mode, log, run_id=f"{run_id}-again", ledger_of=run_id
    )
    assert first.output == second.output == "done"
    assert log.count("send_email") == 1
    # The retry was answered with the stored result, under its own call id, as a success.
    for answers in (first.script.returns(), second.script.returns()):
        retry = answers["call_1_0"]
        assert retry.outcome == "success", retry
        assert retry.content == send_email_output("oncall@example.com")


@pytest.mark.parametrize("mode", MODES)
def test_fusebox_cancel_from_another_process_ends_the_run_at_its_next_step(
    stack: Stack, mode: str
) -> None:
    def cancel_on_third(run_id: str) -> Callable[[int], None]:
        def on_tool(executions: int) -> None:
            if executions == 3:
                fusebox_cancel(stack, run_id)

        return on_tool

    log = ToolLog()
    outcome = drive(stack.nats_url, "pagination", mode, log, on_tool=cancel_on_third)
    assert log.count("list_issues") == 3
    assert outcome.stopped is not None, outcome
    report = outcome.stopped.report
    assert report is not None and report.state_name == "CANCELLED"


@pytest.mark.parametrize("policy", [GateOnError.DENY, GateOnError.ALLOW])
@pytest.mark.parametrize("mode", MODES)
def test_daemon_down(mode: str, policy: GateOnError) -> None:
    log = ToolLog()
    with bare_nats() as url:
        outcome = drive(url, "one_search", mode, log, gate_on_error=policy, timeout_s=0.5)
    assert outcome.output == "done", outcome
    answer = outcome.script.returns()["call_0_0"]
    if policy is GateOnError.DENY:
        assert log.count("search") == 0
        assert "no fuseboxd is listening" in str(answer.content)
        assert answer.outcome == "failed"
    else:
        assert log.count("search") == 1
        assert answer.outcome == "success"


@pytest.mark.parametrize("mode", MODES)
def test_parallel_calls_are_each_gated_and_siblings_refused_after_a_stop(
    stack: Stack, mode: str
) -> None:
    log = ToolLog()
    outcome = drive(stack.nats_url, "parallel_runaway", mode, log)
    assert outcome.stopped is not None, outcome
    assert log.count("search") == RUNAWAY_EXECUTIONS
    refused = [
        part
        for m in outcome.stopped.history
        if isinstance(m, ModelRequest)
        for part in m.parts
        if isinstance(part, ToolReturnPart) and part.outcome != "success"
    ]
    assert refused and all("fusebox" in str(p.content) for p in refused), refused
    assert_history_valid(outcome.stopped.history)


@pytest.mark.parametrize("mode", MODES)
def test_usage_reaches_the_token_budget(stack: Stack, mode: str) -> None:
    # 175 tokens a response: the third crosses 500, and its calls do not run.
    log = ToolLog()
    outcome = drive(stack.nats_url, "pagination", mode, log, policy={"max_tokens": 500})
    assert outcome.stopped is not None, outcome
    assert outcome.stopped.report is not None
    assert outcome.stopped.report.reason == "token_budget"
    assert log.count("list_issues") == 2


# --- sub-agents: an agent called from a tool is a child run ------------------------------


@dataclass
class Delegation:
    """The lead and its researcher, each a `FunctionModel` script."""

    log: ToolLog = field(default_factory=ToolLog)
    lead_seen: list[list[ModelMessage]] = field(default_factory=list)

    def lead(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.lead_seen.append(list(messages))
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        calls = lead_calls(turn)
        if calls is None:
            return ModelResponse(parts=[TextPart("done")], usage=USAGE)
        return ModelResponse(
            parts=[ToolCallPart(n, a, tool_call_id=f"lead_{turn}") for n, a in calls],
            usage=USAGE,
        )

    def researcher(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        topic = topic_of(messages[0])
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        calls = researcher_calls(topic, turn)
        if calls is None:
            return ModelResponse(parts=[TextPart(researcher_answer(topic))], usage=USAGE)
        return ModelResponse(
            parts=[ToolCallPart(n, a, tool_call_id=f"{topic}_{turn}") for n, a in calls],
            usage=USAGE,
        )

    def agents(self, guard: FuseboxCapability) -> Agent[None, str]:
        """The lead, whose `research` tool runs the researcher; both carry the guard."""
        researcher = Agent(
            FunctionModel(self.researcher),
            name="researcher",
            tools=make_tools(self.log)[:1],
            capabilities=[guard],
        )

        async def research(topic: str) -> str:
            """Delegate research on a topic."""
            return (await researcher.run(topic)).output

        return Agent(
            FunctionModel(self.lead),
            name="lead",
            tools=[Tool(research, takes_ctx=False)],
            capabilities=[guard],
        )

    def lead_read(self) -> dict[str, ToolReturnPart]:
        last = self.lead_seen[-1]
        return {
            p.tool_call_id: p
            for m in last
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, ToolReturnPart)
        }


def delegate(url: str, mode: str, policy: dict[str, Any] | None = None) -> tuple[str, Delegation]:
    run_id = fresh_run(f"pai-{mode}-lead")
    script = Delegation()
    if mode == "sync":
        with SyncFusebox.connect(url, tenant=TENANT) as fb:
            guard = FuseboxCapability(fb.start_run(run_id, agent="lead", policy=policy))
            assert guard.run_agent_sync(script.agents(guard), "weather report").output == "done"
        return run_id, script

    async def main() -> None:
        async with await Fusebox.connect(url, tenant=TENANT) as afb:
            guard = FuseboxCapability(await afb.start_run(run_id, agent="lead", policy=policy))
            assert (await guard.run_agent(script.agents(guard), "weather report")).output == "done"

    asyncio.run(main())
    return run_id, script


@pytest.mark.parametrize("mode", MODES)
def test_a_delegated_agent_is_a_child_run_and_its_stop_is_the_tools_result(
    stack: Stack, mode: str
) -> None:
    run_id, script = delegate(stack.nats_url, mode)
    read = script.lead_read()
    assert read["lead_0"].content == FOUND and read["lead_0"].outcome == "success"
    stopped = read["lead_1"]
    assert stopped.outcome == "failed", stopped
    assert str(stopped.content).startswith("fusebox stopped the sub-agent researcher")
    assert "consecutive_blocks" in str(stopped.content)
    assert script.log.count("search") == 1 + RUNAWAY_SEARCHES
    nodes = asyncio.run(tree(stack, run_id))
    first, second = children(nodes, run_id)
    assert first.agent == second.agent == "researcher"
    assert first.executed == ["search"] and first.stop_reason == "completed"
    # The sub-agent's model turns are its own run's (and its tree's).
    assert run_status(stack, first.run)["counters"]["model_turns"] == 2
    assert len(second.executed) == RUNAWAY_SEARCHES
    assert second.stop_reason == "consecutive_blocks"
    assert nodes[run_id].executed == [DELEGATE, DELEGATE]
    assert_closed(stack, run_id, "completed")


@pytest.mark.parametrize("mode", MODES)
def test_a_sub_agent_past_the_caps_does_not_run_and_the_lead_reads_why(
    stack: Stack, mode: str
) -> None:
    run_id, script = delegate(stack.nats_url, mode, policy={"max_children": 1})
    refused = script.lead_read()["lead_1"]
    assert refused.outcome == "failed" and "spawn_limit" in str(refused.content)
    assert script.log.count("search") == 1  # the second researcher never ran
    assert len(children(asyncio.run(tree(stack, run_id)), run_id)) == 2


@pytest.mark.parametrize("mode", MODES)
def test_a_sub_agent_that_fails_is_closed_as_failed_not_told_as_stopped(
    stack: Stack, mode: str
) -> None:
    script = Delegation()

    def broken(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise RuntimeError("the researcher's model is gone")

    script.researcher = broken  # type: ignore[method-assign]
    run_id = fresh_run(f"pai-{mode}-broken")
    with pytest.raises(RuntimeError, match="model is gone"):
        if mode == "sync":
            with SyncFusebox.connect(stack.nats_url, tenant=TENANT) as fb:
                guard = FuseboxCapability(fb.start_run(run_id, agent="lead"))
                guard.run_agent_sync(script.agents(guard), "weather report")
        else:

            async def main() -> None:
                async with await Fusebox.connect(stack.nats_url, tenant=TENANT) as afb:
                    guard = FuseboxCapability(await afb.start_run(run_id, agent="lead"))
                    await guard.run_agent(script.agents(guard), "weather report")

            asyncio.run(main())
    (child,) = children(asyncio.run(tree(stack, run_id)), run_id)
    assert_closed(stack, child.run, "failed: RuntimeError: the researcher's model is gone")
    assert_closed(stack, run_id, "failed: RuntimeError: the researcher's model is gone")
