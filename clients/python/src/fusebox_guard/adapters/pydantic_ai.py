"""Pydantic AI (`pydantic-ai-slim` 2.66): every function tool call of an agent gated by
fuseboxd, as a capability.

    guard = FuseboxCapability(run)
    agent = Agent(model, tools=[search], capabilities=[guard])
    result = await guard.run_agent(agent, "find the weather")   # or guard.run_agent_sync(...)
    # RunStopped on a stop, with the conversation so far in `.history`

- `wrap_tool_execute` asks the gate before the tool runs. `block` (and the guard
  unreachable, unless `gate_on_error=allow`) answers the call with the guard's message
  as a failed tool result (`ToolFailed`: the model reads it, the tool's retry budget is
  not spent); `use_completed_result` returns the stored result; `warn` runs the tool
  and adds the message to what the model reads (after a plain result's text; beside a
  `ToolReturn`, an image or a model, as a `ToolReturn`'s content, their form kept);
  `stop` answers the call the same way and cancels the run (`ctx.cancel()`: what
  completed stays in its history). Parallel calls are each gated; once the run is
  stopped the rest are refused without a round trip.
- The tool's result, or its error (RETRYABLE, no wait), is reported as `tool_result`.
- `after_model_request`: each model response's usage → `model_turn`; a stop answered
  there (a budget) cancels the run before its tools run. `before_model_request`: a run
  stopped meanwhile (`fusebox cancel`, the kill switch) is cancelled before the model
  is asked again.
- `wrap_run`: a run that ends is closed (`run_finished`: completed, or failed with the
  error, a cancellation too) unless `finish=False` (a conversation that goes on in the
  same fusebox run). `run_agent` / `run_agent_sync` are `agent.run` / `agent.run_sync`
  with the guard's cancellation raised as `RunStopped`; called directly, `agent.run`
  raises Pydantic AI's `RunCancelled` on a stop (the same history in `all_messages()`).

Sub-agents (agent delegation): an agent run inside a guarded tool call — the tool
awaits `other_agent.run(...)`, and the other agent carries the same capability — is a
child run of the run that made the call (`wrap_run` sees the call in a context
variable): its calls, model turns and stop are its own, and count in the parent's
budgets. It is closed as it ends. A sub-agent the guard stops is cancelled the same way
(`RunCancelled` out of its `agent.run`), and the tool call that ran it fails with the
stop as its result (`ToolFailed`: which sub-agent, why, what to do instead), so the
parent goes on; one the caps refuse (`max_children`, `max_open_children`, `max_depth`)
does not run at all and answers the same way. A delegated agent without the capability
is not guarded.

Output tools (the run's final answer) are the framework's own and are not gated.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any

from pydantic_ai import Agent, ModelMessage, ModelResponse, RunContext, ToolCallPart, ToolDefinition
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import (
    ValidatedToolArgs,
    WrapRunHandler,
    WrapToolExecuteHandler,
)
from pydantic_ai.exceptions import ModelRetry, RunCancelled, ToolFailed
from pydantic_ai.messages import ModelRequest, ModelRequestPart, ToolReturn, ToolReturnPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.run import AgentRunResult
from pydantic_core import to_jsonable_python

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


@dataclass
class FuseboxCapability(AbstractCapability[Any]):
    """The capability that puts one `Run` behind fuseboxd."""

    run_handle: Run | SyncRun
    _: KW_ONLY
    op_key: OpKeyFn | None = None
    effects: Mapping[str, Effect | str] | None = None
    #: Close the run (`run_finished`) when the agent run ends.
    finish: bool = True
    id: str | None = "fusebox"
    _bridge: Bridge = field(init=False, repr=False)
    _tree: Tree = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._bridge = Bridge(self.run_handle, op_key=self.op_key, effects=self.effects)
        self._tree = Tree(self._bridge)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        # Holds a live connection: not something an agent spec can name.
        return None

    @property
    def run(self) -> Run:
        return self._bridge.run

    # --- the run -----------------------------------------------------------------------

    async def run_agent(
        self, agent: Agent[Any, Any], *args: Any, **kwargs: Any
    ) -> AgentRunResult[Any]:
        """`await agent.run(...)` with the guard's stop as `RunStopped` (its `history`:
        the messages so far); `agent.run` itself raises Pydantic AI's `RunCancelled`."""
        try:
            return await agent.run(*args, **kwargs)
        except RunCancelled as err:
            stop = self._stop_of(err)
            if stop is None:
                raise
            raise stop from None

    def run_agent_sync(
        self, agent: Agent[Any, Any], *args: Any, **kwargs: Any
    ) -> AgentRunResult[Any]:
        """`agent.run_sync(...)`, the same way."""
        try:
            return agent.run_sync(*args, **kwargs)
        except RunCancelled as err:
            stop = self._stop_of(err)
            if stop is None:
                raise
            raise stop from None

    def _stop_of(self, err: RunCancelled) -> RunStopped | None:
        """The guard's stop behind a cancellation (None: someone else cancelled)."""
        stopped = self.run.stop_decision
        if stopped is None:
            return None
        return RunStopped(stopped.report, stopped, history=_answered(err.all_messages(), stopped))

    async def wrap_run(
        self, ctx: RunContext[Any], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        """Closes the run as the agent run ends (the guard's own stop closed it already).
        An agent run inside a guarded tool call is a sub-agent: its own child run."""
        call = self._tree.calling
        if call is not None:
            return await self._sub_agent(ctx, call, handler)
        try:
            result = await handler()
        except (Exception, asyncio.CancelledError) as err:
            if self.finish:
                await finish_run(self._bridge, err)
            raise
        if self.finish:
            await finish_run(self._bridge)
        return result

    async def _sub_agent(
        self, ctx: RunContext[Any], call: Call, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        """Runs a delegated agent as a child run of the call's run, and closes it as it
        ends. A child the caps refused does not run: `RunStopped` out of its `agent.run`,
        which the parent's call answers as the sub-agent's result."""
        child = await start_sub_agent(call.bridge, ctx.agent.name if ctx.agent else None)
        call.children.append(child)
        stopped = child.run.stop_decision
        if stopped is not None:
            raise RunStopped(stopped.report, stopped)
        with self._tree.in_run(child):
            try:
                result = await handler()
            except (Exception, asyncio.CancelledError) as err:
                await finish_run(child, err)
                raise
        await finish_run(child)
        return result

    # --- the model ---------------------------------------------------------------------

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        if self._tree.current.run.stopped is not None:
            ctx.cancel()
        return request_context

    async def after_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        response: ModelResponse,
    ) -> ModelResponse:
        calls = any(isinstance(part, ToolCallPart) for part in response.parts)
        bridge = self._tree.current
        try:
            decision = await bridge.acall(
                bridge.run.model_turn("tool_use" if calls else "end_turn", usage=_usage(response))
            )
        except FuseboxError as err:
            report_failed("model turn", err)
            decision = None
        if is_stop(decision):
            ctx.cancel()
        return response

    # --- the tools ---------------------------------------------------------------------

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        tool, call_id = call.tool_name, call.tool_call_id
        bridge = self._tree.current
        gate = await bridge.acall(
            bridge.run.tool_call(tool, args, call_id=call_id, **bridge.call_fields(tool, args))
        )
        if not gate.may_run:
            return _refused(ctx, gate)
        running = Call(bridge, call_id, tool)
        try:
            with self._tree.in_call(running):
                result = await handler(args)
        except (ModelRetry, ToolFailed) as err:
            if running.stopped_child() is None:
                await self._report_error(bridge, call_id, tool, err.message)
                raise
        except Exception as err:
            if running.stopped_child() is None:
                await self._report_error(bridge, call_id, tool, f"{type(err).__name__}: {err}")
                raise
        child = running.stopped_child()
        if child is not None:
            # A sub-agent the guard stopped: its stop is the call's (failed) result,
            # whatever the tool made of it, and the parent goes on.
            text = sub_agent_stopped(child.run.agent, child.run)
            await self._report_error(bridge, call_id, tool, text, code="sub_agent_stopped")
            raise ToolFailed(text) from None
        try:
            decision = await bridge.acall(
                bridge.run.tool_result(call_id, tool, ResultKind.SUCCESS, output=_json(result))
            )
        except FuseboxError as err:
            report_failed(f"result of {tool} ({call_id})", err)
            decision = None
        if is_stop(decision):
            ctx.cancel()
        return _warned(gate, result) if gate.warning else result

    async def _report_error(
        self, bridge: Bridge, call_id: str, tool: str, error: str, *, code: str = "tool_error"
    ) -> None:
        """A tool that failed: RETRYABLE with no wait, so repetition counts and an
        edit-and-retry is not refused."""
        try:
            await bridge.acall(
                bridge.run.tool_result(
                    call_id,
                    tool,
                    ResultKind.RETRYABLE,
                    code=code,
                    retry_after_ms=0,
                    output=error,
                )
            )
        except FuseboxError as err:
            report_failed(f"error of {tool} ({call_id})", err)


def _warned(gate: Gate, result: Any) -> Any:
    """A warned call's result with the warning, in a form Pydantic AI takes for what the
    tool returned. Plain data (a string, a dict, a list, a number, nothing) is read as
    text: the value, then the warning. Anything else keeps its form, the warning sent
    beside it as a `ToolReturn`'s content (a user part after the result): a `ToolReturn`
    of the tool's own gets it after its content; multimodal content (an image), a
    Pydantic model and the like are the return value of one (as text, an image would
    be its repr)."""
    warning = f"[fusebox warning] {gate.warning}"
    if isinstance(result, ToolReturn):
        content = result.content
        beside: list[Any] = (
            [] if content is None else [content] if isinstance(content, str) else list(content)
        )
        return replace(result, content=[*beside, warning])
    if _plain(result):
        return gate.reads(result)
    return ToolReturn(return_value=result, content=warning)


def _plain(value: Any) -> bool:
    """JSON's own values, all the way down: what text renders without loss."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return False


def _refused(ctx: RunContext[Any], gate: Gate) -> Any:
    """What a call that did not run answers: the stored result, or the guard's words as
    a failed result (a result for its call id either way)."""
    if gate.action is Action.USE_COMPLETED_RESULT:
        return gate.completed_result
    if gate.stopped:
        ctx.cancel()
    raise ToolFailed(gate.model_text or f"fusebox refused {gate.tool}.")


def _answered(history: Sequence[ModelMessage], stop: Decision) -> list[ModelMessage]:
    """The history with a result for every call of its last response: the calls the
    cancellation caught before they were answered are answered with the stop (a
    dangling call id makes the provider refuse the history when it is sent again)."""
    messages = list(history)
    last = messages[-1] if messages else None
    if not isinstance(last, ModelResponse) or not last.tool_calls:
        return messages
    parts: list[ModelRequestPart] = [
        ToolReturnPart(
            tool_name=call.tool_name,
            content=Gate(call.tool_call_id, call.tool_name, decision=stop).model_text,
            tool_call_id=call.tool_call_id,
            outcome="failed",
        )
        for call in last.tool_calls
    ]
    messages.append(ModelRequest(parts=parts))
    return messages


def _json(value: Any) -> Any:
    try:
        return to_jsonable_python(value)
    except Exception:
        return jsonable(value)


def _usage(response: ModelResponse) -> Usage:
    usage = response.usage
    cache_read, cache_write = usage.cache_read_tokens, usage.cache_write_tokens
    # Pydantic AI's input_tokens include the cached ones; the contract sums them apart.
    return Usage(
        input_tokens=max(usage.input_tokens - cache_read - cache_write, 0),
        output_tokens=usage.output_tokens,
        cache_read_input_tokens=cache_read or None,
        cache_creation_input_tokens=cache_write or None,
    )


__all__ = ["FuseboxCapability"]
