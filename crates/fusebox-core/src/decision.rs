//! What the guard answers (guard contract §3): gate decisions for `tool_call`, observe
//! decisions for everything else, and the stop report.
//!
//! Field order in the structs is the field order on the wire; replay compares decisions
//! byte for byte, so it must never depend on anything but these declarations.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    // Gate actions (tool_call).
    Execute,
    Warn,
    UseCompletedResult,
    Block,
    Stop,
    // Observe actions (everything else).
    Continue,
    Complete,
    RetryAfter,
    WaitForChangedPrecondition,
    PollBounded,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Execute => "execute",
            Action::Warn => "warn",
            Action::UseCompletedResult => "use_completed_result",
            Action::Block => "block",
            Action::Stop => "stop",
            Action::Continue => "continue",
            Action::Complete => "complete",
            Action::RetryAfter => "retry_after",
            Action::WaitForChangedPrecondition => "wait_for_changed_precondition",
            Action::PollBounded => "poll_bounded",
        }
    }

    /// May the tool run? Only `execute` and `warn` let it.
    pub fn lets_tool_run(self) -> bool {
        matches!(self, Action::Execute | Action::Warn)
    }

    /// A refusal of a call: `block` or `stop` at the gate.
    pub fn refuses(self) -> bool {
        matches!(self, Action::Block | Action::Stop)
    }

    pub const ALL: [Action; 10] = [
        Action::Execute,
        Action::Warn,
        Action::UseCompletedResult,
        Action::Block,
        Action::Stop,
        Action::Continue,
        Action::Complete,
        Action::RetryAfter,
        Action::WaitForChangedPrecondition,
        Action::PollBounded,
    ];
}

