//! `fusebox hook claude-code` against a real nats-server and fuseboxd: the documented
//! payload of each Claude Code hook event (tests/fixtures/claude-code-hooks/payloads)
//! fed in the sessions of tests/fixtures/claude-code-hooks/cases, each answer checked
//! against the hook protocol — once through the command (a process per event), once
//! through `fusebox hook serve` (Claude Code's HTTP hooks: a 4xx answer is the command's
//! exit 2, a blocked call under `onFailure: "block"`). The fixtures' README describes
//! the case lines.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output};
use std::time::{Duration, Instant};

use fusebox_e2e::hooks::{run_hook, HookStack};
use fusebox_e2e::http::http_post;
use fusebox_e2e::{bin, free_port, Proc};
use serde_json::{json, Value};

const TENANT: &str = "hooks";

/// Every file of tests/fixtures/claude-code-hooks/cases, run each way.
const CASES: [&str; 8] = [
    "runaway",
    "legitimate",
    "rerun",
    "compaction",
    "bad_input",
    "prompts",
    "sub_agents",
    "sub_agent_caps",
];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/claude-code-hooks")
}

async fn stack() -> HookStack {
    HookStack::start(&fixtures().join("policy.toml")).await
}

/// One hook invocation, as Claude Code makes it: the payload on stdin, the answer on
/// stdout.
fn hook(args: &[&str], stdin: &[u8], state_dir: &Path) -> Output {
    let state = state_dir.to_str().expect("temp paths are UTF-8");
    let mut all = vec!["--tenant", TENANT, "--state-dir", state];
    all.extend_from_slice(args);
    run_hook("claude-code", &all, stdin)
}

fn payload(hook: &str, session: &str, id: Option<&str>, set: Option<&Value>) -> Value {
    sub_agent_payload(hook, session, id, set, None)
}

/// A payload fixture with `set` laid over it, then its placeholders filled (in `set`
/// too); for a hook of sub-agent `agent`, with its `agent_id` (`AGENT_ID`), which a
/// payload of the main agent's does not carry.
fn sub_agent_payload(
    hook: &str,
    session: &str,
    id: Option<&str>,
    set: Option<&Value>,
    agent: Option<&str>,
) -> Value {
    let path = fixtures().join("payloads").join(format!("{hook}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let mut payload: Value = serde_json::from_str(&text).expect("payload fixtures are JSON");
    if let Some(Value::Object(fields)) = set {
        for (key, value) in fields {
            payload[key] = value.clone();
        }
    }
    if let (Some(_), None) = (agent, payload.get("agent_id")) {
        payload["agent_id"] = json!("AGENT_ID");
        payload["agent_type"] = json!("general-purpose");
    }
    let text = payload
        .to_string()
        .replace("SESSION", session)
        .replace("TOOL_USE_ID", id.unwrap_or("TOOL_USE_ID"))
        .replace("AGENT_ID", agent.unwrap_or("AGENT_ID"));
    serde_json::from_str(&text).expect("still JSON")
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
        "context" => {
            assert_ne!(event, "PreToolUse", "{at}: a PreToolUse context is a warn");
            assert_eq!(specific["hookEventName"], event, "{at}: {answer}");
            assert!(
                specific.get("permissionDecision").is_none(),
                "{at}: {answer}"
            );
            assert!(answer.get("continue").is_none(), "{at}: {answer}");
            specific["additionalContext"].as_str()
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
        "block" => {
            assert_eq!(
                event, "UserPromptSubmit",
                "{at}: only a prompt is blocked so"
            );
            assert_eq!(answer["decision"], "block", "{at}: {answer}");
            assert!(answer.get("continue").is_none(), "{at}: {answer}");
            answer["reason"].as_str()
        }
        other => panic!("{at}: unknown expectation {other:?}"),
    };
    let text = text.unwrap_or_else(|| panic!("{at}: no reason text: {answer}"));
    assert!(text.starts_with("fusebox"), "{at}: {text}");
    if let Some(phrase) = phrase {
        assert!(text.contains(phrase), "{at}: {text:?} lacks {phrase:?}");
    }
}

/// How the hook events reach the guard.
enum Transport {
    /// `fusebox hook claude-code`, a process per event.
    Command,
    /// A running `fusebox hook serve` on this port.
    Http(u16),
}

/// `fusebox hook serve` on a free loopback port, in front of `stack`.
fn serve(stack: &HookStack, state_dir: &Path, extra: &[&str]) -> (Proc, u16) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut cmd = Command::new(bin("fusebox"));
    cmd.args(["hook", "serve", "--listen", &listen, "--tenant", TENANT])
        .args(["--nats-url", &stack.nats_url])
        .arg("--state-dir")
        .arg(state_dir)
        .args(extra);
    let mut proc = Proc::spawn("fusebox-hook-serve", cmd, &state_dir.join("serve.log"));
    proc.wait_listening(port, Duration::from_secs(20));
    (proc, port)
}

/// One hook event through `transport`, as an [`Output`] the checks read: an HTTP 200 is
/// exit 0 with the body as stdout, any other status exit 2 with the body as stderr.
fn deliver(transport: &Transport, args: &[&str], stdin: &[u8], state_dir: &Path) -> Output {
    let port = match transport {
        Transport::Command => return hook(args, stdin, state_dir),
        Transport::Http(port) => *port,
    };
    let (status, body) = http_post(port, "/claude-code", &[], stdin).expect("endpoint answers");
    let ok = status == 200;
    Output {
        status: ExitStatus::from_raw(if ok { 0 } else { 2 << 8 }),
        stdout: if ok {
            body.clone().into_bytes()
        } else {
            Vec::new()
        },
        stderr: if ok { Vec::new() } else { body.into_bytes() },
    }
}

fn run_case(stack: &HookStack, name: &str) {
    run_case_through(stack, &Transport::Command, name)
}

fn run_case_through(stack: &HookStack, transport: &Transport, name: &str) {
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
        if step.get("status").is_some() {
            check_status(stack, &session, &step, &at);
            continue;
        }
        let event = step["hook"].as_str().unwrap_or("");
        let stdin = match step.get("stdin") {
            Some(Value::String(raw)) => raw.clone().into_bytes(),
            _ => {
                let (id, agent) = (step["id"].as_str(), step["agent"].as_str());
                let body = sub_agent_payload(event, &session, id, step.get("set"), agent);
                serde_json::to_vec(&body).unwrap()
            }
        };
        let out = deliver(transport, &url, &stdin, state.path());
        let expect = step["expect"]
            .as_str()
            .expect("every hook line has an expect");
        check_answer(expect, event, &out, step["reason"].as_str(), &at);
    }
}

