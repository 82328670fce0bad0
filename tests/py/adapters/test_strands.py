"""The Strands Agents hook provider, with the real package (strands-agents 1.62), a
`Model` subclass that streams the shared script (no LLM, no network), a real
nats-server and fuseboxd; every scenario through Strands' sync entry point (`agent(...)`,
its own loop thread, with SyncFusebox) and its async one (`invoke_async`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from fusebox_guard import Fusebox, GateOnError, RunStopped, SyncFusebox
from fusebox_guard.adapters.sessions import session_run
from fusebox_guard.adapters.strands import FuseboxHooks
from strands import Agent, tool
from strands.models.model import Model
from strands.types.content import Messages
from strands.types.exceptions import EventLoopException
from strands.types.streaming import ContentBlockDelta, StreamEvent
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
from support.shapes import CELLS, SHAPES, Read, assert_cell, shaped
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
#: reads, counted apart as Bedrock does) and 25 output; 175 in the contract's sum.
USAGE = {"inputTokens": 50, "outputTokens": 25, "totalTokens": 75, "cacheReadInputTokens": 100}

#: Distinct calls of the sweep: each a new page of a search, none repeated.
SWEEP = 30

Script = Callable[[Messages], "list[Call] | str"]


class ScriptedModel(Model):
    """Streams what `script` says for the conversation so far: tool calls (each with an
    id made of its turn and place), or a final text."""

    def __init__(self, script: Script, *, fail_at: int | None = None) -> None:
        self.script = script
        self.fail_at = fail_at
        self.seen: list[Messages] = []

    def update_config(self, **model_config: Any) -> None:
        # Nothing to configure: the script is the model.
        return None

    def get_config(self) -> Any:
        return {}

    def structured_output(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("the scripted model answers with tools and text only")

    async def stream(
        self, messages: Messages, *args: Any, **kwargs: Any
    ) -> AsyncGenerator[StreamEvent, None]:
        self.seen.append(list(messages))
        turn = turns(messages)
        if turn == self.fail_at:
            raise RuntimeError("the model is gone")
        answer = self.script(messages)
        yield {"messageStart": {"role": "assistant"}}
        if isinstance(answer, str):
            yield {"contentBlockDelta": {"delta": {"text": answer}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "end_turn"}}
        else:
            for k, (name, arguments) in enumerate(answer):
                use = {"toolUseId": f"call_{turn}_{k}", "name": name}
                yield {"contentBlockStart": {"start": {"toolUse": use}}}  # type: ignore[typeddict-item]
                delta: ContentBlockDelta = {"toolUse": {"input": json.dumps(arguments)}}
                yield {"contentBlockDelta": {"delta": delta}}
                yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "tool_use"}}
        yield {"metadata": {"usage": dict(USAGE), "metrics": {"latencyMs": 1}}}  # type: ignore[typeddict-item]


def turns(messages: Messages) -> int:
    return sum(1 for m in messages if m["role"] == "assistant")


def scenario_script(scenario: str) -> Script:
    def script(messages: Messages) -> list[Call] | str:
        return next_calls(scenario, turns(messages)) or "done"

    return script


def sweep_script(messages: Messages) -> list[Call] | str:
    turn = turns(messages)
    return [("search", {"query": f"weather page {turn + 1}"})] if turn < SWEEP else "done"


def make_tools(
    log: ToolLog, on_tool: Callable[[int], None] | None = None, search_shape: str | None = None
) -> list[Any]:
    """The scenario tools; `search_shape`: `search` returns that shape of `SHAPES`."""

    def ran(name: str, arg: Any) -> None:
        log.calls.append((name, arg))
        if on_tool is not None:
            on_tool(len(log.calls))

    @tool
    def search(query: str) -> Any:
        """Search the web."""
        ran("search", query)
        return search_output(query) if search_shape is None else shaped(search_shape)

    @tool
    def open_page(url: str) -> dict[str, Any]:
        """Open a page."""
        ran("open_page", url)
        return open_page_output(url)

    @tool
    def list_issues(page: int) -> dict[str, Any]:
        """List one page of issues."""
        ran("list_issues", page)
        return list_issues_output(page)

    @tool
    def send_email(to: str, incident: str) -> dict[str, Any]:
        """Notify someone about an incident."""
        ran("send_email", to)
        return send_email_output(to)

    return [search, open_page, list_issues, send_email]


@dataclass
class Outcome:
    run_id: str
    model: ScriptedModel
    messages: Messages = field(default_factory=list)
    text: str | None = None
    stop_reason: str | None = None
    stopped: RunStopped | None = None
    error: Exception | None = None

    def answers(self) -> dict[str, dict[str, Any]]:
        """Every tool result of the conversation (what the model reads), by call id."""
        return {
            block["toolResult"]["toolUseId"]: dict(block["toolResult"])
            for m in self.messages
            for block in m["content"]
            if "toolResult" in block
        }

    def read(self, call_id: str) -> str:
        """A result's blocks as the text the model reads."""
        return "\n".join(
            str(b.get("text", json.dumps(b.get("json"))))
            for b in self.answers()[call_id]["content"]
        )

    def assert_history_valid(self) -> None:
        """Every tool use of the conversation has a result for its id."""
        asked = {
            block["toolUse"]["toolUseId"]
            for m in self.messages
            for block in m["content"]
            if "toolUse" in block
        }
        assert asked <= set(self.answers()), f"unanswered: {asked - set(self.answers())}"


