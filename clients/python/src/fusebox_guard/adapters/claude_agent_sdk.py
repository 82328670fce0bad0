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

Sub-agents (`ClaudeAgentOptions(agents=...)`, started by the `Agent` tool, `Task` in
older CLIs), each a child run of the session's run (guard contract §6):

- The `Agent` call is gated as the session's call; once it may run, the sub-agent's
  child run is started (its agent: the `subagent_type`), so the caps can refuse it: the
  call is then denied with why, and the sub-agent never starts.
- The CLI gives each sub-agent an `agent_id`, and every tool hook inside it carries it
  (`PreToolUse`, `PostToolUse`, `PostToolUseFailure`), so its calls are gated and
  reported in its own run; its messages name the `Agent` call (`parent_tool_use_id`),
  so its model turns are its run's too (those the CLI streams: a foreground sub-agent's
  last turn comes only as the call's result). The `SubagentStart` hook names the
  `agent_id` but not the call: it is matched to the earliest `Agent` call of its type
  not yet started, so two sub-agents of one type started at once may swap runs.
- A sub-agent the guard stops: its call is denied with `continue: false`, which ends
  that sub-agent only (the session goes on). For a foreground sub-agent the parent's
  model reads the stop as the sub-agent's report (`PostToolUse` of the `Agent` call
  replaces the report's text; the call is reported failed). A background one's report
  reaches the parent later, as the CLI's notification, unchanged: the guard's
  `child_stopped` warning at the parent's next call tells it.
- Its run is closed when `observe` sees its task end (`TaskNotificationMessage`,
  `TaskUpdatedMessage`: after its last streamed turn), or when the session ends.
- Sub-agents do not start sub-agents in Claude Code; were one to, its run would be a
  child of the session's run (the hooks do not say which sub-agent started another).

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
    TaskNotificationMessage,
    TaskUpdatedMessage,
)
from claude_agent_sdk.types import (
    TERMINAL_TASK_STATUSES,
    HookCallback,
    HookEvent,
    HookInput,
    HookJSONOutput,
)

from ..errors import FuseboxError, GateTimeout
from ..gate import Gate
from ..run import Run
from ..sync import SyncRun
from ..types import Decision, Effect, ResultKind, Usage
from ._common import (
    Bridge,
    OpKeyFn,
    finish_run,
    is_stop,
    jsonable,
    log,
    report_failed,
    start_sub_agent,
    sub_agent_stopped,
)

#: How much longer the SDK waits for a hook than the guard's own deadline: room for the
#: answer to travel back before the SDK would give up and run the tool.
HOOK_TIMEOUT_MARGIN_S = 5.0

