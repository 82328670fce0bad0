//! The service's observations, recorded in `fusebox-metrics` (and `/readyz`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fusebox_core::{Action, Decision};
use fusebox_metrics::{Metrics, Readiness};
use fusebox_nats::Observer;

pub struct MetricsObserver {
    pub metrics: Arc<Metrics>,
    pub readiness: Arc<Readiness>,
}

impl Observer for MetricsObserver {
    fn event(&self, tenant: &str, event_type: &str) {
        self.metrics.event(tenant, event_type);
    }

    fn rejected(&self, reason: &str) {
        self.metrics.event_rejected(reason);
    }

    fn dead_letter(&self) {
        self.metrics.dlq_message();
    }

    fn decision(&self, decision: &Decision) {
        self.metrics.decision(
            &decision.tenant,
            decision.action.as_str(),
            decision.reason.map(|r| r.as_str()),
        );
        let fired = matches!(decision.action, Action::Warn | Action::Block | Action::Stop);
        if let (true, Some(detector)) = (fired, decision.detector) {
            self.metrics
                .detector_fired(detector.as_str(), decision.action.as_str());
        }
    }

    fn run_stopped(&self, tenant: &str, terminal_state: &str, reason: &str) {
        self.metrics.run_stopped(tenant, terminal_state, reason);
    }

    fn gate_latency(&self, elapsed: Duration) {
        self.metrics.observe_gate_latency(elapsed);
    }

    fn log_commit(&self, elapsed: Duration) {
        self.metrics.observe_log_commit(elapsed);
    }

    fn runs_active(&self, runs: u64) {
        self.metrics.set_runs_active(runs);
    }

    fn subagents_active(&self, by_depth: &BTreeMap<u32, u64>) {
        self.metrics.set_subagents_active(by_depth);
    }

    fn nats_connected(&self, connected: bool) {
        self.metrics.set_nats_connected(connected);
        self.readiness.set_nats_connected(connected);
    }

    fn consumer_bound(&self, bound: bool) {
        self.readiness.set_consumer_bound(bound);
    }

    fn consumer_lag(&self, messages: u64) {
        self.metrics.set_consumer_lag(messages);
    }
}
