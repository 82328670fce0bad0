"""OpenAI Agents SDK (`openai-agents` 0.24): every function tool and MCP tool of an agent
gated by fuseboxd.

    guard = OpenAIAgentsGuard(run)
    agent = guard.protect(Agent(name="researcher", tools=[search], model=...))
    result = await guard.run_agent(agent, "find the weather")   # RunStopped on a stop

- Tool input guardrail: asks the gate. `block` and `use_completed_result` answer the model
  with the guard's message or the stored result (`reject_content`: the tool does not run
  and its call id still gets an output); `stop` raises the tripwire, which ends
  `Runner.run` (the SDK cancels the sibling calls of the turn; any that still ask are
  refused by the run's latch).
- Tool output guardrail: reports the result; a `warn`'s message is added to what the
  model reads; a `stop` answer to the result ends the run the same way.
- Agent hooks (set by `protect` on every agent it reaches, around the agent's own):
  before each model call a `model_call` (the guard reserves the run's mean tokens and
  cost per turn; a call a budget of the run or of a run above it has no room for is
  refused, and the model is not called: `RunStopped`); each model response's usage →
  `model_turn`, which reconciles the reservation; a run stopped meanwhile (a `fusebox
  cancel`, a budget, an ancestor's stop) ends before the next model call. Agent hooks,
  not run hooks: a nested `Runner.run` (an agent tool's) gets no run hooks of ours.
- `run_agent` closes the run as the agent ends: `run_finished` completed on a final
  answer, failed (with the error) on an exception that is not the guard's own stop.

Sub-agents, each a child run (guard contract §6):

- `Agent.as_tool`: `protect` wraps the tool's invoker, so each call runs the agent in a
  child run of the calling agent's run (the nested `Runner.run` and its tools see it
  through a context variable). It is closed as it ends: completed on an answer, failed
  when the SDK answered the call with its failure message instead. A sub-agent the
  guard stops ends the nested run with the tripwire, and the call's output — what the
  parent's model reads — says which sub-agent was stopped, why, and what to do instead
  (reported as a failed call); one the caps refuse does not run and answers the same.
- Handoffs: the agent handed off to runs in a child run of the agent that handed off (a
  handoff back to an agent of the chain returns to its run and closes the runs after
  it); the handoff itself is no tool call. A handoff gives the conversation away for
  good, and the SDK has no way to give it back, so a stop of a handoff's run ends
  `Runner.run` as any stop does: `run_agent` raises `RunStopped` with that run's report
  (`decision.run` names it) and closes the runs above as failed (`SubAgentStopped`).
  Runs are told apart by agent name within one `Runner.run`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from agents import (
    Agent,
    AgentHookContext,
    AgentHooks,
    FunctionTool,
    RunContextWrapper,
    Runner,
    RunResult,
    Tool,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrail,
    ToolInputGuardrailData,
    ToolInputGuardrailTripwireTriggered,
    ToolOutputGuardrail,
    ToolOutputGuardrailData,
    ToolOutputGuardrailTripwireTriggered,
)
from agents.items import ModelResponse, TResponseInputItem
from agents.tool_context import ToolContext

from ..errors import FuseboxError, RunStopped
from ..gate import Gate
from ..run import Run
from ..sync import SyncRun
from ..types import Effect, ResultKind, Usage
from ._common import (
    Bridge,
    Call,
    OpKeyFn,
    finish_run,
    is_stop,
    jsonable,
    parse_args,
    report_failed,
    start_sub_agent,
    sub_agent_stopped,
)

Invoke = Callable[[ToolContext[Any], str], Awaitable[Any]]


class OpenAIAgentsGuard:
    """The guardrails and hooks that put one `Run` behind fuseboxd."""

    def __init__(
        self,
        run: Run | SyncRun,
        *,
        op_key: OpKeyFn | None = None,
        effects: Mapping[str, Effect | str] | None = None,
    ) -> None:
        self._bridge = Bridge(run, op_key=op_key, effects=effects)
        self._root = _Scope(self._bridge)
        #: The `Runner.run` the code running now belongs to: the root's, or an agent
        #: tool's (a sub-agent, with its child run).
        self._scope: ContextVar[_Scope | None] = ContextVar("fusebox_scope", default=None)
        #: The calls the gate let run, by run and call id (a sub-agent's call ids may
        #: repeat its parent's).
        self._calls: dict[tuple[str, str], _Running] = {}
        self.input_guardrail: ToolInputGuardrail[Any] = ToolInputGuardrail(
            guardrail_function=self._before_tool, name="fusebox_gate"
        )
        self.output_guardrail: ToolOutputGuardrail[Any] = ToolOutputGuardrail(
            guardrail_function=self._after_tool, name="fusebox_result"
        )

    @property
    def run(self) -> Run:
        return self._bridge.run

    @property
    def scope(self) -> _Scope:
        return self._scope.get() or self._root

    def protect(self, agent: Agent[Any]) -> Agent[Any]:
        """Attaches the guardrails to every function tool and MCP server of `agent`, of
        the agents it hands off to and of the agents it calls as tools, and the guard's
        hooks to each of those agents (around its own hooks); in place, returns
        `agent`."""
        seen: set[int] = set()
        self._protect(agent, seen)
        return agent

    def _protect(self, agent: Agent[Any], seen: set[int]) -> None:
        if id(agent) in seen:
            return
        seen.add(id(agent))
        if not isinstance(agent.hooks, _GuardHooks) or agent.hooks.guard is not self:
            agent.hooks = _GuardHooks(self, agent.hooks)
        for tool in agent.tools:
            if isinstance(tool, FunctionTool):
                tool.tool_input_guardrails = _with(tool.tool_input_guardrails, self.input_guardrail)
                tool.tool_output_guardrails = _with(
                    tool.tool_output_guardrails, self.output_guardrail
                )
                sub_agent = _agent_of(tool)
                if sub_agent is not None:
                    self._protect(sub_agent, seen)
                    if not isinstance(tool.on_invoke_tool, _SubAgentInvoke):
                        tool.on_invoke_tool = _SubAgentInvoke(self, sub_agent, tool.on_invoke_tool)
        for server in agent.mcp_servers:
            server.tool_input_guardrails = _with(server.tool_input_guardrails, self.input_guardrail)
            server.tool_output_guardrails = _with(
                server.tool_output_guardrails, self.output_guardrail
            )
        for handoff in agent.handoffs:
            if isinstance(handoff, Agent):
                self._protect(handoff, seen)

    async def run_agent(
        self,
        agent: Agent[Any],
        input: str | list[TResponseInputItem],
        *,
        finish: bool = True,
        **kwargs: Any,
    ) -> RunResult:
        """`Runner.run` with the guard in place; a stop comes out as `RunStopped`. The
        run is closed as the agent ends (`run_finished`: completed, or failed with the
        error) unless `finish=False` (a conversation that goes on in the same run);
        the runs of the agents it handed off to are closed either way."""
        self._root.restart()
        try:
            result = await Runner.run(agent, input, **kwargs)
        except Exception as err:
            stop = _stop_of(err)
            if stop is None:
                await self._root.end(err)
                if finish:
                    await finish_run(self._bridge, err)
                raise
            # A handoff's run was stopped: the conversation was its, so it is over;
            # the runs above it did not finish their task.
            ended = self._root.stopped_below()
            if ended is not None:
                await self._root.end(ended)
                if finish:
                    await finish_run(self._bridge, ended)
            raise stop from None
        await self._root.end(None)
        if finish:
            await finish_run(self._bridge)
        return result

    # --- guardrails --------------------------------------------------------------------

    async def _before_tool(self, data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        ctx = data.context
        tool, call_id = ctx.tool_name, ctx.tool_call_id
        args = parse_args(ctx.tool_arguments)
        bridge = self.scope.current
        gate = await bridge.acall(
            bridge.run.tool_call(tool, args, call_id=call_id, **bridge.call_fields(tool, args))
        )
        if gate.stopped:
            return ToolGuardrailFunctionOutput.raise_exception(
                output_info=RunStopped(gate.report, gate.decision)
            )
        if not gate.may_run:
            return ToolGuardrailFunctionOutput.reject_content(gate.model_text or "", gate)
        self._calls[(bridge.run.id, call_id)] = _Running(gate, Call(bridge, call_id, tool))
        return ToolGuardrailFunctionOutput.allow(gate)

    async def _after_tool(self, data: ToolOutputGuardrailData) -> ToolGuardrailFunctionOutput:
        ctx = data.context
        bridge = self.scope.current
        running = self._calls.pop((bridge.run.id, ctx.tool_call_id), None)
        stopped = running.call.stopped_child() if running is not None else None
        if stopped is not None:
            # The call ran a sub-agent the guard stopped: a failed call (its output,
            # the stop, is what the model reads).
            kind, code = ResultKind.RETRYABLE, "sub_agent_stopped"
        else:
            kind, code = ResultKind.SUCCESS, None
        try:
            decision = await bridge.acall(
                bridge.run.tool_result(
                    ctx.tool_call_id,
                    ctx.tool_name,
                    kind,
                    code=code,
                    retry_after_ms=0 if code else None,
                    output=jsonable(data.output),
                )
            )
        except FuseboxError as err:
            report_failed(f"result of {ctx.tool_name} ({ctx.tool_call_id})", err)
            decision = None
        if is_stop(decision):
            assert decision is not None
            return ToolGuardrailFunctionOutput.raise_exception(
                output_info=RunStopped(decision.report, decision)
            )
        gate = running.gate if running is not None else None
        if gate is not None and gate.warning:
            return ToolGuardrailFunctionOutput.reject_content(gate.reads(data.output), gate)
        return ToolGuardrailFunctionOutput.allow()

    # --- the agents' hooks -----------------------------------------------------------

    async def _started(self, agent: Agent[Any]) -> None:
        self.scope.started(agent.name)

    async def _handed_off(self, source: Agent[Any], target: Agent[Any]) -> None:
        await self.scope.hand_off(source.name, target.name)

    async def _model_asked(self) -> None:
        # Asked before the model runs, so a call that a token, cost or turn budget of
        # this run or of a run above it has no room for (what the tree's model calls in
        # flight hold counted) never reaches the model; the guard reserves this run's
        # mean per turn, and the turn's usage (`_model_answered`) reconciles it.
        # Unanswered (no daemon), the model still runs: the tools it asks for stay gated
        # by `gate_on_error`, and its turn is judged when reported.
        bridge = self.scope.current
        if bridge.run.stopped is None:
            try:
                await bridge.acall(bridge.run.model_call())
            except FuseboxError as err:
                report_failed("model call", err)
        bridge.run.raise_if_stopped()

    async def _model_answered(self, response: ModelResponse) -> None:
        usage = response.usage
        cached = usage.input_tokens_details.cached_tokens or 0
        calls = any(getattr(item, "type", None) == "function_call" for item in response.output)
        bridge = self.scope.current
        try:
            await bridge.acall(
                bridge.run.model_turn(
                    "tool_use" if calls else "end_turn",
                    # OpenAI counts cached tokens inside input_tokens; the contract sums
                    # input and cache reads, so each token is counted once.
                    usage=Usage(
                        input_tokens=max(usage.input_tokens - cached, 0),
                        output_tokens=usage.output_tokens,
                        cache_read_input_tokens=cached,
                    ),
                )
            )
        except FuseboxError as err:
            report_failed("model turn", err)

    async def _ended(self, agent: Agent[Any]) -> None:
        self.scope.answered = True

    # --- agents as tools -------------------------------------------------------------

    async def _run_sub_agent(
        self, agent: Agent[Any], invoke: Invoke, ctx: ToolContext[Any], input: str
    ) -> Any:
        """An agent called as a tool: a child run of the calling agent's run, for the
        nested `Runner.run` and the agents it hands off to. A stop of any of them is
        the call's output; so is a refusal by the caps, and the agent does not run."""
        parent = self.scope.current
        running = self._calls.get((parent.run.id, ctx.tool_call_id))
        child = await start_sub_agent(parent, agent.name)
        if running is not None:
            running.call.children.append(child)
        if child.run.stopped is not None:
            return sub_agent_stopped(agent.name, child.run)
        scope = _Scope(child, agent.name)
        token = self._scope.set(scope)
        try:
            output = await invoke(ctx, input)
        except Exception as err:
            if scope.stopped_below(include_first=True) is None:
                await scope.end(err, include_first=True)
                raise
        finally:
            self._scope.reset(token)
        stopped = scope.stopped_run()
        if stopped is not None:
            if running is not None and stopped is not child:
                running.call.children.append(stopped)
            await scope.end(scope.stopped_below(include_first=True), include_first=True)
            return sub_agent_stopped(stopped.run.agent, stopped.run)
        # The SDK answers a nested run that raised with its failure message: that is
        # no answer of the agent's.
        failed = None if scope.answered else SubAgentFailed(agent.name, output)
        await scope.end(failed, include_first=True)
        return output


