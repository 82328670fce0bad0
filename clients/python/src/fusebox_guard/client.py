"""`Fusebox`: one NATS connection for one tenant, speaking fuseboxd's wire contract
(interfaces.md §2). It asks and reports; it never decides."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from . import subjects
from .connection import Credentials, TLSConfig, check_id, connect_nats
from .errors import BadAnswer, GateTimeout, NoResponders, Refused, TransportError
from .killswitch import StopWatch
from .run import MAX_RUN_ID, Run
from .types import Decision, GateOnError, ResultMode

#: Who a run is a sub-agent of: the parent's run id, or its handle.
Parent = str | Run


class Fusebox:
    """A tenant's connection to the guard. Make one per process (or per event loop: a
    nats-py connection belongs to the loop that made it) and open runs on it. Made inside
    a running event loop (`Fusebox.connect`, or `Fusebox(nc, ...)` from a coroutine)."""

    def __init__(
        self,
        nc: NATS,
        *,
        tenant: str,
        timeout_s: float = 2.0,
        gate_on_error: GateOnError = GateOnError.DENY,
        results: ResultMode = ResultMode.INLINE,
        owns_connection: bool = False,
    ) -> None:
        #: The loop that owns the connection; blocking and cross-loop callers go through it.
        self.loop = asyncio.get_running_loop()
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream(timeout=timeout_s)
        self.tenant = check_id("tenant", tenant, 64)
        self.timeout_s = timeout_s
        self.gate_on_error = gate_on_error
        self.results = results
        self._owns_connection = owns_connection

    @classmethod
    async def connect(
        cls,
        servers: str | Sequence[str] = "nats://127.0.0.1:4222",
        *,
        tenant: str,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        nkey_seed_file: str | None = None,
        creds_file: str | None = None,
        tls: TLSConfig | None = None,
        inbox_prefix: str | None = None,
        timeout_s: float = 2.0,
        connect_timeout_s: float = 2.0,
        gate_on_error: GateOnError = GateOnError.DENY,
        results: ResultMode = ResultMode.INLINE,
        name: str | None = None,
    ) -> Fusebox:
        """Connects to NATS; raises `ConnectError` with the reason when the first
        connect fails. The inbox prefix defaults to `_INBOX.<tenant>`, the only inboxes
        a tenant user of deploy/nats/accounts.conf may receive replies on."""
        check_id("tenant", tenant, 64)
        nc = await connect_nats(
            servers,
            tenant=tenant,
            credentials=Credentials(user, password, token, nkey_seed_file, creds_file),
            tls=tls,
            inbox_prefix=inbox_prefix,
            connect_timeout_s=connect_timeout_s,
            name=name,
        )
        return cls(
            nc,
            tenant=tenant,
            timeout_s=timeout_s,
            gate_on_error=gate_on_error,
            results=results,
            owns_connection=True,
        )

    @property
    def nats(self) -> NATS:
        return self._nc

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
        parent: Parent | None = None,
        root: str | None = None,
    ) -> Run:
        """A handle for run `run_id` (not started: `await run.start()`, or use
        `start_run`). Use a fresh id per run: ids and `seq` start at 1 per handle, and
        starting an id the daemon already has raises `RunExists`.

        `parent` makes the run a sub-agent of that run of the same tenant (guard
        contract §6): the parent's budgets count this run's spending, and a stop of the
        parent (or of any run above it) stops this one too. A start past the parent's
        caps (`max_depth`, `max_children`, `max_open_children`) is answered with a
        stop: `run.stopped` says why, and nothing of the run may execute.

        `root` is the root of the parent's tree when `parent` is an id of a run that is
        itself a sub-agent (a `Run` parent knows its own; an id alone is taken for the
        root). The run's subjects name it, so that in a cluster the whole tree is served
        by one daemon and its budgets stay exact."""
        parent_id = parent.id if isinstance(parent, Run) else parent
        if isinstance(parent, Run):
            root = root or parent.root
        return Run(
            self,
            check_id("run", run_id, MAX_RUN_ID),
            agent=agent,
            tools=list(tools) if tools is not None else None,
            policy=dict(policy) if policy is not None else None,
            gate_on_error=gate_on_error or self.gate_on_error,
            results=results or self.results,
            timeout_s=timeout_s or self.timeout_s,
            parent=check_id("parent", parent_id, MAX_RUN_ID) if parent_id is not None else None,
            root=check_id("root", root, MAX_RUN_ID) if root is not None else None,
        )

    async def start_run(
        self,
        run_id: str,
        *,
        agent: str | None = None,
        tools: Sequence[str] | None = None,
        policy: Mapping[str, Any] | None = None,
        gate_on_error: GateOnError | None = None,
        results: ResultMode | None = None,
        timeout_s: float | None = None,
        parent: Parent | None = None,
        root: str | None = None,
    ) -> Run:
        """`run(...)` and `start()`: the kill switch is watched and `run_started` sent."""
        run = self.run(
            run_id,
            agent=agent,
            tools=tools,
            policy=policy,
            gate_on_error=gate_on_error,
            results=results,
            timeout_s=timeout_s,
            parent=parent,
            root=root,
        )
        await run.start()
        return run

    async def ask(
        self, run_id: str, payload: bytes, timeout_s: float, *, root: str | None = None
    ) -> Decision:
        """One event on the run's gate subject (its tree's, naming `root`, for a run of a
        tree); its decision. A retried request with the same event id is answered from
        the daemon's dedup with the same decision."""
        subject = subjects.tree_gate(self.tenant, root or run_id, run_id)
        try:
            msg = await self._nc.request(subject, payload, timeout=timeout_s)
        except nats.errors.NoRespondersError:
            raise NoResponders(subject) from None
        except nats.errors.TimeoutError:
            raise GateTimeout(subject, timeout_s) from None
        except nats.errors.Error as err:
            raise TransportError(subject, str(err) or type(err).__name__) from err
        return decode_decision(subject, msg.data)

    async def publish(
        self,
        run_id: str,
        event_id: str,
        payload: bytes,
        timeout_s: float,
        *,
        root: str | None = None,
    ) -> None:
        """One event to `FUSEBOX_EVENTS`, waiting for JetStream to store it. The
        `Nats-Msg-Id` is `<tenant>.<run>.<id>`, so a re-sent event is stored once."""
        subject = subjects.tree_events(self.tenant, root or run_id, run_id)
        headers = {"Nats-Msg-Id": f"{self.tenant}.{run_id}.{event_id}"}
        try:
            await self._js.publish(subject, payload, timeout=timeout_s, headers=headers)
        except nats.js.errors.NoStreamResponseError:
            raise NoResponders(subject) from None
        except nats.errors.TimeoutError:
            raise GateTimeout(subject, timeout_s) from None
        except nats.errors.Error as err:
            raise TransportError(subject, str(err) or type(err).__name__) from err

    async def watch_stop(self, run_id: str) -> StopWatch:
        """The run's kill switch, including a stop kept from before this call."""
        return await StopWatch.open(self._nc, self.tenant, run_id, self.timeout_s)

    async def close(self) -> None:
        """Drains and closes the connection, when this client made it."""
        if self._owns_connection and not self._nc.is_closed:
            await self._nc.drain()

    async def __aenter__(self) -> Fusebox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def decode_decision(subject: str, data: bytes) -> Decision:
    """A reply of fuseboxd: a decision, or `{"error": …}` (a refusal)."""
    try:
        body = json.loads(data)
    except ValueError as err:
        raise BadAnswer(subject, f"not JSON: {err}") from None
    if not isinstance(body, dict):
        raise BadAnswer(subject, "not a JSON object")
    error = body.get("error")
    if isinstance(error, dict):
        raise Refused(
            str(error.get("reason", "refused")),
            str(error.get("message", "")),
            error.get("event_id"),
        )
    try:
        return Decision.from_json(body)
    except (KeyError, ValueError, TypeError) as err:
        raise BadAnswer(subject, f"not a decision: {err!r}") from None
