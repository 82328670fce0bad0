//! The exposition holds every catalogued metric once touched, and label values stay bounded.

#[path = "common/touch.rs"]
mod touch;

use std::collections::BTreeSet;

use fusebox_metrics::{Kind, Metrics, MetricsOptions, CATALOGUE};
use touch::metrics_with_every_metric_touched;

/// `# TYPE name kind` lines of an exposition.
fn declared_types(text: &str) -> BTreeSet<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let (name, kind) = l.split_once(' ').expect("TYPE line has a kind");
            (name.to_string(), kind.to_string())
        })
        .collect()
}

fn series_lines<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = &'a str> {
    text.lines()
        .filter(move |l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
}

#[test]
fn every_catalogued_metric_is_exposed_with_its_type_and_nothing_else() {
    let text = metrics_with_every_metric_touched(MetricsOptions::default())
        .encode()
        .unwrap();
    let expected: BTreeSet<(String, String)> = CATALOGUE
        .iter()
        .map(|d| {
            let kind = match d.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            (d.name.to_string(), kind.to_string())
        })
        .collect();
    assert_eq!(declared_types(&text), expected, "exposition:\n{text}");
}

#[test]
fn fresh_registry_shows_build_info_and_zeroed_gauges() {
    let text = Metrics::new("1.2.3", MetricsOptions::default())
        .unwrap()
        .encode()
        .unwrap();
    assert!(
        text.contains("fusebox_build_info{version=\"1.2.3\"} 1"),
        "{text}"
    );
    assert!(text.contains("fusebox_nats_connected 0"), "{text}");
    assert!(
        text.contains("fusebox_watchdog_instances{state=\"running\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("fusebox_watchdog_next_deadline_seconds NaN"),
        "{text}"
    );
}

#[test]
fn declared_labels_match_the_catalogue_and_never_name_a_run() {
    let text = metrics_with_every_metric_touched(MetricsOptions::default())
        .encode()
        .unwrap();
    for def in CATALOGUE.iter().filter(|d| d.kind != Kind::Histogram) {
        for line in series_lines(&text, def.name) {
            let mut labels: Vec<&str> = line
                .split_once('{')
                .map(|(_, rest)| rest.split_once('}').unwrap().0)
                .into_iter()
                .flat_map(|l| l.split(','))
                .map(|kv| kv.split_once('=').unwrap().0)
                .collect();
            // The encoder sorts labels by name.
            labels.sort_unstable();
            let mut expected = def.labels.to_vec();
            expected.sort_unstable();
            assert_eq!(labels, expected, "{line}");
        }
    }
    assert!(!text.contains("run=\""));
    assert!(!text.contains("tenant=\""));
}

#[test]
fn tenant_label_is_opt_in_and_only_on_events_decisions_and_stops() {
    let options = MetricsOptions {
        tenant_label: true,
        ..MetricsOptions::default()
    };
    let text = metrics_with_every_metric_touched(options).encode().unwrap();
    let with_tenant: BTreeSet<&str> = text
        .lines()
        .filter(|l| l.contains("tenant=\"acme\""))
        .map(|l| l.split('{').next().unwrap())
        .collect();
    assert_eq!(
        with_tenant,
        BTreeSet::from([
            "fusebox_decisions_total",
            "fusebox_events_total",
            "fusebox_runs_stopped_total"
        ])
    );
}

#[test]
fn hostile_label_values_do_not_grow_series_without_bound() {
    let options = MetricsOptions {
        tenant_label: true,
        max_tenants: 5,
    };
    let m = Metrics::new("t", options).unwrap();
    for i in 0..2_000 {
        let v = format!("value-{i}");
        m.event(&v, &v);
        m.event_rejected(&v);
        m.decision(&v, &v, Some(&v));
        m.run_stopped(&v, &v, &v);
        m.detector_fired(&v, "block");
        m.watchdog_termination(&v, &v);
        m.watchdog_api_error(&v);
    }
    let text = m.encode().unwrap();
    let count = |name: &str| series_lines(&text, name).count();
    // Fixed vocabularies collapse to "other"; tenants and open labels stop at their caps.
    assert_eq!(count("fusebox_events_total"), 6);
    assert_eq!(count("fusebox_decisions_total"), 6);
    assert_eq!(count("fusebox_runs_stopped_total"), 6);
    let cap = fusebox_metrics::labels::OPEN_LABEL_CAP;
    assert_eq!(count("fusebox_events_rejected_total"), cap + 1);
    assert_eq!(count("fusebox_detector_fires_total"), cap + 1);
    assert_eq!(count("fusebox_watchdog_api_errors_total"), cap + 1);
    assert_eq!(count("fusebox_watchdog_terminations_total"), cap + 1);
    assert!(text.contains("tenant=\"other\""));
}

#[test]
fn use_completed_result_counts_as_a_ledger_hit() {
    let m = Metrics::new("t", MetricsOptions::default()).unwrap();
    m.decision("acme", "use_completed_result", None);
    m.decision("acme", "execute", None);
    let text = m.encode().unwrap();
    assert!(text.contains("fusebox_ledger_hits_total 1"), "{text}");
    assert!(
        text.contains("fusebox_decisions_total{action=\"execute\",reason=\"none\"} 1"),
        "{text}"
    );
}

#[test]
fn watchdog_instance_states_are_replaced_not_accumulated() {
    let m = Metrics::new("t", MetricsOptions::default()).unwrap();
    m.set_watchdog_instances(&[("running", 4)]);
    m.set_watchdog_instances(&[("stopped", 1)]);
    let text = m.encode().unwrap();
    assert!(
        text.contains("fusebox_watchdog_instances{state=\"running\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("fusebox_watchdog_instances{state=\"stopped\"} 1"),
        "{text}"
    );
}

#[test]
fn sub_agents_are_counted_in_bounded_depth_buckets() {
    let m = Metrics::new("t", MetricsOptions::default()).unwrap();
    // (open sub-agents by depth, the buckets 1, 2, 3, 4+)
    let cases = [
        (vec![], [0, 0, 0, 0]),
        (vec![(1, 5), (2, 2), (3, 1), (4, 1), (9, 2)], [5, 2, 1, 3]),
        // A bucket that emptied shows 0, not its last count.
        (vec![(2, 1)], [0, 1, 0, 0]),
    ];
    for (by_depth, want) in cases {
        m.set_subagents_active(&by_depth.iter().copied().collect());
        let text = m.encode().unwrap();
        for (depth, n) in ["1", "2", "3", "4+"].iter().zip(want) {
            let line = format!("fusebox_subagents_active{{depth=\"{depth}\"}} {n}");
            assert!(text.contains(&line), "{by_depth:?}: {line}\n{text}");
        }
    }
}

#[test]
fn configured_regions_start_with_zeroed_termination_series() {
    let m = Metrics::new("t", MetricsOptions::default()).unwrap();
    m.init_watchdog_regions(&["us-east-1"]);
    m.watchdog_termination("deadline", "us-east-1");
    let text = m.encode().unwrap();
    for reason in ["max_lifetime", "run_ended", "leftover"] {
        let line = format!(
            "fusebox_watchdog_terminations_total{{reason=\"{reason}\",region=\"us-east-1\"}} 0"
        );
        assert!(text.contains(&line), "{text}");
    }
    assert!(
        text.contains("{reason=\"deadline\",region=\"us-east-1\"} 1"),
        "{text}"
    );
}

#[test]
fn configured_api_ops_start_with_zeroed_error_series() {
    let m = Metrics::new("t", MetricsOptions::default()).unwrap();
    m.init_watchdog_api_ops(&["DescribeInstances", "TerminateInstances"]);
    m.watchdog_api_error("TerminateInstances");
    let text = m.encode().unwrap();
    assert!(
        text.contains("fusebox_watchdog_api_errors_total{op=\"DescribeInstances\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("fusebox_watchdog_api_errors_total{op=\"TerminateInstances\"} 1"),
        "{text}"
    );
}

/// Every reason code the engine can give is a label value of its own: a new detector's
/// code (`compaction_thrash`, `compaction_budget`) must not be counted as `other`.
#[test]
fn every_engine_reason_is_a_reason_label_value() {
    for reason in fusebox_core::Reason::ALL {
        assert!(
            fusebox_metrics::labels::REASONS.contains(&reason.as_str()),
            "reason {} is missing from labels::REASONS",
            reason.as_str()
        );
    }
    assert_eq!(
        fusebox_metrics::labels::REASONS.len(),
        fusebox_core::Reason::ALL.len() + 1,
        "labels::REASONS lists a code the engine does not give (besides \"none\")"
    );
}
