"""The Google ADK plugin, with the real package (google-adk 2.13), a `BaseLlm` subclass
that replays the shared script (no LLM, no network), a real nats-server and fuseboxd;
every scenario through ADK's async runner (`run_async`) and its sync one (`run`)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from fusebox_guard import Fusebox, GateOnError, RunStopped, SyncFusebox
from fusebox_guard.adapters.google_adk import FuseboxPlugin
from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.events.event import Event
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.adk.tools.agent_tool import AgentTool
from google.adk.tools.function_tool import FunctionTool
from google.genai import types
from pydantic import Field
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
_ids = itertools.count()


class ScriptedLlm(BaseLlm):
    """Answers from `support.scenarios`: turn N = the model turns in the request.
    150 prompt tokens (100 of them cached) and 25 output per response: 175 in all."""

    model: str = "scripted"
    scenario: str
    seen: list[LlmRequest] = Field(default_factory=list)
    fail_at: int | None = None
    #: Hand the task to this sub-agent first (`transfer_to_agent`), then play nothing.
    delegate_to: str | None = None

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.seen.append(llm_request)
        # Its own turns: a sub-agent's request also holds the other agents' turns.
        turn = len(self.seen) - 1
        if turn == self.fail_at:
            raise RuntimeError("the model is gone")
        calls = next_calls(self.scenario, turn)
        if self.delegate_to is not None:
            calls = [("transfer_to_agent", {"agent_name": self.delegate_to})] if turn == 0 else None
        if calls is None:
            parts = [types.Part(text="done")]
        else:
            parts = [
                types.Part(
                    function_call=types.FunctionCall(id=f"call_{turn}_{k}", name=name, args=args)
                )
                for k, (name, args) in enumerate(calls)
            ]
        usage = types.GenerateContentResponseUsageMetadata(
            prompt_token_count=150, candidates_token_count=25, cached_content_token_count=100
        )
        yield LlmResponse(content=types.Content(role="model", parts=parts), usage_metadata=usage)


def make_tools(
    log: ToolLog,
    on_tool: Callable[[int], None] | None = None,
    search_shape: str | None = None,
) -> list[FunctionTool]:
    """The scenario tools; `search_shape`: `search` returns that shape of `SHAPES`."""

    def ran(name: str, arg: Any) -> None:
        log.calls.append((name, arg))
        if on_tool is not None:
            on_tool(len(log.calls))

    def search(query: str) -> Any:
        """Search the web."""
        ran("search", query)
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

    return [FunctionTool(f) for f in (search, open_page, list_issues, send_email)]


@dataclass
class Outcome:
    run_id: str
    model: BaseLlm
    events: list[Event] = field(default_factory=list)
    stopped: RunStopped | None = None
    error: Exception | None = None
    log: ToolLog = field(default_factory=ToolLog)

    @property
    def text(self) -> str | None:
        texts = [p.text for e in self.events if e.content for p in e.content.parts or [] if p.text]
        return texts[-1] if texts else None

    def assert_history_valid(self) -> None:
        """Every function call of the invocation has a response for its id."""
        asked = {
            str(part.function_call.id)
            for event in self.events
            for part in (event.content.parts or [] if event.content else [])
            if part.function_call is not None
        }
        assert asked <= set(self.answers()), f"unanswered call ids: {asked - set(self.answers())}"

    def answers(self) -> dict[str, dict[str, Any]]:
        """Every tool call's result in the invocation (what the model reads), by call id."""
        return {
            str(part.function_response.id): dict(part.function_response.response or {})
            for event in self.events
            for part in (event.content.parts or [] if event.content else [])
            if part.function_response is not None
        }


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
    fail_at: int | None = None,
    search_shape: str | None = None,
    **connect: Any,
) -> Outcome:
    """Runs the scenario's agent behind a run; its final text, or how it ended.
    `ledger_of`: the run whose op_keys its side effects use (default: its own)."""
    run_id = run_id or fresh_run(f"adk-{mode}-{scenario}")
    model = ScriptedLlm(scenario=scenario, fail_at=fail_at)
    outcome = Outcome(run_id, model)
    tools = make_tools(log, on_tool and on_tool(run_id), search_shape)
    agent = LlmAgent(name="researcher", model=model, tools=list(tools))
    message = types.Content(role="user", parts=[types.Part(text="go")])

    def runner_for(guard: FuseboxPlugin) -> tuple[InMemoryRunner, dict[str, Any]]:
        app = App(name="fusebox_test", root_agent=agent, plugins=[guard])
        runner = InMemoryRunner(app=app)
        session = f"s{next(_ids)}"
        kwargs = {"user_id": "u", "session_id": session, "new_message": message}
        return runner, kwargs

    def ended(err: Exception) -> None:
        if isinstance(err, RunStopped):
            outcome.stopped = err
            outcome.events = list(err.history)
        else:
            outcome.error = err

    async def session(runner: InMemoryRunner, kwargs: dict[str, Any]) -> None:
        await runner.session_service.create_session(
            app_name="fusebox_test", user_id="u", session_id=kwargs["session_id"]
        )

    if mode == "sync":
        with SyncFusebox.connect(url, tenant=TENANT, **connect) as fb:
            guard = FuseboxPlugin(
                fb.start_run(run_id, policy=policy), op_key=op_key_for(ledger_of or run_id)
            )
            runner, kwargs = runner_for(guard)
            asyncio.run(session(runner, kwargs))
            try:
                outcome.events = guard.run_sync(runner, **kwargs)
            except Exception as err:
                ended(err)
        return outcome

    async def main() -> None:
        async with await Fusebox.connect(url, tenant=TENANT, **connect) as afb:
            run = await afb.start_run(run_id, policy=policy)
            guard = FuseboxPlugin(run, op_key=op_key_for(ledger_of or run_id))
            runner, kwargs = runner_for(guard)
            await session(runner, kwargs)
            try:
                outcome.events = await guard.run_async(runner, **kwargs)
            except Exception as err:
                ended(err)
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
    # blocks' messages as the refused calls' results.
    read = outcome.answers()
    assert read[f"call_{RUNAWAY_EXECUTIONS - 1}_0"]["fusebox_warning"]
    assert read[f"call_{RUNAWAY_EXECUTIONS}_0"]["error"].startswith("fusebox blocked search")
    assert "fusebox stopped this run" in list(read.values())[-1]["error"]
    outcome.assert_history_valid()


