"""The sync facade: one background event loop thread per `SyncFusebox`, owning the
nats-py connection (which belongs to the loop that made it). Every blocking call hands a
coroutine to that loop and waits for it; nothing is global."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from .client import Fusebox
from .gate import Gate
from .run import _UNSET, Run
from .types import Decision, Effect, GateOnError, ResultKind, ResultMode, StopReport, Usage

T = TypeVar("T")


def run_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Runs `coro` on `loop` (another thread's) and blocks until it is done."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError(
            "a blocking fusebox call on the event loop that owns the connection would "
            "deadlock: use the async API (await run.tool_call(...)) there"
        )
    if not loop.is_running():
        coro.close()
        raise RuntimeError(
            "the run's event loop is not running, so a blocking call cannot reach it: "
            "sync code uses SyncFusebox (its own loop thread)"
        )
    return concurrent.futures.Future.result(asyncio.run_coroutine_threadsafe(coro, loop))


async def await_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Awaits `coro` on `loop` from any loop: directly when it is the current one."""
    if asyncio.get_running_loop() is loop:
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="fusebox-guard-loop", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
        if not self.loop.is_running():
            self.loop.close()


class SyncFusebox:
    """`Fusebox` for sync code. `SyncFusebox.connect(...)` takes `Fusebox.connect`'s
    arguments."""

    def __init__(self, client: Fusebox, thread: _LoopThread) -> None:
        self.aio = client
        self._thread = thread

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._thread.loop

    @classmethod
    def connect(cls, *args: Any, **kwargs: Any) -> SyncFusebox:
        thread = _LoopThread()
        try:
            client = run_on(thread.loop, Fusebox.connect(*args, **kwargs))
        except BaseException:
            thread.stop()
            raise
        return cls(client, thread)

    def run(
        self,
        run_id: str,
        *,
        agent: str | None = None,
        tools: Sequence[str] | None = None,
        policy: Mapping[str, Any] | None = None,
        gate_on_error: GateOnError | None = None,
        results: ResultMode | None = None,
        timeout_s: float | None = None,
        parent: str | Run | SyncRun | None = None,
        root: str | None = None,
    ) -> SyncRun:
        """`Fusebox.run`: `parent` makes the run a sub-agent of that run (`root`: its
        tree's root, when `parent` is the id of a sub-agent)."""
        parent_run = parent.aio if isinstance(parent, SyncRun) else parent

        async def make() -> Run:
            return self.aio.run(
                run_id,
                agent=agent,
                tools=tools,
                policy=policy,
                gate_on_error=gate_on_error,
                results=results,
                timeout_s=timeout_s,
                parent=parent_run,
                root=root,
            )

        return SyncRun(run_on(self.loop, make()))

    def start_run(self, run_id: str, **kwargs: Any) -> SyncRun:
        run = self.run(run_id, **kwargs)
        run.start()
        return run

    def close(self) -> None:
        try:
            run_on(self.loop, self.aio.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> SyncFusebox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncRun:
    """`Run` for sync code; `aio` is the async handle underneath (on the loop thread)."""

    def __init__(self, run: Run) -> None:
        self.aio = run

    @property
    def id(self) -> str:
        return self.aio.id

    @property
    def parent(self) -> str | None:
        return self.aio.parent

    @property
    def root(self) -> str:
        return self.aio.root

    @property
    def stopped(self) -> StopReport | None:
        return self.aio.stopped

    def raise_if_stopped(self) -> None:
        self.aio.raise_if_stopped()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return run_on(self.aio.loop, coro)

    def start(self, *, watch_stop: bool = True) -> None:
        self._call(self.aio.start(watch_stop=watch_stop))

    def close(self) -> None:
        self._call(self.aio.close())

    def child(self, run_id: str | None = None, **kwargs: Any) -> SyncRun:
        """`Run.child`: a sub-agent's run, a child of this one (not started)."""

        async def make() -> Run:
            return self.aio.child(run_id, **kwargs)

        return SyncRun(self._call(make()))

    def start_child(self, run_id: str | None = None, **kwargs: Any) -> SyncRun:
        """`Run.start_child`: `child.stopped` says why when a cap refused it."""
        return SyncRun(self._call(self.aio.start_child(run_id, **kwargs)))

    def wait_stopped(self, timeout_s: float | None = None) -> StopReport | None:
        return self._call(self.aio.wait_stopped(timeout_s))

    def tool_call(
        self,
        tool: str,
        args: Any = _UNSET,
        *,
        call_id: str | None = None,
        args_hash: str | None = None,
        op_key: str | None = None,
        effect: Effect | str | None = None,
    ) -> Gate:
        return self._call(
            self.aio.tool_call(
                tool, args, call_id=call_id, args_hash=args_hash, op_key=op_key, effect=effect
            )
        )

    def tool_result(
        self,
        call_id: str,
        tool: str,
        kind: ResultKind | str = ResultKind.SUCCESS,
        **fields: Any,
    ) -> Decision | None:
        return self._call(self.aio.tool_result(call_id, tool, kind, **fields))

    def model_turn(
        self,
        stop_reason: str,
        *,
        usage: Usage | None = None,
        cost_usd: float | None = None,
        valid: bool | None = None,
    ) -> Decision | None:
        return self._call(
            self.aio.model_turn(stop_reason, usage=usage, cost_usd=cost_usd, valid=valid)
        )

    def model_call(
        self, *, estimate_tokens: int | None = None, estimate_usd: float | None = None
    ) -> Decision | None:
        return self._call(
            self.aio.model_call(estimate_tokens=estimate_tokens, estimate_usd=estimate_usd)
        )

    def progress(self, version: int, note: str | None = None) -> Decision | None:
        return self._call(self.aio.progress(version, note))

    def compaction(self, reason: str | None = None) -> Decision | None:
        return self._call(self.aio.compaction(reason))

    def finish(self, status: str | None = None) -> Decision | None:
        return self._call(self.aio.finish(status))

    def instance_launched(
        self,
        instance_id: str,
        *,
        region: str,
        provider: str = "ec2",
        max_lifetime_s: int | None = None,
    ) -> Decision | None:
        return self._call(
            self.aio.instance_launched(
                instance_id, region=region, provider=provider, max_lifetime_s=max_lifetime_s
            )
        )

    def __enter__(self) -> SyncRun:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
