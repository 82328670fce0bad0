"""`fusebox replay --from AGENT` as the suites read it: an agent's own session files
imported (docs/history.md), each call's and result's decision by run — and the same
read off the daemon's history of a run the live path (hook or telemetry) fed, what it is
compared with."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .guard import run_history
from .stack import Stack

__all__ = ["Decision", "Replayed", "applied", "applied_by_id", "by_id", "replay_from"]

#: (action, reason)
Decision = tuple[str, str | None]
#: By run: its calls' and results' (event id, action, reason), in the order applied.
Replayed = dict[str, list[tuple[str, str, str | None]]]


def replay_from(stack: Stack, agent: str, tenant: str, *paths: Path, summary: str = "") -> Replayed:
    """`fusebox replay --from AGENT --tenant TENANT PATHS`: it succeeds, the person's
    summary (`summary`, when given) comes first on stderr, and every tool_call's and
    tool_result's decision (the events whose ids end `-call` / `-result`) is kept."""
    done = subprocess.run(
        [
            str(stack.bin("fusebox")),
            "replay",
            "--from",
            agent,
            "--tenant",
            tenant,
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(summary), done.stderr
    runs: Replayed = {}
    for line in done.stdout.splitlines():
        decision = json.loads(line)
        event_id: str = decision.get("event_id", "")
        if event_id.endswith(("-call", "-result")):
            runs.setdefault(decision["run"], []).append(
                (event_id, decision["action"], decision.get("reason"))
            )
    return runs


def by_id(replayed: Replayed) -> dict[str, dict[str, Decision]]:
    """Each run's decisions by event id."""
    return {
        run: {event_id: (action, reason) for event_id, action, reason in rows}
        for run, rows in replayed.items()
    }


def applied(stack: Stack, tenant: str, run: str) -> list[tuple[str, str, str, str | None]]:
    """The run's calls' and results' decisions as the daemon applied them, in order:
    (event id, event type, action, reason)."""
    return [
        (
            entry["event"]["id"],
            entry["event"]["type"],
            entry["decision"]["action"],
            entry["decision"].get("reason"),
        )
        for entry in run_history(stack, tenant, run)
        if entry["event"]["type"] in ("tool_call", "tool_result")
    ]


def applied_by_id(stack: Stack, tenant: str, run: str) -> dict[str, Decision]:
    """[`applied`] by event id."""
    return {
        event_id: (action, reason) for event_id, _, action, reason in applied(stack, tenant, run)
    }