#: One runaway per (mode, shape), read by that shape's three cells of the table.
_runaways: dict[tuple[str, str], tuple[Outcome, Read]] = {}


def shaped_runaway(stack: Stack, mode: str, shape: str) -> tuple[Outcome, Read]:
    if (mode, shape) not in _runaways:
        log = ToolLog()
        outcome = drive(stack.nats_url, "runaway", mode, log, search_shape=shape)
        report = outcome.stopped.report if outcome.stopped is not None else None
        texts = [json.dumps(answer) for answer in outcome.answers().values()]
        state = report.state_name if report is not None else None
        _runaways[(mode, shape)] = (outcome, Read(texts, log.count("search"), state))
    return _runaways[(mode, shape)]


@pytest.mark.parametrize(("shape", "decision"), CELLS)
@pytest.mark.parametrize("mode", MODES)
def test_every_result_shape_through_a_warn_a_block_and_a_stop(
    stack: Stack, mode: str, shape: str, decision: str
) -> None:
    """Issue 49 §1: ADK hands `after_tool_callback` the tool's own return value, so a
    warning merged into a string as if it were a dict crashed the run (FAILED, not
    STOPPED_LOOP_GUARD). A warned result keeps its value: a dict gets the
    `fusebox_warning` field, anything else is wrapped the way ADK wraps a non-dict
    result for the model (`{"result": value}`), with the field beside it."""
    outcome, read = shaped_runaway(stack, mode, shape)
    assert outcome.error is None, outcome.error
    assert_cell(stack, outcome.run_id, shape, decision, read)
    if decision == "warn":
        answer = outcome.answers()[f"call_{RUNAWAY_EXECUTIONS - 1}_0"]
        value = SHAPES[shape]
        kept = value if isinstance(value, dict) else {"result": value}
        warning = answer.pop("fusebox_warning", None)
        assert answer == kept, answer
        assert warning is not None and "one more identical call will be blocked" in warning
    outcome.assert_history_valid()


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
    assert all("fusebox" not in str(answer) for answer in outcome.answers().values())
    counters = run_status(stack, outcome.run_id)["counters"]
    assert counters["model_turns"] == PAGES + 1
    assert counters["tokens"] == (PAGES + 1) * 175
    assert counters["steps"] == PAGES and counters["calls_refused"] == 0
    assert_closed(stack, outcome.run_id, "completed")


@pytest.mark.parametrize("mode", MODES)
def test_an_agent_that_fails_closes_its_run_as_failed(stack: Stack, mode: str) -> None:
    outcome = drive(stack.nats_url, "pagination", mode, ToolLog(), fail_at=2)
    assert isinstance(outcome.error, RuntimeError), outcome
    assert_closed(stack, outcome.run_id, "failed: RuntimeError: the model is gone")


