//! Graceful stop (guard contract §4.5): closing a run latches it with a report, and every
//! later decision of the run is built from that report.

use std::sync::Arc;

use serde_json::Value;

use crate::decision::{
    Action, Decision, Detector, Reason, ResumeCondition, StopReport, TerminalState,
};
use crate::event::Event;
use crate::message;
use crate::run::{RunState, RunStatus};

/// A decision for `event` with nothing but the action filled in.
pub(crate) fn decision(event: &Event, call_id: Option<&str>, action: Action) -> Decision {
    Decision {
        v: 1,
        tenant: event.tenant.clone(),
        run: event.run.clone(),
        seq: event.seq,
        event_id: event.id.clone(),
        call_id: call_id.map(str::to_owned),
        action,
        reason: None,
        detector: None,
        count: None,
        message: None,
        wait_ms: None,
        result: None,
        report: None,
    }
}

/// Where an event sits in its run, for `fired_guards`: its seq, else its ordinal.
pub(crate) fn position(run: &RunState, event: &Event) -> u64 {
    event.seq.unwrap_or(run.counters.events)
}

fn resume_condition(terminal: TerminalState, reason: Reason) -> ResumeCondition {
    match (terminal, reason) {
        (TerminalState::Completed, _) => ResumeCondition::None,
        // A sub-agent stopped for its tree: its parent starts another if it must.
        (
            _,
            Reason::AncestorStopped
            | Reason::TreeBudget
            | Reason::SpawnLimit
            | Reason::ConcurrencyLimit
            | Reason::DepthLimit
            | Reason::SubtaskRepeat,
        ) => ResumeCondition::NewRun,
        (TerminalState::NeedsHuman | TerminalState::Cancelled, _) => ResumeCondition::HumanApproval,
        (
            _,
            Reason::StepBudget
            | Reason::TimeBudget
            | Reason::TokenBudget
            | Reason::CostBudget
            | Reason::TurnBudget
            | Reason::ToolErrorLimit
            | Reason::InvalidModelOutput
            | Reason::CompactionBudget
            | Reason::AgentFailed,
        ) => ResumeCondition::NewRun,
        _ => ResumeCondition::VerifiedPreconditionChange,
    }
}

/// What closes a run, and why.
pub(crate) struct Closing {
    pub terminal: TerminalState,
    pub reason: Reason,
    pub detector: Option<Detector>,
    pub count: Option<u32>,
    pub detail: Option<String>,
    /// Replaces the run's unmet precondition in the report (and keeps it there).
    pub unmet_precondition: Option<String>,
}

impl Closing {
    pub fn guard(reason: Reason) -> Self {
        Closing {
            terminal: TerminalState::StoppedLoopGuard,
            reason,
            detector: None,
            count: None,
            detail: None,
            unmet_precondition: None,
        }
    }

    pub fn detector(reason: Reason, detector: Detector, count: u32) -> Self {
        Closing {
            detector: Some(detector),
            count: Some(count),
            ..Closing::guard(reason)
        }
    }

    pub fn new(terminal: TerminalState, reason: Reason, detail: Option<String>) -> Self {
        Closing {
            terminal,
            reason,
            detector: None,
            count: None,
            detail,
            unmet_precondition: None,
        }
    }
}

/// Latches the run with a report and returns the decision that carries it: `stop`, or
/// `complete` for a run that reached its goal.
pub(crate) fn close(
    run: &mut RunState,
    event: &Event,
    call_id: Option<&str>,
    closing: Closing,
) -> Decision {
    let at = position(run, event);
    if closing.unmet_precondition.is_some() {
        run.unmet_precondition = closing.unmet_precondition;
    }
    if closing.terminal != TerminalState::Completed {
        let guard = closing
            .detector
            .map(Detector::as_str)
            .unwrap_or(closing.reason.as_str());
        run.note_fired(guard, "stop", at);
    }
    let report = StopReport {
        terminal_state: closing.terminal,
        reason: closing.reason,
        completed_steps: run.counters.steps,
        progress_version: run.progress_version,
        completed_operations: run.completed_operations.clone(),
        last_safe_checkpoint: run.last_safe_checkpoint.clone(),
        unmet_precondition: run.unmet_precondition.clone(),
        resume_condition: resume_condition(closing.terminal, closing.reason),
        fired_guards: run.fired_guards.clone(),
        detail: closing.detail,
    };
    let action = if closing.terminal == TerminalState::Completed {
        Action::Complete
    } else {
        Action::Stop
    };
    let mut decided = decision(event, call_id, action);
    decided.reason = Some(closing.reason);
    decided.detector = closing.detector;
    decided.count = closing.count;
    let message = message::stop(&report);
    decided.message = Some(message.clone());
    let report = Arc::new(report);
    decided.report = Some(report.clone());
    run.status = RunStatus::Closed { report, message };
    // A closed run calls no model: what its model calls in flight held is let go (and,
    // by the engine's carry-up, from its ancestors too); a turn that still comes in
    // counts as spent, as ever.
    run.reserved.release_all();
    decided
}

/// The answer of a closed run to anything that asks it to go on: the same report, with
/// `run_closed` as the reason when the run had finished normally. `None` for an open run.
pub(crate) fn latched(run: &RunState, event: &Event, call_id: Option<&str>) -> Option<Decision> {
    let RunStatus::Closed { report, message } = &run.status else {
        return None;
    };
    let mut decided = decision(event, call_id, Action::Stop);
    decided.reason = Some(match report.terminal_state {
        TerminalState::Completed => Reason::RunClosed,
        _ => report.reason,
    });
    decided.message = Some(message.clone());
    decided.report = Some(report.clone());
    Some(decided)
}

/// The stored result a `use_completed_result` answer carries. A result that came only as
/// its hash (too large for the producer to send) is not there to give back: what is
/// stored instead says so and where the result is — the call that made it — under
/// [`RESULT_NOT_STORED`](crate::ledger::RESULT_NOT_STORED), never the bare hash as if it
/// were the result.
pub(crate) fn stored_result(
    output: Option<&crate::event::Output>,
    event: &Event,
    call_id: &str,
) -> String {
    let value = match output {
        Some(crate::event::Output::Json(value)) => return message::compact_json(value),
        Some(crate::event::Output::Hash(hash)) => serde_json::json!({
            crate::ledger::RESULT_NOT_STORED: {
                "output_hash": hash,
                "run": event.run,
                "call_id": call_id,
                "completed_at_ms": event.ts_ms,
            }
        }),
        None => Value::Null,
    };
    message::compact_json(&value)
}
