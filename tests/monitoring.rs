//! End-to-end monitoring: a real nats-server, moto_server (EC2), fuseboxd with its cloud
//! watchdog on moto, and Debian's `prometheus` scraping fuseboxd every second with the
//! shipped alert rules. After demo-like load (a runaway agent stopped, a legit agent
//! finishing, a leftover instance terminated by the watchdog, a bad event dead-lettered),
//! every PromQL expression of `dashboards/*.json` and `deploy/prometheus/alerts.yml` is
//! evaluated through Prometheus's HTTP API and must parse and return data: a dashboard
//! panel that would stay empty fails this test. `promtool check metrics` runs on a live
//! scrape too.
//!
//! The binaries come from `scripts/setup.sh`; a missing one fails the test and says so.

#[allow(dead_code)] // the lint tests use the selector scanner; this test only extracts
#[path = "../crates/fusebox-metrics/tests/common/promql.rs"]
mod promql;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_ec2::types::{InstanceType, ResourceType, Tag, TagSpecification};
use fusebox_client::Gate;
use fusebox_core::Action;
use fusebox_e2e::http::{http_get, url_encode};
use fusebox_e2e::{
    client, event, fixture, now_ms, on_path, repo_dir, write_config, Daemon, Moto, NatsServer,
    Prometheus,
};
use futures_util::StreamExt;
use serde_json::{json, Value};

const REQUIRED: [&str; 4] = ["nats-server", "moto_server", "prometheus", "promtool"];
/// `$__rate_interval` in a test that scrapes every second.
const RATE_INTERVAL: &str = "30s";

/// Where each top-level character sits: outside quotes and brackets.
fn top_level(expr: &str) -> Vec<bool> {
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    expr.chars()
        .map(|c| {
            if let Some(q) = quote {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
                return false;
            }
            match c {
                '"' | '\'' | '`' => {
                    quote = Some(c);
                    false
                }
                '(' | '{' | '[' => {
                    depth += 1;
                    false
                }
                ')' | '}' | ']' => {
                    depth -= 1;
                    false
                }
                _ => depth == 0,
            }
        })
        .collect()
}

/// The operands of top-level `and` / `or` / `unless`.
fn set_operands(expr: &str) -> Vec<String> {
    let flat: String = expr
        .chars()
        .map(|c| if c.is_whitespace() { ' ' } else { c })
        .collect();
    let top = top_level(&flat);
    let mut parts = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < flat.len() {
        let rest = &flat[i..];
        let op = [" and ", " or ", " unless "]
            .into_iter()
            .find(|op| rest.starts_with(op));
        match op {
            Some(op) if top[i] => {
                parts.push(flat[start..i].trim().to_owned());
                i += op.len();
                start = i;
            }
            _ => i += 1,
        }
    }
    parts.push(flat[start..].trim().to_owned());
    parts
}

/// The left side of a top-level comparison (`x > 0.05` → `x`); the expression if none.
fn without_comparison(expr: &str) -> String {
    let top = top_level(expr);
    let bytes = expr.as_bytes();
    for i in 0..bytes.len() {
        if top[i] && matches!(bytes[i], b'>' | b'<' | b'=' | b'!') {
            // `=~` / `!~` only occur inside label braces, which are not top level.
            return expr[..i].trim().to_owned();
        }
    }
    expr.trim().to_owned()
}

/// A dashboard's template variables replaced by what Grafana would put there.
fn instantiate(expr: &str) -> String {
    let e = expr
        .replace("$__rate_interval", RATE_INTERVAL)
        .replace("${__rate_interval}", RATE_INTERVAL)
        .replace("$__interval", "1s")
        .replace("$__range", "5m");
    assert!(
        !e.contains('$'),
        "an unknown template variable in {expr:?}: teach this test what it stands for"
    );
    e
}

fn ec2(endpoint: &str) -> aws_sdk_ec2::Client {
    let conf = aws_sdk_ec2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .build();
    aws_sdk_ec2::Client::from_conf(conf)
}

