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

mod common;
#[path = "../../fusebox-watchdog/tests/common/moto.rs"]
mod moto;
#[allow(dead_code)] // the lint tests use the selector scanner; this test only extracts
#[path = "../../fusebox-metrics/tests/common/promql.rs"]
mod promql;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_ec2::types::{InstanceType, ResourceType, Tag, TagSpecification};
use common::{client, event, fixture, free_port, now_ms, write_config, NatsServer};
use fusebox_client::Gate;
use fusebox_core::Action;
use futures_util::StreamExt;
use serde_json::{json, Value};

const REQUIRED: [&str; 4] = ["nats-server", "moto_server", "prometheus", "promtool"];
/// `$__rate_interval` in a test that scrapes every second.
const RATE_INTERVAL: &str = "30s";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(bin).is_file()))
}

/// A child process killed on drop; its output goes to `log`.
struct Proc {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(name: &'static str, mut cmd: Command, log: PathBuf) -> Proc {
        let out = std::fs::File::create(&log).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {name} ({e}); run `bash scripts/setup.sh`"));
        Proc { name, child, log }
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `GET path` on `port` answers 200.
    fn wait_http_ok(&mut self, port: u16, path: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if matches!(http_get(port, path), Ok((200, _))) {
                return;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("{} exited with {status}:\n{}", self.name, self.logs());
            }
            assert!(
                Instant::now() < deadline,
                "{} did not answer {path} on {port}:\n{}",
                self.name,
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- {} log ---\n{}", self.name, self.logs());
        }
    }
}

/// A plain HTTP/1.0 GET on loopback: (status, body).
fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_owned()))
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Instant query: the number of series returned, or Prometheus's error.
fn query(prometheus: u16, expr: &str) -> Result<usize, String> {
    let (status, body) = http_get(
        prometheus,
        &format!("/api/v1/query?query={}", url_encode(expr)),
    )
    .map_err(|e| format!("HTTP: {e}"))?;
    let reply: Value = serde_json::from_str(&body)
        .map_err(|e| format!("HTTP {status}, not JSON ({e}): {body}"))?;
    if reply["status"] != "success" {
        return Err(format!("{}: {}", reply["errorType"], reply["error"]));
    }
    Ok(match &reply["data"]["result"] {
        Value::Array(series) => series.len(),
        // A scalar or string result is one value.
        _ => 1,
    })
}

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
                .tags(tag("fusebox:max-lifetime", "3600"))
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
    let path = write_config(dir);
    let mut doc: toml::Table = toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let watchdog: toml::Table = toml::from_str(&format!(
        "enabled = true\nregions = [\"us-east-1\"]\nendpoint_url = \"{moto}\"\n\
         grace_s = 1\nsweep_cron = \"*/2 * * * * *\"\nrecheck_after_s = 1\n"
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
    let moto = moto::Moto::start();
    let nats = NatsServer::start();
    let config = config(dir.path(), &moto.url());

    let metrics_port = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fuseboxd"));
    cmd.arg("--config")
        .arg(&config)
        .args(["--nats-url", &nats.url()])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "info")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    let mut daemon = Proc::spawn("fuseboxd", cmd, dir.path().join("fuseboxd.log"));
    daemon.wait_http_ok(metrics_port, "/readyz", Duration::from_secs(30));

    let prom_port = free_port();
    let prom_config = dir.path().join("prometheus.yml");
    let alerts = repo().join("deploy/prometheus/alerts.yml");
    std::fs::write(
        &prom_config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: fuseboxd\n    static_configs:\n      \
             - targets: [\"127.0.0.1:{metrics_port}\"]\n",
            alerts.display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new("prometheus");
    cmd.arg(format!("--config.file={}", prom_config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"));
    let mut prometheus = Proc::spawn("prometheus", cmd, dir.path().join("prometheus.log"));
    prometheus.wait_http_ok(prom_port, "/-/ready", Duration::from_secs(30));

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
    while query(prom_port, "sum(fusebox_watchdog_terminations_total) > 0") != Ok(1) {
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
    let mut exprs = promql::dashboard_expressions(&repo().join("dashboards"));
    exprs.extend(promql::rule_expressions(&repo().join("deploy/prometheus")));
    assert!(exprs.len() > 20, "too few expressions found: {exprs:?}");
    let mut failures = Vec::new();
    for e in &exprs {
        let expr = instantiate(&e.expr);
        match query(prom_port, &expr) {
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
                    match query(prom_port, &bare) {
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