/// A `status` line: the fields of `fusebox run --json`'s summary (`status`) and of its
/// place in the tree of runs (`tree`; `SESSION` stands for the session's run) of the
/// session's run, or with `run` of its sub-agent's run `<session>-<run>`.
fn check_status(stack: &HookStack, session: &str, step: &Value, at: &str) {
    let run = match step["run"].as_str() {
        Some(agent) => format!("{session}-{agent}"),
        None => session.to_owned(),
    };
    let status = run_status(&stack.nats_url, &run);
    let expected = |key: &str| match step.get(key) {
        Some(Value::Object(fields)) => fields.clone(),
        _ => serde_json::Map::new(),
    };
    for (key, value) in expected("status") {
        let got = &status["summary"][&key];
        assert_eq!(got, &value, "{at}: {key} of {run} in {}", status["summary"]);
    }
    for (key, value) in expected("tree") {
        let value = match value {
            Value::String(text) => json!(text.replace("SESSION", session)),
            other => other,
        };
        let got = &status["tree"][&key];
        assert_eq!(
            got, &value,
            "{at}: tree.{key} of {run} in {}",
            status["tree"]
        );
    }
}

/// `fusebox run TENANT/RUN --json`: the run as the operator sees it.
fn run_status(nats_url: &str, run: &str) -> Value {
    let out = Command::new(bin("fusebox"))
        .args(["run", &format!("{TENANT}/{run}"), "--json"])
        .args(["--nats-url", nats_url])
        .output()
        .expect("fusebox run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status is JSON")
}

#[tokio::test]
async fn hook_cases_against_a_real_daemon() {
    let stack = stack().await;
    for case in CASES {
        run_case(&stack, case);
    }
}

#[tokio::test]
async fn hook_cases_over_http_against_a_real_daemon() {
    let stack = stack().await;
    let state = tempfile::tempdir().expect("temp dir");
    let (_serve, port) = serve(&stack, state.path(), &[]);
    for case in CASES {
        run_case_through(&stack, &Transport::Http(port), case);
    }
}

