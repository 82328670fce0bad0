"""An OpenAI Agents SDK agent stuck on the same search, stopped by fuseboxd.

The model is the SDK's own scripted test model (no LLM, no network): it asks for the same
search every turn, as a stuck agent does. Everything else is real: the SDK runs the tool,
fusebox_guard's guardrails ask fuseboxd before each call.

    python clients/python/examples/openai_agents_runaway.py --nats nats://127.0.0.1:4222
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from agents import Agent, function_tool, set_tracing_disabled
from agents.testing import ModelCall, ModelStep, ScriptedModel, function_call
from agents.usage import Usage
from fusebox_guard import Fusebox, RunStopped
from fusebox_guard.adapters.openai_agents import OpenAIAgentsGuard

TAG = "python agent "


def say(run: str, line: str) -> None:
    print(f"[{TAG} {run}] {line}", flush=True)


def stuck_model(run: str) -> ScriptedModel:
    """Every turn: show what the model read for its last call, then search again."""
    turn = 0

    def respond(call: ModelCall) -> Any:
        nonlocal turn
        turn += 1
        items = call.input if isinstance(call.input, list) else []
        outputs = [
            i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"
        ]
        if outputs:
            text = str(outputs[-1]["output"]).replace("\n", " ")
            if "fusebox" in text:
                say(run, f"model reads: {text if len(text) < 140 else text[:137] + '...'}")
        return [function_call("search", {"query": "weather tokyo"}, call_id=f"call_{turn}")]

    model = ScriptedModel([ModelStep.respond(respond) for _ in range(200)])
    model.set_default_usage(Usage(requests=1, input_tokens=900, output_tokens=40))
    return model


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nats", default="nats://127.0.0.1:4222")
    parser.add_argument("--tenant", default="demo")
    parser.add_argument("--run", default=f"py-research-{time.time_ns() % 10**8}")
    args = parser.parse_args()
    set_tracing_disabled(True)

    executions = 0

    @function_tool
    def search(query: str) -> dict[str, Any]:
        """Search the web."""
        nonlocal executions
        executions += 1
        say(args.run, f"search({query!r}) ran (execution {executions})")
        return {"hits": ["jma.go.jp"]}

    async with await Fusebox.connect(args.nats, tenant=args.tenant) as fb:
        run = await fb.start_run(args.run, agent="researcher", tools=["search"])
        guard = OpenAIAgentsGuard(run)
        agent = guard.protect(Agent(name="researcher", model=stuck_model(args.run), tools=[search]))
        try:
            # max_turns far above the SDK's default 10: the guard, not the SDK, ends it.
            await guard.run_agent(agent, "What is the weather in Tokyo?", max_turns=200)
        except RunStopped as stop:
            why = stop.report.summary() if stop.report else "stopped"
            say(args.run, f"STOPPED by fusebox after {executions} executions: {why}")
            await run.close()
            return 0
        say(args.run, "finished without a stop (unexpected for this agent)")
        return 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
