//! Lints the dashboards and alert rules the way grafana's dashboard-linter and a careful
//! reviewer would, and checks that every metric they use is one the registry exposes.

#[path = "common/promql.rs"]
mod promql;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use fusebox_metrics::catalogue::{lookup, Kind};
use promql::{fusebox_selectors, Expr, Selector};
use serde_json::{json, Value as Json};
use serde_norway::Value as Yaml;

const DATASOURCE_REF: &str = "${datasource}";

fn repo_dir(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

fn dashboards_dir() -> PathBuf {
    repo_dir("dashboards")
}

fn prometheus_dir() -> PathBuf {
    repo_dir("deploy/prometheus")
}

fn dashboards() -> Vec<(PathBuf, Json)> {
    let files = promql::files_with_extension(&dashboards_dir(), "json");
    assert!(
        files.len() >= 2,
        "expected the fleet-guard and cloud-watchdog dashboards"
    );
    files
        .into_iter()
        .map(|p| {
            let d = promql::read_json(&p);
            (p, d)
        })
        .collect()
}

fn all_expressions() -> Vec<Expr> {
    let mut exprs = promql::dashboard_expressions(&dashboards_dir());
    exprs.extend(promql::rule_expressions(&prometheus_dir()));
    assert!(exprs.iter().any(|e| e.in_dashboard) && exprs.iter().any(|e| !e.in_dashboard));
    exprs
}

#[test]
fn dashboards_have_a_prometheus_datasource_variable_used_everywhere() {
    let expected = json!({"type": "prometheus", "uid": DATASOURCE_REF});
    for (path, dashboard) in dashboards() {
        let name = path.display();
        let vars = dashboard["templating"]["list"]
            .as_array()
            .expect("templating.list");
        let var = vars
            .iter()
            .find(|v| v["name"] == "datasource")
            .unwrap_or_else(|| panic!("{name}: no datasource variable"));
        assert_eq!(var["type"], "datasource", "{name}");
        assert_eq!(var["query"], "prometheus", "{name}");
        let schema = dashboard["schemaVersion"].as_u64().unwrap_or(0);
        assert!(
            (36..=41).contains(&schema),
            "{name}: schemaVersion {schema}"
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            !text.contains("DS_PROMETHEUS"),
            "{name}: use ${{datasource}}, not an import-time input"
        );
        for panel in promql::panels(&dashboard) {
            assert_eq!(
                panel["datasource"], expected,
                "{name} panel {}",
                panel["id"]
            );
            let targets = panel["targets"]
                .as_array()
                .unwrap_or_else(|| panic!("{name} panel {}: no targets", panel["id"]));
            assert!(
                !targets.is_empty(),
                "{name} panel {}: no targets",
                panel["id"]
            );
            for target in targets {
                assert_eq!(
                    target["datasource"], expected,
                    "{name} panel {} target {}",
                    panel["id"], target["refId"]
                );
            }
        }
    }
}

#[test]
fn every_panel_has_a_title_description_unit_and_unique_id() {
    for (path, dashboard) in dashboards() {
        let name = path.display();
        let mut ids = HashSet::new();
        for panel in promql::panels(&dashboard) {
            let id = panel["id"]
                .as_u64()
                .unwrap_or_else(|| panic!("{name}: panel without id"));
            assert!(ids.insert(id), "{name}: duplicate panel id {id}");
            for field in ["title", "description"] {
                let text = panel[field].as_str().unwrap_or("");
                assert!(!text.trim().is_empty(), "{name} panel {id}: no {field}");
            }
            let unit = panel["fieldConfig"]["defaults"]["unit"]
                .as_str()
                .unwrap_or("");
            assert!(
                !unit.is_empty(),
                "{name} panel {id}: no fieldConfig.defaults.unit"
            );
        }
    }
}

/// Counters (and the counter series of histograms) mean nothing raw: they must be rated.
fn is_counter_series(selector: &Selector) -> bool {
    lookup(&selector.metric).is_some_and(|def| matches!(def.kind, Kind::Counter | Kind::Histogram))
}

#[test]
fn counters_and_buckets_are_wrapped_in_rate_or_increase() {
    for expr in all_expressions() {
        for sel in fusebox_selectors(&expr.expr)
            .iter()
            .filter(|s| is_counter_series(s))
        {
            let call = sel.enclosing_call.as_deref().unwrap_or("");
            assert!(
                matches!(call, "rate" | "increase") && sel.range.is_some(),
                "{}: {} must be inside rate(...[range]) or increase(...[range]): {}",
                expr.origin,
                sel.metric,
                expr.expr
            );
            if expr.in_dashboard {
                assert_eq!(
                    sel.range.as_deref(),
                    Some("$__rate_interval"),
                    "{}: {}",
                    expr.origin,
                    expr.expr
                );
            }
        }
    }
}

#[test]
fn every_metric_referenced_is_exposed_by_the_registry() {
    let mut used = HashSet::new();
    for expr in all_expressions() {
        let selectors = fusebox_selectors(&expr.expr);
        assert!(
            !selectors.is_empty() || expr.expr.contains("up{"),
            "{}: no fusebox metric in {}",
            expr.origin,
            expr.expr
        );
        for sel in selectors {
            let def = lookup(&sel.metric).unwrap_or_else(|| {
                panic!(
                    "{}: {} is not a metric fusebox-metrics exposes",
                    expr.origin, sel.metric
                )
            });
            used.insert(def.name);
        }
    }
    // Everything the daemon exposes is on a dashboard or behind an alert, except the
    // build info, which is for ad-hoc queries.
    let unused: Vec<_> = fusebox_metrics::CATALOGUE
        .iter()
        .map(|d| d.name)
        .filter(|n| !used.contains(n) && *n != "fusebox_build_info")
        .collect();
    assert!(
        unused.is_empty(),
        "metrics on no dashboard and in no rule: {unused:?}"
    );
}

#[test]
fn no_run_ids_in_queries_or_legends() {
    for (path, dashboard) in dashboards() {
        for panel in promql::panels(&dashboard) {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let text = format!("{} {}", target["expr"], target["legendFormat"]);
                for needle in [
                    "run=", "run!=", "run=~", "{{run}}", "(run)", "run,", ", run",
                ] {
                    assert!(
                        !text.contains(needle),
                        "{} panel {}: {text}",
                        path.display(),
                        panel["id"]
                    );
                }
            }
        }
    }
}