/// The stable reason codes (metrics and dashboards use them as label values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    StepBudget,
    TimeBudget,
    TokenBudget,
    CostBudget,
    TurnBudget,
    ToolErrorLimit,
    SameCallRepeat,
    PingPong,
    ArgChurn,
    NoProgress,
    PollNoProgress,
    UnknownTool,
    GlobalCircuitBreaker,
    CompactionLoopPersisted,
    /// Compactions with no progress between them (issue 20).
    CompactionThrash,
    /// `max_compactions` spent.
    CompactionBudget,
    ConsecutiveBlocks,
    OperationInFlight,
    /// An operation's in-flight lease ran out with no result: it may or may not have
    /// happened.
    OperationOutcomeUnknown,
    PreconditionUnchanged,
    RetryTooSoon,
    /// A call the tool told to wait (PENDING, or RETRYABLE with `retry_after_ms`) that
    /// waited as told, still answered the same, past its per-call time budget.
    WaitBudget,
    /// A warning only: one tool gave the same answer to a long streak of calls that
    /// differ only in their words (a flailing search, or a batch — never stopped for it).
    SameAnswerStreak,
    /// Run trees (guard contract §6): an ancestor of the run was stopped or cancelled.
    AncestorStopped,
    /// A budget of an ancestor, which counts its whole subtree, is spent.
    TreeBudget,
    /// A sub-agent past the caps of a run above it: runs started, open at once, depth.
    SpawnLimit,
    ConcurrencyLimit,
    DepthLimit,
    /// A sub-task that sibling runs already ran and ended the same way.
    SubtaskRepeat,
    /// A warning only: a sub-agent of this run was stopped.
    ChildStopped,
    InvalidModelOutput,
    ModelRefusal,
    Cancelled,
    RunClosed,
    Completed,
    /// The producer closed the run as failed (`run_finished` with status `failed…` or
    /// `error…`): the agent ended on an error of its own.
    AgentFailed,
    PermissionDenied,
    PolicyBlocked,
    NeedsHuman,
    Fatal,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::StepBudget => "step_budget",
            Reason::TimeBudget => "time_budget",
            Reason::TokenBudget => "token_budget",
            Reason::CostBudget => "cost_budget",
            Reason::TurnBudget => "turn_budget",
            Reason::ToolErrorLimit => "tool_error_limit",
            Reason::SameCallRepeat => "same_call_repeat",
            Reason::PingPong => "ping_pong",
            Reason::ArgChurn => "arg_churn",
            Reason::NoProgress => "no_progress",
            Reason::PollNoProgress => "poll_no_progress",
            Reason::UnknownTool => "unknown_tool",
            Reason::GlobalCircuitBreaker => "global_circuit_breaker",
            Reason::CompactionLoopPersisted => "compaction_loop_persisted",
            Reason::CompactionThrash => "compaction_thrash",
            Reason::CompactionBudget => "compaction_budget",
            Reason::ConsecutiveBlocks => "consecutive_blocks",
            Reason::OperationInFlight => "operation_in_flight",
            Reason::OperationOutcomeUnknown => "operation_outcome_unknown",
            Reason::PreconditionUnchanged => "precondition_unchanged",
            Reason::RetryTooSoon => "retry_too_soon",
            Reason::WaitBudget => "wait_budget",
            Reason::SameAnswerStreak => "same_answer_streak",
            Reason::AncestorStopped => "ancestor_stopped",
            Reason::TreeBudget => "tree_budget",
            Reason::SpawnLimit => "spawn_limit",
            Reason::ConcurrencyLimit => "concurrency_limit",
            Reason::DepthLimit => "depth_limit",
            Reason::SubtaskRepeat => "subtask_repeat",
            Reason::ChildStopped => "child_stopped",
            Reason::InvalidModelOutput => "invalid_model_output",
            Reason::ModelRefusal => "model_refusal",
            Reason::Cancelled => "cancelled",
            Reason::RunClosed => "run_closed",
            Reason::Completed => "completed",
            Reason::AgentFailed => "agent_failed",
            Reason::PermissionDenied => "permission_denied",
            Reason::PolicyBlocked => "policy_blocked",
            Reason::NeedsHuman => "needs_human",
            Reason::Fatal => "fatal",
        }
    }

    /// Every reason, for the vocabularies that must list them all (metrics labels).
    pub const ALL: [Reason; 40] = [
        Reason::StepBudget,
        Reason::TimeBudget,
        Reason::TokenBudget,
        Reason::CostBudget,
        Reason::TurnBudget,
        Reason::ToolErrorLimit,
        Reason::SameCallRepeat,
        Reason::PingPong,
        Reason::ArgChurn,
        Reason::NoProgress,
        Reason::PollNoProgress,
        Reason::UnknownTool,
        Reason::GlobalCircuitBreaker,
        Reason::CompactionLoopPersisted,
        Reason::CompactionThrash,
        Reason::CompactionBudget,
        Reason::ConsecutiveBlocks,
        Reason::OperationInFlight,
        Reason::OperationOutcomeUnknown,
        Reason::PreconditionUnchanged,
        Reason::RetryTooSoon,
        Reason::WaitBudget,
        Reason::SameAnswerStreak,
        Reason::AncestorStopped,
        Reason::TreeBudget,
        Reason::SpawnLimit,
        Reason::ConcurrencyLimit,
        Reason::DepthLimit,
        Reason::SubtaskRepeat,
        Reason::ChildStopped,
        Reason::InvalidModelOutput,
        Reason::ModelRefusal,
        Reason::Cancelled,
        Reason::RunClosed,
        Reason::Completed,
        Reason::AgentFailed,
        Reason::PermissionDenied,
        Reason::PolicyBlocked,
        Reason::NeedsHuman,
        Reason::Fatal,
    ];
}

/// The loop detectors of guard contract §4.3 (the `detector` field of a decision).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Detector {
    ExactRepeat,
    PingPong,
    ArgChurn,
    PollNoProgress,
    NoProgress,
    UnknownTool,
    GlobalCircuitBreaker,
    ConsecutiveBlocks,
    PostCompaction,
    CompactionThrash,
}