@dataclass
class _Running:
    gate: Gate
    call: Call


class SubAgentFailed(Exception):
    """How a sub-agent's run is closed when it ended without an answer of its own (the
    SDK answered its call with its failure message)."""

    def __init__(self, agent: str | None, why: Any) -> None:
        super().__init__(f"sub-agent {agent or ''} ended without an answer: {why}")


class SubAgentStopped(Exception):
    """How the runs above a stopped sub-agent are closed: their task was not done."""

    def __init__(self, stopped: Bridge) -> None:
        report = stopped.run.stopped
        what = report.summary() if report is not None else "stopped"
        name = stopped.run.agent or stopped.run.id
        super().__init__(f"sub-agent {name} was stopped: {what}")


@dataclass
class _Scope:
    """The runs of one `Runner.run`: the first agent's, then one child run per agent
    handed off to (each below the one that handed off; a handoff back to an agent of
    the chain returns to its run, closing the runs after it)."""

    first: Bridge
    first_agent: str | None = None
    chain: list[tuple[str, Bridge]] = field(default_factory=list)
    #: The agent that has the conversation gave its final answer.
    answered: bool = False

    @property
    def current(self) -> Bridge:
        return self.chain[-1][1] if self.chain else self.first

    def restart(self) -> None:
        """A new `Runner.run` in this scope: it may begin with another agent (the one
        the last run ended with)."""
        self.first_agent = None
        self.chain.clear()
        self.answered = False

    def started(self, agent: str) -> None:
        if self.first_agent is None:
            self.first_agent = agent

    async def hand_off(self, source: str, target: str) -> None:
        self.started(source)
        if target == self.first_agent:
            await self._close(0)
            return
        for i, (name, _) in enumerate(self.chain):
            if name == target:
                await self._close(i + 1)
                return
        self.chain.append((target, await start_sub_agent(self.current, target)))

    async def _close(self, keep: int) -> None:
        while len(self.chain) > keep:
            await finish_run(self.chain.pop()[1])

    def stopped_run(self) -> Bridge | None:
        """The run of the chain the guard stopped (which ended the `Runner.run`)."""
        runs = [self.first, *(bridge for _, bridge in self.chain)]
        return next((b for b in reversed(runs) if b.stopped_by_guard), None)

    def stopped_below(self, *, include_first: bool = False) -> Exception | None:
        """Why the runs of the chain not stopped themselves did not finish, when a run
        of the chain was stopped (the first run counts when `include_first`)."""
        stopped = self.stopped_run()
        if stopped is None or (stopped is self.first and not include_first):
            return None
        return SubAgentStopped(stopped)

    async def end(self, error: BaseException | None, *, include_first: bool = False) -> None:
        """Closes the chain's runs (and the first one when `include_first`), last
        first, as the `Runner.run` ended."""
        while self.chain:
            await finish_run(self.chain.pop()[1], error)
        if include_first:
            await finish_run(self.first, error)
        self.answered = False


