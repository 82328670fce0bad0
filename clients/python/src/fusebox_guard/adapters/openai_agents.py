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
- Run hooks: each model response's usage → `model_turn`; a run stopped meanwhile (a
  `fusebox cancel`, a budget) ends before the next model call.
- `run_agent` closes the run as the agent ends: `run_finished` completed on a final
  answer, failed (with the error) on an exception that is not the guard's own stop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    RunContextWrapper,
    RunHooks,
    Runner,
    RunResult,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrail,
    ToolInputGuardrailData,
    ToolInputGuardrailTripwireTriggered,
    ToolOutputGuardrail,
    ToolOutputGuardrailData,
    ToolOutputGuardrailTripwireTriggered,
)
from agents.items import ModelResponse, TResponseInputItem

from ..errors import FuseboxError, RunStopped
from ..gate import Gate
from ..run import Run
from ..sync import SyncRun
from ..types import Effect, ResultKind, Usage
from ._common import Bridge, OpKeyFn, finish_run, is_stop, jsonable, parse_args, report_failed


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
        self._gates: dict[str, Gate] = {}
        self.input_guardrail: ToolInputGuardrail[Any] = ToolInputGuardrail(
            guardrail_function=self._before_tool, name="fusebox_gate"
        )
        self.output_guardrail: ToolOutputGuardrail[Any] = ToolOutputGuardrail(
            guardrail_function=self._after_tool, name="fusebox_result"
        )
        self.hooks = _FuseboxHooks(self)

    @property
    def run(self) -> Run:
        return self._bridge.run

    def protect(self, agent: Agent[Any]) -> Agent[Any]:
        """Attaches the guardrails to every function tool and MCP server of `agent` and
        of the agents it hands off to (in place; returns `agent`)."""
        seen: set[int] = set()
        self._protect(agent, seen)
        return agent

    def _protect(self, agent: Agent[Any], seen: set[int]) -> None:
        if id(agent) in seen:
            return
        seen.add(id(agent))
        for tool in agent.tools:
            if isinstance(tool, FunctionTool):
                tool.tool_input_guardrails = _with(tool.tool_input_guardrails, self.input_guardrail)
                tool.tool_output_guardrails = _with(
                    tool.tool_output_guardrails, self.output_guardrail
                )
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
        """`Runner.run` with the guard's hooks; a stop comes out as `RunStopped`. The run
        is closed as the agent ends (`run_finished`: completed, or failed with the
        error) unless `finish=False` (a conversation that goes on in the same run)."""
        kwargs.setdefault("hooks", self.hooks)
        try:
            result = await Runner.run(agent, input, **kwargs)
        except Exception as err:
            stop = _stop_of(err)
            if stop is not None:
                raise stop from None
            if finish:
                await finish_run(self._bridge, err)
            raise
        if finish:
            await finish_run(self._bridge)
        return result

    # --- guardrails --------------------------------------------------------------------

    async def _before_tool(self, data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        ctx = data.context
        tool, call_id = ctx.tool_name, ctx.tool_call_id
        args = parse_args(ctx.tool_arguments)
        run = self.run
        gate = await self._bridge.acall(
            run.tool_call(tool, args, call_id=call_id, **self._bridge.call_fields(tool, args))
        )
        if gate.stopped:
            return ToolGuardrailFunctionOutput.raise_exception(
                output_info=RunStopped(gate.report, gate.decision)
            )
        if not gate.may_run:
            return ToolGuardrailFunctionOutput.reject_content(gate.model_text or "", gate)
        self._gates[call_id] = gate
        return ToolGuardrailFunctionOutput.allow(gate)

    async def _after_tool(self, data: ToolOutputGuardrailData) -> ToolGuardrailFunctionOutput:
        ctx = data.context
        gate = self._gates.pop(ctx.tool_call_id, None)
        try:
            decision = await self._bridge.acall(
                self.run.tool_result(
                    ctx.tool_call_id,
                    ctx.tool_name,
                    ResultKind.SUCCESS,
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
        if gate is not None and gate.warning:
            return ToolGuardrailFunctionOutput.reject_content(gate.reads(data.output), gate)
        return ToolGuardrailFunctionOutput.allow()


class _FuseboxHooks(RunHooks[Any]):
    def __init__(self, guard: OpenAIAgentsGuard) -> None:
        self._guard = guard

    async def on_llm_start(
        self,
        context: RunContextWrapper[Any],
        agent: Agent[Any],
        system_prompt: str | None,
        input_items: list[TResponseInputItem],
    ) -> None:
        self._guard.run.raise_if_stopped()

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        usage = response.usage
        cached = usage.input_tokens_details.cached_tokens or 0
        calls = any(getattr(item, "type", None) == "function_call" for item in response.output)
        try:
            await self._guard._bridge.acall(
                self._guard.run.model_turn(
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


def _stop_of(err: Exception) -> RunStopped | None:
    """The guard's stop inside the tripwire the SDK raised for it, if that is what it is."""
    if isinstance(err, ToolInputGuardrailTripwireTriggered | ToolOutputGuardrailTripwireTriggered):
        info = err.output.output_info
        if isinstance(info, RunStopped):
            return info
    return None


def _with(guardrails: list[Any] | None, guardrail: Any) -> list[Any]:
    current = list(guardrails or [])
    return current if guardrail in current else [*current, guardrail]


__all__ = ["OpenAIAgentsGuard"]
