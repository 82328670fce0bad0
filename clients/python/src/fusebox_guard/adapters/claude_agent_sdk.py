"""Claude Agent SDK (`claude-agent-sdk` 0.2.184): every tool call of the agent — built-in
tools, MCP tools, in-process SDK tools — gated by fuseboxd through the SDK's hooks.

    guard = ClaudeAgentGuard(run)
    async with ClaudeSDKClient(guard.protect(ClaudeAgentOptions(...))) as client:
        guard.attach(client)
        await client.query("fix the failing test")
        async for message in client.receive_response():
            await guard.observe(message)
    guard.run.raise_if_stopped()

or, in one call, `await guard.run_agent("fix the failing test", options)` (raises
`RunStopped` when the guard ended the run).

- `PreToolUse`: asks the gate. `block` / `use_completed_result` deny the call with the
  guard's message (or the stored result) as the reason, which is what the model reads
  as the call's tool result, so its id is answered; `warn` lets it run with the message
  added as context; `stop` denies it *and* answers `continue: false` (the session ends;
  `continue: false` alone would let this call's tool run first), and interrupts the
  client as a backstop.
- `PostToolUse` / `PostToolUseFailure`: the result (a failed tool is RETRYABLE with no
  wait: an error, repetition counts, an edit-and-retry is not refused); a `stop` answer
  ends the session the same way (`continue: false` + interrupt: the SDK has been seen
  to ignore `continue: false` from PostToolUse).
- `PreCompact`: `compaction`.
- `run_agent` closes the run as the agent ends: `run_finished` completed on a result,
  failed (with the error) on an exception or an error result that is not the guard's
  own stop.
- `observe(message)`: each model response's usage → `model_turn`; each result message's
  cost since the previous one → a `model_turn` carrying `cost_usd`. A stop learned there
  (a budget, or `fusebox cancel` on the kill switch) interrupts the client.

A hook that errors or outlives its timeout is discarded by the SDK and the tool runs
(fail-open). So the guard answers within its own deadline (`deadline_s`, below the
hook's timeout, which `protect` sets), denies when the guard is silent (unless the run's
`gate_on_error` is `allow`), and its PreToolUse matcher has `on_failure="block"`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any, cast

from claude_agent_sdk import (
    AssistantMessage,
    ClaudeAgentOptions,
    ClaudeSDKClient,
    HookContext,
    HookMatcher,
    ResultMessage,
)
from claude_agent_sdk.types import HookCallback, HookEvent, HookInput, HookJSONOutput

from ..errors import FuseboxError, GateTimeout
from ..gate import Gate
from ..run import Run
from ..sync import SyncRun
from ..types import Decision, Effect, ResultKind, Usage
from ._common import Bridge, OpKeyFn, finish_run, is_stop, jsonable, log, report_failed

#: How much longer the SDK waits for a hook than the guard's own deadline: room for the
#: answer to travel back before the SDK would give up and run the tool.
HOOK_TIMEOUT_MARGIN_S = 5.0


class ClaudeAgentGuard:
    """The hooks that put one `Run` behind fuseboxd, and the client they stop."""

    def __init__(
        self,
        run: Run | SyncRun,
        *,
        deadline_s: float | None = None,
        op_key: OpKeyFn | None = None,
        effects: Mapping[str, Effect | str] | None = None,
    ) -> None:
        """`deadline_s`: the longest a hook waits for the guard before it denies (or,
        under `gate_on_error=allow`, lets the call run); default the run's own request
        timeout plus half a second."""
        self._bridge = Bridge(run, op_key=op_key, effects=effects)
        self.deadline_s = deadline_s if deadline_s is not None else self.run.timeout_s + 0.5
        self._client: ClaudeSDKClient | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._interrupted = False
        self._turns_seen: set[str] = set()
        self._cost_reported = 0.0

    @property
    def run(self) -> Run:
        return self._bridge.run

    @property
    def hook_timeout_s(self) -> float:
        return self.deadline_s + HOOK_TIMEOUT_MARGIN_S

    # --- wiring ----------------------------------------------------------------------

    def hooks(self) -> dict[HookEvent, list[HookMatcher]]:
        """The hook matchers, for `ClaudeAgentOptions(hooks=…)`."""
        timeout = self.hook_timeout_s

        def matcher(callback: HookCallback, *, block_on_failure: bool = False) -> HookMatcher:
            return HookMatcher(
                matcher=None,
                hooks=[callback],
                timeout=timeout,
                on_failure="block" if block_on_failure else None,
            )

        return {
            "PreToolUse": [matcher(self._pre_tool_use, block_on_failure=True)],
            "PostToolUse": [matcher(self._post_tool_use)],
            "PostToolUseFailure": [matcher(self._post_tool_use)],
            "PreCompact": [matcher(self._pre_compact)],
        }

    def protect(self, options: ClaudeAgentOptions) -> ClaudeAgentOptions:
        """A copy of `options` with the guard's hooks added (before the user's own)."""
        merged: dict[HookEvent, list[HookMatcher]] = {
            event: list(matchers) for event, matchers in (options.hooks or {}).items()
        }
        for event, matchers in self.hooks().items():
            merged[event] = [*matchers, *merged.get(event, [])]
        return dataclasses.replace(options, hooks=merged)

    def attach(self, client: ClaudeSDKClient) -> None:
        """The client to interrupt on a stop; also interrupts it when the run's kill
        switch fires between tool calls (`fusebox cancel`, a budget)."""
        self._client = client
        self._interrupted = False
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch_stop())

    async def detach(self) -> None:
        self._client = None
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None

    async def run_agent(
        self, prompt: str, options: ClaudeAgentOptions, *, finish: bool = True
    ) -> ResultMessage | None:
        """Runs `prompt` to its result with the guard in place; raises `RunStopped` when
        the guard ended the run. Returns the result message. The run is closed as the
        agent ends (`run_finished`: completed, or failed with the error or the result's
        error) unless `finish=False` (more queries to come in the same run)."""
        result: ResultMessage | None = None
        try:
            async with ClaudeSDKClient(self.protect(options)) as client:
                self.attach(client)
                try:
                    await client.query(prompt)
                    async for message in client.receive_response():
                        await self.observe(message)
                        if isinstance(message, ResultMessage):
                            result = message
                finally:
                    await self.detach()
            self.run.raise_if_stopped()
        except Exception as err:
            if finish:
                await finish_run(self._bridge, err)
            raise
        if finish:
            failed = AgentFailed(result) if result is not None and result.is_error else None
            await finish_run(self._bridge, failed)
        return result

    # --- messages --------------------------------------------------------------------

    async def observe(self, message: Any) -> None:
        """Feeds a message of the conversation to the guard (usage, cost)."""
        decision: Decision | None = None
        try:
            if isinstance(message, AssistantMessage) and message.usage:
                turn = message.message_id or message.uuid
                if turn is None or turn not in self._turns_seen:
                    if turn is not None:
                        self._turns_seen.add(turn)
                    decision = await self._bridge.acall(
                        self.run.model_turn(
                            message.stop_reason or "tool_use", usage=_usage(message.usage)
                        )
                    )
            elif isinstance(message, ResultMessage) and message.total_cost_usd:
                spent = message.total_cost_usd - self._cost_reported
                if spent > 0:
                    self._cost_reported = message.total_cost_usd
                    decision = await self._bridge.acall(
                        self.run.model_turn(message.stop_reason or "end_turn", cost_usd=spent)
                    )
        except FuseboxError as err:
            report_failed("model_turn", err)
        if is_stop(decision) or self.run.stopped is not None:
            self._interrupt()

    # --- hooks -----------------------------------------------------------------------

    async def _pre_tool_use(
        self, hook_input: HookInput, tool_use_id: str | None, context: HookContext
    ) -> HookJSONOutput:
        data = cast(dict[str, Any], hook_input)
        tool = str(data.get("tool_name", ""))
        args = data.get("tool_input") or {}
        call_id = tool_use_id or data.get("tool_use_id") or self.run.next_call_id()
        gate = await self._ask(tool, args, str(call_id))
        if gate.may_run:
            if gate.warning:
                return _output(_pre_tool({"additionalContext": f"fusebox: {gate.warning}"}))
            if gate.error is not None:  # unguarded by choice (gate_on_error=allow)
                log.warning("fusebox: %s runs unguarded: %s", tool, gate.error)
            # Nothing: "allow" would skip the user's own permission rules.
            return {}
        reason = gate.model_text or f"fusebox refused {tool}."
        answer = _pre_tool({"permissionDecision": "deny", "permissionDecisionReason": reason})
        if gate.stopped:
            answer.update(_end(reason))
            self._interrupt()
        return _output(answer)

    async def _ask(self, tool: str, args: Any, call_id: str) -> Gate:
        asked = self.run.tool_call(
            tool, args, call_id=call_id, **self._bridge.call_fields(tool, args)
        )
        try:
            return await asyncio.wait_for(self._bridge.acall(asked), self.deadline_s)
        except asyncio.TimeoutError:
            error = GateTimeout(f"fusebox.gate.{self.run.tenant}.{self.run.id}", self.deadline_s)
            # Beyond its own deadline the guard is silent, whatever gate_on_error says:
            # the hook must answer before the SDK discards it and runs the tool anyway.
            return Gate(call_id, tool, error=error, allowed_on_error=False)

    async def _post_tool_use(
        self, hook_input: HookInput, tool_use_id: str | None, context: HookContext
    ) -> HookJSONOutput:
        data = cast(dict[str, Any], hook_input)
        event = str(data.get("hook_event_name", "PostToolUse"))
        tool = str(data.get("tool_name", ""))
        call_id = str(tool_use_id or data.get("tool_use_id") or "")
        if event == "PostToolUseFailure":
            code = "interrupted" if data.get("is_interrupt") else "tool_error"
            reported = self.run.tool_result(
                call_id,
                tool,
                ResultKind.RETRYABLE,
                code=code,
                retry_after_ms=0,
                output=jsonable(data.get("error")),
            )
        else:
            reported = self.run.tool_result(
                call_id, tool, ResultKind.SUCCESS, output=jsonable(data.get("tool_response"))
            )
        decision = await self._observed(f"result of {tool}", reported)
        if decision is None:
            return {}
        if is_stop(decision):
            self._interrupt()
            return _output(_end(_text(decision)))
        context_text = _observe_context(decision)
        if context_text is None:
            return {}
        output: dict[str, Any] = {"hookEventName": event, "additionalContext": context_text}
        return _output({"hookSpecificOutput": output})

    async def _pre_compact(
        self, hook_input: HookInput, tool_use_id: str | None, context: HookContext
    ) -> HookJSONOutput:
        data = cast(dict[str, Any], hook_input)
        trigger = str(data.get("trigger") or "compaction")
        decision = await self._observed(
            "compaction", self.run.compaction(f"claude-agent-sdk: {trigger}")
        )
        if is_stop(decision):
            assert decision is not None
            self._interrupt()
            return _output(_end(_text(decision)))
        return {}

    async def _observed(self, what: str, reported: Any) -> Decision | None:
        """An observe event, within the deadline; undelivered ones are re-sent by the run
        with its next event, and the agent goes on."""
        try:
            decision: Decision | None = await asyncio.wait_for(
                self._bridge.acall(reported), self.deadline_s
            )
            return decision
        except asyncio.TimeoutError:
            log.warning("fusebox: %s not answered within %g s", what, self.deadline_s)
        except FuseboxError as err:
            report_failed(what, err)
        return None

    # --- stopping --------------------------------------------------------------------

    def _interrupt(self) -> None:
        """The backstop behind `continue: false`: interrupt the client, once, from a task
        of its own (the CLI is waiting for this very hook's answer)."""
        client = self._client
        if client is None or self._interrupted:
            return
        self._interrupted = True

        async def interrupt() -> None:
            with contextlib.suppress(Exception):
                await client.interrupt()

        asyncio.get_running_loop().create_task(interrupt())

    async def _watch_stop(self) -> None:
        await self._bridge.acall(self.run.wait_stopped())
        if self.run.stopped is not None:
            self._interrupt()


class AgentFailed(Exception):
    """The session ended with an error result (`is_error`): how the run is closed."""

    def __init__(self, result: ResultMessage) -> None:
        errors = "; ".join(result.errors or []) if result.errors else None
        super().__init__(errors or result.result or result.subtype)
        self.result = result


def _output(answer: dict[str, Any]) -> HookJSONOutput:
    """A hook answer built as a plain dict, as the SDK's typed form."""
    return cast(HookJSONOutput, answer)


def _pre_tool(fields: dict[str, Any]) -> dict[str, Any]:
    return {"hookSpecificOutput": {"hookEventName": "PreToolUse", **fields}}


def _end(reason: str) -> dict[str, Any]:
    return {"continue_": False, "stopReason": reason, "systemMessage": reason}


def _text(decision: Decision) -> str:
    if decision.message:
        return f"fusebox: {decision.message}"
    return f"fusebox stopped this run ({decision.reason or decision.action.value})."


def _observe_context(decision: Decision) -> str | None:
    """Words for the model after a tool ran, when the guard has any (a wait, a
    warning); a `retry_after` with no wait is how a failed tool is reported and says
    nothing the model does not know."""
    if decision.action.value == "retry_after" and not decision.wait_ms:
        return None
    return f"fusebox: {decision.message}" if decision.message else None


def _usage(usage: Mapping[str, Any]) -> Usage:
    def count(key: str) -> int | None:
        value = usage.get(key)
        return int(value) if isinstance(value, int | float) else None

    return Usage(
        input_tokens=count("input_tokens"),
        output_tokens=count("output_tokens"),
        cache_creation_input_tokens=count("cache_creation_input_tokens"),
        cache_read_input_tokens=count("cache_read_input_tokens"),
    )