@pytest.mark.parametrize("mode", MODES)
def test_side_effect_with_one_op_key_runs_once_across_a_retry_and_two_runs(
    stack: Stack, mode: str
) -> None:
    log = ToolLog()
    run_id = fresh_run(f"adk-{mode}-email")
    first = drive(stack.nats_url, "retry_side_effect", mode, log, run_id=run_id)
    # The same op_keys from a second run (a restarted worker): the ledger outlives runs.
    second = drive(
        stack.nats_url, "retry_side_effect", mode, log, run_id=f"{run_id}-again", ledger_of=run_id
    )
    assert first.text == second.text == "done"
    assert log.count("send_email") == 1
    # The retry was answered with the stored result, under its own call id.
    for outcome in (first, second):
        assert outcome.answers()["call_1_0"] == send_email_output("oncall@example.com")


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
    assert outcome.text == "done", outcome
    answer = outcome.answers()["call_0_0"]
    if policy is GateOnError.DENY:
        assert log.count("search") == 0
        assert "no fuseboxd is listening" in answer["error"]
    else:
        assert log.count("search") == 1
        assert answer == search_output("weather tokyo")


@pytest.mark.parametrize("mode", MODES)
def test_parallel_calls_are_each_gated_and_siblings_refused_after_a_stop(
    stack: Stack, mode: str
) -> None:
    log = ToolLog()
    outcome = drive(stack.nats_url, "parallel_runaway", mode, log)
    assert outcome.stopped is not None, outcome
    assert log.count("search") == RUNAWAY_EXECUTIONS
    refused = [a for a in outcome.answers().values() if "error" in a]
    assert refused and all("fusebox" in a["error"] for a in refused), refused
    outcome.assert_history_valid()


def test_a_sub_agent_handed_the_task_is_a_child_run_and_its_stop_ends_it_alone(
    stack: Stack,
) -> None:
    """The root hands the task to a sub-agent (`transfer_to_agent`), which runs away: the
    runner's plugin gates the sub-agent's calls in a child run of the root's, whose stop
    ends the sub-agent (its answer says why), not the root's run."""
    log = ToolLog()
    worker_model = ScriptedLlm(scenario="runaway")
    worker = LlmAgent(name="worker", model=worker_model, tools=list(make_tools(log)))
    root_model = ScriptedLlm(scenario="runaway", delegate_to="worker")
    root = LlmAgent(name="root", model=root_model, sub_agents=[worker])
    run_id = fresh_run("adk-multi")

    async def main() -> list[Event]:
        async with await Fusebox.connect(stack.nats_url, tenant=TENANT) as fb:
            guard = FuseboxPlugin(await fb.start_run(run_id))
            app = App(name="fusebox_test", root_agent=root, plugins=[guard])
            runner = InMemoryRunner(app=app)
            await runner.session_service.create_session(
                app_name="fusebox_test", user_id="u", session_id="multi"
            )
            message = types.Content(role="user", parts=[types.Part(text="go")])
            return await guard.run_async(
                runner, user_id="u", session_id="multi", new_message=message
            )

    events = asyncio.run(main())
    assert log.count("search") == RUNAWAY_EXECUTIONS
    last = Outcome(run_id, root_model, events).text or ""
    assert last.startswith("fusebox stopped the sub-agent worker"), last
    assert len(root_model.seen) == 1  # the root's turn was the transfer
    nodes = asyncio.run(tree(stack, run_id))
    (child,) = children(nodes, run_id)
    assert child.agent == "worker" and child.stop_reason == "consecutive_blocks"
    assert len(child.executed) == RUNAWAY_EXECUTIONS
    assert nodes[run_id].executed == ["transfer_to_agent"]
    assert_closed(stack, run_id, "completed")


# --- AgentTool: an agent called as a tool is a child run ---------------------------------

Script = Callable[[LlmRequest], "list[Call] | str"]


class PlayLlm(BaseLlm):
    """Answers what `script` says for the request: tool calls, or a final text."""

    model: str = "play"
    script: Script
    seen: list[LlmRequest] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.seen.append(llm_request)
        answer = self.script(llm_request)
        if isinstance(answer, str):
            parts = [types.Part(text=answer)]
        else:
            turn = _model_turns(llm_request)
            parts = [
                types.Part(function_call=types.FunctionCall(id=f"{name}_{turn}", name=name, args=a))
                for name, a in answer
            ]
        yield LlmResponse(content=types.Content(role="model", parts=parts))


def _model_turns(request: LlmRequest) -> int:
    return sum(1 for c in request.contents if c.role == "model")