async fn launch(ec2: &aws_sdk_ec2::Client, run: &str) -> String {
    launch_tagged(ec2, run, ("fusebox:max-lifetime", "3600")).await
}

async fn launch_tagged(ec2: &aws_sdk_ec2::Client, run: &str, extra: (&str, &str)) -> String {
    let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build();
    let out = ec2
        .run_instances()
        .image_id("ami-12c6146b")
        .instance_type(InstanceType::T3Micro)
        .min_count(1)
        .max_count(1)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::Instance)
                .tags(tag("fusebox:managed", "true"))
                .tags(tag("fusebox:tenant", "demo"))
                .tags(tag("fusebox:run", run))
                .tags(tag(extra.0, extra.1))
                .build(),
        )
        .send()
        .await
        .expect("RunInstances on moto");
    out.instances()[0].instance_id().unwrap().to_owned()
}

async fn state(ec2: &aws_sdk_ec2::Client, id: &str) -> String {
    let out = ec2
        .describe_instances()
        .instance_ids(id)
        .send()
        .await
        .expect("DescribeInstances on moto");
    out.reservations()[0].instances()[0]
        .state()
        .and_then(|s| s.name())
        .map(|n| n.as_str().to_owned())
        .unwrap_or_default()
}

/// The shipped config with the watchdog on moto: 1 s grace, a sweep every 2 s.
fn config(dir: &Path, moto: &str) -> PathBuf {
    config_with(dir, moto, "")
}

