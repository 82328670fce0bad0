"""The guard's answers as typed values (guard contract §3), decoded from the daemon's JSON.

Reason codes stay plain strings: the contract lets a new detector bring a new stable code,
and a client built before it must still read the decision.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Action(str, Enum):
    """What the guard decided. The first five answer a `tool_call`, the rest observe."""

    EXECUTE = "execute"
    WARN = "warn"
    USE_COMPLETED_RESULT = "use_completed_result"
    BLOCK = "block"
    STOP = "stop"
    CONTINUE = "continue"
    COMPLETE = "complete"
    RETRY_AFTER = "retry_after"
    WAIT_FOR_CHANGED_PRECONDITION = "wait_for_changed_precondition"
    POLL_BOUNDED = "poll_bounded"

    @property
    def lets_tool_run(self) -> bool:
        """Only `execute` and `warn` let a tool run."""
        return self in (Action.EXECUTE, Action.WARN)


class TerminalState(str, Enum):
    STOPPED_LOOP_GUARD = "STOPPED_LOOP_GUARD"
    NEEDS_HUMAN = "NEEDS_HUMAN"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    COMPLETED = "COMPLETED"


class ResultKind(str, Enum):
    """How a tool call ended (the `kind` of a `tool_result`)."""

    SUCCESS = "SUCCESS"
    PENDING = "PENDING"
    RETRYABLE = "RETRYABLE"
    PRECONDITION = "PRECONDITION"
    FATAL = "FATAL"


class Effect(str, Enum):
    READ = "read"
    WRITE = "write"


class GateOnError(str, Enum):
    """What a tool does when the guard cannot be asked (timeout, no daemon, NATS down)."""

    #: The tool does not run: an unguarded agent is what fusebox exists to prevent.
    DENY = "deny"
    #: The tool runs unguarded (availability over the guard, by the user's choice).
    ALLOW = "allow"


class ResultMode(str, Enum):
    """Where a run's non-gate events go."""

    #: Request/reply on the gate subject: the observe decision comes back at once.
    INLINE = "inline"
    #: Published to JetStream (`FUSEBOX_EVENTS`, deduplicated by `Nats-Msg-Id`).
    PASSIVE = "passive"


@dataclass(frozen=True)
class StopReport:
    """Why a run was stopped, and what would let it go on."""

    terminal_state: TerminalState | str
    reason: str
    completed_steps: int = 0
    progress_version: int | None = None
    completed_operations: tuple[str, ...] = ()
    last_safe_checkpoint: str | None = None
    unmet_precondition: str | None = None
    resume_condition: str | None = None
    fired_guards: tuple[str, ...] = ()
    detail: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StopReport:
        state = str(data.get("terminal_state", ""))
        try:
            terminal: TerminalState | str = TerminalState(state)
        except ValueError:
            terminal = state
        return cls(
            terminal_state=terminal,
            reason=str(data.get("reason", "")),
            completed_steps=int(data.get("completed_steps") or 0),
            progress_version=_opt_int(data.get("progress_version")),
            completed_operations=tuple(str(x) for x in data.get("completed_operations") or ()),
            last_safe_checkpoint=_opt_str(data.get("last_safe_checkpoint")),
            unmet_precondition=_opt_str(data.get("unmet_precondition")),
            resume_condition=_opt_str(data.get("resume_condition")),
            fired_guards=tuple(str(x) for x in data.get("fired_guards") or ()),
            detail=_opt_str(data.get("detail")),
        )

    @property
    def state_name(self) -> str:
        state = self.terminal_state
        return state.value if isinstance(state, TerminalState) else state

    def summary(self) -> str:
        """One line for a log or for the model: `STOPPED_LOOP_GUARD (same_call_repeat)`."""
        text = f"{self.state_name} ({self.reason})"
        return f"{text}: {self.detail}" if self.detail else text


@dataclass(frozen=True)
class Decision:
    """One decision, exactly as the daemon sent it (the `raw` dict keeps every field)."""

    action: Action
    tenant: str
    run: str
    event_id: str
    seq: int | None = None
    call_id: str | None = None
    reason: str | None = None
    detector: str | None = None
    count: int | None = None
    message: str | None = None
    wait_ms: int | None = None
    result: Any = None
    report: StopReport | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Decision:
        report = data.get("report")
        return cls(
            action=Action(data["action"]),
            tenant=str(data.get("tenant", "")),
            run=str(data.get("run", "")),
            event_id=str(data.get("event_id", "")),
            seq=_opt_int(data.get("seq")),
            call_id=_opt_str(data.get("call_id")),
            reason=_opt_str(data.get("reason")),
            detector=_opt_str(data.get("detector")),
            count=_opt_int(data.get("count")),
            message=_opt_str(data.get("message")),
            wait_ms=_opt_int(data.get("wait_ms")),
            result=data.get("result"),
            report=StopReport.from_json(report) if isinstance(report, dict) else None,
            raw=data,
        )


@dataclass(frozen=True)
class Usage:
    """Tokens of one model turn (every field optional, as providers differ)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None

    def to_json(self) -> dict[str, int]:
        fields = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
        }
        return {k: v for k, v in fields.items() if v is not None}


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def to_text(value: Any) -> str:
    """A tool output as the model reads it: strings as they are, the rest as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
