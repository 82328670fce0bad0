"""Google Agent Development Kit (`google-adk` 2.13): every tool call of every agent of an
app gated by fuseboxd, as a runner plugin.

    guard = FuseboxPlugin(run)
    runner = InMemoryRunner(app=App(name="research", root_agent=root_agent, plugins=[guard]))
    events = await guard.run_async(runner, user_id=..., session_id=..., new_message=...)
    # or guard.run_sync(runner, ...); RunStopped on a stop, its events in `.history`

- `before_tool_callback` asks the gate. A call that may not run is answered by the
  returned dict, which ADK takes as the tool's result without running it: `{"error":
  <the guard's message>}` for a block (and the guard unreachable, unless
  `gate_on_error=allow`), the stored result for `use_completed_result`; a `stop`
  answers the same way and ends the invocation (its `end_invocation` flag: no further
  model call). Parallel calls are each gated; after a stop the rest are refused
  without a round trip.
- `after_tool_callback` reports the result, and a `warn`'s message reaches the model
  beside it as `fusebox_warning`: a field added to a dict result; any other result
  (ADK hands the tool's own return value over: a string, a list, None) wrapped as ADK
  wraps it for the model, `{"result": value, "fusebox_warning": ...}`.
  `on_tool_error_callback` reports a tool's error (RETRYABLE, no wait).
- `after_model_callback`: each model response's usage → `model_turn` (a stop answered
  there, a budget, ends the invocation); `before_model_callback` answers for the model
  once the run is stopped (`fusebox cancel`, the kill switch), so it is not asked again.
- `after_run_callback` / `on_run_error_callback`: the invocation ended → `run_finished`
  (completed, or failed with the error), unless `finish=False` (more invocations, e.g.
  the next user message of a session, go on in the same fusebox run).

A plugin is the runner's (and an `AgentTool`'s runner inherits it), so every agent of a
multi-agent app is gated, each sub-agent in a child run of its own (guard contract §6):

- `AgentTool` (an agent called as a tool): its invocation, which runs inside the guarded
  call, is a child run of the calling agent's run, closed when it ends. A sub-agent the
  guard stops is answered for its model (`before_model_callback`: the model is not
  asked again, the answer says why), so it ends with that answer, and the call's result
  the parent reads is `{"error": <which sub-agent was stopped, why, what to do>}`; one
  the caps refuse does not run and answers the same way.
- `sub_agents` (a transfer, a workflow agent's steps): each agent other than the one the
  invocation began with is a child run of the run of the nearest agent above it in
  ADK's `sub_agents` tree (a transfer to a sibling is a child of their common parent,
  not of the agent that transferred), one per time it starts, closed when it ends. A
  stopped one ends the same way, and ADK goes on as after any agent's answer (after a
  transfer, that answer ends the invocation); only a stop of the root run ends the
  invocation (`end_invocation`).

Live mode (`runner.run_live`, read off ADK 2.13's source): live tool calls go through
the same plugin tool callbacks, so each is gated and refused alike, and after a stop
every further call is refused by the run's latch; but the live flow reads
`end_invocation` only when the session starts, so a stop does not close a live session
(close its `LiveRequestQueue` once `run.wait_stopped()` returns), and live usage is not
reported.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from contextvars import Token
from dataclasses import dataclass
from typing import Any

from google.adk.agents.base_agent import BaseAgent
from google.adk.agents.callback_context import CallbackContext
from google.adk.agents.invocation_context import InvocationContext
from google.adk.events.event import Event
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import Runner
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types

from ..errors import FuseboxError, RunStopped
from ..gate import Gate
from ..run import Run
from ..sync import SyncRun
from ..types import Action, Decision, Effect, ResultKind, Usage
from ._common import (
    Bridge,
    Call,
    OpKeyFn,
    Tree,
    finish_run,
    is_stop,
    jsonable,
    report_failed,
    start_sub_agent,
    sub_agent_stopped,
)


class FuseboxPlugin(BasePlugin):
    """The plugin that puts one `Run` behind fuseboxd."""

    def __init__(
        self,
        run: Run | SyncRun,
        *,
        op_key: OpKeyFn | None = None,
        effects: Mapping[str, Effect | str] | None = None,
        finish: bool = True,
        name: str = "fusebox",
    ) -> None:
        super().__init__(name)
        self._bridge = Bridge(run, op_key=op_key, effects=effects)
        self._tree = Tree(self._bridge)
        self.finish = finish
        #: The run of each invocation under way: the root's, or for an invocation that
        #: runs inside a guarded call (an `AgentTool`'s), a child run of that call's run.
        self._invocations: dict[str, Bridge] = {}
        #: The agent each invocation began with: its calls are the invocation's run's.
        self._first_agents: dict[str, str] = {}
        #: The child run of each other agent running in an invocation (a sub-agent).
        self._agents: dict[tuple[str, str], Bridge] = {}
        #: The calls the gate let run (their results are reported), by invocation,
        #: agent and call id (a sub-agent's call ids may repeat its parent's).
        self._running: dict[tuple[str, str, str], _Running] = {}

    @property
    def run(self) -> Run:
        return self._bridge.run

    # --- entry points ------------------------------------------------------------------

    async def run_async(self, runner: Runner, **kwargs: Any) -> list[Event]:
        """`runner.run_async(**kwargs)` to its end; its events, or `RunStopped` when the
        guard ended the invocation."""
        events = [event async for event in runner.run_async(**kwargs)]
        self._raise_if_stopped(events)
        return events

    def run_sync(self, runner: Runner, **kwargs: Any) -> list[Event]:
        """`runner.run(**kwargs)` (ADK's sync entry point, its own loop thread) to its
        end; its events, or `RunStopped`."""
        events = list(runner.run(**kwargs))
        self._raise_if_stopped(events)
        return events

    def _raise_if_stopped(self, events: list[Event]) -> None:
        stopped = self.run.stop_decision
        if stopped is not None:
            raise RunStopped(stopped.report, stopped, history=events)

    # --- which run ---------------------------------------------------------------------

    def _bridge_of(self, context: CallbackContext | ToolContext) -> Bridge:
        invocation = context.invocation_id
        return (
            self._agents.get((invocation, context.agent_name))
            or self._invocations.get(invocation)
            or self._bridge
        )

    def _parent_of(self, agent: BaseAgent, invocation: str) -> Bridge:
        """The run of the nearest agent above `agent` (ADK's `sub_agents` tree) running
        in the invocation; the invocation's own run when none is."""
        above = agent.parent_agent
        while above is not None and above.name != self._first_agents.get(invocation):
            running = self._agents.get((invocation, above.name))
            if running is not None:
                return running
            above = above.parent_agent
        return self._invocations.get(invocation, self._bridge)

    # --- the invocation ----------------------------------------------------------------

    async def before_run_callback(
        self, *, invocation_context: InvocationContext
    ) -> types.Content | None:
        invocation = invocation_context.invocation_id
        first = invocation_context.agent
        agent = first.name if first is not None else ""
        self._first_agents[invocation] = agent
        call = self._tree.calling
        if call is None:
            self._invocations[invocation] = self._bridge
            return None
        # Inside a guarded call (an AgentTool): a sub-agent, its own child run.
        child = await start_sub_agent(call.bridge, agent)
        call.children.append(child)
        self._invocations[invocation] = child
        if child.run.stopped is not None:
            return _text(sub_agent_stopped(agent, child.run))
        return None

    async def after_run_callback(self, *, invocation_context: InvocationContext) -> None:
        await self._invocation_ended(invocation_context.invocation_id, None)

    async def on_run_error_callback(
        self, *, invocation_context: InvocationContext, error: Exception
    ) -> None:
        await self._invocation_ended(invocation_context.invocation_id, error)

    async def _invocation_ended(self, invocation: str, error: Exception | None) -> None:
        """Closes the invocation's runs: sub-agents still open (ADK skips an agent's
        end callback when it hands the invocation on), then its own, as it ended."""
        for key in [key for key in self._agents if key[0] == invocation]:
            await finish_run(self._agents.pop(key), error)
        self._first_agents.pop(invocation, None)
        bridge = self._invocations.pop(invocation, self._bridge)
        if bridge is not self._bridge or self.finish:
            await finish_run(bridge, error)

    async def before_agent_callback(
        self, *, agent: BaseAgent, callback_context: CallbackContext
    ) -> types.Content | None:
        """A sub-agent (ADK's `sub_agents`: a transfer, a workflow's step) starts: its
        own child run, below the run of the agent above it. One the caps refuse does
        not run: its answer says why."""
        invocation = callback_context.invocation_id
        if agent.name == self._first_agents.get(invocation):
            return None
        child = await start_sub_agent(self._parent_of(agent, invocation), agent.name)
        self._agents[(invocation, agent.name)] = child
        if child.run.stopped is not None:
            return _text(sub_agent_stopped(agent.name, child.run))
        return None

    async def after_agent_callback(
        self, *, agent: BaseAgent, callback_context: CallbackContext
    ) -> types.Content | None:
        child = self._agents.pop((callback_context.invocation_id, agent.name), None)
        if child is not None:
            await finish_run(child)
        return None

    # --- the model ---------------------------------------------------------------------

    async def before_model_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        bridge = self._bridge_of(callback_context)
        report = bridge.run.stopped
        if report is None:
            return None
        if bridge is self._bridge:
            _end(callback_context)
            text = f"fusebox stopped this run ({report.summary()}); the model was not asked again."
        else:
            # A sub-agent ends with this answer; its parent reads it and goes on.
            text = sub_agent_stopped(callback_context.agent_name, bridge.run)
        return LlmResponse(content=_text(text))

    async def after_model_callback(
        self, *, callback_context: CallbackContext, llm_response: LlmResponse
    ) -> LlmResponse | None:
        bridge = self._bridge_of(callback_context)
        if (
            llm_response.partial
            or bridge.run.stopped is not None
            or callback_context._invocation_context.live_request_queue is not None
        ):
            # A streamed fragment (its usage comes with the whole response), the guard's
            # own answer for the model of a stopped run, or live mode (where ADK calls
            # this to screen transcriptions, not once per model response).
            return None
        parts = llm_response.content.parts if llm_response.content else None
        calls = any(part.function_call is not None for part in parts or [])
        turn = bridge.run.model_turn(
            "tool_use" if calls else "end_turn", usage=_usage(llm_response)
        )
        if is_stop(await _observed(bridge, "model turn", turn)) and bridge is self._bridge:
            _end(callback_context)
        return None

    # --- the tools ---------------------------------------------------------------------

    async def before_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext
    ) -> dict[str, Any] | None:
        bridge = self._bridge_of(tool_context)
        call_id = tool_context.function_call_id or bridge.run.next_call_id()
        fields = bridge.call_fields(tool.name, tool_args)
        gate = await bridge.acall(
            bridge.run.tool_call(tool.name, tool_args, call_id=call_id, **fields)
        )
        if gate.may_run:
            # The call runs in this task: an invocation it starts (an AgentTool's) is a
            # sub-agent of this run.
            call = Call(bridge, call_id, tool.name)
            self._running[_key(tool_context, call_id)] = _Running(
                gate, call, self._tree.enter_call(call)
            )
            return None
        if gate.stopped and bridge is self._bridge:
            _end(tool_context)
        if gate.action is Action.USE_COMPLETED_RESULT:
            stored = gate.completed_result
            return stored if isinstance(stored, dict) else {"result": stored}
        return {"error": gate.model_text or f"fusebox refused {tool.name}."}

    async def after_tool_callback(
        self,
        *,
        tool: BaseTool,
        tool_args: dict[str, Any],
        tool_context: ToolContext,
        result: Any,
    ) -> dict[str, Any] | None:
        # `result` is the tool's own return value, whatever its type: ADK 2.13 declares
        # a dict but hands a string, a list or None over unchanged (issue 49).
        call_id = tool_context.function_call_id or ""
        running = self._running.pop(_key(tool_context, call_id), None)
        if running is None:
            return None  # answered by the guard: no result of a tool that did not run
        self._tree.leave_call(running.token)
        bridge, gate = running.call.bridge, running.gate
        child = running.call.stopped_child()
        if child is not None:
            # A sub-agent the guard stopped: that is the call's result.
            text = sub_agent_stopped(child.run.agent, child.run)
            await _failed(bridge, call_id, tool.name, text, code="sub_agent_stopped")
            return {"error": text}
        reported = bridge.run.tool_result(call_id, tool.name, output=jsonable(result))
        stop = is_stop(await _observed(bridge, f"result of {tool.name}", reported))
        if stop and bridge is self._bridge:
            _end(tool_context)
        if gate.warning:
            return _warned(tool, result, gate.warning)
        return None

    async def on_tool_error_callback(
        self,
        *,
        tool: BaseTool,
        tool_args: dict[str, Any],
        tool_context: ToolContext,
        error: Exception,
    ) -> dict[str, Any] | None:
        call_id = tool_context.function_call_id or ""
        running = self._running.pop(_key(tool_context, call_id), None)
        if running is None:
            return None
        self._tree.leave_call(running.token)
        if isinstance(error, asyncio.CancelledError):
            return None
        await _failed(running.call.bridge, call_id, tool.name, f"{type(error).__name__}: {error}")
        return None  # the error goes on as ADK handles it


@dataclass
class _Running:
    """A call the gate let run: its gate, and the sub-agents it starts."""

    gate: Gate
    call: Call
    token: Token[Call | None]


def _warned(tool: BaseTool, result: Any, warning: str) -> dict[str, Any] | None:
    """A warned call's result with the warning beside it, in a shape ADK accepts: a dict
    gets the `fusebox_warning` field; any other value (a string, a list, None) is
    wrapped the way ADK itself hands a non-dict result to the model, `{"result":
    value}`, with the field beside it, so the model reads the same value plus the
    warning. A long-running or deferring tool (an `AgentTool`) that returned nothing
    is answered later by ADK: a dict now would answer it early, so its result is left
    alone and the warning is not delivered there (the next gate still counts)."""
    if isinstance(result, dict):
        return {**result, "fusebox_warning": warning}
    if not result and (tool.is_long_running or tool._defers_response):
        return None
    return {"result": result, "fusebox_warning": warning}


def _key(context: ToolContext, call_id: str) -> tuple[str, str, str]:
    return (context.invocation_id, context.agent_name, call_id)


async def _observed(bridge: Bridge, what: str, reported: Any) -> Decision | None:
    try:
        decision: Decision | None = await bridge.acall(reported)
        return decision
    except FuseboxError as err:
        report_failed(what, err)
        return None


async def _failed(
    bridge: Bridge, call_id: str, tool: str, error: str, *, code: str = "tool_error"
) -> None:
    """A call that failed: RETRYABLE with no wait, so repetition counts and an
    edit-and-retry is not refused."""
    reported = bridge.run.tool_result(
        call_id, tool, ResultKind.RETRYABLE, code=code, retry_after_ms=0, output=error
    )
    await _observed(bridge, f"error of {tool}", reported)


def _text(text: str) -> types.Content:
    return types.Content(role="model", parts=[types.Part(text=text)])


def _end(context: CallbackContext | ToolContext) -> None:
    """Ends the invocation after this step: ADK's own flag, which its flow checks before
    every model call (reached through the context: `get_invocation_context()` hands out
    a copy, on which the flag would be lost)."""
    context._invocation_context.end_invocation = True


def _usage(response: LlmResponse) -> Usage | None:
    meta = response.usage_metadata
    if meta is None:
        return None
    cached = meta.cached_content_token_count or 0
    # Gemini's prompt count includes the cached tokens; the contract sums them apart.
    # Thinking tokens are output the model is billed for.
    return Usage(
        input_tokens=max((meta.prompt_token_count or 0) - cached, 0),
        output_tokens=(meta.candidates_token_count or 0) + (meta.thoughts_token_count or 0),
        cache_read_input_tokens=cached or None,
    )


__all__ = ["FuseboxPlugin"]