impl Detector {
    pub fn as_str(self) -> &'static str {
        match self {
            Detector::ExactRepeat => "exact_repeat",
            Detector::PingPong => "ping_pong",
            Detector::ArgChurn => "arg_churn",
            Detector::PollNoProgress => "poll_no_progress",
            Detector::NoProgress => "no_progress",
            Detector::UnknownTool => "unknown_tool",
            Detector::GlobalCircuitBreaker => "global_circuit_breaker",
            Detector::ConsecutiveBlocks => "consecutive_blocks",
            Detector::PostCompaction => "post_compaction",
            Detector::CompactionThrash => "compaction_thrash",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TerminalState {
    StoppedLoopGuard,
    NeedsHuman,
    Failed,
    Cancelled,
    Completed,
}

impl TerminalState {
    pub fn as_str(self) -> &'static str {
        match self {
            TerminalState::StoppedLoopGuard => "STOPPED_LOOP_GUARD",
            TerminalState::NeedsHuman => "NEEDS_HUMAN",
            TerminalState::Failed => "FAILED",
            TerminalState::Cancelled => "CANCELLED",
            TerminalState::Completed => "COMPLETED",
        }
    }
}

/// What must change before a closed run may go on (the report's `resume_condition`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeCondition {
    /// A progress version above the report's, or a new approval id / credential scope.
    VerifiedPreconditionChange,
    /// A human must act: a new approval id or credential scope.
    HumanApproval,
    /// A budget is spent; budgets survive a resume, so only a new run goes on.
    NewRun,
    /// The run ended normally; nothing to resume.
    None,
}

/// Every stop carries one: enough for an operator to act without reading the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StopReport {
    pub terminal_state: TerminalState,
    pub reason: Reason,
    pub completed_steps: u64,
    pub progress_version: Option<u64>,
    pub completed_operations: Vec<String>,
    pub last_safe_checkpoint: Option<String>,
    pub unmet_precondition: Option<String>,
    pub resume_condition: ResumeCondition,
    pub fired_guards: Vec<String>,
    /// The producer's own words where a code was folded into a stable reason: the raw
    /// FATAL code, the `run_finished` status, the cancel reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// One decision: the same JSON in replay output, on `fusebox.decisions.*`, and as the
/// gate's reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub v: u32,
    pub tenant: String,
    pub run: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    pub event_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    pub action: Action,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detector: Option<Detector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<Arc<StopReport>>,
}

impl Decision {
    /// Worth publishing on `fusebox.decisions.*` and printing in replay output of
    /// non-gate events: anything but a plain `execute` / `continue`.
    pub fn is_notable(&self) -> bool {
        !matches!(self.action, Action::Execute | Action::Continue) || self.message.is_some()
    }

    /// A stop report rides on this decision: publish it on the kill switch.
    pub fn stop_report(&self) -> Option<&StopReport> {
        self.report.as_deref()
    }
}

