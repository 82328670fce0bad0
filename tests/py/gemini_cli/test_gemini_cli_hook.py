"""The real Gemini CLI (`@google/gemini-cli`, pinned in tests/npm) in headless mode
(`gemini -p … --yolo`), offline against a scripted Gemini API, with
`fusebox hook gemini-cli` installed as docs/agents/gemini-cli.md tells a user
(`--print-settings` merged into the user-level settings.json), in front of a real
fuseboxd. Gemini CLI's own loop detector is off, so what stops a loop is the guard.
The user's prompt (BeforeAgent) is a `prompt` event of the session's run, read back
from the daemon's log; a stopped session's next prompt ends the agent before the model.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.coding_agents import Workspace, printed_block
from support.fake_model_api import FakeGemini, Turn, say
from support.guard import ENVELOPE, RUNAWAY_EXECUTIONS, bare_nats, prompt_events
from support.stack import Stack

TENANT = "pytest-gemini"
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


def run_status(stack: Stack, run: str) -> dict[str, Any]:
    status: dict[str, Any] = json.loads(fusebox(stack, "run", f"{TENANT}/{run}", "--json"))
    return status


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path)


def calls_then_give_up(turn: Callable[[int], Turn], calls: int = PATIENCE) -> Callable[[int], Turn]:
    return lambda n: turn(n) if n < calls else say("gave up")


def refused(api: FakeGemini) -> list[str]:
    return [o for o in api.tool_outputs() if "Tool execution blocked: fusebox:" in o]


def session_result(stdout: str) -> dict[str, Any]:
    """The `-o json` result object (the last JSON document on stdout)."""
    start = stdout.find("{")
    assert start >= 0, stdout[-2000:]
    result: dict[str, Any] = json.loads(stdout[start:])
    return result


def test_runaway_loop_is_stopped_and_the_session_ends(stack: Stack, ws: Workspace) -> None:
    settings = printed_block(stack, "gemini-cli", stack.nats_url, TENANT)
    runaway = calls_then_give_up(lambda _: ws.command("cat status.txt || echo running"))
    with FakeGemini(respond=runaway) as api:
        run = ws.gemini(api, settings)
        denials = refused(api)
        served = api.turns_served()
        outputs = api.tool_outputs()

    assert ws.executions() == RUNAWAY_EXECUTIONS, run.stderr[-3000:]
    # Two blocks, then the stop ended the agent: no model turn after it.
    assert len(denials) == 2 and all("already ran" in d for d in denials), denials
    assert served == RUNAWAY_EXECUTIONS + 3, (served, run.stdout[-2000:])
    # The warning before the first block reached the model with the last result.
    assert any("one more identical call will be blocked" in o for o in outputs), outputs
    status = run_status(stack, ws.gemini_run(TENANT))["summary"]
    assert status["open"] is False and status["agent"] == "gemini-cli", status
    assert status["terminal_state"] == "STOPPED_LOOP_GUARD", status


def test_a_stopped_sessions_next_prompt_is_blocked(stack: Stack, ws: Workspace) -> None:
    settings = printed_block(stack, "gemini-cli", stack.nats_url, TENANT)
    runaway = calls_then_give_up(lambda _: ws.command("cat status.txt || echo running"))
    with FakeGemini(respond=runaway) as api:
        ws.gemini(api, settings)
    assert run_status(stack, ws.gemini_run(TENANT))["summary"]["open"] is False
    executed = ws.executions()

    with FakeGemini([ws.command("echo again"), say("gave up")]) as api:
        run = ws.gemini(api, settings, resume=True)
        served = api.turns_served()

    # The agent ends before the model is asked, and the user reads why.
    assert served == 0, run.stdout[-2000:]
    assert ws.executions() == executed
    warnings = session_result(run.stdout).get("warnings", [])
    assert any(w.startswith("Agent execution stopped: fusebox: run stopped") for w in warnings), (
        warnings
    )
    assert any("did not reach the model" in w for w in warnings), warnings


def test_twelve_distinct_calls_run_untouched(stack: Stack, ws: Workspace) -> None:
    settings = printed_block(stack, "gemini-cli", stack.nats_url, TENANT)
    pages = calls_then_give_up(lambda n: ws.command(f"echo page {n + 1}"), calls=12)
    with FakeGemini(respond=pages) as api:
        run = ws.gemini(api, settings)
        outputs = api.tool_outputs()

    assert run.returncode == 0, run.stderr[-3000:]
    assert ws.executions() == 12
    assert len(outputs) == 12
    assert all(f"page {n}" in out for n, out in enumerate(outputs, 1)), outputs
    assert not any("fusebox" in out for out in outputs)
    assert session_result(run.stdout)["response"] == "gave up"
    status = run_status(stack, ws.gemini_run(TENANT))["summary"]
    assert status["steps"] == 12, status
    assert status["open"] is False and status["terminal_state"] == "COMPLETED", status
    # The prompt reached the daemon: one task, named by its moment, without its words.
    [prompt] = prompt_events(stack, TENANT, ws.gemini_run(TENANT))
    assert prompt["id"].startswith("gm-prompt-") and set(prompt) <= ENVELOPE, prompt


def test_operator_cancel_refuses_the_next_call(stack: Stack, ws: Workspace) -> None:
    settings = printed_block(stack, "gemini-cli", stack.nats_url, TENANT)

    def respond(n: int) -> Turn:
        if n == 2:  # two commands ran: an operator cancels from another process
            fusebox(stack, "cancel", f"{TENANT}/{ws.gemini_run(TENANT)}", "--reason", "wrong")
        return ws.command(f"echo step {n}") if n < 5 else say("gave up")

    with FakeGemini(respond=respond) as api:
        ws.gemini(api, settings)
        served = api.turns_served()

    assert ws.executions() == 2
    # The cancel's stop ended the agent at the next call.
    assert served == 3


@pytest.mark.parametrize("on_error", ["deny", "allow"])
def test_guard_down(stack: Stack, ws: Workspace, on_error: str) -> None:
    with bare_nats() as url:
        settings = printed_block(stack, "gemini-cli", url, TENANT, "--on-error", on_error)
        script = [ws.command("echo one"), ws.command("echo two"), say("gave up")]
        with FakeGemini(script) as api:
            run = ws.gemini(api, settings)
            outputs = api.tool_outputs()

    assert run.returncode == 0, run.stderr[-3000:]
    assert len(outputs) == 2, outputs
    if on_error == "deny":
        assert ws.executions() == 0
        assert all("the guard could not be asked" in o for o in outputs), outputs
        assert all("no fuseboxd is listening" in o for o in outputs), outputs
    else:
        assert ws.executions() == 2
        assert "one" in outputs[0] and "two" in outputs[1], outputs
