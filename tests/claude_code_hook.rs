//! `fusebox hook claude-code` against a real nats-server and fuseboxd: the documented
//! payload of each Claude Code hook event (tests/fixtures/claude-code-hooks/payloads)
//! fed in the sessions of tests/fixtures/claude-code-hooks/cases, each answer checked
//! against the hook protocol. The fixtures' README describes the case lines.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use fusebox_e2e::{bin, read, write_config, Daemon, NatsServer};
use serde_json::{json, Value};

const TENANT: &str = "hooks";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/claude-code-hooks")
}

/// A running nats-server + fuseboxd with the fixtures' policy.
struct Stack {
    nats_url: String,
    _nats: NatsServer,
    _dir: tempfile::TempDir,
    _daemon: Daemon,
}

async fn stack() -> Stack {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_config(dir.path());
    let mut doc: toml::Table = toml::from_str(&read(&config)).expect("config is TOML");
    let overlay: toml::Table =
        toml::from_str(&read(&fixtures().join("policy.toml"))).expect("policy.toml is TOML");
    let policy = doc
        .entry("policy")
        .or_insert(toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .expect("[policy] is a table");
    let pinned = overlay.get("policy").and_then(|p| p.as_table());
    for (key, value) in pinned.expect("policy.toml has [policy]") {
        policy.insert(key.clone(), value.clone());
    }
    std::fs::write(&config, toml::to_string(&doc).unwrap()).expect("config written");
    let daemon = Daemon::start(&nats.url(), &config, &dir.path().join("data")).await;
    Stack {
        nats_url: nats.url(),
        _nats: nats,
        _dir: dir,
        _daemon: daemon,
    }
}

fn fusebox() -> PathBuf {
    bin("fusebox")
}

/// One hook invocation, as Claude Code makes it: the payload on stdin, the answer on
/// stdout.
fn hook(args: &[&str], stdin: &[u8], state_dir: &Path) -> Output {
    let mut child = Command::new(fusebox())
        .args(["hook", "claude-code", "--tenant", TENANT])
        .arg("--state-dir")
        .arg(state_dir)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fusebox runs");
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(stdin)
        .expect("hook reads its payload");
    child.wait_with_output().expect("hook finishes")
}

fn payload(hook: &str, session: &str, id: Option<&str>, set: Option<&Value>) -> Value {
    let path = fixtures().join("payloads").join(format!("{hook}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let text = text.replace("SESSION", session);
    let text = text.replace("TOOL_USE_ID", id.unwrap_or("TOOL_USE_ID"));
    let mut payload: Value = serde_json::from_str(&text).expect("payload fixtures are JSON");
    if let Some(Value::Object(fields)) = set {
        for (key, value) in fields {
            payload[key] = value.clone();
        }
    }
    payload
}

fn run_summary(nats_url: &str, session: &str) -> Value {
    let out = Command::new(fusebox())
        .arg("run")
        .arg(format!("{TENANT}/{session}"))
        .arg("--json")
        .args(["--nats-url", nats_url])
        .output()
        .expect("fusebox run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: Value = serde_json::from_slice(&out.stdout).expect("status is JSON");
    status["summary"].clone()
}

/// Checks one answer against the protocol shape `expect` names.
fn check_answer(expect: &str, event: &str, out: &Output, phrase: Option<&str>, at: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    if expect == "exit2" {
        assert_eq!(out.status.code(), Some(2), "{at}: bad input must exit 2");
        assert!(
            stderr.contains("fusebox:"),
            "{at}: the reason goes to stderr: {stderr}"
        );
        return;
    }
    assert!(
        out.status.success(),
        "{at}: exit {:?}: {stderr}",
        out.status
    );
    let answer: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{at}: stdout is not JSON ({e}): {:?}", out.stdout));
    let specific = &answer["hookSpecificOutput"];
    let text = match expect {
        "nothing" => {
            assert_eq!(answer, json!({}), "{at}");
            return;
        }
        "warn" => {
            assert_eq!(specific["hookEventName"], "PreToolUse", "{at}: {answer}");
            assert!(
                specific.get("permissionDecision").is_none(),
                "{at}: {answer}"
            );
            assert!(answer.get("continue").is_none(), "{at}: {answer}");
            specific["additionalContext"].as_str()
        }
        "deny" | "stop" => {
            assert_eq!(specific["hookEventName"], "PreToolUse", "{at}: {answer}");
            assert_eq!(specific["permissionDecision"], "deny", "{at}: {answer}");
            if expect == "stop" {
                assert_eq!(answer["continue"], false, "{at}: {answer}");
                assert_eq!(answer["stopReason"], specific["permissionDecisionReason"]);
            } else {
                assert!(answer.get("continue").is_none(), "{at}: {answer}");
            }
            specific["permissionDecisionReason"].as_str()
        }
        "end" => {
            assert_ne!(event, "PreToolUse", "{at}: a PreToolUse stop also denies");
            assert_eq!(answer["continue"], false, "{at}: {answer}");
            answer["stopReason"].as_str()
        }
        other => panic!("{at}: unknown expectation {other:?}"),
    };
    let text = text.unwrap_or_else(|| panic!("{at}: no reason text: {answer}"));
    assert!(text.starts_with("fusebox"), "{at}: {text}");
    if let Some(phrase) = phrase {
        assert!(text.contains(phrase), "{at}: {text:?} lacks {phrase:?}");
    }
}

fn run_case(stack: &Stack, name: &str) {
    let path = fixtures().join("cases").join(format!("{name}.jsonl"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let state = tempfile::tempdir().expect("temp dir");
    let session = format!("{name}-{}", std::process::id());
    let url = ["--nats-url", stack.nats_url.as_str()];
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = format!("{name}.jsonl:{}", number + 1);
        let step: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{at}: {e}"));
        if let Some(Value::Object(fields)) = step.get("status") {
            let summary = run_summary(&stack.nats_url, &session);
            for (key, value) in fields {
                assert_eq!(&summary[key], value, "{at}: {key} in {summary}");
            }
            continue;
        }
        let event = step["hook"].as_str().unwrap_or("");
        let stdin = match step.get("stdin") {
            Some(Value::String(raw)) => raw.clone().into_bytes(),
            _ => {
                let id = step["id"].as_str();
                serde_json::to_vec(&payload(event, &session, id, step.get("set"))).unwrap()
            }
        };
        let out = hook(&url, &stdin, state.path());
        let expect = step["expect"]
            .as_str()
            .expect("every hook line has an expect");
        check_answer(expect, event, &out, step["reason"].as_str(), &at);
    }
}

#[tokio::test]
async fn hook_cases_against_a_real_daemon() {
    let stack = stack().await;
    for case in ["runaway", "legitimate", "rerun", "compaction", "bad_input"] {
        run_case(&stack, case);
    }
}

#[test]
fn every_case_file_is_run() {
    let mut on_disk: Vec<String> = std::fs::read_dir(fixtures().join("cases"))
        .expect("cases dir")
        .map(|e| {
            e.unwrap()
                .path()
                .file_stem()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    on_disk.sort();
    assert_eq!(
        on_disk,
        ["bad_input", "compaction", "legitimate", "rerun", "runaway"],
        "add a new case file to hook_cases_against_a_real_daemon"
    );
}

/// With no guard to answer, a tool call is denied within the hook's own deadline (never
/// a hang, never let through unasked) or, by choice, runs unguarded; the other events
/// need no answer.
#[test]
fn guard_down_denies_within_the_deadline_and_allow_lets_calls_run() {
    // A listener that accepts and never speaks: the worst kind of silent guard.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("nats://{}", silent.local_addr().unwrap());
    let state = tempfile::tempdir().expect("temp dir");
    let pre = serde_json::to_vec(&payload("PreToolUse", "down", Some("t1"), None)).unwrap();

    let started = Instant::now();
    let down = ["--nats-url", url.as_str(), "--timeout", "500ms"];
    let out = hook(&down, &pre, state.path());
    let took = started.elapsed();
    check_answer(
        "deny",
        "PreToolUse",
        &out,
        Some("could not be asked"),
        "silent guard",
    );
    assert!(
        took < Duration::from_secs(5),
        "the hook must answer near its deadline, not hang ({took:?})"
    );

    let allow = [
        "--nats-url",
        url.as_str(),
        "--timeout",
        "500ms",
        "--on-error",
        "allow",
    ];
    let out = hook(&allow, &pre, state.path());
    check_answer("warn", "PreToolUse", &out, Some("unguarded"), "allow");

    // Events that are not tool calls need no answer from a guard that is down.
    for event in [
        "PostToolUse",
        "PostToolUseFailure",
        "PreCompact",
        "SessionEnd",
    ] {
        let body = serde_json::to_vec(&payload(event, "down", Some("t1"), None)).unwrap();
        let out = hook(&down, &body, state.path());
        check_answer("nothing", event, &out, None, event);
    }
}