impl Decision {
    /// Appends this decision's JSON to `out`: the bytes `serde_json::to_writer` writes,
    /// without serde's per-field machinery. A replay writes one decision per event, and
    /// escaping every key and id through serde was a seventh of its applying thread
    /// (perf). Field names are literals; a string with nothing to escape is copied as it
    /// is, any other goes through serde_json, so the escaping is serde_json's own.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"v\":");
        push_number(out, u64::from(self.v));
        out.extend_from_slice(b",\"tenant\":");
        push_str(out, &self.tenant);
        out.extend_from_slice(b",\"run\":");
        push_str(out, &self.run);
        if let Some(seq) = self.seq {
            out.extend_from_slice(b",\"seq\":");
            push_number(out, seq);
        }
        out.extend_from_slice(b",\"event_id\":");
        push_str(out, &self.event_id);
        if let Some(call_id) = &self.call_id {
            out.extend_from_slice(b",\"call_id\":");
            push_str(out, call_id);
        }
        out.extend_from_slice(b",\"action\":");
        push_str(out, self.action.as_str());
        if let Some(reason) = self.reason {
            out.extend_from_slice(b",\"reason\":");
            push_str(out, reason.as_str());
        }
        if let Some(detector) = self.detector {
            out.extend_from_slice(b",\"detector\":");
            push_str(out, detector.as_str());
        }
        if let Some(count) = self.count {
            out.extend_from_slice(b",\"count\":");
            push_number(out, u64::from(count));
        }
        if let Some(message) = &self.message {
            out.extend_from_slice(b",\"message\":");
            push_str(out, message);
        }
        if let Some(wait_ms) = self.wait_ms {
            out.extend_from_slice(b",\"wait_ms\":");
            push_number(out, wait_ms);
        }
        if let Some(result) = &self.result {
            out.extend_from_slice(b",\"result\":");
            serde_json::to_writer(&mut *out, result).expect("a JSON value serialises");
        }
        if let Some(report) = &self.report {
            out.extend_from_slice(b",\"report\":");
            serde_json::to_writer(&mut *out, &**report).expect("a report serialises");
        }
        out.push(b'}');
    }
}

fn push_number(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// A JSON string as serde_json writes it: it escapes `"`, `\` and control characters
/// only, so a string without them is itself between quotes.
fn push_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(&mut *out, s).expect("a string serialises");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `write_json` is serde's form byte for byte, escapes included (the case files
    /// check it on every decision they make; these are the strings they do not hold).
    #[test]
    fn write_json_escapes_as_serde_does() {
        let report = StopReport {
            terminal_state: TerminalState::NeedsHuman,
            reason: Reason::PermissionDenied,
            completed_steps: 3,
            progress_version: Some(7),
            completed_operations: vec!["op \"1\"".to_owned()],
            last_safe_checkpoint: None,
            unmet_precondition: Some("tab\there".to_owned()),
            resume_condition: ResumeCondition::HumanApproval,
            fired_guards: vec![],
            detail: Some("d".to_owned()),
        };
        for action in Action::ALL {
            let serde = serde_json::to_string(&action).expect("serialises");
            assert_eq!(serde, format!("\"{}\"", action.as_str()));
        }
        for reason in Reason::ALL {
            let serde = serde_json::to_string(&reason).expect("serialises");
            assert_eq!(serde, format!("\"{}\"", reason.as_str()));
        }
        use Detector::*;
        for detector in [
            ExactRepeat,
            PingPong,
            ArgChurn,
            PollNoProgress,
            NoProgress,
            UnknownTool,
            GlobalCircuitBreaker,
            ConsecutiveBlocks,
            PostCompaction,
            CompactionThrash,
        ] {
            let serde = serde_json::to_string(&detector).expect("serialises");
            assert_eq!(serde, format!("\"{}\"", detector.as_str()));
        }
        for text in [
            "plain",
            "",
            "quote \" in",
            "back\\slash",
            "new\nline",
            "\u{1}",
            "\u{7f}",
            "é ✓ /",
            "\u{2028}",
        ] {
            let decision = Decision {
                v: 1,
                tenant: text.to_owned(),
                run: "r".to_owned(),
                seq: Some(u64::MAX),
                event_id: text.to_owned(),
                call_id: Some(text.to_owned()),
                action: Action::Stop,
                reason: Some(Reason::WaitBudget),
                detector: Some(Detector::PostCompaction),
                count: Some(0),
                message: Some(text.to_owned()),
                wait_ms: Some(10),
                result: Some(serde_json::json!({"k": [text, 1.5, null]})),
                report: Some(Arc::new(report.clone())),
            };
            let mut fast = Vec::new();
            decision.write_json(&mut fast);
            assert_eq!(
                String::from_utf8_lossy(&fast),
                serde_json::to_string(&decision).expect("serialises")
            );
        }
    }
}