def lead_script(request: LlmRequest) -> list[Call] | str:
    return lead_calls(_model_turns(request)) or "done"


def researcher_script(request: LlmRequest) -> list[Call] | str:
    topic = topic_of(request.contents[0])
    return researcher_calls(topic, _model_turns(request)) or researcher_answer(topic)


def delegate(url: str, mode: str, policy: dict[str, Any] | None = None) -> Outcome:
    """The lead, whose `research` tool is the researcher agent (an `AgentTool`), behind
    a run; the invocation's events."""
    outcome = Outcome(fresh_run(f"adk-{mode}-lead"), PlayLlm(script=lead_script))
    researcher = LlmAgent(
        name=DELEGATE,
        model=PlayLlm(script=researcher_script),
        tools=list(make_tools(outcome.log)[:1]),
    )
    lead = LlmAgent(name="lead", model=outcome.model, tools=[AgentTool(researcher)])
    message = types.Content(role="user", parts=[types.Part(text="weather report")])
    kwargs = {"user_id": "u", "session_id": "lead", "new_message": message}

    async def session(runner: InMemoryRunner) -> None:
        await runner.session_service.create_session(
            app_name="fusebox_test", user_id="u", session_id="lead"
        )

    def runner_for(guard: FuseboxPlugin) -> InMemoryRunner:
        return InMemoryRunner(app=App(name="fusebox_test", root_agent=lead, plugins=[guard]))

    if mode == "sync":
        with SyncFusebox.connect(url, tenant=TENANT) as fb:
            guard = FuseboxPlugin(fb.start_run(outcome.run_id, agent="lead", policy=policy))
            runner = runner_for(guard)
            asyncio.run(session(runner))
            outcome.events = guard.run_sync(runner, **kwargs)
        return outcome

    async def main() -> None:
        async with await Fusebox.connect(url, tenant=TENANT) as afb:
            run = await afb.start_run(outcome.run_id, agent="lead", policy=policy)
            guard = FuseboxPlugin(run)
            runner = runner_for(guard)
            await session(runner)
            outcome.events = await guard.run_async(runner, **kwargs)

    asyncio.run(main())
    return outcome


#: ADK's own AgentTool hands its runner the plugins the deprecated way.
adk_agent_tool = pytest.mark.filterwarnings("ignore:The `plugins` argument is deprecated")


@adk_agent_tool
@pytest.mark.parametrize("mode", MODES)
def test_an_agent_tool_is_a_child_run_and_its_stop_is_the_tools_result(
    stack: Stack, mode: str
) -> None:
    outcome = delegate(stack.nats_url, mode)
    assert outcome.text == "done", outcome
    read = outcome.answers()
    assert read[f"{DELEGATE}_0"] == {"result": FOUND}
    stopped = read[f"{DELEGATE}_1"]["error"]
    assert stopped.startswith(f"fusebox stopped the sub-agent {DELEGATE}"), stopped
    assert "consecutive_blocks" in stopped
    assert outcome.log.count("search") == 1 + RUNAWAY_SEARCHES
    nodes = asyncio.run(tree(stack, outcome.run_id))
    first, second = children(nodes, outcome.run_id)
    assert first.agent == second.agent == DELEGATE
    assert first.executed == ["search"] and first.stop_reason == "completed"
    assert second.stop_reason == "consecutive_blocks"
    assert len(second.executed) == RUNAWAY_SEARCHES
    assert nodes[outcome.run_id].executed == [DELEGATE, DELEGATE]
    assert_closed(stack, outcome.run_id, "completed")


@adk_agent_tool
@pytest.mark.parametrize("mode", MODES)
def test_an_agent_tool_past_the_caps_does_not_run_and_the_lead_reads_why(
    stack: Stack, mode: str
) -> None:
    outcome = delegate(stack.nats_url, mode, policy={"max_children": 1})
    assert outcome.text == "done", outcome
    refused = outcome.answers()[f"{DELEGATE}_1"]["error"]
    assert "spawn_limit" in refused, refused
    assert outcome.log.count("search") == 1  # the second researcher never ran


@pytest.mark.parametrize("mode", MODES)
def test_usage_reaches_the_token_budget(stack: Stack, mode: str) -> None:
    # 175 tokens a response: the third crosses 500, and its calls do not run.
    log = ToolLog()
    outcome = drive(stack.nats_url, "pagination", mode, log, policy={"max_tokens": 500})
    assert outcome.stopped is not None, outcome
    assert outcome.stopped.report is not None
    assert outcome.stopped.report.reason == "token_budget"
    assert log.count("list_issues") == 2
