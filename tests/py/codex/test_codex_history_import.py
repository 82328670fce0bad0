"""Codex CLI's own rollouts as an event source (`--from codex`, docs/history.md): the
real Codex CLI (`@openai/codex`, pinned in tests/npm) runs `codex exec` offline against
the scripted Responses API with `fusebox hook codex` in front of a real fuseboxd; then the
rollout that same run wrote under its HOME is imported by `fusebox replay --from codex`,
with no daemon, and every call and result must get the decision the live run got.

Codex cannot be made to end a turn, so after a stop the live hook denies every later
call itself, with the kept stop report, and never asks the daemon: those calls are in
the rollout but not in the daemon's log, and the import must answer each of them `stop`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support.coding_agents import Workspace, printed_block
from support.fake_model_api import FakeResponses, Turn, say
from support.guard import RUNAWAY_EXECUTIONS
from support.history import Decision, applied_by_id, by_id, replay_from
from support.stack import Stack

TENANT = "pytest-codex-history"
#: Calls the scripted model makes before it gives up (no hook answer ends a Codex turn).
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
def test_an_imported_rollout_gets_the_decisions_the_hook_gated_run_got(
    stack: Stack, tmp_path: Path, scenario: Callable[[Workspace], Callable[[int], Turn]]
) -> None:
    ws = Workspace(tmp_path)
    hooks = printed_block(stack, "codex", stack.nats_url, TENANT)
    with FakeResponses(respond=scenario(ws)) as api:
        run = ws.codex(api, hooks)
    assert run.returncode == 0, run.stderr[-3000:]
    session = ws.codex_session()
    live = live_decisions(stack, session)
    imported = imported_decisions(stack, ws.home / ".codex" / "sessions")
    assert set(imported) == {session}, imported
    mine = imported[session]
    # Every decision the daemon made, the import makes for the same event.
    assert {key: mine.get(key) for key in live} == live
    # The calls the hook denied on its own after the stop: a stop each in the import.
    after = {key: value for key, value in mine.items() if key not in live}
    assert all(action == "stop" for action, _ in after.values()), after
    if scenario is runaway:
        ran = [a for a, _ in live.values() if a in ("execute", "warn")]
        assert len(ran) == RUNAWAY_EXECUTIONS and ("stop", "consecutive_blocks") in live.values()
        # Three refused by the daemon (block, block, stop), the rest by the hook alone.
        assert len(after) == PATIENCE - RUNAWAY_EXECUTIONS - 3, after
    else:
        assert after == {} and len(live) == 24, live


def imported_decisions(stack: Stack, sessions: Path) -> dict[str, Decisions]:
    """`fusebox replay --from codex SESSIONS`: each call's and result's decision, by run
    and event id."""
    return by_id(
        replay_from(stack, "codex", TENANT, sessions, summary="codex: 1 sessions in 1 files")
    )
