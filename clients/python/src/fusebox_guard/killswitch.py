"""The kill switch seen from an agent: `fusebox.stop.<tenant>.<run>`, live, plus the stop
kept from before the watch began (a worker that starts after its run was stopped, or an
operator's `fusebox cancel` that came first, must still learn it at once)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from . import subjects
from .errors import BadAnswer, FuseboxError, GateTimeout, NoResponders, TransportError
from .types import Action, Decision

log = logging.getLogger("fusebox_guard")


class StopWatch:
    """Holds the run's stop once one is known; calls the listeners once, at that moment."""

    def __init__(self, nc: NATS, tenant: str, run: str) -> None:
        self._nc = nc
        self.tenant = tenant
        self.run = run
        self.subject = subjects.stop(tenant, run)
        self._sub: Subscription | None = None
        self._stop: Decision | None = None
        self._event = asyncio.Event()
        self._listeners: list[Callable[[Decision], None]] = []
        #: Why the stop kept from before the watch could not be looked up (None: it was).
        self.lookup_error: FuseboxError | None = None

    @classmethod
    async def open(cls, nc: NATS, tenant: str, run: str, timeout_s: float) -> StopWatch:
        watch = cls(nc, tenant, run)
        # Subscribe first, then look up the kept stop: a stop published in between is
        # seen on the subscription, so there is no gap.
        watch._sub = await nc.subscribe(watch.subject, cb=watch._on_message)
        await nc.flush(timeout=max(1, round(timeout_s)))
        try:
            kept = await kept_stop(nc, tenant, run, timeout_s)
        except FuseboxError as err:
            # The gate stays the authority (it answers `stop` for every call of a stopped
            # run); the kept stop is the fast path. Say so, and watch live.
            watch.lookup_error = err
            log.warning("fusebox: kept stop of %s/%s unknown: %s", tenant, run, err)
        else:
            if kept is not None:
                watch.latch(kept)
        return watch

    @property
    def stop(self) -> Decision | None:
        """The run's stop decision (with its report), once one is known."""
        return self._stop

    def on_stop(self, listener: Callable[[Decision], None]) -> None:
        """Calls `listener` with the stop when it comes (at once if it already came)."""
        if self._stop is not None:
            listener(self._stop)
        else:
            self._listeners.append(listener)

    async def wait(self, timeout_s: float | None = None) -> Decision | None:
        """Waits for the stop; None when `timeout_s` passed first."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout_s)
        return self._stop

    def latch(self, decision: Decision) -> None:
        """Records a stop learnt here or elsewhere (a gate that answered `stop`)."""
        if self._stop is not None or decision.action is not Action.STOP:
            return
        self._stop = decision
        self._event.set()
        for listener in self._listeners:
            try:
                listener(decision)
            except Exception:
                log.exception("fusebox stop listener failed")
        self._listeners.clear()

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None

    async def _on_message(self, msg: Msg) -> None:
        decision = parse_stop(msg.data)
        if decision is None:
            log.warning("fusebox: not a stop decision on %s: %r", msg.subject, msg.data[:200])
            return
        self.latch(decision)


def parse_stop(data: bytes) -> Decision | None:
    try:
        body = json.loads(data)
        decision = Decision.from_json(body)
    except (ValueError, KeyError, TypeError):
        return None
    return decision if decision.action is Action.STOP else None


async def kept_stop(nc: NATS, tenant: str, run: str, timeout_s: float) -> Decision | None:
    """The stop `FUSEBOX_STOPS` keeps for the run, or None when there is none.

    A JetStream direct get of the last message on the run's own stop subject
    (/work/notes/killswitch-wire.md): the one JetStream request a tenant user may make,
    answered by JetStream itself, so it works while fuseboxd is down. 404 = nothing kept;
    no responders (no stream, or direct get off) and timeouts raise, told apart.
    """
    subject = subjects.stop_direct_get(tenant, run)
    try:
        msg = await nc.request(subject, b"", timeout=timeout_s)
    except nats.errors.NoRespondersError:
        why = "no FUSEBOX_STOPS stream with direct get: has a current fuseboxd ever run?"
        raise NoResponders(subject, why) from None
    except nats.errors.TimeoutError:
        raise GateTimeout(subject, timeout_s) from None
    except nats.errors.Error as err:
        raise TransportError(subject, str(err) or type(err).__name__) from err
    status = (msg.headers or {}).get("Status")
    if status == "404":
        return None
    if status is not None:
        raise BadAnswer(subject, f"status {status} {(msg.headers or {}).get('Description', '')}")
    decision = parse_stop(msg.data)
    if decision is None:
        raise BadAnswer(subject, "the kept message is not a stop decision")
    return decision
