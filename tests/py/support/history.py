"""`fusebox replay --from AGENT` as the suites read it: an agent's own session files
imported (docs/history.md), each call's and result's decision by run — what is compared
with the decisions the live path (hook or telemetry) got for the same session."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .stack import Stack

__all__ = ["Decision", "Replayed", "by_id", "replay_from"]

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
