//! What the service reports as it works. `fuseboxd` implements this over
//! `fusebox-metrics`; keeping it a trait keeps this crate free of the metrics registry.

use std::collections::BTreeMap;
use std::time::Duration;

use fusebox_core::Decision;

pub trait Observer: Send + Sync + 'static {
    /// A valid event was accepted for the log (`event_type` is its wire type).
    fn event(&self, _tenant: &str, _event_type: &str) {}
    /// Input was refused; `reason` is the rejection code.
    fn rejected(&self, _reason: &str) {}
    /// A dead letter was published.
    fn dead_letter(&self) {}
    /// A decision was returned (after its batch was made durable).
    fn decision(&self, _decision: &Decision) {}
    /// A run closed with this terminal state and reason.
    fn run_stopped(&self, _tenant: &str, _terminal_state: &str, _reason: &str) {}
    /// Gate request received → reply published.
    fn gate_latency(&self, _elapsed: Duration) {}
    /// One `submit_batch` (apply + flush).
    fn log_commit(&self, _elapsed: Duration) {}
    fn runs_active(&self, _runs: u64) {}
    /// Open sub-agents (runs started with a parent) by their depth below the root.
    fn subagents_active(&self, _by_depth: &BTreeMap<u32, u64>) {}
    fn nats_connected(&self, _connected: bool) {}
    /// The JetStream consumer is bound and pulling.
    fn consumer_bound(&self, _bound: bool) {}
    /// Events in the stream the daemon has not yet acknowledged.
    fn consumer_lag(&self, _messages: u64) {}
}

/// Observes nothing (tests, benchmarks).
pub struct NoopObserver;

impl Observer for NoopObserver {}
