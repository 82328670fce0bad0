//! The typed recording API. Callers pass spec vocabulary (event types, actions, reason
//! codes …) as strings; each is bounded before it becomes a label value.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::labels::{DEPTHS, INSTANCE_STATES, PARTITION_CHANGES, TERMINATION_REASONS};
use crate::registry::Metrics;

/// Gauges are i64 inside; a count beyond that is not a real count, so clamp.
fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Metrics {
    /// An event was applied (`event_type` from guard.md §2).
    pub fn event(&self, tenant: &str, event_type: &str) {
        let labels = self.with_tenant(&[self.event_types.bound(event_type)], tenant);
        self.events.with_label_values(&labels).inc();
    }

    /// A span the OTLP receiver took in, by `outcome` (`mapped`, `skipped`, or the
    /// reason it was refused).
    pub fn otlp_span(&self, outcome: &str) {
        self.otlp_spans
            .with_label_values(&[self.otlp_outcomes.bound(outcome)])
            .inc();
    }

    /// A log record the OTLP receiver took in, by `outcome` (as [`Metrics::otlp_span`];
    /// the two share the bound on distinct outcomes).
    pub fn otlp_log_record(&self, outcome: &str) {
        self.otlp_log_records
            .with_label_values(&[self.otlp_outcomes.bound(outcome)])
            .inc();
    }

    /// An event was refused as bad input, for `reason` (a short snake_case code).
    pub fn event_rejected(&self, reason: &str) {
        self.events_rejected
            .with_label_values(&[self.rejection_reasons.bound(reason)])
            .inc();
    }

    /// A decision was returned. `reason` is `None` for plain `execute`/`continue`.
    pub fn decision(&self, tenant: &str, action: &str, reason: Option<&str>) {
        let values = [
            self.actions.bound(action),
            self.reasons.bound(reason.unwrap_or("none")),
        ];
        let labels = self.with_tenant(&values, tenant);
        self.decisions.with_label_values(&labels).inc();
        if action == "use_completed_result" {
            self.ledger_hits.inc();
        }
    }

    /// A run reached `terminal_state` for `reason`.
    pub fn run_stopped(&self, tenant: &str, terminal_state: &str, reason: &str) {
        let values = [
            self.terminal_states.bound(terminal_state),
            self.reasons.bound(reason),
        ];
        let labels = self.with_tenant(&values, tenant);
        self.runs_stopped.with_label_values(&labels).inc();
    }

    /// A guard detector fired and caused `action` (`warn`, `block` or `stop`).
    pub fn detector_fired(&self, detector: &str, action: &str) {
        self.detector_fires
            .with_label_values(&[self.detectors.bound(detector), self.actions.bound(action)])
            .inc();
    }

    /// A message was parked on the dead-letter subject.
    pub fn dlq_message(&self) {
        self.dlq.inc();
    }

    pub fn observe_gate_latency(&self, elapsed: Duration) {
        self.gate_latency.observe(elapsed.as_secs_f64());
    }

    pub fn observe_log_commit(&self, elapsed: Duration) {
        self.log_commit.observe(elapsed.as_secs_f64());
    }

    pub fn set_runs_active(&self, runs: u64) {
        self.runs_active.set(gauge_value(runs));
    }

    /// Open sub-agents by depth below their root (1, 2, …); every depth bucket is set, so
    /// one that emptied shows 0, and depths past the last bucket count in it.
    pub fn set_subagents_active(&self, by_depth: &BTreeMap<u32, u64>) {
        let last = DEPTHS.len() - 1;
        let mut buckets = vec![0u64; DEPTHS.len()];
        for (&depth, &n) in by_depth.range(1..) {
            buckets[(depth as usize - 1).min(last)] += n;
        }
        for (label, n) in DEPTHS.iter().zip(buckets) {
            self.subagents_active
                .with_label_values(&[*label])
                .set(gauge_value(n));
        }
    }

    /// How long the start-up rebuild (snapshot + log tail) took.
    pub fn set_replay_duration(&self, elapsed: Duration) {
        self.replay.set(elapsed.as_secs_f64());
    }

    pub fn set_nats_connected(&self, connected: bool) {
        self.nats_connected.set(i64::from(connected));
    }

    pub fn set_snapshot_age(&self, age: Duration) {
        self.snapshot_age.set(age.as_secs_f64());
    }

    pub fn set_log_size_bytes(&self, bytes: u64) {
        self.log_size.set(gauge_value(bytes));
    }

    pub fn set_consumer_lag(&self, messages: u64) {
        self.consumer_lag.set(gauge_value(messages));
    }

    /// The last sweep's managed instances per state. States not listed are set to 0,
    /// so an instance that left a state does not linger in it; names outside EC2's six
    /// states are not counted.
    pub fn set_watchdog_instances(&self, counts: &[(&str, u64)]) {
        for state in INSTANCE_STATES {
            let n: u64 = counts
                .iter()
                .filter(|(s, _)| s == state)
                .map(|(_, n)| n)
                .sum();
            self.watchdog_instances
                .with_label_values(&[*state])
                .set(gauge_value(n));
        }
    }

    /// The watchdog terminated an instance in `region` for `reason`
    /// (`deadline`, `max_lifetime`, `run_ended`, `leftover`).
    pub fn watchdog_termination(&self, reason: &str, region: &str) {
        self.watchdog_terminations
            .with_label_values(&[
                self.termination_reasons.bound(reason),
                self.regions.bound(region),
            ])
            .inc();
    }

    /// Creates every termination series of each configured region at 0. A counter series
    /// born at 1 shows no `increase()`, so without this the first leftover termination in
    /// a region would never raise FuseboxWatchdogLeftoverTerminated.
    pub fn init_watchdog_regions(&self, regions: &[&str]) {
        for region in regions {
            for reason in TERMINATION_REASONS {
                self.watchdog_terminations
                    .with_label_values(&[*reason, self.regions.bound(region)])
                    .inc_by(0);
            }
        }
    }

    /// Creates each API operation's error series at 0, for the same reason as
    /// `init_watchdog_regions`: `rate()` over a series born at 1 misses the first error.
    pub fn init_watchdog_api_ops(&self, ops: &[&str]) {
        for op in ops {
            self.watchdog_api_errors
                .with_label_values(&[self.api_ops.bound(op)])
                .inc_by(0);
        }
    }

    /// A cloud API call `op` (e.g. `describe_instances`) failed after its retries.
    pub fn watchdog_api_error(&self, op: &str) {
        self.watchdog_api_errors
            .with_label_values(&[self.api_ops.bound(op)])
            .inc();
    }

    /// Age of the oldest managed live instance; `None` when there is none.
    pub fn set_watchdog_oldest_instance_age(&self, age: Option<Duration>) {
        self.watchdog_oldest_age
            .set(age.map_or(0.0, |a| a.as_secs_f64()));
    }

    /// Seconds until the earliest known deadline (negative once passed); `None` when
    /// no deadline is known.
    pub fn set_watchdog_next_deadline(&self, seconds_until: Option<f64>) {
        self.watchdog_next_deadline
            .set(seconds_until.unwrap_or(f64::NAN));
    }

    /// A sweep stopped terminating because it hit the blast-radius limit.
    pub fn watchdog_blast_radius_limited(&self) {
        self.watchdog_blast_radius.inc();
    }

    /// Overdue instances the blast-radius limit left running in the latest pass.
    pub fn set_watchdog_terminations_held(&self, instances: u64) {
        self.watchdog_held.set(gauge_value(instances));
    }

    /// `held` more overdue instances were left running by the blast-radius limit for
    /// `reason` (`deadline`, `max_lifetime`, `run_ended`, `leftover`).
    pub fn watchdog_terminations_held(&self, reason: &str, held: u64) {
        self.watchdog_held_total
            .with_label_values(&[self.termination_reasons.bound(reason)])
            .inc_by(held);
    }

    pub fn set_watchdog_protected_instances(&self, instances: u64) {
        self.watchdog_protected.set(gauge_value(instances));
    }

    /// Whether the watchdog is halted until an operator resumes it.
    pub fn set_watchdog_halted(&self, halted: bool) {
        self.watchdog_halted.set(i64::from(halted));
    }

    /// Cluster mode: the configured partition count.
    pub fn set_cluster_partitions(&self, partitions: u32) {
        self.cluster_partitions.set(i64::from(partitions));
    }

    pub fn set_cluster_partitions_owned(&self, owned: usize) {
        self.cluster_partitions_owned.set(gauge_value(owned as u64));
    }

    /// `change` is one of [`PARTITION_CHANGES`]; anything else is a bug and not counted.
    pub fn cluster_partition_change(&self, change: &str) {
        if PARTITION_CHANGES.contains(&change) {
            self.cluster_changes.with_label_values(&[change]).inc();
        }
    }
}
