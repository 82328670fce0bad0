"""The CrewAI guard, with the real package (crewai 1.6.1), a `BaseLLM` subclass that
answers the shared script in CrewAI's own ReAct text (no LLM, no network), a real
nats-server and fuseboxd; every scenario through `kickoff` (sync, SyncFusebox) and
`kickoff_async` (Fusebox)."""

from __future__ import annotations

import os

# CrewAI's telemetry and tracing would reach for the network (and ask on a terminal).
# Its own switch only: OTEL_SDK_DISABLED would switch OpenTelemetry off for every later
# suite of the session (the OTLP receiver's exporters among them).
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from crewai import Agent, Crew, Task
from crewai.llms.base_llm import BaseLLM
from crewai.tools import BaseTool, tool
from fusebox_guard import Fusebox, GateOnError, RunStopped, SyncFusebox
from fusebox_guard.adapters.crewai import FuseboxCrew
from fusebox_guard.adapters.sessions import session_run
from support.guard import (
    PAGES,
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
from support.shapes import CELLS, SHAPES, shaped
from support.stack import Stack
from support.sub_agents import (
    FOUND,
    lead_calls,
    researcher_answer,
    researcher_calls,
    topic_of,
)
from support.trees import children, tree

MODES = ["sync", "async"]

#: Distinct calls of the sweep: each a new page of a search, none repeated.
SWEEP = 30
#: CrewAI's own cap on an agent's turns for one task (its default, 25), after which it
#: forces a final answer: the guard must stop a loop before it.
MAX_ITER = 25

Script = Callable[[int], "list[Call] | None"]


class ScriptedLLM(BaseLLM):
    """Answers the script for its turn (the assistant messages so far) in the ReAct text
    CrewAI 1.6.1's agents parse: one `Action` per turn, or a `Final Answer`."""

    def __init__(self, script: Script, *, fail_at: int | None = None) -> None:
        super().__init__(model="scripted")
        self.script = script
        self.fail_at = fail_at
        self.seen: list[list[dict[str, Any]]] = []

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        self.seen.append([dict(m) for m in messages])
        turn = sum(1 for m in messages if m["role"] == "assistant")
        if turn == self.fail_at:
            raise RuntimeError("the model is gone")
        calls = self.script(turn)
        return final_answer("done") if calls is None else action(calls[0])

    def supports_function_calling(self) -> bool:
        return False

    def supports_stop_words(self) -> bool:
        return True

    def get_context_window_size(self) -> int:
        return 8192

    def observations(self) -> list[str]:
        """What the model read after each of its actions, in order."""
        last = self.seen[-1] if self.seen else []
        return [
            str(m["content"]).split("\nObservation: ", 1)[1]
            for m in last
            if m["role"] == "assistant" and "\nObservation: " in str(m["content"])
        ]


def action(call: Call) -> str:
    name, arguments = call
    return f"Thought: next step\nAction: {name}\nAction Input: {json.dumps(arguments)}"


def final_answer(text: str) -> str:
    return f"Thought: I now know the final answer\nFinal Answer: {text}"


def scenario(name: str) -> Script:
    return lambda turn: next_calls(name, turn)


def sweep(turn: int) -> list[Call] | None:
    return [("search", {"query": f"weather page {turn + 1}"})] if turn < SWEEP else None


def make_tools(
    log: ToolLog, on_tool: Callable[[int], None] | None = None, search_shape: str | None = None
) -> list[BaseTool]:
    """The scenario tools; `search_shape`: `search` returns that shape of `SHAPES`."""

    def ran(name: str, arg: Any) -> None:
        log.calls.append((name, arg))
        if on_tool is not None:
            on_tool(len(log.calls))

    @tool("search")
    def search(query: str) -> Any:
        """Search the web."""
        ran("search", query)
        return search_output(query) if search_shape is None else shaped(search_shape)

    @tool("open_page")
    def open_page(url: str) -> dict[str, Any]:
        """Open a page."""
        ran("open_page", url)
        return open_page_output(url)

    @tool("list_issues")
    def list_issues(page: int) -> dict[str, Any]:
        """List one page of issues."""
        ran("list_issues", page)
        return list_issues_output(page)

    @tool("send_email")
    def send_email(to: str, incident: str) -> dict[str, Any]:
        """Notify someone about an incident."""
        ran("send_email", to)
        return send_email_output(to)

    return [search, open_page, list_issues, send_email]


def crew_of(llm: ScriptedLLM, tools: list[BaseTool], max_iter: int = MAX_ITER) -> Crew:
    # CrewAI's own tool cache would answer a repeated call without running the tool:
    # off, so what the tools count is what the guard let run.
    agent = Agent(
        role="researcher",
        goal="answer",
        backstory="a researcher",
        llm=llm,
        tools=tools,
        cache=False,
        max_iter=max_iter,
    )
    task = Task(description="go", expected_output="an answer", agent=agent)
    return Crew(agents=[agent], tasks=[task], cache=False)


@dataclass
class Outcome:
    run_id: str
    llm: ScriptedLLM
    output: str | None = None
    stopped: RunStopped | None = None
    error: Exception | None = None
    log: ToolLog = field(default_factory=ToolLog)


def drive(
    url: str,
    script: Script,
    mode: str,
    *,
    name: str = "crew",
    run_id: str | None = None,
    ledger_of: str | None = None,
    policy: dict[str, Any] | None = None,
    on_tool: Callable[[str], Callable[[int], None]] | None = None,
    fail_at: int | None = None,
    search_shape: str | None = None,
    log: ToolLog | None = None,
    max_iter: int = MAX_ITER,
    **connect: Any,
) -> Outcome:
    """Kicks off a one-agent crew behind a run; how it ended. `ledger_of`: the run whose
    op_keys its side effects use (default: its own)."""
    run_id = run_id or fresh_run(f"crewai-{mode}-{name}")
    outcome = Outcome(run_id, ScriptedLLM(script, fail_at=fail_at), log=log or ToolLog())
    tools = make_tools(outcome.log, on_tool and on_tool(run_id), search_shape)
    crew = crew_of(outcome.llm, tools, max_iter)

    def ended(err: Exception) -> None:
        if isinstance(err, RunStopped):
            outcome.stopped = err
        else:
            outcome.error = err

    if mode == "sync":
        with SyncFusebox.connect(url, tenant=TENANT, **connect) as fb:
            guard = FuseboxCrew(
                fb.start_run(run_id, policy=policy), op_key=op_key_for(ledger_of or run_id)
            )
            try:
                outcome.output = guard.kickoff(crew).raw
            except Exception as err:
                ended(err)
        return outcome

    async def main() -> None:
        async with await Fusebox.connect(url, tenant=TENANT, **connect) as afb:
            run = await afb.start_run(run_id, policy=policy)
            guard = FuseboxCrew(run, op_key=op_key_for(ledger_of or run_id))
            try:
                outcome.output = (await guard.kickoff_async(crew)).raw
            except Exception as err:
                ended(err)
            await run.close()

    asyncio.run(main())
    return outcome


def sent_text(value: Any) -> str:
    """What CrewAI 1.6.1 hands the model for a tool's return value: its `str`."""
    return str(value)


@pytest.mark.parametrize("mode", MODES)
def test_runaway_is_stopped_by_the_guard_before_crewais_own_cap(stack: Stack, mode: str) -> None:
    """CrewAI 1.6.1 refuses an identical consecutive call itself ("I tried reusing the
    same input"), so the tool runs once; but it keeps asking the model, up to its
    `max_iter`. The guard counts every call the model makes (the hook runs before
    CrewAI's check), warns, blocks in its own words and stops the crew."""
    outcome = drive(stack.nats_url, scenario("runaway"), mode, name="runaway")
    assert outcome.log.count("search") == 1
    assert outcome.stopped is not None, outcome
    assert type(outcome.stopped) is RunStopped  # not the TimeoutError used inside CrewAI
    report = outcome.stopped.report
    assert report is not None and report.state_name == "STOPPED_LOOP_GUARD"
    read = outcome.llm.observations()
    assert read[0] == sent_text(search_output("weather tokyo"))
    assert any("[fusebox warning]" in text for text in read), read
    assert [text.startswith("fusebox blocked search") for text in read[-2:]] == [True, True]
    # The stopped call ended the crew: the model was not asked again.
    counters = run_status(stack, outcome.run_id)["counters"]
    assert len(outcome.llm.seen) == len(read) + 1 == counters["model_turns"] < MAX_ITER
    assert counters["calls_refused"] == 3


#: One runaway per (mode, shape), read by that shape's three cells of the table.
_runaways: dict[tuple[str, str], Outcome] = {}


def shaped_runaway(stack: Stack, mode: str, shape: str) -> Outcome:
    if (mode, shape) not in _runaways:
        _runaways[(mode, shape)] = drive(
            stack.nats_url, scenario("runaway"), mode, name=f"shape-{shape}", search_shape=shape
        )
    return _runaways[(mode, shape)]


@pytest.mark.parametrize(("shape", "decision"), CELLS)
@pytest.mark.parametrize("mode", MODES)
def test_every_result_shape_through_a_warn_a_block_and_a_stop(
    stack: Stack, mode: str, shape: str, decision: str
) -> None:
    """Issue 49 §1 in CrewAI's form: CrewAI turns every tool value into text (`str`)
    before a hook sees it, so the warning is appended to that text and the text the
    model reads before it is left as CrewAI made it. The tool runs once (CrewAI refuses
    the identical repeats itself, see the runaway test), whatever its shape."""
    outcome = shaped_runaway(stack, mode, shape)
    assert outcome.error is None, outcome.error
    assert outcome.log.count("search") == 1
    read = outcome.llm.observations()
    assert read[0] == sent_text(SHAPES[shape])
    if decision == "warn":
        (warned,) = [text for text in read if "[fusebox warning]" in text]
        own, warning = warned.split("\n\n[fusebox warning] ", 1)
        assert own.startswith("I tried reusing the same input"), own  # CrewAI's own words
        assert "one more identical call will be blocked" in warning, warning
    elif decision == "block":
        assert read[-1].startswith("fusebox blocked search"), read
    else:
        assert outcome.stopped is not None and outcome.stopped.report is not None
        assert outcome.stopped.report.state_name == "STOPPED_LOOP_GUARD"
        summary = run_status(stack, outcome.run_id)["summary"]
        assert summary["terminal_state"] == "STOPPED_LOOP_GUARD", summary


@pytest.mark.parametrize("mode", MODES)
def test_ping_pong_is_stopped(stack: Stack, mode: str) -> None:
    outcome = drive(stack.nats_url, scenario("ping_pong"), mode, name="ping-pong")
    assert outcome.stopped is not None, outcome
    assert outcome.stopped.report is not None
    assert "ping_pong" in " ".join(outcome.stopped.report.fired_guards)
    assert len(outcome.log.calls) < 12


@pytest.mark.parametrize("mode", MODES)
def test_pagination_of_twelve_pages_finishes_untouched_and_closes_its_run(
    stack: Stack, mode: str
) -> None:
    outcome = drive(stack.nats_url, scenario("pagination"), mode, name="pages")
    assert outcome.output == "done", outcome
    assert [a for t, a in outcome.log.calls if t == "list_issues"] == list(range(1, PAGES + 1))
    assert all("fusebox" not in text for text in outcome.llm.observations())
    counters = run_status(stack, outcome.run_id)["counters"]
    assert counters["model_turns"] == PAGES + 1
    assert counters["steps"] == PAGES and counters["calls_refused"] == 0
    assert_closed(stack, outcome.run_id, "completed")


@pytest.mark.parametrize("mode", MODES)
def test_a_sweep_of_thirty_distinct_searches_is_untouched(stack: Stack, mode: str) -> None:
    # Past CrewAI's own default cap of 25 turns, which would end the sweep first.
    outcome = drive(stack.nats_url, sweep, mode, name="sweep", max_iter=SWEEP + 5)
    assert outcome.output == "done", outcome
    assert outcome.log.count("search") == SWEEP
    assert all("fusebox" not in text for text in outcome.llm.observations())
    assert_closed(stack, outcome.run_id, "completed")


@pytest.mark.parametrize("mode", MODES)
def test_a_crew_that_fails_closes_its_run_as_failed(stack: Stack, mode: str) -> None:
    outcome = drive(stack.nats_url, scenario("pagination"), mode, name="fails", fail_at=2)
    assert isinstance(outcome.error, RuntimeError), outcome
    assert_closed(stack, outcome.run_id, "failed: RuntimeError: the model is gone")


@pytest.mark.parametrize("mode", MODES)
def test_side_effect_with_one_op_key_runs_once_across_a_retry_and_two_runs(
    stack: Stack, mode: str
) -> None:
    log = ToolLog()
    run_id = fresh_run(f"crewai-{mode}-email")
    retry = scenario("retry_side_effect")
    first = drive(stack.nats_url, retry, mode, run_id=run_id, log=log)
    # The same op_keys from a second run (a restarted worker): the ledger outlives runs.
    second = drive(stack.nats_url, retry, mode, run_id=f"{run_id}-again", ledger_of=run_id, log=log)
    assert first.output == second.output == "done"
    assert log.count("send_email") == 1
    # The model read the first execution's text (CrewAI's, which is what the ledger
    # stored), and the retry and the second run were answered with that same text.
    sent = sent_text(send_email_output("oncall@example.com"))
    assert first.llm.observations() == [sent, sent]
    assert second.llm.observations() == [sent, sent]


@pytest.mark.parametrize("mode", MODES)
def test_fusebox_cancel_from_another_process_ends_the_crew_before_the_next_step(
    stack: Stack, mode: str
) -> None:
    """The cancel reaches the run's kill switch while the third tool runs: the model is
    not asked again (the LLM call hook refuses it), and `kickoff` raises the stop."""

    def cancel_on_third(run_id: str) -> Callable[[int], None]:
        def on_tool(executions: int) -> None:
            if executions == 3:
                fusebox_cancel(stack, run_id)

        return on_tool

    outcome = drive(stack.nats_url, scenario("pagination"), mode, on_tool=cancel_on_third)
    assert outcome.log.count("list_issues") == 3
    assert outcome.stopped is not None, outcome
    report = outcome.stopped.report
    assert report is not None and report.state_name == "CANCELLED"
    assert len(outcome.llm.seen) == 3


@pytest.mark.parametrize("policy", [GateOnError.DENY, GateOnError.ALLOW])
@pytest.mark.parametrize("mode", MODES)
def test_daemon_down(mode: str, policy: GateOnError) -> None:
    with bare_nats() as url:
        outcome = drive(
            url, scenario("one_search"), mode, name="down", gate_on_error=policy, timeout_s=0.5
        )
    assert outcome.output == "done", outcome
    (read,) = outcome.llm.observations()
    if policy is GateOnError.DENY:
        assert outcome.log.count("search") == 0
        assert "no fuseboxd is listening" in read, read
    else:
        assert outcome.log.count("search") == 1
        assert read == sent_text(search_output("weather tokyo"))


# --- sub-agents: a coworker delegated to is a child run ---------------------------------

#: CrewAI 1.6.1's delegation tool (an agent with `allow_delegation`).
DELEGATE_TOOL = "Delegate work to coworker"


class LeadLLM(ScriptedLLM):
    """The lead delegates each topic of `support.sub_agents` to the researcher, then
    answers."""

    def __init__(self) -> None:
        super().__init__(self.delegations)

    @staticmethod
    def delegations(turn: int) -> list[Call] | None:
        calls = lead_calls(turn)
        if calls is None:
            return None
        (_, args), *_ = calls
        task = {"task": f"research {args['topic']}", "context": "weather", "coworker": "researcher"}
        return [(DELEGATE_TOOL, task)]


class ResearcherLLM(ScriptedLLM):
    """The researcher's script for the topic its task names (CrewAI gives each delegated
    task a fresh conversation): one search then an answer, or a runaway."""

    def __init__(self) -> None:
        super().__init__(lambda turn: None)

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        self.seen.append([dict(m) for m in messages])
        topic = topic_of(messages[1]["content"])
        calls = researcher_calls(topic, sum(1 for m in messages if m["role"] == "assistant"))
        return final_answer(researcher_answer(topic)) if calls is None else action(calls[0])


def delegate(url: str, mode: str, policy: dict[str, Any] | None = None) -> Outcome:
    """A crew of a lead (allowed to delegate, no tools of its own) and a researcher with
    `search`; the one task is the lead's."""
    outcome = Outcome(fresh_run(f"crewai-{mode}-lead"), LeadLLM())
    researcher = Agent(
        role="researcher",
        goal="find facts",
        backstory="a researcher",
        llm=ResearcherLLM(),
        tools=make_tools(outcome.log)[:1],
        cache=False,
    )
    lead = Agent(
        role="lead",
        goal="write a weather report",
        backstory="a lead",
        llm=outcome.llm,
        allow_delegation=True,
        cache=False,
    )
    task = Task(description="weather report", expected_output="a report", agent=lead)
    crew = Crew(agents=[lead, researcher], tasks=[task], cache=False)
    if mode == "sync":
        with SyncFusebox.connect(url, tenant=TENANT) as fb:
            guard = FuseboxCrew(fb.start_run(outcome.run_id, agent="lead", policy=policy))
            outcome.output = guard.kickoff(crew).raw
        return outcome

    async def main() -> None:
        async with await Fusebox.connect(url, tenant=TENANT) as afb:
            run = await afb.start_run(outcome.run_id, agent="lead", policy=policy)
            outcome.output = (await FuseboxCrew(run).kickoff_async(crew)).raw

    asyncio.run(main())
    return outcome


@pytest.mark.parametrize("mode", MODES)
def test_a_coworker_delegated_to_is_a_child_run_and_its_stop_is_the_delegations_result(
    stack: Stack, mode: str
) -> None:
    outcome = delegate(stack.nats_url, mode)
    assert outcome.output == "done", outcome
    found, stopped = outcome.llm.observations()
    assert found == FOUND
    assert stopped.startswith("fusebox stopped the sub-agent researcher"), stopped
    assert "consecutive_blocks" in stopped
    nodes = asyncio.run(tree(stack, outcome.run_id))
    first, second = children(nodes, outcome.run_id)
    assert first.agent == second.agent == "researcher"
    assert first.executed == ["search"] and first.stop_reason == "completed"
    assert second.stop_reason == "consecutive_blocks"
    assert nodes[outcome.run_id].executed == [DELEGATE_TOOL, DELEGATE_TOOL]
    assert_closed(stack, outcome.run_id, "completed")


@pytest.mark.parametrize("mode", MODES)
def test_a_coworker_past_the_caps_does_not_run_and_the_lead_reads_why(
    stack: Stack, mode: str
) -> None:
    outcome = delegate(stack.nats_url, mode, policy={"max_children": 1})
    assert outcome.output == "done", outcome
    assert "spawn_limit" in outcome.llm.observations()[1]
    assert outcome.log.count("search") == 1  # the second researcher never ran a tool


def test_a_resumed_session_whose_run_was_stopped_is_refused_before_its_model_is_asked(
    stack: Stack,
) -> None:
    """The session id is the run id: a crew of the same session kicked off again (a new
    process) finds the session's run stopped, from its kept stop, and ends with that
    stop before its model is asked."""
    session = fresh_run("crewai-session")
    log = ToolLog()

    def kickoff(name: str) -> tuple[str, Outcome]:
        outcome = Outcome(session, ScriptedLLM(scenario(name)), log=log)

        async def main() -> str:
            async with await Fusebox.connect(stack.nats_url, tenant=TENANT) as fb:
                run = await session_run(fb, session)
                try:
                    await FuseboxCrew(run).kickoff_async(crew_of(outcome.llm, make_tools(log)))
                except RunStopped as stop:
                    outcome.stopped = stop
                await run.close()
                return run.id

        return asyncio.run(main()), outcome

    first_id, first = kickoff("runaway")
    assert first_id == session and first.stopped is not None
    executed = log.count("search")
    second_id, second = kickoff("one_search")
    assert second_id == session
    assert second.stopped is not None and second.stopped.report is not None
    assert second.stopped.report.state_name == "STOPPED_LOOP_GUARD"
    assert second.llm.seen == [] and log.count("search") == executed