const REQUIRED_ALERTS: &[&str] = &[
    "FuseboxRunawayStorm",
    "FuseboxGateLatencyHigh",
    "FuseboxLogCommitSlow",
    "FuseboxNatsDisconnected",
    "FuseboxConsumerLagGrowing",
    "FuseboxDlqGrowing",
    "FuseboxWatchdogLeftoverTerminated",
    "FuseboxWatchdogApiErrors",
    "FuseboxInstancePastDeadline",
    "FuseboxWatchdogBlastRadiusHit",
    "FuseboxDown",
];

fn alert_names() -> Vec<String> {
    promql::rules(&prometheus_dir())
        .into_iter()
        .filter_map(|(_, rule)| rule["alert"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn every_alert_has_severity_summary_and_runbook() {
    for (file, rule) in promql::rules(&prometheus_dir()) {
        let name = rule["alert"]
            .as_str()
            .unwrap_or_else(|| panic!("{file}: rule without alert name"));
        let severity = rule["labels"]["severity"].as_str().unwrap_or("");
        assert!(
            matches!(severity, "critical" | "warning"),
            "{name}: severity {severity:?}"
        );
        for annotation in ["summary", "runbook"] {
            let text = rule["annotations"][annotation].as_str().unwrap_or("");
            assert!(
                text.len() > 20,
                "{name}: {annotation} missing or too short to act on"
            );
        }
    }
    let names = alert_names();
    for required in REQUIRED_ALERTS {
        assert!(
            names.iter().any(|n| n == required),
            "missing alert {required}"
        );
    }
}

#[test]
fn every_alert_is_unit_tested_both_firing_and_quiet() {
    let tests = promql::read_yaml(&prometheus_dir().join("alerts_test.yml"));
    let mut fires = HashSet::new();
    let mut quiet = HashSet::new();
    for group in tests["tests"].as_sequence().expect("tests list") {
        for case in group["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = case["alertname"].as_str().unwrap_or("").to_string();
            let expected = case["exp_alerts"].as_sequence().map_or(0, Vec::len);
            if expected == 0 {
                quiet.insert(name)
            } else {
                fires.insert(name)
            };
        }
    }
    for name in alert_names() {
        assert!(
            fires.contains(&name),
            "{name}: no promtool test where it fires"
        );
        assert!(
            quiet.contains(&name),
            "{name}: no promtool test where it stays quiet"
        );
    }
    assert!(matches!(tests["rule_files"], Yaml::Sequence(_)));
}

#[test]
fn selector_scanner_sees_through_strings_braces_and_grouping() {
    let sels = fusebox_selectors(
        r#"histogram_quantile(0.99, sum by (le) (rate(fusebox_gate_latency_seconds_bucket{x="(fusebox_fake"}[5m])))
           / on(instance) group_left sum(fusebox_runs_active) and fusebox_dlq_total"#,
    );
    let got: Vec<(&str, Option<&str>, Option<&str>)> = sels
        .iter()
        .map(|s| {
            (
                s.metric.as_str(),
                s.enclosing_call.as_deref(),
                s.range.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "fusebox_gate_latency_seconds_bucket",
                Some("rate"),
                Some("5m")
            ),
            ("fusebox_runs_active", Some("sum"), None),
            ("fusebox_dlq_total", None, None),
        ]
    );
}

#[test]
fn readme_documents_every_metric() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    for def in fusebox_metrics::CATALOGUE {
        assert!(
            readme.contains(&format!("| `{}` |", def.name)),
            "README.md does not document {}",
            def.name
        );
    }
}