fn config_with(dir: &Path, moto: &str, extra: &str) -> PathBuf {
    let path = write_config(dir);
    let mut doc: toml::Table = toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let watchdog: toml::Table = toml::from_str(&format!(
        "enabled = true\nregions = [\"us-east-1\"]\nendpoint_url = \"{moto}\"\n\
         grace_s = 1\nsweep_cron = \"*/2 * * * * *\"\nrecheck_after_s = 1\n{extra}"
    ))
    .unwrap();
    doc.insert("watchdog".into(), toml::Value::Table(watchdog));
    std::fs::write(&path, toml::to_string(&doc).unwrap()).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_and_alert_expression_has_data_after_demo_load() {
    let started = Instant::now();
    let missing: Vec<&str> = REQUIRED.into_iter().filter(|b| !on_path(b)).collect();
    assert!(
        missing.is_empty(),
        "not on PATH: {missing:?}; install them with `bash scripts/setup.sh`"
    );
    let dir = tempfile::tempdir().unwrap();
    let moto = Moto::start();
    let nats = NatsServer::start();
    let config = config(dir.path(), &moto.url());
    let daemon = Daemon::start_with(&nats.url(), &config, &dir.path().join("data"), |cmd| {
        cmd.env("RUST_LOG", "info")
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_EC2_METADATA_DISABLED", "true");
    })
    .await;
    let metrics_port = daemon.metrics_port;
    let alerts = repo_dir().join("deploy/prometheus/alerts.yml");
    let prometheus = Prometheus::start(dir.path(), &[metrics_port], &[alerts]);

    let client = client(&nats.url()).await;
    let mut terminated = client
        .nats()
        .subscribe("fusebox.watchdog.*.terminated")
        .await
        .unwrap();
    client.nats().flush().await.unwrap();
    let ec2 = ec2(&moto.url());

    // A run that launched an instance, then loops until the guard stops it; the instance
    // is left behind and the watchdog must terminate it. Another instance belongs to a
    // job still running: it must survive (and fills the fleet gauges).
    let leftover = launch(&ec2, "runaway-1").await;
    let survivor = launch(&ec2, "long-job").await;
    let t = now_ms();
    let mut seq = 0;
    let mut next = |body: Value| {
        seq += 1;
        let mut e = json!({"v":1,"id":format!("runaway-1-{seq}"),"tenant":"demo","run":"runaway-1","seq":seq,"ts_ms":t + seq});
        e.as_object_mut()
            .unwrap()
            .extend(body.as_object().unwrap().clone());
        event(e)
    };
    let opening = [
        next(json!({"type":"run_started","agent":"researcher"})),
        next(
            json!({"type":"instance_launched","provider":"ec2","region":"us-east-1","instance_id":leftover}),
        ),
    ];
    for e in &opening {
        assert!(
            client.gate(e).await.decision().is_some(),
            "{e:?} not decided"
        );
    }
    let mut stopped = false;
    for i in 0..50 {
        let call = next(
            json!({"type":"tool_call","call_id":format!("c{i}"),"tool":"search","args":{"query":"weather tokyo"}}),
        );
        match client.gate(&call).await {
            Gate::Decided(d) if d.action == Action::Stop => {
                stopped = true;
                break;
            }
            Gate::Decided(_) => {}
            other => panic!("tool call not decided: {other:?}"),
        }
        let result = next(
            json!({"type":"tool_result","call_id":format!("c{i}"),"tool":"search","kind":"SUCCESS","output":{"hits":["jma.go.jp"]}}),
        );
        let _ = client.gate(&result).await;
    }
    assert!(stopped, "the runaway agent was never stopped");

    // A long-running worker that only compacts: its context overflows, it compacts,
    // overflows again … with nothing done in between, until the compaction guard stops
    // it (the dashboard's "Compaction guard" panel and its alert).
    let t = now_ms();
    let mut thrashed = false;
    for cycle in 1..=10u64 {
        let turn = event(
            json!({"v":1,"id":format!("worker-9-t{cycle}"),"tenant":"demo","run":"worker-9","seq":2 * cycle - 1,"ts_ms":t + 2 * cycle,
            "type":"model_turn","stop_reason":"model_context_window_exceeded","usage":{"input_tokens":200_000}}),
        );
        let _ = client.gate(&turn).await;
        let compaction = event(
            json!({"v":1,"id":format!("worker-9-c{cycle}"),"tenant":"demo","run":"worker-9","seq":2 * cycle,"ts_ms":t + 2 * cycle + 1,
            "type":"compaction","reason":"auto"}),
        );
        if let Gate::Decided(d) = client.gate(&compaction).await {
            if d.action == Action::Stop {
                thrashed = true;
                break;
            }
        }
    }
    assert!(thrashed, "the compaction-only worker was never stopped");

    // A tree of runs: a planner that may start one sub-agent starts two — the second is
    // refused (spawn_limit) — and is cancelled, which stops the first with it
    // (ancestor_stopped): the dashboard's "Run trees" panel.
    let t = now_ms();
    let starts = [
        ("planner-1", json!({"policy": {"max_children": 1}})),
        ("helper-1", json!({"parent": "planner-1"})),
        ("helper-2", json!({"parent": "planner-1"})),
    ];
    let mut refused = None;
    for (run, fields) in starts {
        let mut e = json!({"v":1,"id":format!("{run}-1"),"tenant":"demo","run":run,"seq":1,"ts_ms":t,"type":"run_started"});
        e.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        refused = client
            .gate(&event(e))
            .await
            .decision()
            .and_then(|d| d.reason);
    }
    assert_eq!(refused, Some(fusebox_core::Reason::SpawnLimit));
    let cancel = client
        .cancel("demo", "planner-1", Some("ops"), None)
        .await
        .expect("cancel");
    assert_eq!(cancel.action, Action::Stop);
    let helper = client.run_status("demo", "helper-1").await.expect("status");
    assert_eq!(helper.summary.reason.as_deref(), Some("ancestor_stopped"));

    // A legitimate agent paging through a listing and finishing.
    for e in fixture("pagination-ok.jsonl") {
        assert!(
            client.gate(&e).await.decision().is_some(),
            "{} not decided",
            e.id
        );
    }
    // Bad input: refused and dead-lettered.
    match client
        .gate_bytes("demo", "bad-producer", b"{\"v\":1,".to_vec())
        .await
    {
        Gate::Refused(e) => assert_eq!(e.reason, "malformed_json"),
        other => panic!("malformed JSON not refused: {other:?}"),
    }

    // The watchdog's announcement of the leftover's termination.
    let message = tokio::time::timeout(Duration::from_secs(30), terminated.next())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no fusebox.watchdog.*.terminated within 30 s:\n{}",
                daemon.logs()
            )
        })
        .unwrap();
    assert_eq!(message.subject.as_str(), "fusebox.watchdog.demo.terminated");
    let t: Value = serde_json::from_slice(&message.payload).unwrap();
    assert_eq!(t["instance_id"], leftover.as_str(), "{t}");
    assert_eq!(t["run"], "runaway-1", "{t}");
    assert_eq!(t["region"], "us-east-1", "{t}");
    assert_eq!(t["outcome"], "terminated", "{t}");
    assert_eq!(t["dry_run"], false, "{t}");
    assert!(
        t["reason"] == "leftover" || t["reason"] == "run_ended",
        "{t}"
    );
    let gone = state(&ec2, &leftover).await;
    assert!(
        gone == "terminated" || gone == "shutting-down",
        "leftover is {gone}"
    );
    assert_eq!(state(&ec2, &survivor).await, "running");
    let journal = std::fs::read_to_string(dir.path().join("data/watchdog.journal")).unwrap();
    assert!(
        journal.contains("\"termination\":{") && journal.contains(&leftover),
        "termination not journaled:\n{journal}"
    );

    // Prometheus has scraped the termination, and a few more samples for rate().
    let deadline = Instant::now() + Duration::from_secs(30);
    while prometheus.query("sum(fusebox_watchdog_terminations_total) > 0") != Ok(1) {
        assert!(
            Instant::now() < deadline,
            "Prometheus never saw the termination:\n{}",
            prometheus.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    // promtool on what a scrape really returns.
    let (status, exposition) = http_get(metrics_port, "/metrics").unwrap();
    assert_eq!(status, 200);
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool: run `bash scripts/setup.sh`");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Every expression: parses, and returns data.
    let mut exprs = promql::dashboard_expressions(&repo_dir().join("dashboards"));
    exprs.extend(promql::rule_expressions(
        &repo_dir().join("deploy/prometheus"),
    ));
    assert!(exprs.len() > 20, "too few expressions found: {exprs:?}");
    let mut failures = Vec::new();
    for e in &exprs {
        let expr = instantiate(&e.expr);
        match prometheus.query(&expr) {
            Err(err) => failures.push(format!("{}: does not evaluate: {err}\n  {expr}", e.origin)),
            Ok(n) if n > 0 => {}
            // An alert condition that is false (as it should be here) is empty: its
            // operands must still have data, once their comparisons are taken off.
            Ok(_) if !e.in_dashboard => {
                for operand in set_operands(&expr) {
                    // Exception: `absent(x)` is empty exactly while x is there, the healthy
                    // state (FuseboxDown's second half); x itself is checked by the first.
                    if operand.starts_with("absent(") {
                        continue;
                    }
                    let bare = without_comparison(&operand);
                    match prometheus.query(&bare) {
                        Ok(n) if n > 0 => {}
                        other => failures.push(format!(
                            "{}: no data even without the comparison ({other:?}):\n  {bare}",
                            e.origin
                        )),
                    }
                }
            }
            Ok(_) => failures.push(format!("{}: panel would stay empty:\n  {expr}", e.origin)),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} expressions fail:\n{}",
        failures.len(),
        exprs.len(),
        failures.join("\n")
    );
    eprintln!(
        "{} expressions evaluated with data; whole test took {:.1} s",
        exprs.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(started.elapsed() < Duration::from_secs(120), "too slow");
}

fn fusebox_watchdog(nats: &NatsServer, args: &[&str]) -> (bool, String) {
    let out = Command::new(fusebox_e2e::bin("fusebox"))
        .arg("watchdog")
        .args(args)
        .args(["--nats-url", &nats.url()])
        .output()
        .expect("running fusebox watchdog");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn halted_gauge(metrics_port: u16) -> Option<String> {
    let (_, exposition) = http_get(metrics_port, "/metrics").ok()?;
    exposition
        .lines()
        .find_map(|l| l.strip_prefix("fusebox_watchdog_halted "))
        .map(str::to_owned)
}

/// `on_blast_radius = "halt"` latches (issue 25 §3): two overdue instances against a
/// limit of one halt the watchdog; once one is gone the other fits the limit, and it is
/// still left alone — through a restart — until `fusebox watchdog resume --by`, which is
/// journaled. The halt shows in `fusebox watchdog status` and `fusebox_watchdog_halted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halted_watchdog_stays_halted_until_an_operator_resumes_it() {
    let dir = tempfile::tempdir().unwrap();
    let moto = Moto::start();
    let nats = NatsServer::start();
    let config = config_with(
        dir.path(),
        &moto.url(),
        "on_blast_radius = \"halt\"\nmax_terminations_per_sweep = 1\nmax_termination_share = 1.0\n",
    );
    let ec2 = ec2(&moto.url());
    let past = ("fusebox:deadline", "2020-01-01T00:00:00Z");
    let first = launch_tagged(&ec2, "old-1", past).await;
    let second = launch_tagged(&ec2, "old-2", past).await;
    let data = dir.path().join("data");
    let nats_url = nats.url();
    let start = || {
        Daemon::start_with(&nats_url, &config, &data, |cmd| {
            cmd.env("AWS_ACCESS_KEY_ID", "testing")
                .env("AWS_SECRET_ACCESS_KEY", "testing")
                .env("AWS_EC2_METADATA_DISABLED", "true");
        })
    };
    let mut daemon = start().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, out) = fusebox_watchdog(&nats, &["status"]);
        assert!(ok, "{out}");
        if out.contains("HALTED") {
            assert!(
                out.contains("blast-radius") || out.contains("max_terminations_per_sweep"),
                "{out}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never halted: {out}\n{}",
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while halted_gauge(daemon.metrics_port).as_deref() != Some("1") {
        assert!(Instant::now() < deadline, "fusebox_watchdog_halted never 1");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // One goes by other hands: the other fits the limit now, and still stays.
    ec2.terminate_instances()
        .instance_ids(&first)
        .send()
        .await
        .expect("TerminateInstances on moto");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(state(&ec2, &second).await, "running", "{}", daemon.logs());

    // A restart comes back halted (the journal holds the halt).
    daemon.terminate();
    let daemon = start().await;
    let (ok, out) = fusebox_watchdog(&nats, &["status", "--json"]);
    let status: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(ok && status["halted"] == true, "{out}\n{}", daemon.logs());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(state(&ec2, &second).await, "running", "{}", daemon.logs());

    let (ok, out) = fusebox_watchdog(&nats, &["resume", "--by", "oncall"]);
    assert!(ok && out.contains("resumed by oncall"), "{out}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = state(&ec2, &second).await;
        if now == "terminated" || now == "shutting-down" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not terminated after the resume: {now}\n{}",
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let journal = std::fs::read_to_string(data.join("watchdog.journal")).unwrap();
    assert!(
        journal.contains(r#""type":"halted""#)
            && journal.contains(r#""type":"resumed""#)
            && journal.contains(r#""by":"oncall""#),
        "halt and resume not journaled:\n{journal}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while halted_gauge(daemon.metrics_port).as_deref() != Some("0") {
        assert!(
            Instant::now() < deadline,
            "fusebox_watchdog_halted never back to 0"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (ok, out) = fusebox_watchdog(&nats, &["resume", "--by", "oncall"]);
    assert!(ok && out.contains("not halted"), "{out}");
}

#[test]
fn expression_helpers_split_and_strip_at_top_level() {
    assert_eq!(
        set_operands("up{job=\"a or b\"} == 0 or absent(up{job=\"x\"})"),
        ["up{job=\"a or b\"} == 0", "absent(up{job=\"x\"})"]
    );
    assert_eq!(
        without_comparison("sum(rate(x{a!~\"b\"}[5m])) > 3 * sum(rate(x[1h]))"),
        "sum(rate(x{a!~\"b\"}[5m]))"
    );
    assert_eq!(
        without_comparison("fusebox_nats_connected"),
        "fusebox_nats_connected"
    );
    assert_eq!(url_encode("a b{\"c\"}"), "a%20b%7B%22c%22%7D");
}
