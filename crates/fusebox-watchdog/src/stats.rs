//! The numbers the metrics crate exports (`fusebox_watchdog_*`).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::deadline::Reason;
use crate::provider::Op;

/// A point-in-time copy of the watchdog's gauges and counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WatchdogStats {
    /// Managed instances by state, as of the last full sweep
    /// (`fusebox_watchdog_instances{state}`).
    pub instances_by_state: BTreeMap<String, u64>,
    /// Live managed instances tagged `fusebox:protect`, as of the last full sweep.
    pub protected_instances: u64,
    /// Overdue instances kept alive by `fusebox:protect`, as of the last full sweep
    /// (`fusebox_watchdog_protected_instances`).
    pub protected_overdue: u64,
    /// Overdue instances kept alive by `fusebox:protect` (counter).
    pub protected_overdue_total: u64,
    /// Age of the oldest live managed instance
    /// (`fusebox_watchdog_oldest_instance_age_seconds`).
    pub oldest_instance_age_s: Option<u64>,
    /// API requests by operation, attempts included (counter).
    pub api_calls_by_op: BTreeMap<String, u64>,
    /// Failed API requests by operation (`fusebox_watchdog_api_errors_total{op}`). Expected
    /// answers (not found, termination protection) are not errors.
    pub api_errors_by_op: BTreeMap<String, u64>,
    /// The next armed deadline or verify check, Unix ms.
    pub next_deadline_ms: Option<u64>,
    /// The last pass with overdue instances was held back by the blast-radius limit.
    pub blast_radius_alert: bool,
    /// Passes held back by the blast-radius limit (counter).
    pub blast_radius_trips_total: u64,
    /// Overdue instances the blast-radius limit left running in the latest pass that
    /// found any overdue (`fusebox_watchdog_terminations_held`).
    pub held_last_pass: u64,
    /// Overdue instances left running by the limit, summed over passes, by reason
    /// (`fusebox_watchdog_terminations_held_total{reason}`): an instance held in three
    /// passes counts three times.
    pub held_total_by_reason: BTreeMap<String, u64>,
    /// Passes run (sweeps and timer passes).
    pub passes_total: u64,
    /// When the last full sweep finished, Unix ms.
    pub last_sweep_ms: Option<u64>,
    /// Halted by the blast-radius limit until an operator resumes it
    /// (`fusebox_watchdog_halted`).
    pub halted: bool,
}

/// The mutable side of the stats, kept by the engine.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub instances_by_state: BTreeMap<String, u64>,
    pub protected_instances: u64,
    pub protected_overdue: u64,
    pub protected_overdue_total: u64,
    pub oldest_launch_ms: Option<u64>,
    pub api_calls: BTreeMap<Op, u64>,
    pub api_errors: BTreeMap<Op, u64>,
    pub blast_radius_alert: bool,
    pub blast_radius_trips_total: u64,
    pub held_last_pass: u64,
    pub held_total: BTreeMap<Reason, u64>,
    pub passes_total: u64,
    pub last_sweep_ms: Option<u64>,
    /// Live managed instances at the last full sweep: the floor for the share limit.
    pub managed: usize,
}

impl Counters {
    pub fn snapshot(&self, now_ms: u64, next_deadline_ms: Option<u64>) -> WatchdogStats {
        let by_op = |m: &BTreeMap<Op, u64>| {
            m.iter()
                .map(|(op, n)| (op.as_str().to_owned(), *n))
                .collect()
        };
        WatchdogStats {
            instances_by_state: self.instances_by_state.clone(),
            protected_instances: self.protected_instances,
            protected_overdue: self.protected_overdue,
            protected_overdue_total: self.protected_overdue_total,
            oldest_instance_age_s: self
                .oldest_launch_ms
                .map(|l| now_ms.saturating_sub(l) / 1000),
            api_calls_by_op: by_op(&self.api_calls),
            api_errors_by_op: by_op(&self.api_errors),
            next_deadline_ms,
            blast_radius_alert: self.blast_radius_alert,
            blast_radius_trips_total: self.blast_radius_trips_total,
            held_last_pass: self.held_last_pass,
            held_total_by_reason: self
                .held_total
                .iter()
                .map(|(r, n)| (r.as_str().to_owned(), *n))
                .collect(),
            passes_total: self.passes_total,
            last_sweep_ms: self.last_sweep_ms,
            halted: false,
        }
    }
}
