//! Every metric fuseboxd exposes, declared once. The registry is built from these
//! definitions, and the dashboard/alert lint checks PromQL against them, so a metric
//! that is renamed here and not in a dashboard fails a test instead of a panel.

/// The Prometheus type of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One metric: its name, type, labels and meaning.
#[derive(Debug)]
pub struct MetricDef {
    pub name: &'static str,
    pub kind: Kind,
    /// Labels always present. `tenant` is appended when the operator opts in and
    /// `tenant_opt_in` is set.
    pub labels: &'static [&'static str],
    pub tenant_opt_in: bool,
    pub help: &'static str,
}

impl MetricDef {
    /// Series names this metric produces in the text exposition (histograms give three).
    pub fn series_names(&self) -> Vec<String> {
        match self.kind {
            Kind::Histogram => ["_bucket", "_sum", "_count"]
                .iter()
                .map(|suffix| format!("{}{suffix}", self.name))
                .collect(),
            Kind::Counter | Kind::Gauge => vec![self.name.to_string()],
        }
    }
}

const fn def(
    name: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    tenant_opt_in: bool,
    help: &'static str,
) -> MetricDef {
    MetricDef {
        name,
        kind,
        labels,
        tenant_opt_in,
        help,
    }
}

use Kind::{Counter, Gauge, Histogram};

pub const EVENTS: MetricDef = def(
    "fusebox_events_total",
    Counter,
    &["type"],
    true,
    "Events applied to the guard, by event type.",
);
pub const EVENTS_REJECTED: MetricDef = def(
    "fusebox_events_rejected_total",
    Counter,
    &["reason"],
    false,
    "Events refused as bad input (error reply or dead-lettered), by rejection reason.",
);
pub const DECISIONS: MetricDef = def(
    "fusebox_decisions_total",
    Counter,
    &["action", "reason"],
    true,
    "Decisions returned, by action and reason code (reason \"none\" for plain execute/continue).",
);
pub const GATE_LATENCY: MetricDef = def(
    "fusebox_gate_latency_seconds",
    Histogram,
    &[],
    false,
    "Time from a gate request's arrival to its reply, including the durable log commit.",
);
pub const LOG_COMMIT: MetricDef = def(
    "fusebox_log_commit_seconds",
    Histogram,
    &[],
    false,
    "Time to make one group-commit batch durable (append and flush).",
);
pub const RUNS_ACTIVE: MetricDef = def(
    "fusebox_runs_active",
    Gauge,
    &[],
    false,
    "Runs currently open (started and not stopped, completed, cancelled or finished).",
);
pub const SUBAGENTS_ACTIVE: MetricDef = def(
    "fusebox_subagents_active",
    Gauge,
    &["depth"],
    false,
    "Sub-agents open now (runs started with a parent, in a tree of runs), by depth below their root: 1, 2, 3, 4+.",
);
pub const RUNS_STOPPED: MetricDef = def(
    "fusebox_runs_stopped_total",
    Counter,
    &["terminal_state", "reason"],
    true,
    "Runs that reached a terminal state, by terminal state and reason code.",
);
pub const REPLAY: MetricDef = def(
    "fusebox_replay_seconds",
    Gauge,
    &[],
    false,
    "Seconds the last state rebuild (snapshot plus log tail replay) took at start.",
);
pub const NATS_CONNECTED: MetricDef = def(
    "fusebox_nats_connected",
    Gauge,
    &[],
    false,
    "1 while the NATS connection is up, 0 otherwise.",
);
pub const WATCHDOG_INSTANCES: MetricDef = def(
    "fusebox_watchdog_instances",
    Gauge,
    &["state"],
    false,
    "Managed cloud instances seen by the last sweep, by instance state.",
);
pub const WATCHDOG_TERMINATIONS: MetricDef = def("fusebox_watchdog_terminations_total", Counter, &["reason", "region"], false,
    "Instances the watchdog terminated, by reason (deadline, max_lifetime, run_ended, leftover) and region.");
pub const WATCHDOG_OLDEST_AGE: MetricDef = def(
    "fusebox_watchdog_oldest_instance_age_seconds",
    Gauge,
    &[],
    false,
    "Age of the oldest managed, not yet terminated instance (0 when there is none).",
);
pub const WATCHDOG_API_ERRORS: MetricDef = def(
    "fusebox_watchdog_api_errors_total",
    Counter,
    &["op"],
    false,
    "Cloud API calls that failed after retries, by operation.",
);
pub const BUILD_INFO: MetricDef = def(
    "fusebox_build_info",
    Gauge,
    &["version"],
    false,
    "Always 1; the version label says which fuseboxd build is running.",
);
pub const DETECTOR_FIRES: MetricDef = def(
    "fusebox_detector_fires_total",
    Counter,
    &["detector", "action"],
    false,
    "Guard detectors that fired, by detector and the action they caused (warn, block, stop).",
);
pub const LEDGER_HITS: MetricDef = def("fusebox_ledger_hits_total", Counter, &[], false,
    "Calls answered use_completed_result from the side-effect ledger (a duplicate side effect avoided).");
pub const SNAPSHOT_AGE: MetricDef = def(
    "fusebox_snapshot_age_seconds",
    Gauge,
    &[],
    false,
    "Seconds since the latest state snapshot was written.",
);
pub const LOG_SIZE: MetricDef = def(
    "fusebox_log_size_bytes",
    Gauge,
    &[],
    false,
    "Size of the event/decision log on disk.",
);
pub const CONSUMER_LAG: MetricDef = def(
    "fusebox_consumer_lag_messages",
    Gauge,
    &[],
    false,
    "Messages pending on the JetStream events consumer (not yet delivered or not yet acked).",
);
pub const DLQ: MetricDef = def(
    "fusebox_dlq_total",
    Counter,
    &[],
    false,
    "Messages parked on the dead-letter subject.",
);
pub const WATCHDOG_NEXT_DEADLINE: MetricDef = def("fusebox_watchdog_next_deadline_seconds", Gauge, &[], false,
    "Seconds until the earliest deadline of a managed, unprotected instance; negative once it has passed, NaN when none is known.");
