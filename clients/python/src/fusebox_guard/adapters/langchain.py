"""LangChain v1 `create_agent` and LangGraph (`langchain` 1.5, `langgraph` 1.2): every
tool call gated by fuseboxd, sync and async (neither path delegates to the other).

    guard = FuseboxMiddleware(run)
    agent = create_agent(model, tools, middleware=[guard])
    state = agent.invoke({"messages": [...]})       # or await agent.ainvoke(...)
    state.get("fusebox_stop")                       # the stop report, when the guard ended it

    # A hand-built LangGraph graph: the same guard as a ToolNode wrapper, plus a router.
    tools = guard.tool_node([search])
    graph.add_conditional_edges("tools", guard.route("agent"))

- A refused call (block, stop, guard unavailable under deny) is answered with a
  `ToolMessage` for its call id without calling the tool; `use_completed_result` answers
  with the stored result. A `warn`'s message is appended to the tool's output.
- A stop ends the graph: `create_agent`'s tools→model edge ignores a `Command(goto=END)`
  from a tool, so the stop is kept in the run handle (and, through `before_model`, in the
  state's `fusebox_stop`) and `before_model` jumps to the end before the model is called
  again. The kill switch (`fusebox cancel`) ends it the same way at the next step.
- `after_model`: the last AI message's `usage_metadata` → `model_turn`.
- `after_agent`: the agent reached its end without a stop → `run_finished` completed.
  `guard.invoke(graph, …)` / `await guard.ainvoke(graph, …)` close the run as it ends
  for any graph (a hand-built one has no `after_agent`): completed, or failed with the
  error when the graph raises.
- `GuardedSummarization`: the summarization middleware, reporting each summary as a
  `compaction`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from langchain.agents.middleware import AgentMiddleware, AgentState, SummarizationMiddleware
from langchain.agents.middleware.types import hook_config
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.graph import END
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.runtime import Runtime
from langgraph.types import Command
from typing_extensions import NotRequired

from ..errors import FuseboxError
from ..gate import Gate
from ..run import Run
from ..sync import SyncRun
from ..types import Action, Effect, ResultKind, StopReport, Usage
from ._common import Bridge, OpKeyFn, finish_run, finish_run_sync, jsonable, report_failed

STOP_KEY = "fusebox_stop"

ToolOutcome = ToolMessage | Command[Any]


class FuseboxState(AgentState[Any]):
    """`create_agent` state with the guard's stop report (set when the guard ended it)."""

    fusebox_stop: NotRequired[dict[str, Any] | None]


class FuseboxMiddleware(AgentMiddleware[FuseboxState, Any, Any]):
    """The guard for one `Run`, as `create_agent` middleware and as ToolNode wrappers."""

    state_schema = FuseboxState

    def __init__(
        self,
        run: Run | SyncRun,
        *,
        op_key: OpKeyFn | None = None,
        effects: Mapping[str, Effect | str] | None = None,
        finish: bool = True,
    ) -> None:
        """`finish=False` keeps the run open when the agent ends (a conversation that
        goes on in the same run, e.g. with a checkpointer): close it with
        `run.finish()` yourself."""
        super().__init__()
        self._bridge = Bridge(run, op_key=op_key, effects=effects)
        self.finish = finish

    @property
    def run(self) -> Run:
        return self._bridge.run

    # --- the model hooks -------------------------------------------------------------

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: FuseboxState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._end_if_stopped()

    @hook_config(can_jump_to=["end"])
    async def abefore_model(
        self, state: FuseboxState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return self._end_if_stopped()

    def after_model(self, state: FuseboxState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        turn = _model_turn(state)
        if turn is not None:
            try:
                self._bridge.call(self.run.model_turn(turn[0], usage=turn[1]))
            except FuseboxError as err:
                report_failed("model turn", err)
        return None

    async def aafter_model(
        self, state: FuseboxState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        turn = _model_turn(state)
        if turn is not None:
            try:
                await self._bridge.acall(self.run.model_turn(turn[0], usage=turn[1]))
            except FuseboxError as err:
                report_failed("model turn", err)
        return None

    # --- the end of the agent --------------------------------------------------------

    def after_agent(self, state: FuseboxState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        if self.finish:
            finish_run_sync(self._bridge)
        return None

    async def aafter_agent(
        self, state: FuseboxState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        if self.finish:
            await finish_run(self._bridge)
        return None

    def invoke(self, agent: Any, input: Any, config: Any = None, **kwargs: Any) -> Any:
        """`agent.invoke(...)` that closes the run as it ends: completed (what
        `after_agent` does for `create_agent`; a hand-built graph has no such hook), or
        failed with the error when the graph raises."""
        try:
            state = agent.invoke(input, config, **kwargs)
        except Exception as err:
            if self.finish:
                finish_run_sync(self._bridge, err)
            raise
        if self.finish:
            finish_run_sync(self._bridge)
        return state

    async def ainvoke(self, agent: Any, input: Any, config: Any = None, **kwargs: Any) -> Any:
        """`await agent.ainvoke(...)`, closing the run the same way."""
        try:
            state = await agent.ainvoke(input, config, **kwargs)
        except Exception as err:
            if self.finish:
                await finish_run(self._bridge, err)
            raise
        if self.finish:
            await finish_run(self._bridge)
        return state

    def _end_if_stopped(self) -> dict[str, Any] | None:
        report = self.run.stopped
        if report is None:
            return None
        return {"jump_to": "end", STOP_KEY: _report_json(report)}

    # --- the tool wrappers (create_agent middleware and ToolNode alike) ----------------

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolOutcome],
    ) -> ToolOutcome:
        name, call_id, args = _call_of(request)
        gate = self._bridge.call(
            self.run.tool_call(name, args, call_id=call_id, **self._bridge.call_fields(name, args))
        )
        if not gate.may_run:
            return _refusal(gate)
        outcome = handler(request)
        kind, output = _result_of(outcome)
        try:
            self._bridge.call(self.run.tool_result(call_id, name, kind, output=output))
        except FuseboxError as err:
            report_failed(f"result of {name} ({call_id})", err)
        return _with_warning(gate, outcome)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolOutcome]],
    ) -> ToolOutcome:
        name, call_id, args = _call_of(request)
        gate = await self._bridge.acall(
            self.run.tool_call(name, args, call_id=call_id, **self._bridge.call_fields(name, args))
        )
        if not gate.may_run:
            return _refusal(gate)
        outcome = await handler(request)
        kind, output = _result_of(outcome)
        try:
            await self._bridge.acall(self.run.tool_result(call_id, name, kind, output=output))
        except FuseboxError as err:
            report_failed(f"result of {name} ({call_id})", err)
        return _with_warning(gate, outcome)

    # --- plain LangGraph -------------------------------------------------------------

    def tool_node(self, tools: Sequence[BaseTool | Callable[..., Any]], **kwargs: Any) -> ToolNode:
        """A `ToolNode` whose every call is gated (sync and async)."""
        return ToolNode(
            tools,
            wrap_tool_call=self.wrap_tool_call,
            awrap_tool_call=self.awrap_tool_call,
            **kwargs,
        )

    def route(self, next_node: str) -> Callable[[Any], str]:
        """A conditional edge after the tools: END once the run is stopped, else
        `next_node` (a hand-built graph's equivalent of the `before_model` jump)."""

        def route(state: Any) -> str:
            return END if self.run.stopped is not None else next_node

        return route


