"""Strands Agents (`strands-agents` 1.62): every tool call of an agent gated by fuseboxd,
as a hook provider.

    guard = FuseboxHooks(run)            # or: FuseboxHooks(await session_run(fb, session_id))
    agent = Agent(model=model, tools=[search], hooks=[guard])
    result = await guard.invoke_async(agent, "find the weather")   # or guard.invoke(agent, ...)
    # RunStopped on a stop, with the agent's messages in `.history`

- `BeforeToolCallEvent` asks the gate. A call that may not run is cancelled with the
  guard's words as its result (`cancel_tool`: an error tool result the model reads);
  `use_completed_result` is answered with the stored result as a success
  (`AfterToolCallEvent.result` is writable); `stop` answers the same way and cancels
  the invocation after the current tool batch (`agent.cancel(after_current_tools=True)`
  with the stop as the final assistant message, `stop_reason="cancelled"`). Parallel
  calls are each gated; once the run is stopped the rest are refused without a round
  trip.
- `AfterToolCallEvent` reports the result (its content blocks as they are), or the
  tool's error (RETRYABLE, no wait). A `warn` adds the message as one more text block,
  so the tool's own blocks (text, JSON, images) keep their shape.
- `AfterModelCallEvent`: each model response → `model_turn` with its usage (from the
  message's metadata); a stop answered there (a budget) cancels the invocation.
  `BeforeModelCallEvent` / `BeforeInvocationEvent`: a run stopped meanwhile (`fusebox
  cancel`, the kill switch, a resumed session whose run was stopped) is answered for
  the model, which is not asked again.
- `AfterInvocationEvent`: the invocation ended → `run_finished` (completed, or failed
  with the error it ended with), unless `finish=False` (a conversation that goes on in
  the same run: close it with `run.finish()`).

Sub-agents ("agents as tools"): an agent invoked inside a guarded tool call (the tool
calls `other_agent(...)` or `await other_agent.invoke_async(...)`, the other agent
carrying the same hook provider) is a child run of the run that made the call: its
calls, turns and stop are its own and count in the parent's budgets; it is closed when
its invocation ends. A stopped sub-agent is cancelled the same way, and the call that
ran it answers the parent with the stop (which sub-agent, why, what to do instead) as
an error result; one the caps refuse does not run (its invocation is cancelled at
`BeforeInvocationEvent`) and answers the same way. A sub-agent without the hook provider
is not guarded. Multi-agent orchestrators (`Swarm`, `Graph`) are not told apart: agents
that carry the provider report to the run they were given.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping
from contextvars import Token
from dataclasses import dataclass
from typing import Any

from strands import Agent
from strands.agent.agent_result import AgentResult
from strands.hooks import (
    AfterInvocationEvent,
    AfterModelCallEvent,
    AfterToolCallEvent,
    BeforeInvocationEvent,
    BeforeModelCallEvent,
    BeforeToolCallEvent,
    HookProvider,
    HookRegistry,
)
from strands.types.tools import ToolResult, ToolResultContent

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
    finish_run_sync,
    is_stop,
    jsonable,
    report_failed,
    start_sub_agent,
    sub_agent_stopped,
)


@dataclass
class _Running:
    """A call the gate let run: its gate (for a warning) and the token of its `Call`."""

    gate: Gate
    call: Call
    token: Token[Call | None]


class FuseboxHooks(HookProvider):
    """The hook provider that puts one `Run` behind fuseboxd."""

    def __init__(
        self,
        run: Run | SyncRun,
        *,
        op_key: OpKeyFn | None = None,
        effects: Mapping[str, Effect | str] | None = None,
        finish: bool = True,
    ) -> None:
        self._bridge = Bridge(run, op_key=op_key, effects=effects)
        self._tree = Tree(self._bridge)
        self.finish = finish
        #: The child run of each agent invoked inside a guarded call (a sub-agent), by
        #: the agent object: every event names its agent, whatever task it runs in.
        self._agents: dict[int, Bridge] = {}
        #: The calls the gate let run, by (agent, tool use id).
        self._running: dict[tuple[int, str], _Running] = {}
        #: The calls answered by the guard with a stored result, by (agent, tool use id).
        self._completed: dict[tuple[int, str], Any] = {}

    @property
    def run(self) -> Run:
        return self._bridge.run

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeInvocationEvent, self._before_invocation)
        registry.add_callback(AfterInvocationEvent, self._after_invocation)
        registry.add_callback(BeforeModelCallEvent, self._before_model)
        registry.add_callback(AfterModelCallEvent, self._after_model)
        registry.add_callback(BeforeToolCallEvent, self._before_tool)
        registry.add_callback(AfterToolCallEvent, self._after_tool)

    # --- entry points ------------------------------------------------------------------

    async def invoke_async(self, agent: Agent, prompt: Any = None, **kwargs: Any) -> AgentResult:
        """`await agent.invoke_async(...)`; `RunStopped` (its `history`: the agent's
        messages) when the guard stopped the run. The run is closed as the invocation
        ended (failed with the error's text when it raised)."""
        try:
            result = await agent.invoke_async(prompt, **kwargs)
        except (Exception, asyncio.CancelledError) as err:
            if self.finish:
                await finish_run(self._bridge, err)
            raise
        self._raise_if_stopped(agent)
        return result

    def invoke(self, agent: Agent, prompt: Any = None, **kwargs: Any) -> AgentResult:
        """`agent(...)` (Strands' sync entry point, its own loop thread), the same way."""
        try:
            result = agent(prompt, **kwargs)
        except Exception as err:
            if self.finish:
                finish_run_sync(self._bridge, err)
            raise
        self._raise_if_stopped(agent)
        return result

    def _raise_if_stopped(self, agent: Agent) -> None:
        stopped = self.run.stop_decision
        if stopped is not None:
            raise RunStopped(stopped.report, stopped, history=list(agent.messages))

    # --- which run ---------------------------------------------------------------------

    def _bridge_of(self, agent: Any) -> Bridge:
        return self._agents.get(id(agent), self._bridge)

    # --- the invocation ----------------------------------------------------------------

    async def _before_invocation(self, event: BeforeInvocationEvent) -> None:
        agent = event.agent
        call = self._tree.calling
        if call is not None and id(agent) not in self._agents:
            # Invoked inside a guarded call: a sub-agent, its own child run.
            child = await start_sub_agent(call.bridge, getattr(agent, "name", None))
            call.children.append(child)
            self._agents[id(agent)] = child
        bridge = self._bridge_of(agent)
        if bridge.run.stopped is not None:
            # Stopped before it began (a cap, a resumed session's kept stop): the model is
            # not asked; the invocation ends with why.
            event.cancel = self._stopped_text(bridge, agent)

    async def _after_invocation(self, event: AfterInvocationEvent) -> None:
        agent = event.agent
        child = self._agents.pop(id(agent), None)
        error: BaseException | None = None
        if event.result is None:
            # Strands calls this from the `finally` its error propagates through, so the
            # error is the one being handled (the run is closed with its own text).
            error = sys.exc_info()[1] or _NoResult()
        if child is not None:
            await finish_run(child, error)
        elif self.finish:
            await finish_run(self._bridge, error)

    def _stopped_text(self, bridge: Bridge, agent: Any) -> str:
        if bridge is self._bridge:
            report = bridge.run.stopped
            what = report.summary() if report is not None else "stopped"
            return f"fusebox stopped this run ({what}); the model was not asked again."
        return sub_agent_stopped(getattr(agent, "name", None), bridge.run)

    # --- the model ---------------------------------------------------------------------

    async def _before_model(self, event: BeforeModelCallEvent) -> None:
        bridge = self._bridge_of(event.agent)
        if bridge.run.stopped is not None:
            event.cancel = self._stopped_text(bridge, event.agent)

    async def _after_model(self, event: AfterModelCallEvent) -> None:
        agent = event.agent
        bridge = self._bridge_of(agent)
        response = event.stop_response
        if response is None or bridge.run.stopped is not None:
            # A failed model call (the invocation's error says it), or the guard's own
            # answer for the model of a stopped run.
            return
        calls = any("toolUse" in block for block in response.message.get("content", []))
        usage = _usage(response.message)
        turn = bridge.run.model_turn("tool_use" if calls else "end_turn", usage=usage)
        if is_stop(await _observed(bridge, "model turn", turn)):
            _cancel(agent, self._stopped_text(bridge, agent))

    # --- the tools ---------------------------------------------------------------------

    async def _before_tool(self, event: BeforeToolCallEvent) -> None:
        agent, use = event.agent, event.tool_use
        bridge = self._bridge_of(agent)
        tool, call_id = use["name"], use["toolUseId"]
        args = use.get("input") or {}
        gate = await bridge.acall(
            bridge.run.tool_call(tool, args, call_id=call_id, **bridge.call_fields(tool, args))
        )
        if gate.may_run:
            # The tool runs in this task (a sync tool in a thread with a copy of this
            # context): an agent it invokes is a sub-agent of this run.
            call = Call(bridge, call_id, tool)
            self._running[(id(agent), call_id)] = _Running(gate, call, self._tree.enter_call(call))
            return
        if gate.action is Action.USE_COMPLETED_RESULT:
            # Cancelled here, answered as a success in `_after_tool`.
            self._completed[(id(agent), call_id)] = gate.completed_result
        elif gate.stopped:
            _cancel(agent, self._stopped_text(bridge, agent))
        event.cancel_tool = gate.model_text or f"fusebox refused {tool}."

    async def _after_tool(self, event: AfterToolCallEvent) -> None:
        agent, use = event.agent, event.tool_use
        key = (id(agent), use["toolUseId"])
        if key in self._completed:
            stored = self._completed.pop(key)
            event.result = _result(use["toolUseId"], "success", [_content(stored)])
            return
        running = self._running.pop(key, None)
        if running is None:
            return  # answered by the guard: no result of a tool that did not run
        self._tree.leave_call(running.token)
        bridge, gate = running.call.bridge, running.gate
        call_id, tool = use["toolUseId"], use["name"]
        child = running.call.stopped_child()
        if child is not None:
            # A sub-agent the guard stopped: that is the call's result, whatever the tool
            # made of the sub-agent's cancelled answer.
            text = sub_agent_stopped(child.run.agent, child.run)
            await _failed(bridge, call_id, tool, text, code="sub_agent_stopped")
            event.result = _result(call_id, "error", [{"text": text}])
            return
        result = event.result
        content = list(result.get("content", []))
        if event.exception is not None or result.get("status") == "error":
            error = _text_of(content) or f"{type(event.exception).__name__}: {event.exception}"
            await _failed(bridge, call_id, tool, error)
        else:
            reported = bridge.run.tool_result(call_id, tool, output=_output(content))
            if is_stop(await _observed(bridge, f"result of {tool}", reported)):
                _cancel(agent, self._stopped_text(bridge, agent))
        if gate.warning:
            # One more block: the tool's own blocks stay as they are (issue 49).
            warned: list[ToolResultContent] = [
                *content,
                {"text": f"[fusebox warning] {gate.warning}"},
            ]
            event.result = _result(call_id, result["status"], warned)


class _NoResult(Exception):
    """An invocation that ended without a result (its error propagates to the caller)."""

    def __init__(self) -> None:
        super().__init__("the invocation ended without a result")


def _cancel(agent: Any, text: str) -> None:
    """Ends the invocation after the current tool batch, with `text` as its final
    assistant message: the tools already asked for are each answered (the refused ones
    by the guard, without a round trip), so no call id is left without a result."""
    agent.cancel(message=text, after_current_tools=True)


def _usage(message: Any) -> Usage | None:
    """The response's usage, which Strands attaches to the message before the hook."""
    usage = (message.get("metadata") or {}).get("usage")
    if not usage:
        return None
    cache_read = int(usage.get("cacheReadInputTokens") or 0)
    cache_write = int(usage.get("cacheWriteInputTokens") or 0)
    # Strands (Bedrock's convention) counts cached input apart already, as the contract.
    return Usage(
        input_tokens=int(usage.get("inputTokens") or 0),
        output_tokens=int(usage.get("outputTokens") or 0),
        cache_read_input_tokens=cache_read or None,
        cache_creation_input_tokens=cache_write or None,
    )


def _result(call_id: str, status: Any, content: list[ToolResultContent]) -> ToolResult:
    return {"toolUseId": call_id, "status": status, "content": content}


def _content(value: Any) -> ToolResultContent:
    """A stored result as the model reads it: text as text, anything else as JSON."""
    if isinstance(value, str):
        return {"text": value}
    return {"json": jsonable(value)}


def _text_of(content: list[ToolResultContent]) -> str:
    return "\n".join(str(block["text"]) for block in content if "text" in block)


def _output(content: list[ToolResultContent]) -> Any:
    """A result's content blocks as the output the guard fingerprints: a single text
    block that is JSON (how Strands returns a dict, a list or None) as that value, else
    each block's text or JSON."""
    if len(content) == 1 and "text" in content[0]:
        text = str(content[0]["text"])
        try:
            return json.loads(text)
        except ValueError:
            return text
    return [
        block.get("text", jsonable(block.get("json")))
        if ("text" in block or "json" in block)
        else sorted(block)
        for block in content
    ]


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


__all__ = ["FuseboxHooks"]
