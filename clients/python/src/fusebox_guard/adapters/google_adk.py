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
- `after_tool_callback` reports the result (a `warn`'s message is added to it as
  `fusebox_warning`), `on_tool_error_callback` a tool's error (RETRYABLE, no wait).
- `after_model_callback`: each model response's usage → `model_turn` (a stop answered
  there, a budget, ends the invocation); `before_model_callback` answers for the model
  once the run is stopped (`fusebox cancel`, the kill switch), so it is not asked again.
- `after_run_callback` / `on_run_error_callback`: the invocation ended → `run_finished`
  (completed, or failed with the error), unless `finish=False` (more invocations, e.g.
  the next user message of a session, go on in the same fusebox run).

A plugin is the runner's, so every agent of a multi-agent app (sub-agents, agents as
tools) is gated by the same run.

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
from typing import Any

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
from ._common import Bridge, OpKeyFn, finish_run, is_stop, jsonable, report_failed


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
        self.finish = finish
        #: The calls the gate let run, by call id (their results are reported).
        self._running: dict[str, Gate] = {}

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

    # --- the invocation ----------------------------------------------------------------

    async def after_run_callback(self, *, invocation_context: InvocationContext) -> None:
        if self.finish:
            await finish_run(self._bridge)

    async def on_run_error_callback(
        self, *, invocation_context: InvocationContext, error: Exception
    ) -> None:
        if self.finish:
            await finish_run(self._bridge, error)

    # --- the model ---------------------------------------------------------------------

    async def before_model_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        report = self.run.stopped
        if report is None:
            return None
        _end(callback_context)
        text = f"fusebox stopped this run ({report.summary()}); the model was not asked again."
        return LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))

    async def after_model_callback(
        self, *, callback_context: CallbackContext, llm_response: LlmResponse
    ) -> LlmResponse | None:
        if (
            llm_response.partial
            or self.run.stopped is not None
            or callback_context._invocation_context.live_request_queue is not None
        ):
            # A streamed fragment (its usage comes with the whole response), the guard's
            # own answer for the model of a stopped run, or live mode (where ADK calls
            # this to screen transcriptions, not once per model response).
            return None
        parts = llm_response.content.parts if llm_response.content else None
        calls = any(part.function_call is not None for part in parts or [])
        turn = self.run.model_turn("tool_use" if calls else "end_turn", usage=_usage(llm_response))
        if is_stop(await self._observed("model turn", turn)):
            _end(callback_context)
        return None

    # --- the tools ---------------------------------------------------------------------

    async def before_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext
    ) -> dict[str, Any] | None:
        call_id = tool_context.function_call_id or self.run.next_call_id()
        fields = self._bridge.call_fields(tool.name, tool_args)
        gate = await self._bridge.acall(
            self.run.tool_call(tool.name, tool_args, call_id=call_id, **fields)
        )
        if gate.may_run:
            self._running[call_id] = gate
            return None
        if gate.stopped:
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
        result: dict[str, Any],
    ) -> dict[str, Any] | None:
        call_id = tool_context.function_call_id or ""
        gate = self._running.pop(call_id, None)
        if gate is None:
            return None  # answered by the guard: no result of a tool that did not run
        reported = self.run.tool_result(call_id, tool.name, output=jsonable(result))
        if is_stop(await self._observed(f"result of {tool.name}", reported)):
            _end(tool_context)
        if gate.warning:
            return {**result, "fusebox_warning": gate.warning}
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
        gate = self._running.pop(call_id, None)
        if gate is None or isinstance(error, asyncio.CancelledError):
            return None
        reported = self.run.tool_result(
            call_id,
            tool.name,
            ResultKind.RETRYABLE,
            code="tool_error",
            retry_after_ms=0,
            output=f"{type(error).__name__}: {error}",
        )
        await self._observed(f"error of {tool.name}", reported)
        return None  # the error goes on as ADK handles it

    async def _observed(self, what: str, reported: Any) -> Decision | None:
        try:
            decision: Decision | None = await self._bridge.acall(reported)
            return decision
        except FuseboxError as err:
            report_failed(what, err)
            return None


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
