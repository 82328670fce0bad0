"""OTLP in with OpenInference's conventions (issue 46 §1): the real OpenAI Agents SDK
(openai-agents 0.24), traced by the real OpenInference instrumentation
(`openinference-instrumentation-openai-agents` 2.6.0), exported by the Python SDK's
OTLP/HTTP exporter to a real fuseboxd with its `[otlp]` receiver on. No LLM, no network:
the SDK's Responses model with the real `openai` client talks to a scripted Responses
API on loopback (`support.fake_model_api.FakeResponses`: its `LLM` spans carry token
counts), or the SDK's own `ScriptedModel` plays the model (no `LLM` span). Runs are
named with OpenInference's `using_session` (`session.id`); a sub-agent run inside the
lead's tool call under a session of its own starts as the lead's child."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agents import (
    Agent,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from openai import AsyncOpenAI
from openinference.instrumentation import using_session
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from support.fake_model_api import FakeResponses, Turn, say, shell
from support.otlp import (
    Receiver,
    receiving,
    status,
    stops_of,
    summary,
    tracer_provider,
    wait_for,
)
from support.stack import Stack

RUNAWAY = 12  # the same call, as often as the Pydantic AI suite's runaway


@pytest.fixture(scope="module")
def receiver(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    """The shipped body bound (4 MiB): OpenInference's `LLM` spans carry the whole
    conversation so far in `input.value`, past the small bound of the bad-input suite."""
    with receiving(stack, tmp_path_factory, 4 * 1024 * 1024) as running:
        yield running


@pytest.fixture(scope="module")
def traced(receiver: Receiver) -> Iterator[TracerProvider]:
    """OpenInference's processor in place of the SDK's own (`exclusive_processor`, its
    default: nothing goes to OpenAI's tracing backend), exporting to the receiver. The
    batch processor waits for `force_flush` (a long schedule), so each test's spans go
    in one request, as a short run's do at the default 5 s schedule."""
    provider = tracer_provider(receiver.url, schedule_delay_millis=600_000)
    instrumentor = OpenAIAgentsInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    # The adapter suite switches the SDK's tracing off when it is imported.
    set_tracing_disabled(False)
    try:
        yield provider
    finally:
        set_tracing_disabled(True)
        instrumentor.uninstrument()
        provider.shutdown()


@function_tool
def exec_command(cmd: str) -> str:
    """Run a shell command (the tool `FakeResponses` calls)."""
    return "nothing new" if cmd == "same" else f"listing of {cmd}"


def run_against(api: FakeResponses, session: str, provider: TracerProvider) -> str:
    """One run of an agent on the Responses model, streamed (the fake API streams)."""

    async def go() -> str:
        client = AsyncOpenAI(base_url=api.base_url + "/v1", api_key="test-key")
        model = OpenAIResponsesModel(model="fake-model", openai_client=client)
        agent = Agent(name="operator", model=model, tools=[exec_command])
        with using_session(session):
            result = Runner.run_streamed(agent, "go", max_turns=2 * RUNAWAY)
            async for _ in result.stream_events():
                pass
        return str(result.final_output)

    output = asyncio.run(go())
    assert provider.force_flush(10_000)
    return output


def commands(first: Callable[[int], str]) -> Callable[[int], Turn]:
    """`RUNAWAY` turns running `first(turn)`, then the answer."""
    return lambda turn: shell(first(turn)) if turn < RUNAWAY else say("done")


def test_a_runaway_loop_is_stopped_on_the_kill_switch(
    receiver: Receiver, traced: TracerProvider, run_id: str
) -> None:
    with FakeResponses(respond=commands(lambda _: "same")) as api:
        # Passive: nothing stood between the agent and its tool; all the calls ran.
        assert run_against(api, run_id, traced) == "done"
        assert api.tool_outputs() == ["nothing new"] * RUNAWAY

    state = wait_for(
        lambda: (s := summary(receiver, run_id)).get("terminal_state") and s, "the run's stop"
    )
    assert state["terminal_state"] == "STOPPED_LOOP_GUARD", state
    assert state["reason"] in {"consecutive_blocks", "same_call_repeat", "no_progress"}, state
    stops = asyncio.run(stops_of(receiver.stack.nats_url, run_id, timeout=5))
    assert stops, "the stop is published on the kill switch"
    assert stops[0]["report"]["terminal_state"] == "STOPPED_LOOP_GUARD", stops[0]


def test_a_legitimate_run_is_untouched(
    receiver: Receiver, traced: TracerProvider, run_id: str
) -> None:
    with FakeResponses(respond=commands(lambda turn: f"ls page-{turn}")) as api:
        assert run_against(api, run_id, traced) == "done"

    # Every call, its result and every model turn (12 + 12 + 13), the turns' tokens
    # from the LLM spans' `llm.token_count.*` (the fake API's 100 in, 10 out each).
    events = 3 * RUNAWAY + 1
    state = wait_for(
        lambda: (s := status(receiver, run_id)).get("summary", {}).get("events", 0) >= events and s,
        "all events applied",
    )
    assert state["summary"]["events"] == events, state["summary"]
    assert state["summary"].get("terminal_state") is None, state["summary"]
    counters = state["counters"]
    assert counters["calls_refused"] == 0, counters
    assert counters["model_turns"] == RUNAWAY + 1, counters
    assert counters["tokens"] == (100 + 10) * (RUNAWAY + 1), counters
    assert not asyncio.run(stops_of(receiver.stack.nats_url, run_id, timeout=1))


# --- sub-agents: the lead's tool runs a researcher under a session of its own -----------


def playing(turns: list[list[tuple[str, dict[str, Any]]]]) -> ScriptedModel:
    """A model asking for `turns[i]`'s calls on its i-th turn, then answering `done`."""

    def respond(call: Any) -> Any:
        items = call.input if isinstance(call.input, list) else []
        turn = sum(1 for i in items if _as_dict(i).get("type") == "function_call")
        if turn < len(turns):
            return [function_call(n, a, call_id=f"call_{turn}_{n}") for n, a in turns[turn]]
        return [assistant_message("done")]

    return ScriptedModel([ModelStep.respond(respond) for _ in range(len(turns) + 1)])


def _as_dict(item: Any) -> dict[str, Any]:
    found: dict[str, Any] = item if isinstance(item, dict) else item.model_dump()
    return found


@function_tool
def search(query: str) -> str:
    """Search the web."""
    return f"results for {query}: nothing new" if query == "same" else f"page about {query}"


def researcher(turns: list[list[tuple[str, dict[str, Any]]]]) -> Agent[Any]:
    return Agent(name="researcher", model=playing(turns), tools=[search])


def run(agent: Agent[Any], session: str, provider: TracerProvider) -> str:
    """One run under `session`, its spans exported before this returns."""

    async def go() -> str:
        with using_session(session):
            result = await Runner.run(agent, "go", max_turns=2 * RUNAWAY)
        return str(result.final_output)

    output = asyncio.run(go())
    assert provider.force_flush(10_000)
    return output


def test_a_sub_agent_in_the_leads_tool_call_is_its_child_and_stopped_alone(
    receiver: Receiver, traced: TracerProvider, run_id: str
) -> None:
    child = f"{run_id}-researcher"
    looping = researcher([[("search", {"query": "same"})]] * RUNAWAY)

    @function_tool
    async def research(topic: str) -> str:
        """Delegate research to the researcher."""
        with using_session(child):
            result = await Runner.run(looping, topic, max_turns=2 * RUNAWAY)
        return str(result.final_output)

    lead = Agent(name="lead", model=playing([[("research", {"topic": "tokyo"})]]), tools=[research])
    assert run(lead, run_id, traced) == "done"

    # The child's spans, its agent span, and the lead's tool span around it came in one
    # export: the child's run started naming the lead.
    state = wait_for(
        lambda: (s := status(receiver, child)).get("summary", {}).get("terminal_state") and s,
        "the child's stop",
    )
    assert state["summary"]["terminal_state"] == "STOPPED_LOOP_GUARD", state
    assert state["tree"]["parent"] == run_id, state["tree"]
    stops = asyncio.run(stops_of(receiver.stack.nats_url, child, timeout=5))
    assert stops and stops[0]["report"]["terminal_state"] == "STOPPED_LOOP_GUARD", stops

    # The lead's one delegation (call and result) applied, the lead still open: a
    # child's stop does not stop its parent.
    lead_state = wait_for(
        lambda: (s := status(receiver, run_id)).get("summary", {}).get("events", 0) >= 2 and s,
        "the lead's events",
    )
    assert lead_state["summary"].get("terminal_state") is None, lead_state
    assert [c["run"] for c in lead_state["tree"]["children"]] == [child], lead_state["tree"]
    assert not asyncio.run(stops_of(receiver.stack.nats_url, run_id, timeout=1))
