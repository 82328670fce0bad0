"""The LangChain v1 `create_agent` middleware and the LangGraph `ToolNode` wrapper, with
the real packages (langchain 1.5, langgraph 1.2), a scripted chat model (no LLM, no
network), a real nats-server and fuseboxd; every scenario sync (SyncFusebox, `invoke`)
and async (Fusebox, `ainvoke`)."""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import Callable
from typing import Any, Self

import pytest
from fusebox_guard import Fusebox, GateOnError, SyncFusebox
from fusebox_guard.adapters.langchain import FuseboxMiddleware, stop_report
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from pydantic import Field
from support.guard import (
    PAGES,
    RUNAWAY_EXECUTIONS,
    TENANT,
    ToolLog,
    assert_closed,
    bare_nats,
    fresh_run,
    fusebox_cancel,
    list_issues_output,
    open_page_output,
    run_status,
    search_output,
    send_email_output,
)
from support.scenarios import Call, next_calls, op_key_for
from support.shapes import CELLS, Read, assert_cell, shaped
from support.stack import Stack
from support.sub_agents import (
    DELEGATE,
    FOUND,
    RUNAWAY_SEARCHES,
    TOPICS,
    lead_calls,
    researcher_answer,
    researcher_calls,
    topic_of,
)
from support.trees import children, tree

MODES = ["sync", "async"]


class OfflineChatModel(BaseChatModel):
    """A chat model with no LLM behind it: the tools bound to it change nothing, and it
    answers each call with the one message :meth:`answer` makes of the messages."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Self:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.answer(messages))])

    @abstractmethod
    def answer(self, messages: list[BaseMessage]) -> AIMessage:
        """The model's one message for `messages`."""


class ScriptedChatModel(OfflineChatModel):
    """Answers from `support.scenarios`: turn N = the number of AI messages so far."""

    scenario: str
    seen: list[list[BaseMessage]] = Field(default_factory=list)
    #: Count turns itself instead of reading them off the history (which a compaction
    #: shortens: a model that forgets what it did is another test).
    remembers: bool = False

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def answer(self, messages: list[BaseMessage]) -> AIMessage:
        self.seen.append(list(messages))
        turn = (
            len(self.seen) - 1
            if self.remembers
            else sum(isinstance(m, AIMessage) for m in messages)
        )
        calls = next_calls(self.scenario, turn)
        usage = {
            "input_tokens": 150,
            "output_tokens": 25,
            "total_tokens": 175,
            "input_token_details": {"cache_read": 100},
        }
        if calls is None:
            message = AIMessage(content="done", usage_metadata=usage)
        else:
            message = AIMessage(
                content="",
                tool_calls=[
                    {
                        "name": name,
                        "args": args,
                        "id": f"call_{turn}_{k}",
                        "type": "tool_call",
                    }
                    for k, (name, args) in enumerate(calls)
                ],
                usage_metadata=usage,
            )
        return message


def make_tools(
    log: ToolLog,
    on_tool: Callable[[int], None] | None = None,
    search_shape: str | None = None,
) -> list[BaseTool]:
    """The scenario tools; `search_shape`: `search` returns that shape of `SHAPES`."""

    def ran(name: str, arg: Any) -> None:
        log.calls.append((name, arg))
        if on_tool is not None:
            on_tool(len(log.calls))

    @tool
    def search(query: str) -> Any:
        """Search the web."""
        ran("search", query)
        return search_output(query) if search_shape is None else shaped(search_shape)

    @tool
    def open_page(url: str) -> dict[str, Any]:
        """Open a page."""
        ran("open_page", url)
        return open_page_output(url)

    @tool
    def list_issues(page: int) -> dict[str, Any]:
        """List one page of issues."""
        ran("list_issues", page)
        return list_issues_output(page)

    @tool
    def send_email(to: str, incident: str) -> dict[str, Any]:
        """Notify someone about an incident."""
        ran("send_email", to)
        return send_email_output(to)

    return [search, open_page, list_issues, send_email]


