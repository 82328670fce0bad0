"""The real OpenCode (`opencode-ai`, pinned in tests/npm) in `opencode run`, offline
against a scripted chat-completions API, with the fusebox plugin installed as
docs/agents/opencode.md tells a user (`fusebox hook opencode --print-plugin` saved in
~/.config/opencode/plugin/), in front of a real fuseboxd. Every scripted command counts
itself in the workspace's ledger before it runs, so a refused call leaves no line.

OpenCode's own guard is a `doom_loop` permission prompt after 3 identical calls, which
`permission: {"*": "allow"}` (what a headless run needs) answers yes: what stops a loop
here is fusebox.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.coding_agents import Workspace
from support.fake_chat_completions import ChatCall, FakeChatCompletions
from support.fake_model_api import Turn, say
from support.guard import RUNAWAY_EXECUTIONS, bare_nats
from support.opencode import opencode, printed_plugin, session_ids
from support.stack import Stack

TENANT = "pytest-opencode"
#: Calls the scripted model makes before it gives up, if nothing stops it first.
PATIENCE = 10


def fusebox(stack: Stack, *args: str) -> str:
    done = subprocess.run(
        [str(stack.bin("fusebox")), *args, "--nats-url", stack.nats_url],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout


def summary(stack: Stack, run: str) -> dict[str, Any]:
    status: dict[str, Any] = json.loads(fusebox(stack, "run", f"{TENANT}/{run}", "--json"))
    return dict(status["summary"])


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path)


def calls_then_give_up(turn: Callable[[int], Turn], calls: int = PATIENCE) -> Callable[[int], Turn]:
    return lambda n: turn(n) if n < calls else say("gave up")


def refused(outputs: list[str]) -> list[str]:
    return [o for o in outputs if "fusebox:" in o]


def test_runaway_loop_is_stopped_and_the_session_ends(stack: Stack, ws: Workspace) -> None:
    plugin = printed_plugin(stack, stack.nats_url, TENANT)
    runaway = calls_then_give_up(lambda _: ws.command("cat status.txt || echo running"))
    with FakeChatCompletions(respond=runaway) as api:
        run = opencode(ws, api, plugin)
        outputs = api.tool_outputs()
        served = api.turns_served()

    assert ws.executions() == RUNAWAY_EXECUTIONS, (outputs, run.stderr[-3000:])
    # Two blocks, then the stop: the model read each in the guard's words, and the
    # aborted session asked the model nothing more.
    denials = refused(outputs)
    assert len(denials) >= 2 and all("already ran" in d for d in denials[:2]), outputs
    assert served <= RUNAWAY_EXECUTIONS + 3, (served, run.stdout[-2000:])
    [session] = session_ids(run)
    status = summary(stack, session)
    assert status["open"] is False and status["agent"] == "opencode", status
    assert status["terminal_state"] == "STOPPED_LOOP_GUARD", status


def test_twelve_distinct_calls_run_untouched(stack: Stack, ws: Workspace) -> None:
    plugin = printed_plugin(stack, stack.nats_url, TENANT)
    pages = calls_then_give_up(lambda n: ws.command(f"echo page {n + 1}"), calls=12)
    with FakeChatCompletions(respond=pages) as api:
        run = opencode(ws, api, plugin)
        outputs = api.tool_outputs()

    assert run.returncode == 0, run.stderr[-3000:]
    assert ws.executions() == 12
    assert len(outputs) == 12
    assert all(f"page {n}" in out for n, out in enumerate(outputs, 1)), outputs
    assert not refused(outputs)
    # The run closed when the agent ended.
    [session] = session_ids(run)
    status = summary(stack, session)
    assert status["steps"] == 12, status
    assert status["open"] is False and status["terminal_state"] == "COMPLETED", status


def test_the_stop_is_said_to_the_user(stack: Stack, ws: Workspace) -> None:
    plugin = printed_plugin(stack, stack.nats_url, TENANT)
    runaway = calls_then_give_up(lambda _: ws.command("cat status.txt || echo running"))
    with FakeChatCompletions(respond=runaway) as api:
        run = opencode(ws, api, plugin)

    # `--format json` prints each call's error as the user sees it: the guard's report.
    errors = [line for line in run.stdout.splitlines() if "fusebox: run stopped" in line]
    assert errors, run.stdout[-3000:]


def test_ping_pong_is_stopped(stack: Stack, ws: Workspace) -> None:
    # A B A B … with the same answers: no call repeats back to back.
    plugin = printed_plugin(stack, stack.nats_url, TENANT)
    pair = [ws.command("cat a.txt || echo A"), ws.command("cat b.txt || echo B")]
    with FakeChatCompletions(respond=calls_then_give_up(lambda n: pair[n % 2], 12)) as api:
        run = opencode(ws, api, plugin)
        outputs = api.tool_outputs()

    assert ws.executions() < 12, outputs
    [session] = session_ids(run)
    status = summary(stack, session)
    assert status["open"] is False and status["terminal_state"] == "STOPPED_LOOP_GUARD", status
    assert any("ping_pong" in o for o in refused(outputs)) or "ping_pong" in json.dumps(status), (
        outputs,
        status,
    )


def test_a_sweep_of_thirty_calls_runs_untouched(stack: Stack, ws: Workspace) -> None:
    # Thirty different searches, each finding nothing: the same answer to calls never
    # made before is a sweep, not a loop.
    plugin = printed_plugin(stack, stack.nats_url, TENANT)
    sweep = calls_then_give_up(lambda n: ws.command(f"grep -rn handle_{n} . || true"), 30)
    with FakeChatCompletions(respond=sweep) as api:
        run = opencode(ws, api, plugin)
        outputs = api.tool_outputs()

    assert ws.executions() == 30, (outputs, run.stderr[-2000:])
    assert not refused(outputs), outputs
    [session] = session_ids(run)
    assert summary(stack, session)["terminal_state"] == "COMPLETED"


def test_an_operation_runs_once_across_a_retry(stack: Stack, ws: Workspace) -> None:
    # The model retries the payment: its op_key (the bash tool's `command`, as the user
    # configured) is answered from the ledger, with the stored result.
    plugin = printed_plugin(stack, stack.nats_url, TENANT, "--op-key", "bash=command")
    pay = ws.command("echo paid invoice 7")
    with FakeChatCompletions([pay, pay, say("done")]) as api:
        run = opencode(ws, api, plugin)
        outputs = api.tool_outputs()

    assert ws.executions() == 1, (outputs, run.stderr[-2000:])
    assert len(outputs) == 2 and "paid invoice 7" in outputs[0], outputs
    assert "fusebox:" in outputs[1] and "paid invoice 7" in outputs[1], outputs


def test_operator_cancel_refuses_the_next_call(stack: Stack, ws: Workspace) -> None:
    tenant = f"{TENANT}-{ws.root.name}"[:60]
    plugin = printed_plugin(stack, stack.nats_url, tenant)

    def respond(n: int) -> Turn:
        if n == 2:  # two commands ran: an operator cancels from another process
            [run] = open_runs(stack, tenant)
            fusebox(stack, "cancel", f"{tenant}/{run}", "--reason", "wrong")
        return ws.command(f"echo step {n}") if n < 5 else say("gave up")

    with FakeChatCompletions(respond=respond) as api:
        run = opencode(ws, api, plugin)
        outputs = api.tool_outputs()
        served = api.turns_served()

    assert ws.executions() == 2, outputs
    # The cancel's stop refused the next call and aborted the session: the model was
    # asked nothing more, and the user reads the operator's reason.
    assert served == 3, outputs
    assert "fusebox: run stopped (CANCELLED)" in run.stdout, run.stdout[-3000:]


@pytest.mark.parametrize("on_error", ["deny", "allow"])
def test_guard_down(stack: Stack, ws: Workspace, on_error: str) -> None:
    with bare_nats() as url:
        plugin = printed_plugin(stack, url, TENANT, "--on-error", on_error)
        script = [ws.command("echo one"), ws.command("echo two"), say("gave up")]
        with FakeChatCompletions(script) as api:
            run = opencode(ws, api, plugin)
            outputs = api.tool_outputs()

    assert run.returncode == 0, run.stderr[-3000:]
    assert len(outputs) == 2, outputs
    if on_error == "deny":
        assert ws.executions() == 0
        assert all("the guard could not be asked" in o for o in outputs), outputs
    else:
        assert ws.executions() == 2
        assert "one" in outputs[0] and "two" in outputs[1], outputs


def test_a_sub_agent_is_a_child_run(stack: Stack, ws: Workspace) -> None:
    plugin = printed_plugin(stack, stack.nats_url, TENANT)
    task = ChatCall(
        name="task",
        arguments={
            "description": "echo from a sub-agent",
            "prompt": "run echo from-subagent",
            "subagent_type": "general",
        },
    )
    script = [task, ws.command("echo from-subagent"), say("sub done"), say("all done")]
    with FakeChatCompletions(script) as api:
        run = opencode(ws, api, plugin)

    assert ws.executions() == 1, run.stderr[-3000:]
    # The task tool's child session is a run of its own, under its own session id, a
    # child of the session's run (`--format json` prints the root session's events only).
    [root] = session_ids(run)
    others = [line["run"] for line in runs_of(stack, TENANT) if line["run"] != root]
    children = [s for s in others if tree(stack, s).get("parent") == root]
    assert len(children) == 1, (root, [tree(stack, s) for s in others[-3:]])
    status = summary(stack, children[0])
    assert status["steps"] == 1 and status["open"] is False, status
    assert summary(stack, root)["terminal_state"] == "COMPLETED"


def tree(stack: Stack, run: str) -> dict[str, Any]:
    status: dict[str, Any] = json.loads(fusebox(stack, "run", f"{TENANT}/{run}", "--json"))
    return dict(status.get("tree") or {})


def runs_of(stack: Stack, tenant: str) -> list[dict[str, Any]]:
    out = fusebox(stack, "runs", "--json")
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [line for line in lines if line.get("tenant") == tenant]


def open_runs(stack: Stack, tenant: str) -> list[str]:
    return [line["run"] for line in runs_of(stack, tenant) if line.get("open")]