def drive(
    url: str,
    scenario: str | Script,
    mode: str,
    log: ToolLog,
    *,
    run_id: str | None = None,
    ledger_of: str | None = None,
    policy: dict[str, Any] | None = None,
    on_tool: Callable[[str], Callable[[int], None]] | None = None,
    fail_at: int | None = None,
    search_shape: str | None = None,
    **connect: Any,
) -> Outcome:
    """Runs the scenario's agent behind a run; how it ended. `ledger_of`: the run whose
    op_keys its side effects use (default: its own)."""
    name = scenario if isinstance(scenario, str) else "sweep"
    run_id = run_id or fresh_run(f"strands-{mode}-{name}")
    script = scenario_script(scenario) if isinstance(scenario, str) else scenario
    model = ScriptedModel(script, fail_at=fail_at)
    outcome = Outcome(run_id, model)
    tools = make_tools(log, on_tool and on_tool(run_id), search_shape)

    def agent(guard: FuseboxHooks) -> Agent:
        return Agent(model=model, tools=tools, hooks=[guard], callback_handler=None)

    def ended(the_agent: Agent, err: Exception | None) -> None:
        outcome.messages = list(the_agent.messages)
        if isinstance(err, RunStopped):
            outcome.stopped = err
        elif err is not None:
            outcome.error = err

    if mode == "sync":
        with SyncFusebox.connect(url, tenant=TENANT, **connect) as fb:
            guard = FuseboxHooks(
                fb.start_run(run_id, policy=policy), op_key=op_key_for(ledger_of or run_id)
            )
            the_agent = agent(guard)
            try:
                result = guard.invoke(the_agent, "go")
                outcome.text, outcome.stop_reason = str(result).strip(), result.stop_reason
                ended(the_agent, None)
            except Exception as err:
                ended(the_agent, err)
        return outcome

    async def main() -> None:
        async with await Fusebox.connect(url, tenant=TENANT, **connect) as afb:
            run = await afb.start_run(run_id, policy=policy)
            guard = FuseboxHooks(run, op_key=op_key_for(ledger_of or run_id))
            the_agent = agent(guard)
            try:
                result = await guard.invoke_async(the_agent, "go")
                outcome.text, outcome.stop_reason = str(result).strip(), result.stop_reason
                ended(the_agent, None)
            except Exception as err:
                ended(the_agent, err)
            await run.close()

    asyncio.run(main())
    return outcome


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
    # What the model read: the warning beside the last executed result, then the
    # blocks' messages as the refused calls' (error) results; the invocation ended with
    # the stop as its last word, and the model was not asked again.
    assert "[fusebox warning]" in outcome.read(f"call_{RUNAWAY_EXECUTIONS - 1}_0")
    blocked = outcome.answers()[f"call_{RUNAWAY_EXECUTIONS}_0"]
    assert blocked["status"] == "error"
    assert outcome.read(f"call_{RUNAWAY_EXECUTIONS}_0").startswith("fusebox blocked search")
    last = outcome.messages[-1]
    assert last["role"] == "assistant" and "fusebox stopped this run" in str(last["content"])
    assert len(outcome.model.seen) == turns(outcome.messages[:-1])
    outcome.assert_history_valid()


