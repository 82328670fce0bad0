"""Errors, told apart by kind: a caller reacts differently to a daemon that is silent,
one that is absent and one that refused the event."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .types import Decision, StopReport


class FuseboxError(Exception):
    """Base of every error this package raises."""


class ConnectError(FuseboxError):
    """The first connection to NATS failed (refused, unreachable, bad credentials, TLS)."""

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(f"cannot connect to NATS at {url}: {detail}")
        self.url = url
        self.detail = detail


class GuardUnavailable(FuseboxError):
    """The guard could not be asked: the decision is the run's `gate_on_error`."""


class GateTimeout(GuardUnavailable):
    def __init__(self, subject: str, timeout_s: float) -> None:
        super().__init__(f"no answer from fuseboxd on {subject} within {timeout_s * 1000:.0f} ms")
        self.subject = subject
        self.timeout_s = timeout_s


class NoResponders(GuardUnavailable):
    def __init__(self, subject: str, why: str = "is the daemon running?") -> None:
        super().__init__(f"no fuseboxd is listening on {subject} ({why})")
        self.subject = subject


class TransportError(GuardUnavailable):
    """NATS itself failed (connection closed, permission violation, JetStream error)."""

    def __init__(self, subject: str, detail: str) -> None:
        super().__init__(f"NATS request on {subject} failed: {detail}")
        self.subject = subject
        self.detail = detail


class Refused(FuseboxError):
    """fuseboxd refused the event itself (malformed, wrong tenant, `seq` backwards …)."""

    def __init__(self, reason: str, message: str, event_id: str | None = None) -> None:
        super().__init__(f"fuseboxd refused the event ({reason}): {message}")
        self.reason = reason
        self.message = message
        self.event_id = event_id


class RunExists(Refused):
    """`Run.start` for a run id the daemon already has events of: another process (a
    restarted worker) reusing it. Refused, so this process is never answered with the old
    one's decisions; start the run under a new run id."""

    def __init__(self, tenant: str, run: str, message: str, event_id: str | None = None) -> None:
        super().__init__("run_exists", message, event_id)
        self.args = (f"run {tenant}/{run} already exists: {message}; start it under a new run id",)
        self.tenant = tenant
        self.run = run


class BadAnswer(FuseboxError):
    """The daemon's answer was not a decision (a version mismatch, or not fuseboxd)."""

    def __init__(self, subject: str, detail: str) -> None:
        super().__init__(f"unexpected answer on {subject}: {detail}")
        self.subject = subject
        self.detail = detail


class RunStopped(FuseboxError):
    """The guard stopped the run. Adapters raise it to end the framework's run; it
    carries the stop report an operator acts on."""

    def __init__(
        self,
        report: StopReport | None,
        decision: Decision | None = None,
        *,
        history: Sequence[Any] = (),
    ) -> None:
        what = report.summary() if report is not None else "stopped"
        super().__init__(f"fusebox stopped the run: {what}")
        self.report = report
        self.decision = decision
        #: The conversation up to the stop, where the framework hands it over (Pydantic
        #: AI's messages: pass them as `message_history` to go on after a resume).
        self.history = list(history)