class _SubAgentInvoke:
    """An agent tool's invoker, running the agent as a sub-agent (see `_run_sub_agent`)."""

    def __init__(self, guard: OpenAIAgentsGuard, agent: Agent[Any], invoke: Invoke) -> None:
        self.guard, self.agent, self.invoke = guard, agent, invoke

    async def __call__(self, ctx: ToolContext[Any], input: str) -> Any:
        return await self.guard._run_sub_agent(self.agent, self.invoke, ctx, input)


class _GuardHooks(AgentHooks[Any]):
    """The guard's agent hooks, before the agent's own (`inner`): each model response's
    usage, the stop check before each model call, handoffs, and final answers, for the
    run of the agent they fire for."""

    def __init__(self, guard: OpenAIAgentsGuard, inner: AgentHooks[Any] | None) -> None:
        self.guard, self.inner = guard, inner

    async def on_start(self, context: AgentHookContext[Any], agent: Agent[Any]) -> None:
        await self.guard._started(agent)
        if self.inner is not None:
            await self.inner.on_start(context, agent)

    async def on_end(self, context: AgentHookContext[Any], agent: Agent[Any], output: Any) -> None:
        await self.guard._ended(agent)
        if self.inner is not None:
            await self.inner.on_end(context, agent, output)

    async def on_handoff(
        self, context: RunContextWrapper[Any], agent: Agent[Any], source: Agent[Any]
    ) -> None:
        # The SDK calls the hooks of the agent that hands off, with the new agent.
        await self.guard._handed_off(source, agent)
        if self.inner is not None:
            await self.inner.on_handoff(context, agent, source)

    async def on_tool_start(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool
    ) -> None:
        if self.inner is not None:
            await self.inner.on_tool_start(context, agent, tool)

    async def on_tool_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool, result: object
    ) -> None:
        if self.inner is not None:
            await self.inner.on_tool_end(context, agent, tool, result)

    async def on_llm_start(
        self,
        context: RunContextWrapper[Any],
        agent: Agent[Any],
        system_prompt: str | None,
        input_items: list[TResponseInputItem],
    ) -> None:
        await self.guard._model_asked()
        if self.inner is not None:
            await self.inner.on_llm_start(context, agent, system_prompt, input_items)

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        await self.guard._model_answered(response)
        if self.inner is not None:
            await self.inner.on_llm_end(context, agent, response)


def _agent_of(tool: FunctionTool) -> Agent[Any] | None:
    """The agent behind an `Agent.as_tool` tool (the SDK keeps it on the tool)."""
    agent = getattr(tool, "_agent_instance", None)
    return agent if isinstance(agent, Agent) else None


def _stop_of(err: Exception) -> RunStopped | None:
    """The guard's stop, raised itself or inside the tripwire the SDK raised for it."""
    if isinstance(err, RunStopped):
        return err
    if isinstance(err, ToolInputGuardrailTripwireTriggered | ToolOutputGuardrailTripwireTriggered):
        info = err.output.output_info
        if isinstance(info, RunStopped):
            return info
    return None


def _with(guardrails: list[Any] | None, guardrail: Any) -> list[Any]:
    current = list(guardrails or [])
    return current if guardrail in current else [*current, guardrail]


__all__ = ["OpenAIAgentsGuard"]
