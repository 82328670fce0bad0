//! Drives every recording method once, so every metric appears in the exposition.

use std::time::Duration;

use fusebox_metrics::{Metrics, MetricsOptions};

pub fn metrics_with_every_metric_touched(options: MetricsOptions) -> Metrics {
    let m = Metrics::new("0.1.0-test", options).expect("registry builds");
    m.event("acme", "tool_call");
    m.event_rejected("malformed_json");
    m.decision("acme", "block", Some("same_call_repeat"));
    m.decision("acme", "use_completed_result", None);
    m.observe_gate_latency(Duration::from_micros(180));
    m.observe_log_commit(Duration::from_micros(900));
    m.set_runs_active(3);
    m.set_subagents_active(&[(1, 2), (2, 1)].into());
    m.run_stopped("acme", "STOPPED_LOOP_GUARD", "no_progress");
    m.set_replay_duration(Duration::from_millis(40));
    m.set_nats_connected(true);
    m.set_watchdog_instances(&[("running", 2), ("stopped", 1)]);
    m.watchdog_termination("deadline", "us-east-1");
    m.set_watchdog_oldest_instance_age(Some(Duration::from_secs(600)));
    m.watchdog_api_error("terminate_instances");
    m.detector_fired("exact_repeat", "block");
    m.set_snapshot_age(Duration::from_secs(30));
    m.set_log_size_bytes(1 << 20);
    m.set_consumer_lag(5);
    m.dlq_message();
    m.set_watchdog_next_deadline(Some(120.0));
    m.watchdog_blast_radius_limited();
    m.set_watchdog_protected_instances(1);
    m
}
