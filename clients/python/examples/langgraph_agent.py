"""A LangChain v1 `create_agent` agent behind fuseboxd: `--mode loop` searches the same
thing forever and is stopped; `--mode paginate` reads 12 pages and finishes untouched.

The chat model is a few lines of script standing in for an LLM (no network); the agent,
its tools and the middleware are the real LangChain/LangGraph ones. `--sync` runs the
graph with `invoke` on the sync facade, otherwise `ainvoke` on the async client.

    python clients/python/examples/langgraph_agent.py --nats nats://127.0.0.1:4222 --mode loop
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from fusebox_guard import Fusebox, SyncFusebox
from fusebox_guard.adapters.langchain import FuseboxMiddleware, stop_report
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

PAGES = 12


class ScriptedModel(BaseChatModel):
    """Stands in for the LLM: `loop` asks for the same search every turn, `paginate`
    asks for pages 1..12 and then answers."""

    mode: str

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        turn = sum(isinstance(m, AIMessage) for m in messages)
        if self.mode == "loop":
            call = {"name": "search", "args": {"query": "weather tokyo"}}
        elif turn < PAGES:
            call = {"name": "list_issues", "args": {"page": turn + 1}}
        else:
            return ChatResult(generations=[ChatGeneration(message=AIMessage("all pages read"))])
        message = AIMessage("", tool_calls=[{**call, "id": f"call_{turn}", "type": "tool_call"}])
        return ChatResult(generations=[ChatGeneration(message=message)])


@tool
def search(query: str) -> dict[str, Any]:
    """Search the web."""
    return {"hits": ["jma.go.jp"]}


@tool
def list_issues(page: int) -> dict[str, Any]:
    """One page of the issue list."""
    return {"issues": [f"ISSUE-{page * 10}", f"ISSUE-{page * 10 + 1}"], "next": page < PAGES}


def report(run: str, state: dict[str, Any]) -> int:
    answers = sum(1 for m in state["messages"] if getattr(m, "type", "") == "tool")
    stop = stop_report(state)
    what = (
        f"STOPPED by fusebox: {stop.summary()}"
        if stop
        else f"finished: {state['messages'][-1].content}"
    )
    print(f"[langgraph agent {run}] {what} ({answers} tool answers)")
    return 0


async def run_async(args: argparse.Namespace) -> int:
    async with await Fusebox.connect(args.nats, tenant=args.tenant) as fb:
        run = await fb.start_run(args.run, agent="triager")
        agent = create_agent(
            ScriptedModel(mode=args.mode),
            [search, list_issues],
            middleware=[FuseboxMiddleware(run)],
        )
        state = await agent.ainvoke({"messages": [HumanMessage("go")]}, {"recursion_limit": 500})
        await run.close()
        return report(args.run, state)


def run_sync(args: argparse.Namespace) -> int:
    with SyncFusebox.connect(args.nats, tenant=args.tenant) as fb:
        run = fb.start_run(args.run, agent="triager")
        agent = create_agent(
            ScriptedModel(mode=args.mode),
            [search, list_issues],
            middleware=[FuseboxMiddleware(run)],
        )
        state = agent.invoke({"messages": [HumanMessage("go")]}, {"recursion_limit": 500})
        run.close()
        return report(args.run, state)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nats", default="nats://127.0.0.1:4222")
    parser.add_argument("--tenant", default="demo")
    parser.add_argument("--mode", choices=["loop", "paginate"], default="loop")
    parser.add_argument("--run", default=f"py-lg-{time.time_ns() % 10**8}")
    parser.add_argument("--sync", action="store_true")
    args = parser.parse_args()
    return run_sync(args) if args.sync else asyncio.run(run_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
