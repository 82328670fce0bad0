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
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from . import subjects
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

    @classmethod
    async def open(cls, nc: NATS, tenant: str, run: str, timeout_s: float) -> StopWatch:
        watch = cls(nc, tenant, run)
        # Subscribe first, then look up the kept stop: a stop published in between is
        # seen on the subscription, so there is no gap.
        watch._sub = await nc.subscribe(watch.subject, cb=watch._on_message)
        await nc.flush(timeout=max(1, round(timeout_s)))
        kept = await kept_stop(nc, tenant, run, timeout_s)
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
    """The stop `FUSEBOX_STOPS` keeps for the run, if any (last message per subject)."""
    js = nc.jetstream(timeout=timeout_s)
    try:
        msg = await js.get_last_msg(subjects.STOPS_STREAM, subjects.stop(tenant, run))
    except nats.js.errors.NotFoundError:
        return None
    except (nats.errors.Error, asyncio.TimeoutError) as err:
        log.warning("fusebox: cannot look up the kept stop of %s/%s: %s", tenant, run, err)
        return None
    return parse_stop(msg.data or b"")
