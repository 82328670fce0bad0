"""The answer to one tool call, as an adapter acts on it: may the tool run, and what does
the model read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import FuseboxError, GuardUnavailable, Refused
from .types import Action, Decision, StopReport, to_text


@dataclass(frozen=True)
class Gate:
    """One gated call: the guard's decision, or why there is none.

    Exactly one of `decision` and `error` is set. With `error`, the tool runs only when
    the run's `gate_on_error` is `allow` (`allowed_on_error`); a refusal by the daemon
    (`Refused`) never lets it run.
    """

    call_id: str
    tool: str
    decision: Decision | None = None
    error: FuseboxError | None = None
    allowed_on_error: bool = False

    @property
    def action(self) -> Action | None:
        return self.decision.action if self.decision is not None else None

    @property
    def may_run(self) -> bool:
        """May the tool run? Only after `execute` or `warn`, or unguarded by choice."""
        if self.decision is not None:
            return self.decision.action.lets_tool_run
        return self.allowed_on_error and isinstance(self.error, GuardUnavailable)

    @property
    def stopped(self) -> bool:
        return self.decision is not None and self.decision.action is Action.STOP

    @property
    def report(self) -> StopReport | None:
        return self.decision.report if self.decision is not None else None

    @property
    def completed_result(self) -> Any:
        """The stored result of a side effect that already succeeded
        (`use_completed_result`), which the model reads instead of a second execution."""
        return self.decision.result if self.decision is not None else None

    @property
    def warning(self) -> str | None:
        """A `warn`'s message: the tool runs and the model also reads this."""
        if self.decision is not None and self.decision.action is Action.WARN:
            return self.decision.message
        return None

    @property
    def model_text(self) -> str | None:
        """What the model reads in place of the tool's output when the tool does not run
        (None when it may run). Always a full sentence: a blind refusal makes an agent
        that retries."""
        if self.may_run:
            return None
        decision = self.decision
        if decision is None:
            why = str(self.error) if self.error is not None else "no decision"
            if isinstance(self.error, Refused):
                return f"fusebox refused to gate {self.tool}: {why}. The tool did not run."
            return (
                f"fusebox could not be asked whether {self.tool} may run ({why}); "
                "the tool did not run."
            )
        if decision.action is Action.USE_COMPLETED_RESULT:
            return to_text(decision.result)
        if decision.action is Action.STOP:
            report = decision.report
            what = report.summary() if report is not None else decision.reason or "stopped"
            base = f"fusebox stopped this run ({what}); {self.tool} did not run."
            return f"{base} {decision.message}" if decision.message else base
        message = decision.message or f"{self.tool} was refused ({decision.reason})."
        return f"fusebox blocked {self.tool}: {message}"

    def reads(self, output: Any) -> str:
        """What the model reads after the call: the tool's `output` (when it ran) with a
        warning appended, else `model_text`."""
        text = self.model_text
        if text is not None:
            return text
        body = to_text(output)
        warning = self.warning
        return f"{body}\n\n[fusebox warning] {warning}" if warning else body
