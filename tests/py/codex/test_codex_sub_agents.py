"""Codex's sub-agents (`spawn_agent`) as child runs, with the real `codex exec` offline
against a scripted Responses API that spawns a sub-agent and waits for it, `fusebox hook
codex` installed as docs/agents/codex.md tells a user (`--print-config`), in front of a
real fuseboxd. What the daemon holds is read back as the operator reads it: each run's
status (its place in the tree) and history.

No hook answer ends a Codex sub-agent: once its run is stopped each of its calls is
denied with the kept report, and the scripted sub-agent, as a model would, ends saying
so when it reads that it was stopped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.agent_runs import children, node, run_status
from support.coding_agents import Workspace, printed_block
from support.fake_codex_agents import FakeCodexAgents, Request, spawn_agent, wait_agent
from support.fake_model_api import Turn, say
from support.guard import RUNAWAY_EXECUTIONS
from support.stack import Stack

TENANT = "pytest-codex"
#: Calls the scripted sub-agent makes before it gives up.
PATIENCE = 10


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path)


def main_agent(ws: Workspace, request: Request) -> Turn:
    """Spawn a sub-agent, wait for it, run a command of its own, finish."""
    n = len(request.calls())
    if n == 0:
        return spawn_agent("look around the repository")
    if n == 1:
        return wait_agent(request.spawned())
    return ws.command("echo main") if n == 2 else say("done")


def session_of(api: FakeCodexAgents) -> str:
    [session] = {request.session_id for request in api.requests()}
    return session


def test_a_sub_agent_is_a_child_run_of_the_session(stack: Stack, ws: Workspace) -> None:
    def respond(request: Request) -> Turn:
        if request.sub_agent:
            return ws.command("echo sub") if not request.calls() else say("looked around")
        return main_agent(ws, request)

    hooks = printed_block(stack, "codex", stack.nats_url, TENANT)
    with FakeCodexAgents(respond) as api:
        run = ws.codex(api, hooks)
        session = session_of(api)
        [agent_id] = {r.thread_id for r in api.requests() if r.sub_agent}

    assert run.returncode == 0, run.stderr[-3000:]
    assert ws.executions() == 2
    child = f"{session}-{agent_id}"
    [row] = children(stack, TENANT, session)
    assert row["run"] == child and row["terminal_state"] == "COMPLETED", row
    sub = node(stack, TENANT, child)
    assert (sub.parent, sub.agent, sub.calls) == (session, "codex", [("Bash", "execute")]), sub
    main = node(stack, TENANT, session)
    assert main.parent is None
    assert [tool for tool, _ in main.calls] == [
        "spawn_agent",
        "multi_agent_v1wait_agent",
        "Bash",
    ], main
    assert run_status(stack, TENANT, session)["summary"]["terminal_state"] == "COMPLETED"


def test_a_looping_sub_agent_is_stopped_alone_and_the_main_agent_goes_on(
    stack: Stack, ws: Workspace
) -> None:
    # The sub-agent runs the same command until it reads that it was stopped (or gives
    # up); the main agent waits for it, then runs its own command, warned that its
    # sub-agent was stopped, and finishes.
    def respond(request: Request) -> Turn:
        if request.sub_agent:
            outputs = request.outputs()
            stopped = any("This sub-agent's run is stopped" in o for o in outputs)
            if stopped or len(outputs) >= PATIENCE:
                return say("the guard stopped me: I ran the same command again and again")
            return ws.command("cat status.txt || echo running")
        return main_agent(ws, request)

    hooks = printed_block(stack, "codex", stack.nats_url, TENANT)
    with FakeCodexAgents(respond) as api:
        run = ws.codex(api, hooks)
        session = session_of(api)
        [agent_id] = {r.thread_id for r in api.requests() if r.sub_agent}
        main_requests = [r for r in api.requests() if not r.sub_agent]
        sub_requests = [r for r in api.requests() if r.sub_agent]

    assert run.returncode == 0, run.stderr[-3000:]
    # The loop's executions, then the main agent's command.
    assert ws.executions() == RUNAWAY_EXECUTIONS + 1
    # The sub-agent read its stop, and ended before its patience ran out.
    last = sub_requests[-1].outputs()
    assert any("This sub-agent's run is stopped" in o for o in last), last
    assert len(last) < PATIENCE
    # The main agent read the sub-agent's answer, then the guard's warning.
    assert any("the guard stopped me" in o for o in main_requests[-1].outputs())
    words = main_requests[-1].developer_words()
    assert any("a sub-agent of this run was stopped by the guard" in w for w in words), words
    sub = run_status(stack, TENANT, f"{session}-{agent_id}")
    assert sub["summary"]["terminal_state"] == "STOPPED_LOOP_GUARD", sub["summary"]
    assert sub["summary"]["steps"] == RUNAWAY_EXECUTIONS, sub["summary"]
    assert sub["tree"]["parent"] == session, sub["tree"]
    main = node(stack, TENANT, session)
    assert main.calls[-1] == ("Bash", "warn"), main
    assert run_status(stack, TENANT, session)["summary"]["terminal_state"] == "COMPLETED"