/// A sub-agent's events are asked on its tree's subject, naming the session's run as the
/// root (`fusebox.gate.<tenant>.<session run>.<sub-agent run>`), the session's own on its
/// plain one: so a cluster serves a session and its sub-agents on one daemon, and their
/// budgets stay exact. Through the command and through `hook serve` alike.
#[tokio::test]
async fn a_sub_agents_events_name_the_sessions_run_on_the_wire() {
    use futures_util::StreamExt;
    let stack = stack().await;
    let watcher = async_nats::connect(&stack.nats_url).await.expect("connect");
    let mut asked = watcher
        .subscribe("fusebox.gate.>")
        .await
        .expect("subscribe");
    watcher.flush().await.expect("flush");
    let state = tempfile::tempdir().expect("temp dir");
    let (_serve, port) = serve(&stack, state.path(), &[]);
    for (transport, session) in [
        (Transport::Command, "wire-cmd"),
        (Transport::Http(port), "wire-http"),
    ] {
        let steps: [(&str, Option<&str>, Option<&str>); 4] = [
            ("SessionStart", None, None),
            ("SubagentStart", None, Some("a1")),
            ("PreToolUse", Some("s1"), Some("a1")),
            ("PreToolUse", Some("m1"), None),
        ];
        for (event, id, agent) in steps {
            let body = sub_agent_payload(event, session, id, None, agent);
            let url = ["--nats-url", stack.nats_url.as_str()];
            let out = deliver(&transport, &url, body.to_string().as_bytes(), state.path());
            assert!(out.status.success(), "{session} {event}: {out:?}");
        }
        let mut subjects = Vec::new();
        while subjects.len() < steps.len() {
            let message = tokio::time::timeout(Duration::from_secs(5), asked.next())
                .await
                .unwrap_or_else(|_| panic!("{session}: only {subjects:?} asked"))
                .expect("open");
            subjects.push(message.subject.to_string());
        }
        let own = format!("fusebox.gate.{TENANT}.{session}");
        let sub = format!("fusebox.gate.{TENANT}.{session}.{session}-a1");
        assert_eq!(subjects, [own.clone(), sub.clone(), sub, own], "{session}");
    }
}

/// A tool named a business operation (`--op-key`): a repeat of the operation, in another
/// session of the tenant, is denied with the first call's result whole up to
/// `--max-stored-result-bytes` (past 32 KiB, where a result once went as its hash), and
/// past the bound is told the operation completed and where, never given a hash as its
/// result — also when the daemon's `max_event_bytes` is below the bound (the harness's
/// 8 KiB): the result it refuses `too_large` is sent again as its hash.
#[tokio::test]
async fn a_repeated_operation_gets_its_large_result_or_where_it_is() {
    const KIB: usize = 1024;
    let mut overlay: toml::Table =
        toml::from_str(&std::fs::read_to_string(fixtures().join("policy.toml")).unwrap()).unwrap();
    overlay.insert(
        "guard".into(),
        toml::toml! { max_event_bytes = 1048576 }.into(),
    );
    let roomy = HookStack::start_with(&overlay).await;
    let tight = stack().await;
    for (stack, report, size, whole) in [
        (&roomy, "sales", 200 * KIB, true),
        (&roomy, "audit", 450 * KIB, false),
        (&tight, "ledger", 20 * KIB, false),
    ] {
        let at = format!("{report} ({} KiB)", size / KIB);
        let (first, rows, reason) = repeat_operation(stack, report, size);
        if whole {
            let stored = reason.split_once("\nStored result: ").map(|(_, r)| r);
            let stored: Value =
                serde_json::from_str(stored.expect("the result is attached")).unwrap();
            assert_eq!(stored, rows, "{at}: the result whole");
        } else {
            assert!(reason.contains("too large to store"), "{at}: {reason}");
            assert!(reason.contains(&first), "{at}: where it is: {reason}");
            assert!(!reason.contains("Stored result"), "{at}: {reason}");
        }
    }
}

