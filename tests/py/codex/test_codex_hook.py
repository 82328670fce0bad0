"""The real Codex CLI (`@openai/codex`, pinned in tests/npm) in `codex exec`, offline
against a scripted Responses API, with `fusebox hook codex` installed as
docs/agents/codex.md tells a user (`--print-config` pasted into config.toml), in front
of a real fuseboxd.

Codex cannot be made to end a turn from a hook, so after a stop every later call of
the session is denied with the stop report; the scripted model gives up after a while.
The user's prompt is a `prompt` event of the session's run, read back from the daemon's
log; a stopped session's next prompt is blocked.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.coding_agents import Workspace, printed_block
from support.fake_model_api import FakeResponses, Turn, say
from support.guard import ENVELOPE, RUNAWAY_EXECUTIONS, bare_nats, prompt_events
from support.stack import Stack

TENANT = "pytest-codex"
#: Calls the scripted model makes before it gives up (a runaway that never stops
#: would make `codex exec` run for ever: no hook answer ends its turn).
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


def refused(api: FakeResponses) -> list[str]:
    return [o for o in api.tool_outputs() if "blocked by PreToolUse hook: fusebox:" in o]


def test_runaway_loop_is_refused_and_every_later_call_denied(stack: Stack, ws: Workspace) -> None:
    hooks = printed_block(stack, "codex", stack.nats_url, TENANT)
    runaway = calls_then_give_up(lambda _: ws.command("cat status.txt || echo running"))
    with FakeResponses(respond=runaway) as api:
        run = ws.codex(api, hooks)
        denials = refused(api)
        context = api.context_seen()

    assert run.returncode == 0, run.stderr[-3000:]
    # Refused within the default bound, as the Rust demo's runaway and Claude Code's.
    assert ws.executions() == RUNAWAY_EXECUTIONS
    assert len(denials) == PATIENCE - RUNAWAY_EXECUTIONS
    assert all("already ran" in d or "run stopped" in d for d in denials), denials
    # After the stop, every call is denied with the stop report, kept by the hook.
    kept = [d for d in denials if "every further tool call is refused" in d]
    assert kept and all("run stopped" in d for d in kept), denials
    # The warning before the first block reached the model.
    assert any("one more identical call will be blocked" in c for c in context), context
    status = run_status(stack, ws.codex_session())["summary"]
    assert status["open"] is False and status["agent"] == "codex", status


def test_a_stopped_sessions_next_prompt_is_blocked(stack: Stack, ws: Workspace) -> None:
    hooks = printed_block(stack, "codex", stack.nats_url, TENANT)
    runaway = calls_then_give_up(lambda _: ws.command("cat status.txt || echo running"))
    with FakeResponses(respond=runaway) as api:
        ws.codex(api, hooks)
    session = ws.codex_session()
    assert run_status(stack, session)["summary"]["open"] is False
    executed = ws.executions()

    with FakeResponses([ws.command("echo again"), say("gave up")]) as api:
        run = ws.codex(api, hooks, resume=session)
        served = api.turns_served()

    # The turn ends before the model is asked: the hook kept the stop.
    assert run.returncode == 0, run.stderr[-3000:]
    assert served == 0
    assert ws.executions() == executed
    assert "hook: UserPromptSubmit Blocked" in run.stderr, run.stderr[-3000:]


def compaction_requests(api: FakeResponses) -> int:
    """The requests in which Codex asked the model for a compaction's summary."""
    prompt = "helping the next LLM seamlessly continue"
    return sum(1 for body in api.bodies if prompt in json.dumps(body.get("input", [])[-1:]))


def test_each_compaction_counts_once(stack: Stack, ws: Workspace) -> None:
    # A low auto-compaction limit makes Codex compact after every answer of the scripted
    # model, more than once in the one turn of `codex exec`: each compaction must reach
    # the guard once, though Codex gives it no id and the turn stays the same.
    hooks = printed_block(stack, "codex", stack.nats_url, TENANT)
    steps = calls_then_give_up(lambda n: ws.command(f"echo step {n}"), calls=4)
    with FakeResponses(respond=steps) as api:
        run = ws.codex(api, hooks, user_keys="model_auto_compact_token_limit = 100")
        compactions = compaction_requests(api)

    assert run.returncode == 0, run.stderr[-3000:]
    assert compactions >= 2, compactions
    status = run_status(stack, ws.codex_session())["summary"]
    # run_started, the prompt, a call and its result per execution, each compaction,
    # run_finished.
    expected = 1 + 1 + 2 * ws.executions() + compactions + 1
    assert status["events"] == expected, (status, ws.executions(), compactions)


def test_twelve_distinct_calls_run_untouched(stack: Stack, ws: Workspace) -> None:
    hooks = printed_block(stack, "codex", stack.nats_url, TENANT)
    pages = calls_then_give_up(lambda n: ws.command(f"echo page {n + 1}"), calls=12)
    with FakeResponses(respond=pages) as api:
        run = ws.codex(api, hooks)
        outputs = api.tool_outputs()
        context = api.context_seen()

    assert run.returncode == 0, run.stderr[-3000:]
    assert ws.executions() == 12
    assert len(outputs) == 12
    assert all(f"page {n}" in out for n, out in enumerate(outputs, 1)), outputs
    assert not any("fusebox" in out for out in outputs)
    assert context == []
    status = run_status(stack, ws.codex_session())["summary"]
    assert status["steps"] == 12, status
    # SessionEnd closed the run as completed.
    assert status["open"] is False and status["terminal_state"] == "COMPLETED", status
    # The prompt reached the daemon: one task, named by its turn, without its words.
    [prompt] = prompt_events(stack, TENANT, ws.codex_session())
    assert prompt["id"].startswith("cx-prompt-") and set(prompt) <= ENVELOPE, prompt


def test_operator_cancel_refuses_the_next_call(stack: Stack, ws: Workspace) -> None:
    hooks = printed_block(stack, "codex", stack.nats_url, TENANT)

    def respond(n: int) -> Turn:
        if n == 2:  # two commands ran: an operator cancels from another process
            fusebox(stack, "cancel", f"{TENANT}/{ws.codex_session()}", "--reason", "wrong branch")
        return ws.command(f"echo step {n}") if n < 5 else say("gave up")

    with FakeResponses(respond=respond) as api:
        run = ws.codex(api, hooks)
        denials = refused(api)

    assert run.returncode == 0, run.stderr[-3000:]
    assert ws.executions() == 2
    assert len(denials) == 3
    assert all("cancel" in d.lower() for d in denials), denials


@pytest.mark.parametrize("on_error", ["deny", "allow"])
def test_guard_down(stack: Stack, ws: Workspace, on_error: str) -> None:
    with bare_nats() as url:
        hooks = printed_block(stack, "codex", url, TENANT, "--on-error", on_error)
        script = [ws.command("echo one"), ws.command("echo two"), say("gave up")]
        with FakeResponses(script) as api:
            run = ws.codex(api, hooks)
            outputs = api.tool_outputs()

    assert run.returncode == 0, run.stderr[-3000:]
    assert len(outputs) == 2
    if on_error == "deny":
        assert ws.executions() == 0
        assert all("the guard could not be asked" in o for o in outputs), outputs
        assert all("no fuseboxd is listening" in o for o in outputs), outputs
    else:
        assert ws.executions() == 2
        assert "one" in outputs[0] and "two" in outputs[1], outputs
