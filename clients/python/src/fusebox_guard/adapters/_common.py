"""What every adapter shares: reaching the run from any thread or loop, and the shape of
a tool's arguments and output on the wire."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from ..errors import FuseboxError
from ..run import Run
from ..sync import SyncRun, await_on, run_on
from ..types import Decision, Effect

T = TypeVar("T")

log = logging.getLogger("fusebox_guard")

#: The business-operation identity of a side-effecting call, from the tool and its args.
OpKeyFn = Callable[[str, Any], "str | None"]


def as_run(run: Run | SyncRun) -> Run:
    return run.aio if isinstance(run, SyncRun) else run


class Bridge:
    """Calls a `Run`'s coroutines from sync code (any thread but the run's loop) and from
    async code on any loop."""

    def __init__(
        self,
        run: Run | SyncRun,
        *,
        op_key: OpKeyFn | None = None,
        effects: Mapping[str, Effect | str] | None = None,
    ) -> None:
        self.run = as_run(run)
        self.op_key = op_key
        self.effects = dict(effects or {})

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return run_on(self.run.loop, coro)

    async def acall(self, coro: Coroutine[Any, Any, T]) -> T:
        return await await_on(self.run.loop, coro)

    def call_fields(self, tool: str, args: Any) -> dict[str, Any]:
        """`op_key` and `effect` of a call, as configured for the adapter."""
        fields: dict[str, Any] = {}
        if self.op_key is not None:
            key = self.op_key(tool, args)
            if key is not None:
                fields["op_key"] = key
        if tool in self.effects:
            fields["effect"] = self.effects[tool]
        return fields


def jsonable(value: Any) -> Any:
    """A tool output as JSON: as it is when it serialises, else its text."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


def parse_args(raw: str | Mapping[str, Any] | None) -> Any:
    if raw is None:
        return {}
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except ValueError:
            return raw
    return dict(raw)


def report_failed(what: str, err: FuseboxError) -> None:
    """A result that could not be reported is re-sent before the next event; the
    framework's run goes on (the next gate still asks)."""
    log.warning("fusebox: %s not delivered yet (re-sent with the next event): %s", what, err)


def is_stop(decision: Decision | None) -> bool:
    return decision is not None and decision.action.value == "stop"
