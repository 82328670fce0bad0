"""Copilot CLI's sub-agents (the `task` tool) as child runs, with the real `copilot -p`
offline in BYOK mode against a scripted chat-completions API, the hooks file `fusebox
hook copilot-cli --print-config` prints installed as docs/agents/copilot-cli.md tells a
user, in front of a real fuseboxd. What the daemon holds is read back as the operator
reads it: each run's status (its place in the tree) and history.

The scripted model tells the requests apart by their first user message: the prompt the
main agent gave the sub-agent is the first message of the sub-agent's requests only. No
hook answer ends a Copilot CLI sub-agent: once its run is stopped each of its calls is
denied with the stop, and the scripted sub-agent gives up after a while, as a model
would.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.agent_runs import children, node, run_status
from support.coding_agents import Workspace
from support.copilot_cli import copilot, printed_hooks
from support.fake_chat_completions import ChatCall, FakeChatCompletions
from support.fake_model_api import Turn, say, shell
from support.guard import RUNAWAY_EXECUTIONS
from support.stack import Stack

TENANT = "pytest-copilot-sub"
#: What the main agent asks its sub-agent (and a sub-agent its own); it marks their
#: requests.
SUB = "SUB-AGENT: run the checks"
INNER = "INNER-AGENT: run one more check"
#: Calls the scripted sub-agent makes before it gives up.
PATIENCE = 10


@pytest.fixture
def ws(tmp_path: Path, unpacked_copilot: Path) -> Workspace:
    return Workspace(tmp_path, cache=unpacked_copilot)


def delegate(prompt: str = SUB, mode: str = "sync") -> Turn:
    return ChatCall(
        name="task",
        arguments={
            "name": "checker",
            "agent_type": "task",
            "description": "Run the checks",
            "prompt": prompt,
            "mode": mode,
        },
    )


def first_prompt(body: dict[str, Any]) -> str:
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    return json.dumps(users[:1])


def whose(body: dict[str, Any]) -> str:
    """Which agent's request: "inner" (a sub-agent's sub-agent), "sub" or "main"."""
    prompt = first_prompt(body)
    return "inner" if INNER in prompt else "sub" if SUB in prompt else "main"


def results(body: dict[str, Any]) -> int:
    """How many tool results the agent whose request it is has read."""
    return sum(1 for m in body.get("messages", []) if m.get("role") == "tool")


def run(ws: Workspace, who: str, command: str) -> Turn:
    """A shell call, counted with who made it before it runs."""
    return shell(f"echo {who} >> {ws.ledger}; {command}")


def executed(ws: Workspace) -> list[str]:
    return ws.ledger.read_text().splitlines() if ws.ledger.exists() else []


def main_agent(ws: Workspace, body: dict[str, Any]) -> Turn:
    """Delegate, then run a command of its own, then finish."""
    return [delegate(), run(ws, "main", "echo main"), say("done")][min(results(body), 2)]


def main_read(api: FakeChatCompletions) -> str:
    """Everything the main agent's model was sent."""
    return json.dumps([b for b in api.bodies if whose(b) == "main"])


def session_of(done_stderr: str, done_stdout: str) -> str:
    found = re.search(r"--resume=([0-9a-f-]{36})", done_stderr + done_stdout)
    assert found, (done_stdout[-1500:], done_stderr[-1500:])
    return found.group(1)