#: The tool that starts a sub-agent (`Task` is its older name).
SUB_AGENT_TOOLS = frozenset({"Agent", "Task"})


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
        #: Sub-agents' child runs, by the id of the call that started them (the
        #: parent's `Agent` call; their messages carry it as `parent_tool_use_id`) …
        self._by_call: dict[str, Bridge] = {}
        #: … by the agent id the CLI gives them (their hooks carry it) …
        self._by_agent: dict[str, Bridge] = {}
        #: … and, between the `Agent` call and the sub-agent's start, by agent type.
        self._starting: dict[str, list[Bridge]] = {}

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
            "SubagentStart": [matcher(self._sub_agent_start)],
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
            await self._close_sub_agents(err)
            if finish:
                await finish_run(self._bridge, err)
            raise
        failed = AgentFailed(result) if result is not None and result.is_error else None
        await self._close_sub_agents(failed)
        if finish:
            await finish_run(self._bridge, failed)
        return result

    async def _close_sub_agents(self, error: BaseException | None) -> None:
        """Sub-agents whose end was not seen when the session ended (background ones
        the CLI cut short) end with it, as unfinished."""
        unfinished = error or SubAgentEnded("unfinished when the session ended")
        for child in {id(c): c for c in self._by_call.values()}.values():
            await finish_run(child, unfinished)
        self._by_call.clear()
        self._by_agent.clear()
        self._starting.clear()

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
                    # A sub-agent's turn (its messages name the call that started it)
                    # is its own run's.
                    bridge = self._by_call.get(message.parent_tool_use_id or "", self._bridge)
                    reported = await bridge.acall(
                        bridge.run.model_turn(
                            message.stop_reason or "tool_use", usage=_usage(message.usage)
                        )
                    )
                    decision = reported if bridge is self._bridge else None
            elif isinstance(message, TaskNotificationMessage | TaskUpdatedMessage):
                await self._task_ended(message)
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

    async def _task_ended(self, message: TaskNotificationMessage | TaskUpdatedMessage) -> None:
        """A sub-agent's task reached its end: its run is closed. Read off the messages,
        not the `SubagentStop` hook, so that its last model turn, which comes before
        this in the same stream, is counted in its run first."""
        if isinstance(message, TaskNotificationMessage):
            status, call = str(message.status), message.tool_use_id
        else:
            status, call = str(message.patch.get("status") or ""), None
        if status not in TERMINAL_TASK_STATUSES:
            return
        child = self._by_call.get(call or "") or self._by_agent.get(message.task_id)
        if child is not None:
            failed = None if status == "completed" else SubAgentEnded(status)
            await finish_run(child, failed)

    # --- hooks -----------------------------------------------------------------------

    async def _pre_tool_use(
        self, hook_input: HookInput, tool_use_id: str | None, context: HookContext
    ) -> HookJSONOutput:
        data = cast(dict[str, Any], hook_input)
        tool = str(data.get("tool_name", ""))
        args = data.get("tool_input") or {}
        bridge = self._bridge_of(data)
        call_id = str(tool_use_id or data.get("tool_use_id") or bridge.run.next_call_id())
        gate = await self._ask(bridge, tool, args, call_id)
        if gate.may_run:
            if tool in SUB_AGENT_TOOLS:
                refused = await self._start_sub_agent(bridge, call_id, args)
                if refused is not None:
                    return refused
            if gate.warning:
                return _output(_pre_tool({"additionalContext": f"fusebox: {gate.warning}"}))
            if gate.error is not None:  # unguarded by choice (gate_on_error=allow)
                log.warning("fusebox: %s runs unguarded: %s", tool, gate.error)
            # Nothing: "allow" would skip the user's own permission rules.
            return {}
        reason = gate.model_text or f"fusebox refused {tool}."
        answer = _pre_tool({"permissionDecision": "deny", "permissionDecisionReason": reason})
        if gate.stopped:
            # `continue: false` from a sub-agent's hook ends that sub-agent only (its
            # parent goes on); the client is interrupted for the session's own stop.
            answer.update(_end(reason))
            if bridge is self._bridge:
                self._interrupt()
        return _output(answer)

    def _bridge_of(self, data: Mapping[str, Any]) -> Bridge:
        """A sub-agent's run for its calls (the hook input's `agent_id`), else the
        session's."""
        return self._by_agent.get(str(data.get("agent_id") or ""), self._bridge)

    async def _start_sub_agent(
        self, parent: Bridge, call_id: str, args: Any
    ) -> HookJSONOutput | None:
        """The `Agent` call the gate let run starts a sub-agent: its child run, started
        now, so the caps can refuse it before it runs (the call denied, with why)."""
        agent_type = str(args.get("subagent_type") or "general-purpose")
        try:
            child = await asyncio.wait_for(start_sub_agent(parent, agent_type), self.deadline_s)
        except asyncio.TimeoutError:
            # Its calls are still gated, in the parent's run.
            log.warning("fusebox: the run of sub-agent %s was not started in time", agent_type)
            return None
        if child.run.stopped is not None:
            text = sub_agent_stopped(agent_type, child.run)
            await self._observed(
                f"result of {call_id}",
                parent.run.tool_result(
                    call_id,
                    "Agent",
                    ResultKind.RETRYABLE,
                    code="sub_agent_stopped",
                    retry_after_ms=0,
                    output=text,
                ),
            )
            return _output(
                _pre_tool({"permissionDecision": "deny", "permissionDecisionReason": text})
            )
        self._by_call[call_id] = child
        self._starting.setdefault(agent_type, []).append(child)
        return None

    async def _sub_agent_start(
        self, hook_input: HookInput, tool_use_id: str | None, context: HookContext
    ) -> HookJSONOutput:
        """The CLI names the sub-agent it starts (`agent_id`): the child run of the
        `Agent` call of its type that came first. The CLI does not say which call
        started it, so two sub-agents of one type started at once may swap runs."""
        data = cast(dict[str, Any], hook_input)
        waiting = self._starting.get(str(data.get("agent_type") or ""))
        if waiting:
            self._by_agent[str(data.get("agent_id"))] = waiting.pop(0)
        return {}

    async def _ask(self, bridge: Bridge, tool: str, args: Any, call_id: str) -> Gate:
        asked = bridge.run.tool_call(tool, args, call_id=call_id, **bridge.call_fields(tool, args))
        try:
            return await asyncio.wait_for(bridge.acall(asked), self.deadline_s)
        except asyncio.TimeoutError:
            run = bridge.run
            error = GateTimeout(f"fusebox.gate.{run.tenant}.{run.id}", self.deadline_s)
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
        bridge = self._bridge_of(data)
        child = self._by_call.get(call_id) if tool in SUB_AGENT_TOOLS else None
        if child is not None and child.stopped_by_guard:
            return await self._sub_agent_stopped(bridge, call_id, tool, child, data)
        if event == "PostToolUseFailure":
            code = "interrupted" if data.get("is_interrupt") else "tool_error"
            reported = bridge.run.tool_result(
                call_id,
                tool,
                ResultKind.RETRYABLE,
                code=code,
                retry_after_ms=0,
                output=jsonable(data.get("error")),
            )
        else:
            reported = bridge.run.tool_result(
                call_id, tool, ResultKind.SUCCESS, output=jsonable(data.get("tool_response"))
            )
        decision = await self._observed(f"result of {tool}", reported)
        if decision is None:
            return {}
        if is_stop(decision):
            if bridge is self._bridge:
                self._interrupt()
            return _output(_end(_text(decision)))
        context_text = _observe_context(decision)
        if context_text is None:
            return {}
        output: dict[str, Any] = {"hookEventName": event, "additionalContext": context_text}
        return _output({"hookSpecificOutput": output})

    async def _sub_agent_stopped(
        self, parent: Bridge, call_id: str, tool: str, child: Bridge, data: Mapping[str, Any]
    ) -> HookJSONOutput:
        """The `Agent` call whose sub-agent the guard stopped: what the parent's model
        reads as the sub-agent's report is the stop (`updatedToolOutput`, the call's
        own output with its text replaced; the context says it too, should a CLI refuse
        that shape), and the call is reported failed."""
        text = sub_agent_stopped(child.run.agent, child.run)
        await self._observed(
            f"result of {tool}",
            parent.run.tool_result(
                call_id,
                tool,
                ResultKind.RETRYABLE,
                code="sub_agent_stopped",
                retry_after_ms=0,
                output=text,
            ),
        )
        output: dict[str, Any] = {"hookEventName": "PostToolUse", "additionalContext": text}
        response = data.get("tool_response")
        if isinstance(response, dict):
            output["updatedToolOutput"] = {**response, "content": [{"type": "text", "text": text}]}
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


class SubAgentEnded(Exception):
    """How a sub-agent's run is closed when its task ended otherwise than completed."""

    def __init__(self, status: str) -> None:
        super().__init__(f"the sub-agent's task ended {status}")


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
