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
  with the stored result. A `warn`'s message is appended to the tool's output: to its
  text, or as one more text block after its content blocks (images stay blocks).
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

Sub-agents, each a child run of the run that started it (guard contract §6):

- `create_agent` used as a tool (a tool that invokes another agent built with the same
  middleware): `before_agent` sees the guarded call it runs in (a context variable,
  which LangGraph carries into its steps, sync and async) and starts a child run of that
  call's run, named by the agent's `name`; the agent's state names it (`fusebox_run`),
  so its calls, model turns and stop are its own. It is closed as it ends. A stopped
  one ends like any guarded agent (the jump to the end); whatever the tool makes of its
  final state, the call's answer is a `ToolMessage` (status `error`) saying which
  sub-agent was stopped, why, and what to do instead. One the caps refuse ends before
  its first model call and answers the same way.
- A compiled subgraph as a node of a parent graph: `guard.subgraph(graph, name=...)` is
  that node, running the subgraph in a child run of the parent's each time (its steps
  report to it: a `create_agent` with this middleware, or a hand-built graph with
  `tool_node` and `route`). A stopped one ends the subgraph, and the node's output ends
  with an AI message saying so (the guard's own state keys are the parent's, never
  copied out of a subgraph). A subgraph added as a node directly is not told apart: its
  steps report to the parent's run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from langchain.agents.middleware import AgentMiddleware, AgentState, SummarizationMiddleware
from langchain.agents.middleware.types import hook_config
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool
from langgraph.config import get_config
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
from ._common import (
    Bridge,
    Call,
    OpKeyFn,
    Tree,
    finish_run,
    finish_run_sync,
    jsonable,
    report_failed,
    start_sub_agent,
    start_sub_agent_sync,
    sub_agent_stopped,
)

STOP_KEY = "fusebox_stop"
#: The state key naming a sub-agent's child run (absent, or None, for the guard's run).
RUN_KEY = "fusebox_run"

ToolOutcome = ToolMessage | Command[Any]