#: One runaway per (mode, shape), read by that shape's three cells of the table.
_runaways: dict[tuple[str, str], tuple[Outcome, Read]] = {}


def shaped_runaway(stack: Stack, mode: str, shape: str) -> tuple[Outcome, Read]:
    if (mode, shape) not in _runaways:
        log = ToolLog()
        outcome = drive(stack.nats_url, "runaway", mode, log, search_shape=shape)
        report = outcome.stopped.report if outcome.stopped is not None else None
        texts = [outcome.read(call_id) for call_id in outcome.answers()]
        state = report.state_name if report is not None else None
        _runaways[(mode, shape)] = (outcome, Read(texts, log.count("search"), state))
    return _runaways[(mode, shape)]


@pytest.mark.parametrize(("shape", "decision"), CELLS)
@pytest.mark.parametrize("mode", MODES)
def test_every_result_shape_through_a_warn_a_block_and_a_stop(
    stack: Stack, mode: str, shape: str, decision: str
) -> None:
    """Issue 49 §1: Strands hands the tool's value to the model as content blocks (a
    string as text, anything else as its JSON text). A warning is one more text block:
    the tool's own block is left exactly as Strands made it."""
    outcome, read = shaped_runaway(stack, mode, shape)
    assert outcome.error is None, outcome.error
    assert_cell(stack, outcome.run_id, shape, decision, read)
    if decision == "warn":
        content = outcome.answers()[f"call_{RUNAWAY_EXECUTIONS - 1}_0"]["content"]
        value = SHAPES[shape]
        own = value if isinstance(value, str) else json.dumps(value)
        assert content[0] == {"text": own}, content
        assert content[1]["text"].startswith("[fusebox warning]"), content
        assert len(content) == 2, content


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
    assert outcome.text == "done", outcome
    assert [a for t, a in log.calls if t == "list_issues"] == list(range(1, PAGES + 1))
    assert all("fusebox" not in json.dumps(answer) for answer in outcome.answers().values())
    counters = run_status(stack, outcome.run_id)["counters"]
    assert counters["model_turns"] == PAGES + 1
    assert counters["tokens"] == (PAGES + 1) * 175
    assert counters["steps"] == PAGES and counters["calls_refused"] == 0
    assert_closed(stack, outcome.run_id, "completed")


@pytest.mark.parametrize("mode", MODES)
def test_a_sweep_of_thirty_distinct_searches_is_untouched(stack: Stack, mode: str) -> None:
    log = ToolLog()
    outcome = drive(stack.nats_url, sweep_script, mode, log)
    assert outcome.text == "done", outcome
    assert log.count("search") == SWEEP
    assert all("fusebox" not in json.dumps(answer) for answer in outcome.answers().values())
    assert_closed(stack, outcome.run_id, "completed")


@pytest.mark.parametrize("mode", MODES)
def test_an_agent_that_fails_closes_its_run_as_failed(stack: Stack, mode: str) -> None:
    outcome = drive(stack.nats_url, "pagination", mode, ToolLog(), fail_at=2)
    # Strands wraps the model's error in its own, which is what the agent raises.
    assert isinstance(outcome.error, EventLoopException), outcome
    assert isinstance(outcome.error.__cause__, RuntimeError), outcome
    assert_closed(stack, outcome.run_id, "failed: EventLoopException: the model is gone")


@pytest.mark.parametrize("mode", MODES)
def test_side_effect_with_one_op_key_runs_once_across_a_retry_and_two_runs(
    stack: Stack, mode: str
) -> None:
    log = ToolLog()
    run_id = fresh_run(f"strands-{mode}-email")
    first = drive(stack.nats_url, "retry_side_effect", mode, log, run_id=run_id)
    # The same op_keys from a second run (a restarted worker): the ledger outlives runs.
    second = drive(
        stack.nats_url, "retry_side_effect", mode, log, run_id=f"{run_id}-again", ledger_of=run_id
    )
    assert first.text == second.text == "done"
    assert log.count("send_email") == 1
    # The retry was answered with the stored result, under its own id, as a success.
    for outcome in (first, second):
        answer = outcome.answers()["call_1_0"]
        assert answer["status"] == "success", answer
        assert answer["content"] == [{"json": send_email_output("oncall@example.com")}]


