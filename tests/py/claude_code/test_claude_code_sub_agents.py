"""Claude Code's sub-agents (the Agent tool) as child runs, with the real CLI (the one in
the claude-agent-sdk wheel) offline against the scripted model API, `fusebox hook
claude-code` installed as the README tells a user (`--print-settings`), in front of a
real fuseboxd. What the daemon holds is read back as the operator reads it: each run's
status (its place in the tree) and history.

The scripted model tells the main agent's requests from the sub-agent's by the
sub-agent's prompt, which is the first message of the sub-agent's requests only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from support.agent_runs import children, node, run_status
from support.claude_code import fusebox, run_claude
from support.fake_anthropic import FakeAnthropic, Turn, text, tool_use
from support.guard import RUNAWAY_EXECUTIONS, TENANT
from support.stack import Stack

#: What the main agent asks its sub-agent; it marks the sub-agent's requests.
SUB_PROMPT = "SUB-AGENT: look around the repository"


def hook_settings(stack: Stack) -> dict[str, Any]:
    printed = fusebox(stack, "hook", "claude-code", "--print-settings", "--tenant", TENANT)
    settings: dict[str, Any] = json.loads(printed)
    return settings


class Workspace:
    def __init__(self, root: Path) -> None:
        self.home = root / "home"
        self.cwd = root / "work"
        self.home.mkdir()
        self.cwd.mkdir()
        self.ledger = root / "executed.txt"

    def bash(self, command: str) -> Turn:
        """A Bash call, counted (with who made it) before it runs."""
        return tool_use("Bash", {"command": f"echo {command!r} >> {self.ledger}; {command}"})

    def executed(self) -> list[str]:
        return self.ledger.read_text().splitlines() if self.ledger.exists() else []


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path)


def claude(api: FakeAnthropic, stack: Stack, ws: Workspace) -> dict[str, Any]:
    """The session's result: `claude -p` given the task, with the hook as printed, Bash
    and Agent allowed."""
    return run_claude(
        api,
        "do the task",
        home=ws.home,
        cwd=ws.cwd,
        settings=hook_settings(stack),
        allowed_tools=("Bash", "Agent"),
    ).result()


def is_sub_agent(body: dict[str, Any]) -> bool:
    return SUB_PROMPT in json.dumps(body["messages"][:1])


def turn_of(body: dict[str, Any]) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def delegate(background: bool = False) -> Turn:
    return tool_use(
        "Agent",
        {
            "description": "Look around",
            "prompt": SUB_PROMPT,
            "subagent_type": "general-purpose",
            "run_in_background": background,
        },
    )


def said(api: FakeAnthropic) -> str:
    """Everything the main agent's model was sent (tool results and hook context)."""
    return json.dumps([b for b in api.message_requests() if not is_sub_agent(b)])


def agent_id_of(api: FakeAnthropic) -> str:
    """The sub-agent's id, as the Agent call's result told the main agent."""
    found = re.search(r"agentId: (\w+)", said(api))
    assert found, said(api)[-2000:]
    return found.group(1)


def test_a_sub_agent_is_a_child_run_of_the_session(stack: Stack, ws: Workspace) -> None:
    # The main agent delegates; the sub-agent runs two commands and answers; the main
    # agent runs one of its own and finishes.
    def respond(body: dict[str, Any]) -> Turn:
        n = turn_of(body)
        if is_sub_agent(body):
            return ws.bash(f"echo sub {n}") if n < 2 else text("looked around")
        return [delegate(), ws.bash("echo main"), text("done")][min(n, 2)]

    with FakeAnthropic(respond=respond) as api:
        result = claude(api, stack, ws)
        agent_id = agent_id_of(api)

    assert result["result"] == "done" and result["permission_denials"] == [], result
    assert ws.executed() == ["echo sub 0", "echo sub 1", "echo main"]
    session = result["session_id"]
    child = f"{session}-{agent_id}"
    # The session's run lists the sub-agent's as its one child, finished.
    [row] = children(stack, TENANT, session)
    assert row["run"] == child and row["terminal_state"] == "COMPLETED", row
    # The sub-agent's run_started named the session's run; its calls are its own.
    sub = node(stack, TENANT, child)
    assert (sub.parent, sub.agent) == (session, "claude-code"), sub
    assert sub.calls == [("Bash", "execute"), ("Bash", "execute")], sub
    status = run_status(stack, TENANT, child)
    assert status["tree"]["parent"] == session and status["tree"]["depth"] == 1, status
    main = node(stack, TENANT, session)
    assert main.parent is None
    assert main.calls == [("Agent", "execute"), ("Bash", "execute")], main
    summary = run_status(stack, TENANT, session)["summary"]
    assert summary["terminal_state"] == "COMPLETED" and summary["steps"] == 2, summary