class FuseboxState(AgentState[Any]):
    """`create_agent` state with the guard's stop report (set when the guard ended it)."""

    fusebox_stop: NotRequired[dict[str, Any] | None]
    fusebox_run: NotRequired[str | None]


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
        self._tree = Tree(self._bridge)
        #: The sub-agents' child runs under way, by run id (the state's `fusebox_run`).
        self._children: dict[str, Bridge] = {}
        self.finish = finish

    @property
    def run(self) -> Run:
        return self._bridge.run

    # --- which run ---------------------------------------------------------------------

    def _bridge_of(self, state: Any) -> Bridge:
        """The run a step belongs to: the sub-agent's its state names, else the one the
        code runs in (a `subgraph`'s child run), else the guard's own."""
        run_id = state.get(RUN_KEY) if isinstance(state, Mapping) else None
        return self._children.get(run_id or "") or self._tree.current

    # --- the start of the agent: a sub-agent's child run -----------------------------

    @hook_config(can_jump_to=["end"])
    def before_agent(self, state: FuseboxState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        call = self._tree.calling
        if call is None:
            return self._own_run(state)
        return self._sub_agent(call, start_sub_agent_sync(call.bridge, _agent_name()))

    @hook_config(can_jump_to=["end"])
    async def abefore_agent(
        self, state: FuseboxState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        call = self._tree.calling
        if call is None:
            return self._own_run(state)
        return self._sub_agent(call, await start_sub_agent(call.bridge, _agent_name()))

    def _own_run(self, state: FuseboxState) -> dict[str, Any] | None:
        """Outside a guarded call: the run the code runs in (a conversation's state may
        still name an earlier sub-agent's run)."""
        current = self._tree.current
        run_id = None if current is self._bridge else current.run.id
        return {RUN_KEY: run_id} if state.get(RUN_KEY) != run_id else None

    def _sub_agent(self, call: Call, child: Bridge) -> dict[str, Any]:
        """An agent invoked inside a guarded tool call (`create_agent` used as a tool) is
        a sub-agent: its state names its child run. One the caps refused ends at once."""
        call.children.append(child)
        self._children[child.run.id] = child
        report = child.run.stopped
        if report is not None:
            return {RUN_KEY: child.run.id, "jump_to": "end", STOP_KEY: _report_json(report)}
        return {RUN_KEY: child.run.id, STOP_KEY: None}

    # --- the model hooks -------------------------------------------------------------

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: FuseboxState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._end_if_stopped(state)

    @hook_config(can_jump_to=["end"])
    async def abefore_model(
        self, state: FuseboxState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return self._end_if_stopped(state)

    def after_model(self, state: FuseboxState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        turn = _model_turn(state)
        if turn is not None:
            bridge = self._bridge_of(state)
            try:
                bridge.call(bridge.run.model_turn(turn[0], usage=turn[1]))
            except FuseboxError as err:
                report_failed("model turn", err)
        return None

    async def aafter_model(
        self, state: FuseboxState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        turn = _model_turn(state)
        if turn is not None:
            bridge = self._bridge_of(state)
            try:
                await bridge.acall(bridge.run.model_turn(turn[0], usage=turn[1]))
            except FuseboxError as err:
                report_failed("model turn", err)
        return None

    # --- the end of the agent --------------------------------------------------------

    def after_agent(self, state: FuseboxState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        bridge = self._bridge_of(state)
        if bridge is not self._bridge:
            finish_run_sync(bridge)  # a sub-agent's run ends with it
        elif self.finish:
            finish_run_sync(self._bridge)
        return None

    async def aafter_agent(
        self, state: FuseboxState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        bridge = self._bridge_of(state)
        if bridge is not self._bridge:
            await finish_run(bridge)
        elif self.finish:
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

    def _end_if_stopped(self, state: FuseboxState) -> dict[str, Any] | None:
        report = self._bridge_of(state).run.stopped
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
        bridge = self._bridge_of(request.state)
        gate = bridge.call(
            bridge.run.tool_call(name, args, call_id=call_id, **bridge.call_fields(name, args))
        )
        if not gate.may_run:
            return _refusal(gate)
        call = Call(bridge, call_id, name)
        try:
            with self._tree.in_call(call):
                outcome = handler(request)
        except Exception as err:
            for child in call.children:
                finish_run_sync(child, err)
            if call.stopped_child() is None:
                raise
        answer = self._sub_agents_ended(call)
        if answer is not None:
            bridge.call(_report_stopped(bridge, call_id, name, str(answer.content)))
            return answer
        kind, output = _result_of(outcome)
        try:
            bridge.call(bridge.run.tool_result(call_id, name, kind, output=output))
        except FuseboxError as err:
            report_failed(f"result of {name} ({call_id})", err)
        return _with_warning(gate, outcome)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolOutcome]],
    ) -> ToolOutcome:
        name, call_id, args = _call_of(request)
        bridge = self._bridge_of(request.state)
        gate = await bridge.acall(
            bridge.run.tool_call(name, args, call_id=call_id, **bridge.call_fields(name, args))
        )
        if not gate.may_run:
            return _refusal(gate)
        call = Call(bridge, call_id, name)
        try:
            with self._tree.in_call(call):
                outcome = await handler(request)
        except Exception as err:
            for child in call.children:
                await finish_run(child, err)
            if call.stopped_child() is None:
                raise
        answer = self._sub_agents_ended(call)
        if answer is not None:
            await bridge.acall(_report_stopped(bridge, call_id, name, str(answer.content)))
            return answer
        kind, output = _result_of(outcome)
        try:
            await bridge.acall(bridge.run.tool_result(call_id, name, kind, output=output))
        except FuseboxError as err:
            report_failed(f"result of {name} ({call_id})", err)
        return _with_warning(gate, outcome)

    def _sub_agents_ended(self, call: Call) -> ToolMessage | None:
        """Forgets the call's sub-agents (each closed as it ended); when the guard
        stopped one, its stop is the call's answer, whatever the tool made of it."""
        for child in call.children:
            self._children.pop(child.run.id, None)
        stopped = call.stopped_child()
        if stopped is None:
            return None
        return ToolMessage(
            content=sub_agent_stopped(stopped.run.agent, stopped.run),
            tool_call_id=call.call_id,
            name=call.tool,
            status="error",
        )

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
            return END if self._bridge_of(state).run.stopped is not None else next_node

        return route

    def subgraph(
        self, graph: Runnable[Any, Any], *, name: str | None = None
    ) -> RunnableLambda[Any, Any]:
        """A compiled graph as a node of a parent graph, run as a sub-agent: each time
        the node runs, the subgraph runs in a child run of the parent's (`name`, default
        the graph's, is its agent). Its steps report to that run — a `create_agent`
        with this middleware, or a hand-built graph with `tool_node` and `route` — and
        it is closed as the subgraph ends. When the guard stopped it (or the caps did
        not let it start), the node's output ends with an AI message that says so."""
        agent = name or getattr(graph, "name", None)

        def run(state: Any, config: RunnableConfig) -> Any:
            child = start_sub_agent_sync(self._bridge_of(state), agent)
            if child.run.stopped is not None:
                return _subgraph_output(state, child, agent)
            try:
                with self._tree.in_run(child):
                    output = graph.invoke(_without_keys(state), config)
            except Exception as err:
                finish_run_sync(child, err)
                raise
            finish_run_sync(child)
            return _subgraph_output(output, child, agent)

        async def arun(state: Any, config: RunnableConfig) -> Any:
            child = await start_sub_agent(self._bridge_of(state), agent)
            if child.run.stopped is not None:
                return _subgraph_output(state, child, agent)
            try:
                with self._tree.in_run(child):
                    output = await graph.ainvoke(_without_keys(state), config)
            except Exception as err:
                await finish_run(child, err)
                raise
            await finish_run(child)
            return _subgraph_output(output, child, agent)

        return RunnableLambda(run, afunc=arun, name=agent)


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


def _agent_name() -> str | None:
    """The `create_agent` graph's `name`, as LangChain puts it in the step's metadata."""
    try:
        name = get_config().get("metadata", {}).get("lc_agent_name")
    except RuntimeError:  # not inside a graph step
        return None
    return str(name) if name else None


async def _report_stopped(bridge: Bridge, call_id: str, tool: str, text: str) -> None:
    """The call that ran a stopped sub-agent failed: RETRYABLE with no wait (starting
    the same sub-task again is the guard's to judge, `subtask_repeat`)."""
    try:
        await bridge.run.tool_result(
            call_id,
            tool,
            ResultKind.RETRYABLE,
            code="sub_agent_stopped",
            retry_after_ms=0,
            output=text,
        )
    except FuseboxError as err:
        report_failed(f"result of {tool} ({call_id})", err)


def _without_keys(state: Any) -> Any:
    """A parent's state as a subgraph's input: without the guard's own keys, which are
    the parent's run's."""
    if not isinstance(state, Mapping):
        return state
    return {k: v for k, v in state.items() if k not in (RUN_KEY, STOP_KEY)}


def _subgraph_output(state: Any, child: Bridge, agent: str | None) -> Any:
    """A subgraph's output as the parent's update: without the guard's keys (a child's
    stop is not the parent's), and, when the guard stopped it, an AI message saying so."""
    output = _without_keys(state)
    if not child.stopped_by_guard or not isinstance(output, dict):
        return output
    said = AIMessage(content=sub_agent_stopped(agent, child.run), name=agent)
    return {**output, "messages": [*output.get("messages", []), said]}


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
    """A warned call's message: its content, then the warning, in the content's own
    form. LangChain keeps a tool's content blocks (text, images) as a list: the warning
    is one more text block after them, so no block is flattened into JSON text."""
    warning = gate.warning
    if not warning or not isinstance(outcome, ToolMessage):
        return outcome
    content = outcome.content
    if isinstance(content, list):
        block = {"type": "text", "text": f"[fusebox warning] {warning}"}
        return outcome.model_copy(update={"content": [*content, block]})
    return outcome.model_copy(update={"content": gate.reads(content)})


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
