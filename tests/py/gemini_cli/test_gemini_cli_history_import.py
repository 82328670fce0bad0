"""Gemini CLI's own chats as an event source (`--from gemini-cli`, docs/history.md): the
real Gemini CLI (`@google/gemini-cli`, pinned in tests/npm) runs headless offline against
the scripted Gemini API with `fusebox hook gemini-cli` in front of a real fuseboxd; then
the chat that same run wrote under its HOME is imported by `fusebox replay --from
gemini-cli`, with no daemon, and every call and result must get the decision the live
run got, under the same event id (the hook's call book numbers calls `g1`, `g2` …; the
import numbers them so too).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support.coding_agents import Workspace, printed_block
from support.fake_model_api import FakeGemini, Turn, say
from support.guard import RUNAWAY_EXECUTIONS
from support.history import Decision, applied_by_id, by_id, replay_from
from support.stack import Stack

TENANT = "pytest-gemini-history"
#: Calls the scripted model makes before it gives up.
PATIENCE = 10

Decisions = dict[str, tuple[str, str | None]]


def live_decisions(stack: Stack, run: str) -> dict[str, Decision]:
    """Each tool_call's and tool_result's decision as the daemon applied it, by event id."""
    return applied_by_id(stack, TENANT, run)


def calls_then_give_up(turn: Callable[[int], Turn], calls: int) -> Callable[[int], Turn]:
    return lambda n: turn(n) if n < calls else say("gave up")


def runaway(ws: Workspace) -> Callable[[int], Turn]:
    return calls_then_give_up(lambda _: ws.command("cat status.txt || echo running"), PATIENCE)


def pages(ws: Workspace) -> Callable[[int], Turn]:
    return calls_then_give_up(lambda n: ws.command(f"echo page {n + 1}"), 12)


@pytest.mark.parametrize("scenario", [runaway, pages], ids=["runaway", "pages"])
def test_an_imported_chat_gets_the_decisions_the_hook_gated_run_got(
    stack: Stack, tmp_path: Path, scenario: Callable[[Workspace], Callable[[int], Turn]]
) -> None:
    ws = Workspace(tmp_path)
    settings = printed_block(stack, "gemini-cli", stack.nats_url, TENANT)
    with FakeGemini(respond=scenario(ws)) as api:
        run = ws.gemini(api, settings)
    assert run.returncode in (0, 1), run.stderr[-3000:]
    session = ws.gemini_run(TENANT)
    live = live_decisions(stack, session)
    imported = imported_decisions(stack, ws.home / ".gemini" / "tmp")
    assert imported == {session: live}
    ran = [a for a, _ in live.values() if a in ("execute", "warn")]
    if scenario is runaway:
        assert len(ran) == RUNAWAY_EXECUTIONS and ("stop", "consecutive_blocks") in live.values()
    else:
        assert len(ran) == 12 and len(live) == 24, live


def imported_decisions(stack: Stack, chats: Path) -> dict[str, Decisions]:
    """`fusebox replay --from gemini-cli CHATS`: each call's and result's decision, by run
    and event id."""
    summary = "gemini-cli: 1 sessions in 1 files"
    return by_id(replay_from(stack, "gemini-cli", TENANT, chats, summary=summary))
