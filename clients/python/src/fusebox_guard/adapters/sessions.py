"""A framework's own session id as the run id, resumable across processes: for the
adapters whose framework keeps sessions (a Strands `SessionManager`'s `session_id`, the
id a CrewAI app keeps its conversation under).

    run = await session_run(fb, session_id, agent="researcher")
    guard = FuseboxHooks(run)            # or FuseboxCrew(run), any adapter
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..client import Fusebox
from ..errors import RunExists
from ..run import MAX_RUN_ID, Run
from ..sync import SyncFusebox, SyncRun, run_on
from ..types import GateOnError

#: How many continuations of one session are tried before giving up (each is one run
#: of the session's tree of runs; a session resumed this often is a loop of its own).
MAX_CONTINUATIONS = 1000


async def session_run(
    fb: Fusebox,
    session_id: str,
    *,
    agent: str | None = None,
    policy: Mapping[str, Any] | None = None,
    gate_on_error: GateOnError | None = None,
) -> Run:
    """The started run of a session: `session_id` itself the first time. A run id names
    one execution to the daemon (a second `run_started` of it is refused, `RunExists`),
    so a session resumed later, in this process or another, goes on in the next free
    `<session_id>-2`, `-3` …; but when the run it would go on from was stopped by the
    guard, that run is returned with its kept stop latched (read by `start` from the
    kill switch), so every call of the resumed session is refused without a round trip,
    as the stop said."""
    for n in range(1, MAX_CONTINUATIONS + 1):
        run_id = session_id if n == 1 else _continuation(session_id, n)
        run = fb.run(
            run_id,
            agent=agent,
            policy=dict(policy) if policy is not None else None,
            gate_on_error=gate_on_error,
        )
        try:
            await run.start()
        except RunExists:
            if run.stopped is not None:
                return run
            continue
        return run
    raise RuntimeError(f"session {session_id} was resumed more than {MAX_CONTINUATIONS} times")


def session_run_sync(
    fb: SyncFusebox,
    session_id: str,
    *,
    agent: str | None = None,
    policy: Mapping[str, Any] | None = None,
    gate_on_error: GateOnError | None = None,
) -> SyncRun:
    """`session_run` for sync code."""
    coro = session_run(fb.aio, session_id, agent=agent, policy=policy, gate_on_error=gate_on_error)
    return SyncRun(run_on(fb.loop, coro))


def _continuation(session_id: str, n: int) -> str:
    suffix = f"-{n}"
    return session_id[: MAX_RUN_ID - len(suffix)] + suffix


__all__ = ["session_run", "session_run_sync"]