@pytest.mark.parametrize("mode", MODES)
def test_fusebox_cancel_from_another_process_ends_the_run_before_the_next_step(
    stack: Stack, mode: str
) -> None:
    """The operator's cancel reaches the run's kill switch while the third tool runs: the
    model is not asked again (`BeforeModelCallEvent` is answered with the stop), so no
    further call is made, and the invocation ends saying why."""

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
    assert len(outcome.model.seen) == 3
    last = outcome.messages[-1]
    assert last["role"] == "assistant" and "fusebox stopped this run" in str(last["content"])
    outcome.assert_history_valid()


@pytest.mark.parametrize("policy", [GateOnError.DENY, GateOnError.ALLOW])
@pytest.mark.parametrize("mode", MODES)
def test_daemon_down(mode: str, policy: GateOnError) -> None:
    log = ToolLog()
    with bare_nats() as url:
        outcome = drive(url, "one_search", mode, log, gate_on_error=policy, timeout_s=0.5)
    assert outcome.text == "done", outcome
    answer = outcome.answers()["call_0_0"]
    if policy is GateOnError.DENY:
        assert log.count("search") == 0
        assert answer["status"] == "error"
        assert "no fuseboxd is listening" in outcome.read("call_0_0")
    else:
        assert log.count("search") == 1
        assert answer["status"] == "success"
        assert json.loads(outcome.read("call_0_0")) == search_output("weather tokyo")


@pytest.mark.parametrize("mode", MODES)
def test_parallel_calls_are_each_gated_and_siblings_refused_after_a_stop(
    stack: Stack, mode: str
) -> None:
    log = ToolLog()
    outcome = drive(stack.nats_url, "parallel_runaway", mode, log)
    assert outcome.stopped is not None, outcome
    assert log.count("search") == RUNAWAY_EXECUTIONS
    refused = [a for a in outcome.answers().values() if a["status"] == "error"]
    assert refused and all("fusebox" in json.dumps(a) for a in refused), refused
    outcome.assert_history_valid()


@pytest.mark.parametrize("mode", MODES)
def test_usage_reaches_the_token_budget(stack: Stack, mode: str) -> None:
    # 175 tokens a response: the third crosses 500, and its calls do not run.
    log = ToolLog()
    outcome = drive(stack.nats_url, "pagination", mode, log, policy={"max_tokens": 500})
    assert outcome.stopped is not None, outcome
    assert outcome.stopped.report is not None
    assert outcome.stopped.report.reason == "token_budget"
    assert log.count("list_issues") == 2


# --- the session id as the run id --------------------------------------------------------


def test_a_session_resumed_goes_on_in_the_next_run_and_a_stopped_one_stays_stopped(
    stack: Stack,
) -> None:
    """The agent's session id is the run id; a second process resuming the session (a
    run id the daemon already has) goes on in `<session>-2`, unless the session's run
    was stopped: then its kept stop refuses the resumed session's calls, and its model
    is not asked."""
    session = fresh_run("strands-session")
    log = ToolLog()

    def invoke(scenario: str) -> tuple[str, Outcome]:
        model = ScriptedModel(scenario_script(scenario))
        outcome = Outcome(session, model)

        async def main() -> str:
            async with await Fusebox.connect(stack.nats_url, tenant=TENANT) as fb:
                run = await session_run(fb, session)
                guard = FuseboxHooks(run)
                agent = Agent(model=model, tools=make_tools(log), hooks=[guard])
                try:
                    result = await guard.invoke_async(agent, "go")
                    outcome.text = str(result).strip()
                except RunStopped as stop:
                    outcome.stopped = stop
                outcome.messages = list(agent.messages)
                await run.close()
                return run.id

        return asyncio.run(main()), outcome

    first_id, first = invoke("one_search")
    assert first_id == session and first.text == "done"
    assert_closed(stack, session, "completed")
    second_id, second = invoke("runaway")  # a new process: the next run of the session
    assert second_id == f"{session}-2" and second.stopped is not None
    executed = log.count("search")
    third_id, third = invoke("one_search")  # resumed after the stop: still stopped
    assert third_id == f"{session}-2"
    assert third.stopped is not None and log.count("search") == executed
    assert third.model.seen == []  # refused before the model was asked
    assert "fusebox stopped this run" in str(third.messages[-1]["content"])


