"""What every adapter shares: reaching the run from any thread or loop, and the shape of
a tool's arguments and output on the wire."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import FuseboxError, RunStopped
from ..run import Run
from ..sync import SyncRun, await_on, run_on
from ..types import Decision, Effect

T = TypeVar("T")

log = logging.getLogger("fusebox_guard")

#: The longest `run_finished` status sent: an error's text past it is cut.
MAX_STATUS_CHARS = 500

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
        #: `run_finished` was sent (an adapter with two ways to end sends it once).
        self.finished = False

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return run_on(self.run.loop, coro)

    async def acall(self, coro: Coroutine[Any, Any, T]) -> T:
        return await await_on(self.run.loop, coro)

    @property
    def stopped_by_guard(self) -> bool:
        """The guard stopped the run (a budget, a detector, a cap, an ancestor's stop):
        not the stop a failed `run_finished` of the adapter's own is answered with."""
        return self.run.stopped is not None and not self.finished

    def child(self, run: Run) -> Bridge:
        """The bridge of a sub-agent's run, with this one's `op_key` and `effects`."""
        return Bridge(run, op_key=self.op_key, effects=self.effects)

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


def finished_status(error: BaseException | None) -> str | None:
    """The `run_finished` status of an agent that ended: `completed` on a final answer,
    `failed: <error>` on an exception, None after the guard's own stop (the daemon closed
    that run already)."""
    if error is None:
        return "completed"
    if isinstance(error, RunStopped):
        return None
    return f"failed: {type(error).__name__}: {error}"[:MAX_STATUS_CHARS]


async def finish_run(bridge: Bridge, error: BaseException | None = None) -> None:
    """Closes the run as the agent ended (issue: an open run is later stopped by its
    time budget, a false `time_budget` stop). Never raises for the guard's sake: the
    agent's own answer or error is what the caller gets."""
    status = finished_status(error)
    if status is None or bridge.finished or bridge.run.stopped is not None:
        return
    bridge.finished = True
    try:
        await bridge.acall(bridge.run.finish(status))
    except FuseboxError as err:
        report_failed("run_finished", err)


def finish_run_sync(bridge: Bridge, error: BaseException | None = None) -> None:
    """`finish_run` from sync code."""
    status = finished_status(error)
    if status is None or bridge.finished or bridge.run.stopped is not None:
        return
    bridge.finished = True
    try:
        bridge.call(bridge.run.finish(status))
    except FuseboxError as err:
        report_failed("run_finished", err)


# --- sub-agents: child runs -------------------------------------------------------------


@dataclass
class Call:
    """A guarded call in progress, inside which the framework may run sub-agents: each
    one's child run is listed here, so the call's result can say one was stopped."""

    bridge: Bridge
    call_id: str
    tool: str
    children: list[Bridge] = field(default_factory=list)

    def stopped_child(self) -> Bridge | None:
        return next((c for c in self.children if c.stopped_by_guard), None)


class Tree:
    """The runs one adapter reports to: the run it was given (the root) and a child run
    for each sub-agent the framework runs. Which run the code running now belongs to,
    and inside which guarded call it runs, are context variables, so sub-agents that run
    at once (tasks, or threads that copy the context) each see their own."""

    def __init__(self, root: Bridge) -> None:
        self.root = root
        self._run: ContextVar[Bridge | None] = ContextVar("fusebox_run", default=None)
        self._call: ContextVar[Call | None] = ContextVar("fusebox_call", default=None)

    @property
    def current(self) -> Bridge:
        return self._run.get() or self.root

    @property
    def calling(self) -> Call | None:
        return self._call.get()

    @contextmanager
    def in_run(self, bridge: Bridge) -> Iterator[None]:
        """Code in this block belongs to `bridge`'s run, inside none of its calls yet."""
        run, call = self._run.set(bridge), self._call.set(None)
        try:
            yield
        finally:
            self._call.reset(call)
            self._run.reset(run)

    @contextmanager
    def in_call(self, call: Call) -> Iterator[None]:
        """Sub-agents started in this block are children of `call`'s run."""
        token = self.enter_call(call)
        try:
            yield
        finally:
            self.leave_call(token)

    def enter_call(self, call: Call) -> Token[Call | None]:
        """`in_call` for frameworks whose call begins and ends in two callbacks (of the
        same task): pass the token to `leave_call`."""
        return self._call.set(call)

    def leave_call(self, token: Token[Call | None]) -> None:
        try:
            self._call.reset(token)
        except ValueError:  # ended in another context than it began: only undo it here
            self._call.set(None)


async def start_sub_agent(parent: Bridge, agent: str | None) -> Bridge:
    """A child run of `parent` for a sub-agent. A start past the caps is answered with a
    stop (`run.stopped`): the sub-agent must not run."""
    return parent.child(await parent.acall(parent.run.start_child(agent=agent)))


def start_sub_agent_sync(parent: Bridge, agent: str | None) -> Bridge:
    """`start_sub_agent` from sync code."""
    return parent.child(parent.call(parent.run.start_child(agent=agent)))


def sub_agent_stopped(agent: str | None, run: Run) -> str:
    """What the parent's model reads as the result of a sub-agent the guard stopped (or
    did not let start): which one, why, and what to do instead of starting it again."""
    report = run.stopped
    why = report.summary() if report is not None else "stopped"
    name = f"sub-agent {agent}" if agent else "sub-agent"
    return (
        f"fusebox stopped the {name} (run {run.id}): {why}. Its task is not done: do it "
        "another way or report that it could not be done, rather than starting the same "
        "sub-agent again."
    )
