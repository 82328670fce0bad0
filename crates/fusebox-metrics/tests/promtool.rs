//! Runs promtool over the rules, their unit tests, the scrape config and a real
//! exposition. promtool comes from scripts/setup.sh; without it these tests fail loudly
//! rather than pass without checking anything.

#[path = "common/touch.rs"]
mod touch;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use fusebox_metrics::MetricsOptions;

fn prometheus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/prometheus")
}

fn promtool() -> Command {
    let found = Command::new("sh")
        .args(["-c", "command -v promtool"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "promtool is not on PATH: run scripts/setup.sh (it installs Debian's prometheus package)"
    );
    let mut cmd = Command::new("promtool");
    cmd.current_dir(prometheus_dir());
    cmd
}

fn assert_success(what: &str, output: Output) {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn alert_rules_are_valid() {
    let out = promtool()
        .args(["check", "rules", "alerts.yml"])
        .output()
        .unwrap();
    assert_success("promtool check rules alerts.yml", out);
}

#[test]
fn alert_rule_unit_tests_pass() {
    let out = promtool()
        .args(["test", "rules", "alerts_test.yml"])
        .output()
        .unwrap();
    assert_success("promtool test rules alerts_test.yml", out);
}

#[test]
fn scrape_config_is_valid() {
    let out = promtool()
        .args(["check", "config", "prometheus.yml"])
        .output()
        .unwrap();
    assert_success("promtool check config prometheus.yml", out);
}

#[test]
fn exposition_passes_promtool_metric_lint() {
    let options = MetricsOptions {
        tenant_label: true,
        ..MetricsOptions::default()
    };
    let text = touch::metrics_with_every_metric_touched(options)
        .encode()
        .unwrap();
    let mut child = promtool()
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    assert_success("promtool check metrics", child.wait_with_output().unwrap());
}