# --- sub-agents: an agent invoked from a tool is a child run -----------------------------


def lead_script(messages: Messages) -> list[Call] | str:
    return lead_calls(turns(messages)) or "done"


def researcher_script(messages: Messages) -> list[Call] | str:
    topic = topic_of(messages[0]["content"])
    return researcher_calls(topic, turns(messages)) or researcher_answer(topic)


def delegate(
    url: str, mode: str, policy: dict[str, Any] | None = None
) -> tuple[str, Outcome, ToolLog]:
    """The lead, whose `research` tool invokes a fresh researcher agent (the same hook
    provider) for each topic."""
    run_id = fresh_run(f"strands-{mode}-lead")
    log = ToolLog()
    outcome = Outcome(run_id, ScriptedModel(lead_script))

    def agents(guard: FuseboxHooks) -> Agent:
        searches = make_tools(log)[:1]

        if mode == "sync":

            @tool
            def research(topic: str) -> str:
                """Delegate research on a topic."""
                researcher = Agent(
                    name="researcher",
                    model=ScriptedModel(researcher_script),
                    tools=searches,
                    hooks=[guard],
                    callback_handler=None,
                )
                return str(researcher(topic)).strip()

            tools: list[Any] = [research]
        else:

            @tool
            async def research(topic: str) -> str:
                """Delegate research on a topic."""
                researcher = Agent(
                    name="researcher",
                    model=ScriptedModel(researcher_script),
                    tools=searches,
                    hooks=[guard],
                    callback_handler=None,
                )
                return str(await researcher.invoke_async(topic)).strip()

            tools = [research]
        return Agent(
            name="lead", model=outcome.model, tools=tools, hooks=[guard], callback_handler=None
        )

    if mode == "sync":
        with SyncFusebox.connect(url, tenant=TENANT) as fb:
            guard = FuseboxHooks(fb.start_run(run_id, agent="lead", policy=policy))
            lead = agents(guard)
            outcome.text = str(guard.invoke(lead, "weather report")).strip()
            outcome.messages = list(lead.messages)
        return run_id, outcome, log

    async def main() -> None:
        async with await Fusebox.connect(url, tenant=TENANT) as afb:
            guard = FuseboxHooks(await afb.start_run(run_id, agent="lead", policy=policy))
            lead = agents(guard)
            outcome.text = str(await guard.invoke_async(lead, "weather report")).strip()
            outcome.messages = list(lead.messages)

    asyncio.run(main())
    return run_id, outcome, log


@pytest.mark.parametrize("mode", MODES)
def test_an_agent_invoked_by_a_tool_is_a_child_run_and_its_stop_is_the_tools_result(
    stack: Stack, mode: str
) -> None:
    run_id, outcome, log = delegate(stack.nats_url, mode)
    assert outcome.text == "done", outcome
    first = outcome.answers()["call_0_0"]
    assert first["status"] == "success" and outcome.read("call_0_0") == FOUND, first
    stopped = outcome.answers()["call_1_0"]
    assert stopped["status"] == "error", stopped
    text = outcome.read("call_1_0")
    assert text.startswith("fusebox stopped the sub-agent researcher"), text
    assert "consecutive_blocks" in text
    assert log.count("search") == 1 + RUNAWAY_SEARCHES
    nodes = asyncio.run(tree(stack, run_id))
    first_child, second_child = children(nodes, run_id)
    assert first_child.agent == second_child.agent == "researcher"
    assert first_child.executed == ["search"] and first_child.stop_reason == "completed"
    assert len(second_child.executed) == RUNAWAY_SEARCHES
    assert second_child.stop_reason == "consecutive_blocks"
    assert nodes[run_id].executed == [DELEGATE, DELEGATE]
    assert_closed(stack, run_id, "completed")


@pytest.mark.parametrize("mode", MODES)
def test_a_sub_agent_past_the_caps_does_not_run_and_the_lead_reads_why(
    stack: Stack, mode: str
) -> None:
    _, outcome, log = delegate(stack.nats_url, mode, policy={"max_children": 1})
    assert outcome.text == "done", outcome
    assert "spawn_limit" in outcome.read("call_1_0")
    assert log.count("search") == 1  # the second researcher never ran