def sessions(stack: Stack, tenant: str, open_: bool = True) -> list[str]:
    """The open (or closed) runs of `tenant` that are no sub-agent's."""
    listed = subprocess.run(
        [str(stack.bin("fusebox")), "runs", "--json", "--nats-url", stack.nats_url],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    rows = [json.loads(line) for line in listed.splitlines() if line]
    return [
        row["run"]
        for row in rows
        if row.get("tenant") == tenant and row.get("open") == open_ and len(row["run"]) == 36
    ]


def guarded(
    stack: Stack, ws: Workspace, respond_to: Callable[[dict[str, Any]], Turn], tenant: str = TENANT
) -> tuple[str, str]:
    """The session's run id and what its main agent read."""
    hooks = printed_hooks(stack, stack.nats_url, tenant)
    with FakeChatCompletions(respond_to=respond_to, describe=True) as api:
        done = copilot(ws, api, hooks)
        read = main_read(api)
    assert done.returncode == 0, done.stderr[-3000:]
    return session_of(done.stderr, done.stdout), read


def test_a_sub_agent_is_a_child_run_of_the_session(stack: Stack, ws: Workspace) -> None:
    # The main agent delegates; the sub-agent runs two commands and answers; the main
    # agent runs one of its own and finishes.
    def respond_to(body: dict[str, Any]) -> Turn:
        if whose(body) == "sub":
            n = results(body)
            return run(ws, "sub", f"echo sub {n}") if n < 2 else say("checked")
        return main_agent(ws, body)

    session, _ = guarded(stack, ws, respond_to)

    assert executed(ws) == ["sub", "sub", "main"]
    # The session's run lists the sub-agent's as its one child, finished.
    [row] = children(stack, TENANT, session)
    child = row["run"]
    assert re.fullmatch(f"{session}-[0-9a-f-]{{36}}", child), row
    assert row["terminal_state"] == "COMPLETED", row
    # The sub-agent's run_started named the session's run; its calls are its own.
    sub = node(stack, TENANT, child)
    assert (sub.parent, sub.agent) == (session, "copilot-cli"), sub
    assert sub.calls == [("bash", "execute"), ("bash", "execute")], sub
    status = run_status(stack, TENANT, child)
    assert status["tree"]["parent"] == session and status["tree"]["depth"] == 1, status
    main = node(stack, TENANT, session)
    assert main.parent is None
    assert main.calls == [("task", "execute"), ("bash", "execute")], main
    summary = run_status(stack, TENANT, session)["summary"]
    assert summary["terminal_state"] == "COMPLETED" and summary["steps"] == 2, summary


def test_a_sub_agents_sub_agent_is_its_child(stack: Stack, ws: Workspace) -> None:
    # A sub-agent has `task` too: its sub-agent's hooks name it as parent (parentAgentId),
    # and its run is a child of the sub-agent's, in the session's tree.
    def respond_to(body: dict[str, Any]) -> Turn:
        n = results(body)
        if whose(body) == "inner":
            return run(ws, "inner", "echo inner") if n == 0 else say("inner checked")
        if whose(body) == "sub":
            return [delegate(INNER), run(ws, "sub", "echo sub"), say("checked")][min(n, 2)]
        return main_agent(ws, body)

    session, _ = guarded(stack, ws, respond_to)

    assert executed(ws) == ["inner", "sub", "main"]
    [sub] = children(stack, TENANT, session)
    [inner] = children(stack, TENANT, sub["run"])
    assert inner["run"].startswith(f"{session}-"), inner
    status = run_status(stack, TENANT, inner["run"])
    assert status["tree"]["parent"] == sub["run"], status["tree"]
    assert status["tree"]["depth"] == 2 and status["tree"]["root"] == session, status["tree"]
    assert node(stack, TENANT, inner["run"]).calls == [("bash", "execute")]
    assert node(stack, TENANT, sub["run"]).calls == [("task", "execute"), ("bash", "execute")]
    assert {sub["terminal_state"], inner["terminal_state"]} == {"COMPLETED"}


def test_a_background_sub_agent_is_a_child_run_too(stack: Stack, ws: Workspace) -> None:
    # `mode: "background"`: the task's result is the launch, and the sub-agent's hooks
    # interleave with the main agent's, which waits for it with read_agent; only their
    # agentId tells them apart.
    def respond_to(body: dict[str, Any]) -> Turn:
        n = results(body)
        if whose(body) == "sub":
            return run(ws, "sub", "sleep 1; echo sub") if n == 0 else say("checked")
        if n == 0:
            return delegate(mode="background")
        if n == 1:
            launched = re.search(r"agent_id: ([0-9a-f-]{36})", json.dumps(body["messages"]))
            assert launched, body["messages"][-1]
            arguments = {"agent_id": launched.group(1), "wait": True, "timeout": 60}
            return ChatCall(name="read_agent", arguments=arguments)
        return run(ws, "main", "echo main") if n == 2 else say("done")

    session, _ = guarded(stack, ws, respond_to)

    assert executed(ws) == ["sub", "main"]
    [row] = children(stack, TENANT, session)
    sub = node(stack, TENANT, row["run"])
    assert (sub.parent, sub.calls) == (session, [("bash", "execute")]), sub
    assert row["terminal_state"] == "COMPLETED", row
    main = node(stack, TENANT, session)
    assert [tool for tool, _ in main.calls] == ["task", "read_agent", "bash"], main


def test_a_session_that_goes_on_after_its_end_goes_on_in_its_next_run(
    stack: Stack, ws: Workspace
) -> None:
    # The main agent launches a background sub-agent and ends its turn at once: `copilot
    # -p` fires sessionEnd (the session's run is completed), waits for the sub-agent,
    # submits its notice as a prompt (and reads the sub-agent itself), and the main agent
    # takes another turn. What the session does after its end goes on in its next run,
    # `<session>-2`, whose child the sub-agent is then. The sub-agent's first request is
    # answered once the first end closed the session's run.
    tenant = f"{TENANT}-{ws.root.name}"[:60]
    notified: list[bool] = []

    def respond_to(body: dict[str, Any]) -> Turn:
        n = results(body)
        if whose(body) == "sub":
            if n == 0:
                while not sessions(stack, tenant, open_=False):
                    time.sleep(0.1)
            return run(ws, "sub", f"echo sub {n}") if n < 2 else say("checked")
        if n == 0:
            return delegate(mode="background")
        users = [m for m in body["messages"] if m.get("role") == "user"]
        if "<system_notification>" not in json.dumps(users):
            return say("waiting for the checker")
        if not notified:
            notified.append(True)
            return run(ws, "main", "echo main")
        return say("done")

    session, _ = guarded(stack, ws, respond_to, tenant)

    assert executed(ws) == ["sub", "sub", "main"]
    first = node(stack, tenant, session)
    assert first.calls == [("task", "execute")], first
    assert run_status(stack, tenant, session)["summary"]["terminal_state"] == "COMPLETED"
    went_on = f"{session}-2"
    second = node(stack, tenant, went_on)
    assert (second.parent, second.agent) == (None, "copilot-cli"), second
    assert second.calls == [("bash", "execute")], second
    [row] = children(stack, tenant, went_on)
    sub = node(stack, tenant, row["run"])
    assert (sub.parent, sub.calls) == (went_on, [("bash", "execute")] * 2), sub
    summary = run_status(stack, tenant, went_on)["summary"]
    assert summary["terminal_state"] == "COMPLETED", summary


def test_a_looping_sub_agent_is_stopped_alone_and_the_main_agent_goes_on(
    stack: Stack, ws: Workspace
) -> None:
    # The sub-agent runs the same command for ever. The guard stops its run; each of its
    # later calls is denied with the stop, and it gives up. The main agent reads the stop
    # with the task's result, is warned at its next call, and finishes its own work.
    loop = "cat status.txt || echo running"

    def respond_to(body: dict[str, Any]) -> Turn:
        if whose(body) == "sub":
            return run(ws, "sub", loop) if results(body) < PATIENCE else say("gave up")
        return main_agent(ws, body)

    session, read = guarded(stack, ws, respond_to)

    assert executed(ws) == ["sub"] * RUNAWAY_EXECUTIONS + ["main"]
    assert "the guard stopped sub-agent" in read and "STOPPED_LOOP_GUARD" in read, read[-3000:]
    [row] = children(stack, TENANT, session)
    sub = run_status(stack, TENANT, row["run"])
    assert sub["summary"]["terminal_state"] == "STOPPED_LOOP_GUARD", sub["summary"]
    assert sub["summary"]["steps"] == RUNAWAY_EXECUTIONS, sub["summary"]
    assert sub["tree"]["parent"] == session, sub["tree"]
    main = node(stack, TENANT, session)
    assert main.calls == [("task", "execute"), ("bash", "warn")], main
    summary = run_status(stack, TENANT, session)["summary"]
    assert summary["terminal_state"] == "COMPLETED", summary


def test_the_sessions_cancel_stops_its_running_sub_agent(stack: Stack, ws: Workspace) -> None:
    # An operator cancels the session while its sub-agent works: the sub-agent's next
    # call is refused (its run was closed with the session's), and so is the main
    # agent's.
    tenant = f"{TENANT}-{ws.root.name}"[:60]

    def respond_to(body: dict[str, Any]) -> Turn:
        if whose(body) == "sub":
            n = results(body)
            if n == 1:
                [session] = sessions(stack, tenant)
                subprocess.run(
                    [
                        *(str(stack.bin("fusebox")), "cancel", f"{tenant}/{session}"),
                        *("--reason", "wrong branch", "--nats-url", stack.nats_url),
                    ],
                    check=True,
                    timeout=30,
                    capture_output=True,
                )
            return run(ws, "sub", f"echo sub {n}") if n < 3 else say("stopped")
        return main_agent(ws, body)

    session, _ = guarded(stack, ws, respond_to, tenant)

    # One command of the sub-agent ran before the cancel; nothing after it.
    assert executed(ws) == ["sub"]
    [row] = children(stack, tenant, session)
    sub = run_status(stack, tenant, row["run"])
    assert sub["summary"]["terminal_state"] == "CANCELLED", sub["summary"]
    assert sub["summary"]["reason"] == "ancestor_stopped", sub["summary"]
    assert sub["tree"]["stopped_by"] == session, sub["tree"]
    sub_calls = node(stack, tenant, row["run"]).calls
    assert sub_calls[0] == ("bash", "execute") and len(sub_calls) > 1, sub_calls
    assert all(action == "stop" for _, action in sub_calls[1:]), sub_calls