def assert_history_valid(messages: list[BaseMessage]) -> None:
    """Every tool call id of every AI message is answered by a ToolMessage."""
    asked = {c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    assert asked <= answered, f"unanswered call ids: {asked - answered}"


def drive(
    url: str,
    scenario: str,
    mode: str,
    log: ToolLog,
    *,
    graph: str = "create_agent",
    on_tool: Callable[[str], Callable[[int], None]] | None = None,
    search_shape: str | None = None,
    **connect: Any,
) -> tuple[dict[str, Any], FuseboxMiddleware]:
    """Runs the scenario's agent behind a fresh run; returns the final state and guard."""
    run_id = fresh_run(f"lc-{mode}-{scenario}")
    model = ScriptedChatModel(scenario=scenario)
    tools = make_tools(log, on_tool(run_id) if on_tool else None, search_shape)
    config = {"recursion_limit": 500}
    prompt = {"messages": [HumanMessage("go")]}

    def build(guard: FuseboxMiddleware) -> Any:
        if graph == "create_agent":
            return create_agent(model, tools, middleware=[guard])

        # A hand-built LangGraph loop: the guard as ToolNode wrapper plus its router.
        def agent_node(state: MessagesState) -> dict[str, Any]:
            return {"messages": [model.invoke(state["messages"])]}

        async def aagent_node(state: MessagesState) -> dict[str, Any]:
            return {"messages": [await model.ainvoke(state["messages"])]}

        def after_agent(state: MessagesState) -> str:
            last = state["messages"][-1]
            return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

        builder = StateGraph(MessagesState)
        builder.add_node("agent", agent_node if mode == "sync" else aagent_node)
        builder.add_node("tools", guard.tool_node(tools))
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", after_agent, ["tools", END])
        builder.add_conditional_edges("tools", guard.route("agent"), ["agent", END])
        return builder.compile()

    if mode == "sync":
        fb = SyncFusebox.connect(url, tenant=TENANT, **connect)
        try:
            run = fb.start_run(run_id, agent="triager")
            guard = FuseboxMiddleware(run, op_key=op_key_for(run_id))
            state = guard.invoke(build(guard), prompt, config)
        finally:
            fb.close()
        return state, guard

    async def main() -> tuple[dict[str, Any], FuseboxMiddleware]:
        async with await Fusebox.connect(url, tenant=TENANT, **connect) as afb:
            arun = await afb.start_run(run_id, agent="triager")
            guard = FuseboxMiddleware(arun, op_key=op_key_for(run_id))
            state = await guard.ainvoke(build(guard), prompt, config)
            await arun.close()
            return state, guard

    return asyncio.run(main())


@pytest.mark.parametrize("graph", ["create_agent", "tool_node"])
@pytest.mark.parametrize("mode", MODES)
def test_runaway_is_stopped_after_the_same_executions_as_the_rust_demo(
    stack: Stack, mode: str, graph: str
) -> None:
    log = ToolLog()
    state, guard = drive(stack.nats_url, "runaway", mode, log, graph=graph)
    assert log.count("search") == RUNAWAY_EXECUTIONS
    report = guard.run.stopped
    assert report is not None and report.state_name == "STOPPED_LOOP_GUARD"
    if graph == "create_agent":
        assert stop_report(state) == report
    read = [str(m.content) for m in state["messages"] if isinstance(m, ToolMessage)]
    assert "[fusebox warning]" in read[RUNAWAY_EXECUTIONS - 1]
    assert read[RUNAWAY_EXECUTIONS].startswith("fusebox blocked search")
    assert "fusebox stopped this run" in read[-1]
    assert_history_valid(state["messages"])


#: One runaway per (graph, mode, shape), read by that shape's three cells of the table.
_runaways: dict[tuple[str, str, str], tuple[str, Read, list[BaseMessage]]] = {}


def shaped_runaway(
    stack: Stack, graph: str, mode: str, shape: str
) -> tuple[str, Read, list[BaseMessage]]:
    if (graph, mode, shape) not in _runaways:
        log = ToolLog()
        state, guard = drive(stack.nats_url, "runaway", mode, log, graph=graph, search_shape=shape)
        messages = list(state["messages"])
        texts = [str(m.content) for m in messages if isinstance(m, ToolMessage)]
        report = guard.run.stopped
        read = Read(texts, log.count("search"), report.state_name if report else None)
        _runaways[(graph, mode, shape)] = (guard.run.id, read, messages)
    return _runaways[(graph, mode, shape)]


@pytest.mark.parametrize(("shape", "decision"), CELLS)
@pytest.mark.parametrize("graph", ["create_agent", "tool_node"])
@pytest.mark.parametrize("mode", MODES)
def test_every_result_shape_through_a_warn_a_block_and_a_stop(
    stack: Stack, mode: str, graph: str, shape: str, decision: str
) -> None:
    """Issue 49 §1 across result shapes: the warned call's ToolMessage is the tool's
    result as LangChain gives it for any call (the first one's content), then the
    warning in the same form: appended to text, one more block after content blocks
    (not the blocks flattened into JSON text); a block and a stop are the guard's words."""
    run_id, read, messages = shaped_runaway(stack, graph, mode, shape)
    assert_cell(stack, run_id, shape, decision, read)
    if decision == "warn":
        results = [m.content for m in messages if isinstance(m, ToolMessage)]
        first, warned = results[0], results[RUNAWAY_EXECUTIONS - 1]
        if isinstance(first, list):
            assert isinstance(warned, list) and warned[:-1] == first, warned
            last = warned[-1]
            assert isinstance(last, dict) and last["type"] == "text", warned
            assert str(last["text"]).startswith("[fusebox warning] "), warned
        else:
            assert str(warned).startswith(f"{first}\n\n[fusebox warning] "), warned
    assert_history_valid(messages)


@pytest.mark.parametrize("mode", MODES)
def test_ping_pong_is_stopped(stack: Stack, mode: str) -> None:
    log = ToolLog()
    state, _ = drive(stack.nats_url, "ping_pong", mode, log)
    assert stop_report(state) is not None
    assert len(log.calls) < 20
    assert_history_valid(state["messages"])


@pytest.mark.parametrize("mode", MODES)
def test_pagination_of_twelve_pages_finishes_untouched(stack: Stack, mode: str) -> None:
    log = ToolLog()
    state, guard = drive(stack.nats_url, "pagination", mode, log)
    assert [a for t, a in log.calls if t == "list_issues"] == list(range(1, PAGES + 1))
    assert guard.run.stopped is None and stop_report(state) is None
    assert state["messages"][-1].content == "done"
    tool_messages = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert all("fusebox" not in str(m.content) for m in tool_messages)
    assert_history_valid(state["messages"])
    # usage_metadata reached the daemon: 150 input (100 of them cache reads) + 25 output.
    counters = run_status(stack, guard.run.id)["counters"]
    assert counters["model_turns"] == PAGES + 1
    assert counters["tokens"] == (PAGES + 1) * 175
    assert counters["steps"] == PAGES and counters["calls_refused"] == 0
    assert_closed(stack, guard.run.id, "completed")


@pytest.mark.parametrize("mode", MODES)
def test_a_hand_built_graph_closes_its_run_through_the_guards_invoke(
    stack: Stack, mode: str
) -> None:
    log = ToolLog()
    state, guard = drive(stack.nats_url, "pagination", mode, log, graph="tool_node")
    assert state["messages"][-1].content == "done"
    assert_closed(stack, guard.run.id, "completed")


@pytest.mark.parametrize("mode", MODES)
def test_an_agent_that_fails_closes_its_run_as_failed(stack: Stack, mode: str) -> None:
    from langgraph.errors import GraphRecursionError

    run_id = fresh_run(f"lc-{mode}-fails")
    model = ScriptedChatModel(scenario="pagination")
    prompt = {"messages": [HumanMessage("go")]}
    # Too few graph steps for 12 pages: the graph raises before its end.
    config = {"recursion_limit": 5}
    if mode == "sync":
        with SyncFusebox.connect(stack.nats_url, tenant=TENANT) as fb:
            guard = FuseboxMiddleware(fb.start_run(run_id))
            agent = create_agent(model, make_tools(ToolLog()), middleware=[guard])
            with pytest.raises(GraphRecursionError):
                guard.invoke(agent, prompt, config)
    else:

        async def main() -> None:
            async with await Fusebox.connect(stack.nats_url, tenant=TENANT) as afb:
                guard = FuseboxMiddleware(await afb.start_run(run_id))
                agent = create_agent(model, make_tools(ToolLog()), middleware=[guard])
                with pytest.raises(GraphRecursionError):
                    await guard.ainvoke(agent, prompt, config)

        asyncio.run(main())
    assert_closed(stack, run_id, "failed: GraphRecursionError")


@pytest.mark.parametrize("mode", MODES)
def test_side_effect_with_one_op_key_runs_once_across_a_retry(stack: Stack, mode: str) -> None:
    log = ToolLog()
    state, _ = drive(stack.nats_url, "retry_side_effect", mode, log)
    assert log.count("send_email") == 1
    answers = {m.tool_call_id: m for m in state["messages"] if isinstance(m, ToolMessage)}
    # The retry was answered with the stored result, under its own call id.
    assert '"sent": true' in str(answers["call_1_0"].content)
    assert answers["call_1_0"].status == "success"
    assert_history_valid(state["messages"])


@pytest.mark.parametrize("mode", MODES)
def test_fusebox_cancel_from_another_process_ends_the_run_at_its_next_step(
    stack: Stack, mode: str
) -> None:
    def cancel_on_third(run_id: str) -> Callable[[int], None]:
        def on_tool(executions: int) -> None:
            if executions == 3:
                fusebox_cancel(stack, run_id)

        return on_tool

    log = ToolLog()
    state, _ = drive(stack.nats_url, "pagination", mode, log, on_tool=cancel_on_third)
    assert log.count("list_issues") == 3
    report = stop_report(state)
    assert report is not None and report.state_name == "CANCELLED"
    assert_history_valid(state["messages"])


@pytest.mark.parametrize("policy", [GateOnError.DENY, GateOnError.ALLOW])
@pytest.mark.parametrize("mode", MODES)
def test_daemon_down(mode: str, policy: GateOnError) -> None:
    log = ToolLog()
    with bare_nats() as url:
        state, _ = drive(url, "one_search", mode, log, gate_on_error=policy, timeout_s=0.5)
    answers = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    if policy is GateOnError.DENY:
        assert log.count("search") == 0
        assert "no fuseboxd is listening" in str(answers[0].content)
        assert answers[0].status == "error"
    else:
        assert log.count("search") == 1
    assert state["messages"][-1].content == "done"
    assert_history_valid(state["messages"])


@pytest.mark.parametrize("mode", MODES)
def test_parallel_calls_are_each_gated_and_siblings_refused_after_a_stop(
    stack: Stack, mode: str
) -> None:
    log = ToolLog()
    state, _ = drive(stack.nats_url, "parallel_runaway", mode, log)
    assert log.count("search") == RUNAWAY_EXECUTIONS
    assert stop_report(state) is not None
    answers = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert any("stopped this run" in str(m.content) for m in answers)
    assert_history_valid(state["messages"])


@pytest.mark.parametrize("mode", MODES)
def test_summarization_is_reported_as_compaction(
    stack: Stack, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fusebox_guard.adapters.langchain import GuardedSummarization
    from fusebox_guard.run import Run
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    reported: list[str | None] = []
    original = Run.compaction

    async def spy(self: Run, reason: str | None = None) -> Any:
        reported.append(reason)
        return await original(self, reason)

    monkeypatch.setattr(Run, "compaction", spy)
    run_id = fresh_run(f"lc-{mode}-summary")
    log = ToolLog()
    model = ScriptedChatModel(scenario="pagination", remembers=True)
    summarizer = GenericFakeChatModel(messages=iter([AIMessage("pages so far: fine")] * 50))
    prompt = {"messages": [HumanMessage("go")]}

    def agent(guard: FuseboxMiddleware) -> Any:
        summary = GuardedSummarization(
            guard, summarizer, trigger=("messages", 10), keep=("messages", 4)
        )
        middleware: list[AgentMiddleware[Any, Any, Any]] = [summary, guard]
        return create_agent(model, make_tools(log), middleware=middleware)

    if mode == "sync":
        with SyncFusebox.connect(stack.nats_url, tenant=TENANT) as fb:
            guard = FuseboxMiddleware(fb.start_run(run_id))
            state = agent(guard).invoke(prompt, {"recursion_limit": 500})
    else:

        async def main() -> dict[str, Any]:
            async with await Fusebox.connect(stack.nats_url, tenant=TENANT) as afb:
                guard = FuseboxMiddleware(await afb.start_run(run_id))
                result: dict[str, Any] = await agent(guard).ainvoke(
                    prompt, {"recursion_limit": 500}
                )
                return result

        state = asyncio.run(main())
    assert reported and set(reported) == {"summarization"}
    # Compacted, and still a legitimate run: all 12 pages, nothing refused.
    assert [a for t, a in log.calls if t == "list_issues"] == list(range(1, PAGES + 1))
    assert stop_report(state) is None
    assert_history_valid(state["messages"])


# --- sub-agents: create_agent used as a tool, and a subgraph as a node --------------------

Script = Callable[[list[BaseMessage]], "list[Call] | str"]
#: Room for a runaway sub-agent's steps (a subgraph's count against its parent's limit).
CONFIG = {"recursion_limit": 200}


class PlayChatModel(OfflineChatModel):
    """Answers what `script` says for the messages: tool calls, or a final text."""

    script: Script

    @property
    def _llm_type(self) -> str:
        return "play"

    def answer(self, messages: list[BaseMessage]) -> AIMessage:
        reply = self.script(messages)
        if isinstance(reply, str):
            return AIMessage(content=reply)
        turn = sum(isinstance(m, AIMessage) for m in messages)
        calls = [{"name": n, "args": a, "id": f"{n}_{turn}", "type": "tool_call"} for n, a in reply]
        return AIMessage(content="", tool_calls=calls)


def lead_script(messages: list[BaseMessage]) -> list[Call] | str:
    return lead_calls(sum(isinstance(m, AIMessage) for m in messages)) or "done"


def researcher_script(messages: list[BaseMessage]) -> list[Call] | str:
    topic = topic_of(messages[0].content)
    turn = sum(isinstance(m, AIMessage) for m in messages)
    return researcher_calls(topic, turn) or researcher_answer(topic)


def researcher(guard: FuseboxMiddleware, log: ToolLog) -> Any:
    model = PlayChatModel(script=researcher_script)
    return create_agent(model, make_tools(log)[:1], middleware=[guard], name="researcher")


def lead(guard: FuseboxMiddleware, log: ToolLog, mode: str) -> Any:
    """The lead, whose `research` tool invokes the researcher agent (same guard)."""
    sub = researcher(guard, log)

    @tool(DELEGATE)
    def research(topic: str) -> str:
        """Delegate research on a topic."""
        return str(sub.invoke({"messages": [HumanMessage(topic)]})["messages"][-1].content)

    @tool(DELEGATE)
    async def aresearch(topic: str) -> str:
        """Delegate research on a topic."""
        state = await sub.ainvoke({"messages": [HumanMessage(topic)]})
        return str(state["messages"][-1].content)

    tools = [research if mode == "sync" else aresearch]
    model = PlayChatModel(script=lead_script)
    return create_agent(model, tools, middleware=[guard], name="lead")


def drive_tree(
    url: str,
    mode: str,
    build: Callable[[FuseboxMiddleware, ToolLog], Any],
    ask: str = "weather report",
    **start: Any,
) -> tuple[str, dict[str, Any], ToolLog]:
    """Runs the graph `build` makes behind a fresh run: its final state."""
    run_id, log = fresh_run(f"lc-{mode}-lead"), ToolLog()
    prompt = {"messages": [HumanMessage(ask)]}
    if mode == "sync":
        with SyncFusebox.connect(url, tenant=TENANT) as fb:
            guard = FuseboxMiddleware(fb.start_run(run_id, agent="lead", **start))
            return run_id, guard.invoke(build(guard, log), prompt, CONFIG), log

    async def main() -> dict[str, Any]:
        async with await Fusebox.connect(url, tenant=TENANT) as afb:
            guard = FuseboxMiddleware(await afb.start_run(run_id, agent="lead", **start))
            state: dict[str, Any] = await guard.ainvoke(build(guard, log), prompt, CONFIG)
            return state

    return run_id, asyncio.run(main()), log


@pytest.mark.parametrize("mode", MODES)
def test_an_agent_invoked_by_a_tool_is_a_child_run_and_its_stop_is_the_tools_result(
    stack: Stack, mode: str
) -> None:
    run_id, state, log = drive_tree(stack.nats_url, mode, lambda g, lg: lead(g, lg, mode))
    assert state["messages"][-1].content == "done" and stop_report(state) is None
    read = {m.tool_call_id: m for m in state["messages"] if isinstance(m, ToolMessage)}
    assert read[f"{DELEGATE}_0"].content == FOUND and read[f"{DELEGATE}_0"].status == "success"
    stopped = read[f"{DELEGATE}_1"]
    assert stopped.status == "error", stopped
    assert str(stopped.content).startswith("fusebox stopped the sub-agent researcher")
    assert "consecutive_blocks" in str(stopped.content)
    assert log.count("search") == 1 + RUNAWAY_SEARCHES
    nodes = asyncio.run(tree(stack, run_id))
    first, second = children(nodes, run_id)
    assert first.agent == second.agent == "researcher"
    assert first.executed == ["search"] and first.stop_reason == "completed"
    assert second.stop_reason == "consecutive_blocks"
    assert len(second.executed) == RUNAWAY_SEARCHES
    assert nodes[run_id].executed == [DELEGATE, DELEGATE]
    assert_closed(stack, run_id, "completed")


@pytest.mark.parametrize("mode", MODES)
def test_a_sub_agent_past_the_caps_does_not_run_and_the_lead_reads_why(
    stack: Stack, mode: str
) -> None:
    _, state, log = drive_tree(
        stack.nats_url, mode, lambda g, lg: lead(g, lg, mode), policy={"max_children": 1}
    )
    refused = [m for m in state["messages"] if isinstance(m, ToolMessage)][-1]
    assert refused.status == "error" and "spawn_limit" in str(refused.content)
    assert log.count("search") == 1  # the second researcher never ran
    assert state["messages"][-1].content == "done"


@pytest.mark.parametrize("mode", MODES)
def test_a_subgraph_node_is_a_child_run_and_the_parent_reads_its_stop(
    stack: Stack, mode: str
) -> None:
    def build(guard: FuseboxMiddleware, log: ToolLog) -> Any:
        builder = StateGraph(MessagesState)
        builder.add_node("research", guard.subgraph(researcher(guard, log)))
        builder.add_edge(START, "research")
        builder.add_edge("research", END)
        return builder.compile()

    # The researcher runs away on this topic.
    run_id, state, log = drive_tree(stack.nats_url, mode, build, ask=TOPICS[1])
    last = state["messages"][-1]
    assert isinstance(last, AIMessage) and last.name == "researcher"
    assert str(last.content).startswith("fusebox stopped the sub-agent researcher")
    assert stop_report(state) is None  # the child's stop is not the parent's
    assert log.count("search") == RUNAWAY_SEARCHES
    nodes = asyncio.run(tree(stack, run_id))
    (child,) = children(nodes, run_id)
    assert child.agent == "researcher" and child.stop_reason == "consecutive_blocks"
    assert nodes[run_id].calls == []
    assert_closed(stack, run_id, "completed")