class GuardedSummarization(SummarizationMiddleware):
    """`SummarizationMiddleware` that reports every summary it makes as a `compaction`
    (the guard then watches for the loop coming back, `compaction_loop_persisted`)."""

    def __init__(self, guard: FuseboxMiddleware, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard = guard

    def before_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        update = super().before_model(state, runtime)
        if update is not None:
            try:
                self._guard._bridge.call(self._guard.run.compaction("summarization"))
            except FuseboxError as err:
                report_failed("compaction", err)
        return update

    async def abefore_model(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        update = await super().abefore_model(state, runtime)
        if update is not None:
            try:
                await self._guard._bridge.acall(self._guard.run.compaction("summarization"))
            except FuseboxError as err:
                report_failed("compaction", err)
        return update


def _call_of(request: ToolCallRequest) -> tuple[str, str, Any]:
    call = request.tool_call
    return str(call["name"]), str(call.get("id") or ""), call.get("args", {})


def _refusal(gate: Gate) -> ToolMessage:
    """The refused call's answer, for its call id (a dangling id breaks the provider)."""
    reused = gate.action is Action.USE_COMPLETED_RESULT
    return ToolMessage(
        content=gate.model_text or "",
        tool_call_id=gate.call_id,
        name=gate.tool,
        status="success" if reused else "error",
    )


def _result_of(outcome: ToolOutcome) -> tuple[ResultKind, Any]:
    if isinstance(outcome, ToolMessage):
        kind = ResultKind.RETRYABLE if outcome.status == "error" else ResultKind.SUCCESS
        return kind, jsonable(outcome.content)
    return ResultKind.SUCCESS, None


def _with_warning(gate: Gate, outcome: ToolOutcome) -> ToolOutcome:
    if gate.warning and isinstance(outcome, ToolMessage):
        return outcome.model_copy(update={"content": gate.reads(outcome.content)})
    return outcome


def _model_turn(state: Mapping[str, Any]) -> tuple[str, Usage | None] | None:
    messages = state.get("messages") or []
    last = messages[-1] if messages else None
    if not isinstance(last, AIMessage):
        return None
    stop_reason = "tool_use" if last.tool_calls else "end_turn"
    meta = last.usage_metadata
    if meta is None:
        return stop_reason, None
    details = meta.get("input_token_details") or {}
    cache_read = int(details.get("cache_read") or 0)
    cache_creation = int(details.get("cache_creation") or 0)
    # LangChain's input_tokens include the cached ones; the contract sums them apart.
    usage = Usage(
        input_tokens=max(int(meta.get("input_tokens") or 0) - cache_read - cache_creation, 0),
        output_tokens=int(meta.get("output_tokens") or 0),
        cache_read_input_tokens=cache_read or None,
        cache_creation_input_tokens=cache_creation or None,
    )
    return stop_reason, usage


def _report_json(report: StopReport) -> dict[str, Any]:
    data = dataclasses.asdict(report)
    data["terminal_state"] = report.state_name
    return data


def stop_report(state: Mapping[str, Any]) -> StopReport | None:
    """The guard's stop report from a finished `create_agent` state, if it ended it."""
    data = state.get(STOP_KEY)
    return StopReport.from_json(data) if isinstance(data, dict) else None


__all__ = [
    "STOP_KEY",
    "FuseboxMiddleware",
    "FuseboxState",
    "GuardedSummarization",
    "stop_report",
]