def test_a_background_sub_agent_is_a_child_run_too(stack: Stack, ws: Workspace) -> None:
    # Agent's default: in the background. Its start comes after the Agent call's result
    # (the launch), its hooks interleave with the main agent's; only its agent_id tells
    # them apart. Its completion notice, a prompt Claude Code submits, is no new task.
    def respond(body: dict[str, Any]) -> Turn:
        n = turn_of(body)
        if is_sub_agent(body):
            return ws.bash("sleep 1; echo sub") if n == 0 else text("looked around")
        return [delegate(background=True), ws.bash("echo main")][n] if n < 2 else text("done")

    with FakeAnthropic(respond=respond) as api:
        result = claude(api, stack, ws)
        agent_id = agent_id_of(api)

    assert sorted(ws.executed()) == ["echo main", "sleep 1; echo sub"]
    session = result["session_id"]
    sub = node(stack, TENANT, f"{session}-{agent_id}")
    assert (sub.parent, sub.calls) == (session, [("Bash", "execute")]), sub
    assert run_status(stack, TENANT, sub.run)["summary"]["terminal_state"] == "COMPLETED"
    main = node(stack, TENANT, session)
    assert main.calls == [("Agent", "execute"), ("Bash", "execute")], main


def test_a_looping_sub_agent_is_stopped_alone_and_the_main_agent_goes_on(
    stack: Stack, ws: Workspace
) -> None:
    # The sub-agent runs the same command for ever. The guard stops its run; the stop
    # (a deny with continue: false) ends the sub-agent, not the session. The main agent
    # reads the stop with the Agent call's result, is warned at its next call, and
    # finishes its task.
    def respond(body: dict[str, Any]) -> Turn:
        if is_sub_agent(body):
            return ws.bash("cat status.txt || echo running")
        return [delegate(), ws.bash("echo main"), text("done")][min(turn_of(body), 2)]

    with FakeAnthropic(respond=respond) as api:
        result = claude(api, stack, ws)
        agent_id = agent_id_of(api)
        main_read = said(api)

    loop = "cat status.txt || echo running"
    assert ws.executed() == [loop] * RUNAWAY_EXECUTIONS + ["echo main"]
    # The session went on to its end.
    assert result["terminal_reason"] == "completed" and result["result"] == "done", result
    assert f"the guard stopped sub-agent {agent_id}" in main_read
    assert "run stopped (STOPPED_LOOP_GUARD)" in main_read
    assert "a sub-agent of this run was stopped by the guard" in main_read
    session = result["session_id"]
    child = f"{session}-{agent_id}"
    sub = run_status(stack, TENANT, child)
    assert sub["summary"]["terminal_state"] == "STOPPED_LOOP_GUARD", sub["summary"]
    assert sub["summary"]["steps"] == RUNAWAY_EXECUTIONS, sub["summary"]
    assert sub["tree"]["parent"] == session, sub["tree"]
    main = node(stack, TENANT, session)
    assert main.calls == [("Agent", "execute"), ("Bash", "warn")], main
    summary = run_status(stack, TENANT, session)["summary"]
    assert summary["terminal_state"] == "COMPLETED", summary


def test_the_sessions_cancel_stops_its_running_sub_agent(stack: Stack, ws: Workspace) -> None:
    # An operator cancels the session while its sub-agent works: the sub-agent's next
    # call is refused (its run was closed with the session's), which ends it, and the
    # session ends at the guard's next answer to the main agent.
    def respond(body: dict[str, Any]) -> Turn:
        n = turn_of(body)
        if is_sub_agent(body):
            if n == 1:
                session = session_id(ws)
                fusebox(stack, "cancel", f"{TENANT}/{session}", "--reason", "wrong branch")
            return ws.bash(f"echo sub {n}") if n < 3 else text("looked around")
        return [delegate(), ws.bash("echo main"), text("done")][min(turn_of(body), 2)]

    with FakeAnthropic(respond=respond) as api:
        result = claude(api, stack, ws)

    # One command of the sub-agent ran before the cancel; nothing after it.
    assert ws.executed() == ["echo sub 0"]
    assert result["terminal_reason"] == "hook_stopped", result
    session = result["session_id"]
    [row] = children(stack, TENANT, session)
    sub = run_status(stack, TENANT, row["run"])
    assert sub["summary"]["terminal_state"] == "CANCELLED", sub["summary"]
    assert sub["summary"]["reason"] == "ancestor_stopped", sub["summary"]
    assert sub["tree"]["stopped_by"] == session, sub["tree"]


def session_id(ws: Workspace) -> str:
    """The one session of this HOME (Claude Code names its transcript after it)."""
    transcripts = list((ws.home / ".claude" / "projects").glob("*/*.jsonl"))
    assert len(transcripts) == 1, transcripts
    return transcripts[0].stem
