"""`Run`: the handle that owns a run's envelope (guard contract §2): ids, `seq`, `ts_ms`,
`run_started`, and one call per event type.

Ordering invariant: events are numbered 1, 2, 3 … and every one reaches the daemon, in
order. fuseboxd holds an event whose `seq` is ahead of a missing one, so a lost event
would stall the run: an event whose delivery failed stays queued and is re-sent, with the
same id and bytes, before anything newer (the daemon's dedup answers a re-sent event it
already applied with the original decision). One lock per run keeps sends in order, so
parallel tool calls of one turn are gated one after the other.

The one id that is not `<run>-<seq>` is `run_started`'s, `<run>-1.<nonce of this Run>`,
sent inline: a second process starting a run id the daemon already has (a restarted
worker) is refused with `RunExists` instead of being answered the old process's
decisions from the dedup.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import FuseboxError, GuardUnavailable, Refused, RunExists, RunStopped
from .gate import Gate
from .killswitch import StopWatch
from .types import Action, Decision, Effect, GateOnError, ResultKind, ResultMode, StopReport, Usage

if TYPE_CHECKING:
    from .client import Fusebox

log = logging.getLogger("fusebox_guard")

#: Marks "no output given" (None is a valid JSON output).
_UNSET: Any = object()

#: The longest run id (guard contract §2).
MAX_RUN_ID = 128


@dataclass
class _Queued:
    id: str
    seq: int
    payload: bytes
    inline: bool
    done: asyncio.Future[Decision | None] = field(repr=False)


class Run:
    """One agent run behind the guard. Made by `Fusebox.run` / `Fusebox.start_run`."""

    def __init__(
        self,
        client: Fusebox,
        run_id: str,
        *,
        agent: str | None,
        tools: list[str] | None,
        policy: dict[str, Any] | None,
        gate_on_error: GateOnError,
        results: ResultMode,
        timeout_s: float,
        parent: str | None = None,
        root: str | None = None,
    ) -> None:
        self.client = client
        self.loop = client.loop
        self.tenant = client.tenant
        self.id = run_id
        self.agent = agent
        self.tools = tools
        self.policy = policy
        self.gate_on_error = gate_on_error
        self.results = results
        self.timeout_s = timeout_s
        #: The run this one is a sub-agent of (guard contract §6), or None for a root.
        self.parent = parent
        #: The root of the run's tree (the run itself for a root): its subjects name it,
        #: so a cluster serves the whole tree in one place (guard contract §6).
        self.root = root or parent or run_id
        self._seq = 0
        self._children = 0
        self._calls = 0
        self._queue: list[_Queued] = []
        self._lock = asyncio.Lock()
        self._watch: StopWatch | None = None
        self._stop: Decision | None = None
        self._started = False
        self._nonce = secrets.token_hex(6)
        #: Set once the daemon said this run id belongs to another process: nothing more
        #: is sent (a later id would be the other process's, answered from the dedup).
        self._exists: RunExists | None = None
        #: Why `run_started` is not delivered yet (it is re-sent with the next event).
        self.start_error: GuardUnavailable | None = None

    # --- lifecycle -------------------------------------------------------------------

    async def start(self, *, watch_stop: bool = True) -> None:
        """Watches the kill switch (learning a stop kept from before), then sends
        `run_started`. Idempotent."""
        if self._started:
            return
        self._started = True
        if watch_stop:
            self._watch = await self.client.watch_stop(self.id)
            self._watch.on_stop(self._latch)
        started: dict[str, Any] = {}
        if self.agent is not None:
            started["agent"] = self.agent
        if self.tools is not None:
            started["tools"] = list(self.tools)
        if self.policy is not None:
            started["policy"] = self.policy
        if self.parent is not None:
            started["parent"] = self.parent
        try:
            # Inline whatever the result mode: a refusal must reach the caller.
            await self._send("run_started", started, inline=True)
        except Refused:
            await self.close()
            raise
        except GuardUnavailable as err:
            # Queued: re-sent before the run's first gate, which decides (gate_on_error)
            # what the agent may do meanwhile.
            self.start_error = err
            log.warning(
                "fusebox: run_started of %s/%s not delivered yet: %s", self.tenant, self.id, err
            )

    def child(
        self,
        run_id: str | None = None,
        *,
        agent: str | None = None,
        tools: Sequence[str] | None = None,
        policy: Mapping[str, Any] | None = None,
        gate_on_error: GateOnError | None = None,
        results: ResultMode | None = None,
        timeout_s: float | None = None,
    ) -> Run:
        """A handle for a sub-agent's run, a child of this one (not started: `await
        child.start()`, or use `start_child`). It inherits this run's connection and
        its `gate_on_error`, result mode and timeout unless given. `run_id` defaults to
        `<this run>-<agent>-<n>`: fresh as long as this run's id is (a second handle of
        a run id is refused at start). Its events go to its own subjects and it has
        its own kill switch, as any run's; the guard counts its spending in this run's
        budgets and stops it when this run is stopped."""
        self._children += 1
        return self.client.run(
            run_id or child_run_id(self.id, agent, self._children),
            agent=agent,
            tools=tools,
            policy=policy,
            gate_on_error=gate_on_error or self.gate_on_error,
            results=results or self.results,
            timeout_s=timeout_s or self.timeout_s,
            parent=self,
        )

    async def start_child(
        self,
        run_id: str | None = None,
        *,
        agent: str | None = None,
        tools: Sequence[str] | None = None,
        policy: Mapping[str, Any] | None = None,
        gate_on_error: GateOnError | None = None,
        results: ResultMode | None = None,
        timeout_s: float | None = None,
    ) -> Run:
        """`child(...)` and `start()`. A child past this run's caps (`max_depth`,
        `max_children`, `max_open_children`) is stopped at its start: `child.stopped`
        says why (`depth_limit`, `spawn_limit`, `concurrency_limit`), and none of its
        calls may run."""
        child = self.child(
            run_id,
            agent=agent,
            tools=tools,
            policy=policy,
            gate_on_error=gate_on_error,
            results=results,
            timeout_s=timeout_s,
        )
        await child.start()
        return child

    async def close(self) -> None:
        """Stops watching the kill switch (the run itself stays as it is)."""
        if self._watch is not None:
            await self._watch.close()
            self._watch = None

    async def __aenter__(self) -> Run:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- state -----------------------------------------------------------------------

    @property
    def seq(self) -> int:
        """The `seq` of the last event made."""
        return self._seq

    @property
    def stop_decision(self) -> Decision | None:
        return self._stop

    @property
    def stopped(self) -> StopReport | None:
        """The stop report once the run is stopped (gate, observe answer, or kill
        switch); None while it may go on."""
        if self._stop is None:
            return None
        return self._stop.report or StopReport("", self._stop.reason or "stopped")

    def raise_if_stopped(self) -> None:
        if self._stop is not None:
            raise RunStopped(self.stopped, self._stop)

    async def wait_stopped(self, timeout_s: float | None = None) -> StopReport | None:
        """Waits for the kill switch (needs `start()` with `watch_stop`)."""
        if self._watch is not None and self._stop is None:
            await self._watch.wait(timeout_s)
        return self.stopped

    def _latch(self, decision: Decision) -> None:
        if self._stop is None and decision.action is Action.STOP:
            self._stop = decision
            if self._watch is not None:
                self._watch.latch(decision)

    # --- events ----------------------------------------------------------------------

    def next_call_id(self) -> str:
        """A call id for producers whose framework has none."""
        self._calls += 1
        return f"{self.id}-call-{self._calls}"

    async def tool_call(
        self,
        tool: str,
        args: Any = _UNSET,
        *,
        call_id: str | None = None,
        args_hash: str | None = None,
        op_key: str | None = None,
        effect: Effect | str | None = None,
    ) -> Gate:
        """Asks whether `tool` may run. Never raises for the guard's sake: a silent or
        absent daemon gives a `Gate` with `error` set, which lets the tool run only
        under `gate_on_error=allow`; a run known to be stopped is refused without a round
        trip."""
        if not self._started:
            await self.start()
        call_id = call_id or self.next_call_id()
        if self._stop is not None:
            return Gate(call_id, tool, decision=self._refusal(call_id))
        body: dict[str, Any] = {"call_id": call_id, "tool": tool}
        if args_hash is not None:
            body["args_hash"] = args_hash
        else:
            body["args"] = {} if args is _UNSET else args
        if op_key is not None:
            body["op_key"] = op_key
        if effect is not None:
            body["effect"] = Effect(effect).value
        try:
            decision = await self._send("tool_call", body, inline=True)
        except FuseboxError as err:
            allowed = self.gate_on_error is GateOnError.ALLOW and isinstance(err, GuardUnavailable)
            return Gate(call_id, tool, error=err, allowed_on_error=allowed)
        assert decision is not None
        return Gate(call_id, tool, decision=decision)

    async def tool_result(
        self,
        call_id: str,
        tool: str,
        kind: ResultKind | str = ResultKind.SUCCESS,
        *,
        output: Any = _UNSET,
        output_hash: str | None = None,
        code: str | None = None,
        retry_after_ms: int | None = None,
        progress: int | None = None,
        terminal: bool | None = None,
    ) -> Decision | None:
        """Reports how a call ended. Inline mode returns the observe decision
        (`continue`, `retry_after`, `stop` …); passive mode returns None."""
        body: dict[str, Any] = {"call_id": call_id, "tool": tool, "kind": ResultKind(kind).value}
        if code is not None:
            body["code"] = code
        if retry_after_ms is not None:
            body["retry_after_ms"] = retry_after_ms
        if terminal is not None:
            body["terminal"] = terminal
        if output_hash is not None:
            body["output_hash"] = output_hash
        elif output is not _UNSET:
            body["output"] = output
        if progress is not None:
            body["progress"] = progress
        return await self._observe("tool_result", body)

    async def model_turn(
        self,
        stop_reason: str,
        *,
        usage: Usage | None = None,
        cost_usd: float | None = None,
        valid: bool | None = None,
    ) -> Decision | None:
        body: dict[str, Any] = {"stop_reason": stop_reason}
        if usage is not None:
            body["usage"] = usage.to_json()
        if cost_usd is not None:
            body["cost_usd"] = cost_usd
        if valid is not None:
            body["valid"] = valid
        return await self._observe("model_turn", body)

    async def model_call(
        self,
        *,
        estimate_tokens: int | None = None,
        estimate_usd: float | None = None,
    ) -> Decision | None:
        """Asks, before the agent calls its model, whether a token, cost or model-turn
        budget (this run's, or one of a run above it counting its tree) has room for
        the call; the guard holds what it reserves (the estimate, else this run's mean
        per model turn) until the next `model_turn`. Always inline: the answer must come
        before the model is called. A `stop` is latched like a tool call's (the run is
        over: `raise_if_stopped` raises it); a run known to be stopped is answered with
        its stop without a round trip. Unanswered, it raises the `FuseboxError`, or
        returns None (the call may go ahead) under `gate_on_error=allow`."""
        if not self._started:
            await self.start()
        if self._stop is not None:
            return self._refusal(None)
        body: dict[str, Any] = {}
        if estimate_tokens is not None:
            body["estimate_tokens"] = estimate_tokens
        if estimate_usd is not None:
            body["estimate_usd"] = estimate_usd
        try:
            return await self._send("model_call", body, inline=True)
        except GuardUnavailable:
            if self.gate_on_error is GateOnError.ALLOW:
                return None
            raise

    async def progress(self, version: int, note: str | None = None) -> Decision | None:
        body: dict[str, Any] = {"version": version}
        if note is not None:
            body["note"] = note
        return await self._observe("progress", body)

    async def compaction(self, reason: str | None = None) -> Decision | None:
        return await self._observe("compaction", {} if reason is None else {"reason": reason})

    async def finish(self, status: str | None = None) -> Decision | None:
        """`run_finished`: the producer closes the run."""
        return await self._observe("run_finished", {} if status is None else {"status": status})

    async def instance_launched(
        self,
        instance_id: str,
        *,
        region: str,
        provider: str = "ec2",
        max_lifetime_s: int | None = None,
    ) -> Decision | None:
        """A cloud instance was started for this run (the watchdog tears it down)."""
        body: dict[str, Any] = {"provider": provider, "region": region, "instance_id": instance_id}
        if max_lifetime_s is not None:
            body["max_lifetime_s"] = max_lifetime_s
        return await self._observe("instance_launched", body)

    async def send(self, type: str, fields: dict[str, Any], *, inline: bool) -> Decision | None:
        """Any event type with its own fields, enveloped like the rest (for event
        types or producer fields this handle has no method for)."""
        return await self._send(type, fields, inline=inline)

    # --- transport -------------------------------------------------------------------

    async def _observe(self, type: str, body: dict[str, Any]) -> Decision | None:
        return await self._send(type, body, inline=self.results is ResultMode.INLINE)

    async def _send(self, type: str, body: dict[str, Any], *, inline: bool) -> Decision | None:
        async with self._lock:
            if self._exists is not None:
                raise self._exists
            queued = self._make(type, body, inline)
            self._queue.append(queued)
            await self._flush()
        return queued.done.result()

    def _make(self, type: str, body: dict[str, Any], inline: bool) -> _Queued:
        self._seq += 1
        event_id = f"{self.id}-{self._seq}"
        if type == "run_started":
            event_id += f".{self._nonce}"
        event = {
            "v": 1,
            "id": event_id,
            "tenant": self.tenant,
            "run": self.id,
            "seq": self._seq,
            "ts_ms": time.time_ns() // 1_000_000,
            "type": type,
            **body,
        }
        payload = json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()
        done: asyncio.Future[Decision | None] = asyncio.get_running_loop().create_future()
        return _Queued(event_id, self._seq, payload, inline, done)

    async def _flush(self) -> None:
        """Delivers the queue in order; stops at the first failure (the failed event and
        everything after it stay queued for the next send)."""
        while self._queue:
            head = self._queue[0]
            try:
                decision = await self._deliver(head)
            except Refused as err:
                if err.reason == "run_exists":
                    # run_started was queued (the daemon was unreachable at start) and the
                    # run id is another process's: fail everything, send nothing more.
                    self._exists = RunExists(self.tenant, self.id, err.message, err.event_id)
                    for queued in self._queue:
                        if not queued.done.done():
                            queued.done.set_exception(self._exists)
                    self._queue.clear()
                    return
                # Not applied: give its seq to the events behind it.
                self._queue.pop(0)
                self._renumber(head.seq)
                if not head.done.done():
                    head.done.set_exception(err)
                continue
            except FuseboxError as err:
                newest = self._queue[-1]
                if not newest.done.done():
                    newest.done.set_exception(err)
                return
            self._queue.pop(0)
            if decision is not None and decision.action is Action.STOP:
                self._latch(decision)
            if not head.done.done():
                head.done.set_result(decision)

    async def _deliver(self, event: _Queued) -> Decision | None:
        if event.inline:
            return await self.client.ask(self.id, event.payload, self.timeout_s, root=self.root)
        await self.client.publish(self.id, event.id, event.payload, self.timeout_s, root=self.root)
        return None

    def _renumber(self, free_seq: int) -> None:
        """Shifts the queued events after a refused one down by one `seq`."""
        seq = free_seq
        for i, queued in enumerate(self._queue):
            if queued.seq <= free_seq:
                continue
            event = json.loads(queued.payload)
            event["seq"] = seq
            event["id"] = f"{self.id}-{seq}"
            payload = json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()
            self._queue[i] = _Queued(event["id"], seq, payload, queued.inline, queued.done)
            seq += 1
        self._seq = seq - 1

    def _refusal(self, call_id: str | None) -> Decision:
        """The answer to a call of a run known to be stopped: the run's own stop."""
        assert self._stop is not None
        stop = self._stop
        return Decision(
            action=Action.STOP,
            tenant=self.tenant,
            run=self.id,
            event_id="",
            call_id=call_id,
            reason=stop.reason,
            message=stop.message,
            report=stop.report,
            raw=stop.raw,
        )


def child_run_id(parent: str, agent: str | None, n: int) -> str:
    """`<parent>-<agent>-<n>`, within the 128 characters of a run id: a long parent id
    is cut and marked with a hash of it, so two parents that share a prefix never share
    a child id."""
    tag = re.sub(r"[^A-Za-z0-9_-]+", "_", agent)[:32] if agent else "sub"
    suffix = f"-{tag}-{n}"
    if len(parent) + len(suffix) <= MAX_RUN_ID:
        return parent + suffix
    digest = hashlib.sha256(parent.encode()).hexdigest()[:8]
    return f"{parent[: MAX_RUN_ID - len(suffix) - 9]}-{digest}{suffix}"


def tool_names(tools: Sequence[Any]) -> list[str]:
    """Names of framework tool objects (anything with `.name`)."""
    return [str(getattr(tool, "name", tool)) for tool in tools]