/// An `mcp__shop__export` of `report` answered with `size` bytes of rows in one session,
/// then called again in the next: the first session's run, the rows, and the reason the
/// repeat was denied with (it did not run).
fn repeat_operation(stack: &HookStack, report: &str, size: usize) -> (String, Value, String) {
    let state = tempfile::tempdir().expect("temp dir");
    let args = [
        "--nats-url",
        stack.nats_url.as_str(),
        "--op-key",
        "mcp__shop__export=report",
        "--max-stored-result-bytes",
        "400000",
    ];
    let rows = json!([{"type": "text", "text": format!("{report}:{}", "x".repeat(size))}]);
    let call = json!({"tool_name": "mcp__shop__export", "tool_input": {"report": report}});
    let mut result = call.clone();
    result["tool_response"] = rows.clone();
    let send = |hook_event: &str, session: &str, set: &Value| {
        let body = payload(
            hook_event,
            session,
            Some(&format!("{session}-t1")),
            Some(set),
        );
        hook(&args, &serde_json::to_vec(&body).unwrap(), state.path())
    };
    let at = format!("{report} ({size} bytes)");
    let first = format!("export-{report}-1-{}", std::process::id());
    let start = json!({});
    for (hook_event, set) in [
        ("SessionStart", &start),
        ("PreToolUse", &call),
        ("PostToolUse", &result),
    ] {
        check_answer(
            "nothing",
            hook_event,
            &send(hook_event, &first, set),
            None,
            &at,
        );
    }
    let again = format!("export-{report}-2-{}", std::process::id());
    check_answer(
        "nothing",
        "SessionStart",
        &send("SessionStart", &again, &start),
        None,
        &at,
    );
    let out = send("PreToolUse", &again, &call);
    check_answer("deny", "PreToolUse", &out, Some("already completed"), &at);
    assert_eq!(
        stack.run_summary(TENANT, &again)["steps"],
        0,
        "{at}: it did not run"
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    let reason = answer["hookSpecificOutput"]["permissionDecisionReason"]
        .as_str()
        .unwrap();
    (first, rows, reason.to_owned())
}

/// Off loopback, the endpoint does not start without tokens, and refuses a request
/// without a known one (Claude Code then blocks the call: `onFailure: "block"`).
#[tokio::test]
async fn a_non_loopback_endpoint_requires_a_bearer_token() {
    let stack = stack().await;
    let state = tempfile::tempdir().expect("temp dir");
    let open = Command::new(bin("fusebox"))
        .args([
            "hook",
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--nats-url",
            &stack.nats_url,
        ])
        .output()
        .expect("fusebox runs");
    assert!(!open.status.success());
    assert!(String::from_utf8_lossy(&open.stderr).contains("--tokens"));

    let token = "acme-0123456789abcdef0123456789";
    let tokens = state.path().join("tokens");
    std::fs::write(&tokens, format!("{TENANT} {token}\n")).expect("tokens written");
    let port = free_port();
    let listen = format!("0.0.0.0:{port}");
    let mut cmd = Command::new(bin("fusebox"));
    cmd.args([
        "hook",
        "serve",
        "--listen",
        &listen,
        "--nats-url",
        &stack.nats_url,
    ])
    .arg("--tokens")
    .arg(&tokens)
    .arg("--state-dir")
    .arg(state.path());
    let mut proc = Proc::spawn("fusebox-hook-serve", cmd, &state.path().join("serve.log"));
    proc.wait_listening(port, Duration::from_secs(20));

    let session = format!("token-{}", std::process::id());
    let body = serde_json::to_vec(&payload("PreToolUse", &session, Some("t1"), None)).unwrap();
    for refused in [
        vec![],
        vec!["Authorization: Bearer wrong-token-0123456789".to_owned()],
    ] {
        let headers: Vec<&str> = refused.iter().map(String::as_str).collect();
        let (status, said) = http_post(port, "/claude-code", &headers, &body).unwrap();
        assert_eq!(status, 401, "{said}");
    }
    let bearer = format!("Authorization: Bearer {token}");
    let (status, said) = http_post(port, "/claude-code", &[&bearer], &body).unwrap();
    assert_eq!((status, said.as_str()), (200, "{}"));
    // The token's tenant is the run's.
    assert_eq!(stack.run_summary(TENANT, &session)["steps"], 1);
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
    let mut run = CASES.to_vec();
    run.sort_unstable();
    assert_eq!(on_disk, run, "add a new case file to CASES");
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

    // Events that are not tool calls need no answer from a guard that is down: a prompt
    // goes on (the calls after it are denied).
    for event in [
        "UserPromptSubmit",
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
