"""Gemini CLI's sub-agents (`invoke_agent`) with the real CLI offline against a scripted
Gemini API, `fusebox hook gemini-cli` installed as docs/agents/gemini-cli.md tells a
user, in front of a real fuseboxd.

Gemini CLI 0.61 fires a sub-agent's BeforeTool/AfterTool with the main agent's fields
(same session, no agent id, no SubagentStart) and runs the main agent's other calls of
the same turn at the same time, so nothing tells the two apart: a sub-agent's calls
are the session's run's, as docs/agents/gemini-cli.md says. What that means, with the
real binary: its calls count and loop in the session's run, and a stop of that run is
the session's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.agent_runs import children, node, run_status
from support.coding_agents import Workspace, printed_block
from support.fake_gemini_agents import FakeGeminiAgents, GeminiRequest, complete_task, invoke_agent
from support.fake_model_api import Turn, say
from support.guard import RUNAWAY_EXECUTIONS
from support.stack import Stack

TENANT = "pytest-gemini"
SUB_PROMPT = "SUB-AGENT: look around the repository"
#: The `generalist` sub-agent's turn limit in Gemini CLI 0.61 (`runConfig.maxTurns`).
SUB_AGENT_TURNS = 20


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path)


def main_agent(ws: Workspace, request: GeminiRequest) -> Turn:
    n = len(request.calls())
    if n == 0:
        return invoke_agent(SUB_PROMPT)
    return ws.command("echo main") if n == 1 else say("done")


def test_a_sub_agents_calls_are_the_sessions(stack: Stack, ws: Workspace) -> None:
    def respond(request: GeminiRequest) -> Turn:
        if request.sub_agent:
            return ws.command("echo sub") if not request.calls() else complete_task("looked")
        return main_agent(ws, request)

    settings = printed_block(stack, "gemini-cli", stack.nats_url, TENANT)
    with FakeGeminiAgents(SUB_PROMPT, respond) as api:
        run = ws.gemini(api, settings)

    assert run.returncode == 0, run.stderr[-3000:]
    assert ws.executions() == 2
    session = ws.gemini_run(TENANT)
    # No child run: the sub-agent's calls, its complete_task included, are the
    # session's, between invoke_agent's call and its result.
    assert children(stack, TENANT, session) == []
    calls = node(stack, TENANT, session).calls
    assert calls == [
        ("invoke_agent", "execute"),
        ("run_shell_command", "execute"),
        ("complete_task", "execute"),
        ("run_shell_command", "execute"),
    ], calls
    assert run_status(stack, TENANT, session)["summary"]["terminal_state"] == "COMPLETED"


def test_a_looping_sub_agent_stops_the_session(stack: Stack, ws: Workspace) -> None:
    # The sub-agent's loop is the session's run's loop: the guard stops the session.
    # Gemini CLI hands a sub-agent a stopped call's answer as the call's error (its
    # sub-agent loop does not end on it, as the main loop does), so the sub-agent goes
    # on, every call refused, nothing run, until its turn limit; then invoke_agent ends
    # with the stop, and so does the agent.
    def respond(request: GeminiRequest) -> Turn:
        if request.sub_agent:
            return ws.command("cat status.txt || echo running")
        return main_agent(ws, request)

    settings = printed_block(stack, "gemini-cli", stack.nats_url, TENANT)
    with FakeGeminiAgents(SUB_PROMPT, respond) as api:
        run = ws.gemini(api, settings)
        requests = api.requests()

    assert ws.executions() == RUNAWAY_EXECUTIONS
    main_requests = [r for r in requests if not r.sub_agent]
    sub_requests = [r for r in requests if r.sub_agent]
    # The main agent was not asked again: its `echo main` never came.
    assert len(main_requests) == 1, [r.calls() for r in main_requests]
    assert len(sub_requests) <= SUB_AGENT_TURNS + 1
    said = sub_requests[-1].outputs()[-1]
    assert "Agent execution stopped by hook: fusebox: run stopped" in said, said
    assert "Agent execution stopped by hook: fusebox: run stopped" in run.stdout + run.stderr
    session = ws.gemini_run(TENANT)
    summary = run_status(stack, TENANT, session)["summary"]
    assert summary["terminal_state"] == "STOPPED_LOOP_GUARD", summary
    assert summary["steps"] == 1 + RUNAWAY_EXECUTIONS, summary