pub const WATCHDOG_BLAST_RADIUS: MetricDef = def(
    "fusebox_watchdog_blast_radius_limited_total",
    Counter,
    &[],
    false,
    "Sweeps that hit the blast-radius limit and stopped terminating.",
);
pub const WATCHDOG_HELD: MetricDef = def(
    "fusebox_watchdog_terminations_held",
    Gauge,
    &[],
    false,
    "Overdue instances the blast-radius limit left running in the latest pass that found any overdue.",
);
pub const WATCHDOG_HELD_TOTAL: MetricDef = def(
    "fusebox_watchdog_terminations_held_total",
    Counter,
    &["reason"],
    false,
    "Overdue instances left running by the blast-radius limit, summed over passes (one held in three passes counts three), by reason.",
);
pub const WATCHDOG_PROTECTED: MetricDef = def(
    "fusebox_watchdog_protected_instances",
    Gauge,
    &[],
    false,
    "Managed instances past their deadline that are protected and so only reported.",
);

pub const WATCHDOG_HALTED: MetricDef = def(
    "fusebox_watchdog_halted",
    Gauge,
    &[],
    false,
    "1 while the watchdog is halted by on_blast_radius = \"halt\" (it terminates nothing until `fusebox watchdog resume`), else 0.",
);

pub const CLUSTER_PARTITIONS: MetricDef = def(
    "fusebox_cluster_partitions",
    Gauge,
    &[],
    false,
    "Partitions the cluster is configured with (N of the subject mapping); 0 when not in cluster mode.",
);
pub const CLUSTER_PARTITIONS_OWNED: MetricDef = def(
    "fusebox_cluster_partitions_owned",
    Gauge,
    &[],
    false,
    "Partitions this daemon holds the lease of and serves.",
);
pub const CLUSTER_HANDOVERS: MetricDef = def(
    "fusebox_cluster_partition_changes_total",
    Counter,
    &["change"],
    false,
    "Partitions this daemon started serving (claimed) or stopped serving (released, lost, failed).",
);

pub const OTLP_SPANS: MetricDef = def(
    "fusebox_otlp_spans_total",
    Counter,
    &["outcome"],
    false,
    "Spans the OTLP receiver took in, by outcome: mapped, skipped (nothing to map), or the reason it refused one (dead-lettered); undecodable_batch counts refused requests.",
);

pub const OTLP_LOG_RECORDS: MetricDef = def(
    "fusebox_otlp_log_records_total",
    Counter,
    &["outcome"],
    false,
    "Log records (coding agents' telemetry events) the OTLP receiver took in, by outcome: mapped, skipped (an event with nothing to map), or the reason it refused one (dead-lettered); undecodable_batch counts refused requests.",
);

/// Every metric, in exposition-independent order.
pub const CATALOGUE: &[&MetricDef] = &[
    &EVENTS,
    &EVENTS_REJECTED,
    &DECISIONS,
    &GATE_LATENCY,
    &LOG_COMMIT,
    &RUNS_ACTIVE,
    &SUBAGENTS_ACTIVE,
    &RUNS_STOPPED,
    &REPLAY,
    &NATS_CONNECTED,
    &WATCHDOG_INSTANCES,
    &WATCHDOG_TERMINATIONS,
    &WATCHDOG_OLDEST_AGE,
    &WATCHDOG_API_ERRORS,
    &BUILD_INFO,
    &DETECTOR_FIRES,
    &LEDGER_HITS,
    &SNAPSHOT_AGE,
    &LOG_SIZE,
    &CONSUMER_LAG,
    &DLQ,
    &WATCHDOG_NEXT_DEADLINE,
    &WATCHDOG_BLAST_RADIUS,
    &WATCHDOG_HELD,
    &WATCHDOG_HELD_TOTAL,
    &WATCHDOG_PROTECTED,
    &WATCHDOG_HALTED,
    &CLUSTER_PARTITIONS,
    &CLUSTER_PARTITIONS_OWNED,
    &CLUSTER_HANDOVERS,
    &OTLP_SPANS,
    &OTLP_LOG_RECORDS,
];

/// The catalogue entry whose exposition includes `series` (e.g. a histogram's `_bucket`).
pub fn lookup(series: &str) -> Option<&'static MetricDef> {
    CATALOGUE
        .iter()
        .copied()
        .find(|def| def.series_names().iter().any(|s| s == series))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_prefixed_and_suffixed_by_kind() {
        let mut seen = HashSet::new();
        for def in CATALOGUE {
            assert!(seen.insert(def.name), "duplicate {}", def.name);
            assert!(def.name.starts_with("fusebox_"), "{}", def.name);
            assert_eq!(
                def.kind == Kind::Counter,
                def.name.ends_with("_total"),
                "{}",
                def.name
            );
            assert!(!def.labels.contains(&"tenant") && !def.labels.contains(&"run"));
        }
    }

    #[test]
    fn lookup_finds_histogram_series() {
        assert_eq!(
            lookup("fusebox_gate_latency_seconds_bucket").map(|d| d.name),
            Some(GATE_LATENCY.name)
        );
        assert!(lookup("fusebox_gate_latency_seconds_total").is_none());
    }
}
