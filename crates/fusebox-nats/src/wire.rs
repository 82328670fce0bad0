//! JSON shapes on the wire besides events and decisions (which are `fusebox-core`'s):
//! error replies, dead letters, operator requests and run summaries. Shared by the
//! daemon and `fusebox-client`, so both ends agree by construction.

use fusebox_core::decision::StopReport;
use fusebox_core::run::Counters;
use fusebox_core::{Decision, EventError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Why a request was refused: `reason` is the `fusebox_events_rejected_total` label
/// (`malformed_json`, `tenant_mismatch`, …), `message` says what to fix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireError {
    pub reason: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
}

impl From<&EventError> for WireError {
    fn from(err: &EventError) -> Self {
        WireError {
            reason: err.reason.as_str().to_owned(),
            message: err.to_string(),
            event_id: err.event_id.clone(),
        }
    }
}

/// The reply to a request the daemon refused (a decision has `action`, this has
/// `error`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub error: WireError,
}

/// What lands on `fusebox.dlq.<tenant>`: the refusal, where the input came from, and the
/// input itself (lossily decoded when it was not UTF-8), so nothing vanishes silently.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub subject: String,
    pub error: WireError,
    pub payload: String,
}

/// Body of `fusebox.control.<t>.<r>.cancel`. `id` makes a retried command idempotent:
/// the same id is applied once and answered with the same decision.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CancelRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Body of `fusebox.control.<t>.<r>.resume` (guard.md §4.6 evidence).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResumeRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    pub evidence: Value,
}

/// One run in `fusebox.control.runs`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub tenant: String,
    pub run: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    pub open: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal_state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub events: u64,
    pub steps: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seq: Option<u64>,
    pub last_ts_ms: u64,
}

/// One partition's answer to `fusebox.control.runs` in a cluster (a single daemon
/// answers with the plain list): the asker knows from it how many answers to gather.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionRuns {
    pub partition: u32,
    pub partitions: u32,
    pub runs: Vec<RunSummary>,
}

/// The answer of `fusebox.control.<t>.<r>.status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStatusReply {
    pub summary: RunSummary,
    pub counters: Counters,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_version: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<StopReport>,
    /// The run's latest notable decisions seen by this daemon process, oldest first.
    pub last_decisions: Vec<Decision>,
}
