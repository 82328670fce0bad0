"""The real GitHub Copilot CLI (`@github/copilot`, pinned in tests/npm) in `copilot -p`,
offline in BYOK mode against a scripted chat-completions API, with the hooks file
`fusebox hook copilot-cli --print-config` installed as docs/agents/copilot-cli.md tells
a user (`.github/hooks/fusebox.json`), in front of a real fuseboxd. Every scripted
command counts itself in the workspace's ledger before it runs.

No hook answer ends Copilot CLI's turn: after a stop, every later call of the session
is denied with the stop report (the daemon's latch), and the model is told to end.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.coding_agents import Workspace
from support.copilot_cli import copilot, printed_hooks
from support.fake_chat_completions import FakeChatCompletions
from support.fake_model_api import Turn, say
from support.guard import RUNAWAY_EXECUTIONS, bare_nats
from support.stack import Stack

TENANT = "pytest-copilot"
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


def summary(stack: Stack, tenant: str, run: str) -> dict[str, Any]:
    status: dict[str, Any] = json.loads(fusebox(stack, "run", f"{tenant}/{run}", "--json"))
    return dict(status["summary"])


def session_of(run_stderr: str, run_stdout: str) -> str:
    """The session id Copilot CLI prints for resuming it (`copilot --resume=<id>`)."""
    found = re.search(r"--resume=([0-9a-f-]{36})", run_stderr + run_stdout)
    assert found, (run_stdout[-1500:], run_stderr[-1500:])
    return found.group(1)


def open_runs(stack: Stack, tenant: str) -> list[str]:
    lines = [json.loads(line) for line in fusebox(stack, "runs", "--json").splitlines() if line]
    return [line["run"] for line in lines if line.get("tenant") == tenant and line.get("open")]


@pytest.fixture
def ws(tmp_path: Path, unpacked_copilot: Path) -> Workspace:
    return Workspace(tmp_path, cache=unpacked_copilot)


def calls_then_give_up(turn: Callable[[int], Turn], calls: int = PATIENCE) -> Callable[[int], Turn]:
    return lambda n: turn(n) if n < calls else say("gave up")


def refused(outputs: list[str]) -> list[str]:
    return [o for o in outputs if "fusebox:" in o]


def test_runaway_loop_is_stopped_and_every_later_call_denied(stack: Stack, ws: Workspace) -> None:
    hooks = printed_hooks(stack, stack.nats_url, TENANT)
    runaway = calls_then_give_up(lambda _: ws.command("cat status.txt || echo running"))
    with FakeChatCompletions(respond=runaway, describe=True) as api:
        run = copilot(ws, api, hooks)
        outputs = api.tool_outputs()

    assert ws.executions() == RUNAWAY_EXECUTIONS, (outputs, run.stderr[-2000:])
    denials = refused(outputs)
    assert all("already ran" in d for d in denials[:2]), outputs
    # Every call after the stop is denied with its report.
    assert any("every further tool call is refused" in d for d in denials), denials
    status = summary(stack, TENANT, session_of(run.stderr, run.stdout))
    assert status["terminal_state"] == "STOPPED_LOOP_GUARD", status
    assert status["agent"] == "copilot-cli", status


def test_ping_pong_is_stopped(stack: Stack, ws: Workspace) -> None:
    hooks = printed_hooks(stack, stack.nats_url, TENANT)
    pair = [ws.command("cat a.txt || echo A"), ws.command("cat b.txt || echo B")]
    with FakeChatCompletions(
        respond=calls_then_give_up(lambda n: pair[n % 2], 12), describe=True
    ) as api:
        run = copilot(ws, api, hooks)
        outputs = api.tool_outputs()

    assert ws.executions() < 12, outputs
    status = summary(stack, TENANT, session_of(run.stderr, run.stdout))
    assert status["terminal_state"] == "STOPPED_LOOP_GUARD", status


@pytest.mark.parametrize(
    ("calls", "command"), [(12, "echo page {n}"), (30, "grep -rn h_{n} . || true")]
)
def test_distinct_calls_and_a_sweep_run_untouched(
    stack: Stack, ws: Workspace, calls: int, command: str
) -> None:
    hooks = printed_hooks(stack, stack.nats_url, TENANT)
    script = calls_then_give_up(lambda n: ws.command(command.format(n=n + 1)), calls)
    with FakeChatCompletions(respond=script, describe=True) as api:
        run = copilot(ws, api, hooks)
        outputs = api.tool_outputs()

    assert ws.executions() == calls, (outputs, run.stderr[-2000:])
    assert not refused(outputs), outputs
    # The run closed when the agent ended (sessionEnd).
    status = summary(stack, TENANT, session_of(run.stderr, run.stdout))
    assert status["steps"] == calls, status
    assert status["open"] is False and status["terminal_state"] == "COMPLETED", status


def test_an_operation_runs_once_across_a_retry(stack: Stack, ws: Workspace) -> None:
    hooks = printed_hooks(stack, stack.nats_url, TENANT, "--op-key", "bash=command")
    pay = ws.command("echo paid invoice 7")
    with FakeChatCompletions([pay, pay, say("done")], describe=True) as api:
        run = copilot(ws, api, hooks)
        outputs = api.tool_outputs()

    assert ws.executions() == 1, (outputs, run.stderr[-2000:])
    assert len(outputs) == 2 and "paid invoice 7" in outputs[0], outputs
    assert "fusebox:" in outputs[1] and "paid invoice 7" in outputs[1], outputs


def test_operator_cancel_refuses_the_next_call(stack: Stack, ws: Workspace) -> None:
    tenant = f"{TENANT}-{ws.root.name}"[:60]
    hooks = printed_hooks(stack, stack.nats_url, tenant)

    def respond(n: int) -> Turn:
        if n == 2:  # two commands ran: an operator cancels from another process
            [run] = open_runs(stack, tenant)
            fusebox(stack, "cancel", f"{tenant}/{run}", "--reason", "wrong")
        return ws.command(f"echo step {n}") if n < 5 else say("gave up")

    with FakeChatCompletions(respond=respond, describe=True) as api:
        copilot(ws, api, hooks)
        outputs = api.tool_outputs()

    assert ws.executions() == 2, outputs
    assert all("fusebox:" in o for o in outputs[2:]) and len(outputs) > 2, outputs


@pytest.mark.parametrize("on_error", ["deny", "allow"])
def test_guard_down(stack: Stack, ws: Workspace, on_error: str) -> None:
    with bare_nats() as url:
        hooks = printed_hooks(stack, url, TENANT, "--on-error", on_error)
        script = [ws.command("echo one"), ws.command("echo two"), say("gave up")]
        with FakeChatCompletions(script, describe=True) as api:
            run = copilot(ws, api, hooks)
            outputs = api.tool_outputs()

    assert run.returncode == 0, run.stderr[-3000:]
    assert len(outputs) == 2, outputs
    if on_error == "deny":
        assert ws.executions() == 0
        assert all("the guard could not be asked" in o for o in outputs), outputs
    else:
        assert ws.executions() == 2


def test_a_session_resumed_after_its_end_goes_on_in_its_next_run(
    stack: Stack, ws: Workspace
) -> None:
    hooks = printed_hooks(stack, stack.nats_url, TENANT)
    with FakeChatCompletions([ws.command("echo one"), say("done")], describe=True) as api:
        first = copilot(ws, api, hooks)
    session = session_of(first.stderr, first.stdout)
    assert summary(stack, TENANT, session)["terminal_state"] == "COMPLETED"

    with FakeChatCompletions([ws.command("echo two"), say("done")], describe=True) as api:
        second = copilot(ws, api, hooks, resume=session)
        outputs = api.tool_outputs()

    assert session_of(second.stderr, second.stdout) == session
    assert ws.executions() == 2 and "two" in outputs[-1], outputs
    # The session's id is the run's; its continuation is the session's next run.
    resumed = summary(stack, TENANT, f"{session}-2")
    assert resumed["steps"] == 1 and resumed["terminal_state"] == "COMPLETED", resumed
