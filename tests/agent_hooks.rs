//! `fusebox hook codex` and `fusebox hook gemini-cli` against a real nats-server and
//! fuseboxd: each agent's recorded payloads (tests/fixtures/<agent>-hooks/payloads, from
//! the real CLIs) fed in the sessions of its `cases/`, each answer checked against that
//! agent's hook protocol. The fixtures' README describes the case lines; the language is
//! Claude Code's (tests/claude_code_hook.rs) with each protocol's own answers. And
//! `fusebox hook opencode`'s subjects for a tree of sessions.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use fusebox_e2e::hooks::{run_hook, HookStack};
use serde_json::{json, Value};

const TENANT: &str = "hooks";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Agent {
    Codex,
    GeminiCli,
}

impl Agent {
    fn protocol(self) -> &'static str {
        match self {
            Agent::Codex => "codex",
            Agent::GeminiCli => "gemini-cli",
        }
    }

    fn fixtures(self) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures")
            .join(format!("{}-hooks", self.protocol()))
    }

    fn cases(self) -> &'static [&'static str] {
        match self {
            Agent::Codex => &[
                "bad_input",
                "compaction",
                "legitimate",
                "merged_streams",
                "prompts",
                "rerun",
                "runaway",
                "sub_agents",
            ],
            Agent::GeminiCli => &[
                "bad_input",
                "legitimate",
                "merged_streams",
                "prompts",
                "rerun",
                "runaway",
                "sub_agents",
            ],
        }
    }
}

fn hook(agent: Agent, args: &[&str], stdin: &[u8], state_dir: &Path) -> Output {
    let state = state_dir.to_str().expect("temp paths are UTF-8");
    let mut all = vec!["--tenant", TENANT, "--state-dir", state];
    all.extend_from_slice(args);
    run_hook(agent.protocol(), &all, stdin)
}

/// A payload fixture with `set` laid over it and its placeholders filled (in `set` too):
/// the session, the tool use id (Codex), the event's timestamp (Gemini CLI: a fresh one
/// per line unless the case names one), the sub-agent whose hook it is (Codex: `agent`,
/// `AGENT_ID`; added with its `agent_type` to a payload of the main agent's shape).
fn payload(agent: Agent, step: &Value, session: &str, line: usize) -> Value {
    let event = step["hook"].as_str().expect("a hook line names its event");
    let path = agent
        .fixtures()
        .join("payloads")
        .join(format!("{event}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let mut payload: Value = serde_json::from_str(&text).expect("payload fixtures are JSON");
    if let Some(Value::Object(fields)) = step.get("set") {
        for (key, value) in fields {
            payload[key] = value.clone();
        }
    }
    let sub_agent = step["agent"].as_str();
    if let (Some(_), None) = (sub_agent, payload.get("agent_id")) {
        payload["agent_id"] = json!("AGENT_ID");
        payload["agent_type"] = json!("default");
    }
    let fresh = format!("2026-12-01T19:22:{:02}.{:03}Z", line / 1000, line % 1000);
    let text = payload
        .to_string()
        .replace("SESSION", session)
        .replace("TOOL_USE_ID", step["id"].as_str().unwrap_or("TOOL_USE_ID"))
        .replace("TURN_ID", step["turn"].as_str().unwrap_or("TURN_ID"))
        .replace("TIMESTAMP", step["at"].as_str().unwrap_or(&fresh))
        .replace("AGENT_ID", sub_agent.unwrap_or("AGENT_ID"));
    serde_json::from_str(&text).expect("still JSON")
}

/// The answer's text the case's `reason` is looked for in, after the protocol checks.
/// `event` is the hook's: a `context` is its own (after a result; a sub-agent's start).
fn check_codex(expect: &str, event: &str, out: &Output, at: &str) -> Option<String> {
    let specific = |answer: &Value| answer["hookSpecificOutput"].clone();
    let answer = json_answer(out, at)?;
    match expect {
        "nothing" => {
            assert_eq!(answer, json!({}), "{at}");
            None
        }
        "warn" | "context" => {
            let event = if expect == "warn" {
                "PreToolUse"
            } else {
                event
            };
            let s = specific(&answer);
            assert_eq!(s["hookEventName"], event, "{at}: {answer}");
            assert!(s.get("permissionDecision").is_none(), "{at}: {answer}");
            text(&s["additionalContext"], at)
        }
        "block" => {
            assert_eq!(answer["decision"], "block", "{at}: {answer}");
            assert!(answer.get("hookSpecificOutput").is_none(), "{at}: {answer}");
            text(&answer["reason"], at)
        }
        "deny" | "kept" => {
            let s = specific(&answer);
            assert_eq!(s["hookEventName"], "PreToolUse", "{at}: {answer}");
            assert_eq!(s["permissionDecision"], "deny", "{at}: {answer}");
            // `continue: false` would be taken for a failed hook, and the tool would run.
            assert!(answer.get("continue").is_none(), "{at}: {answer}");
            let reason = text(&s["permissionDecisionReason"], at);
            if expect == "kept" {
                let reason = reason.as_deref().unwrap_or("");
                assert!(
                    reason.contains("every further tool call is refused"),
                    "{at}: {reason}"
                );
            }
            reason
        }
        other => panic!("{at}: unknown expectation {other:?}"),
    }
}

fn check_gemini(expect: &str, out: &Output, at: &str) -> Option<String> {
    if expect == "unreadable" {
        assert_eq!(out.status.code(), Some(2), "{at}: bad input must exit 2");
    }
    let answer = json_answer(out, at)?;
    match expect {
        "nothing" => {
            assert_eq!(answer, json!({}), "{at}");
            None
        }
        "context" => {
            let s = &answer["hookSpecificOutput"];
            assert_eq!(s["hookEventName"], "AfterTool", "{at}: {answer}");
            assert!(answer.get("decision").is_none(), "{at}: {answer}");
            text(&s["additionalContext"], at)
        }
        "deny" | "unreadable" => {
            assert_eq!(answer["decision"], "deny", "{at}: {answer}");
            assert!(answer.get("continue").is_none(), "{at}: {answer}");
            text(&answer["reason"], at)
        }
        "stop" => {
            assert_eq!(answer["continue"], false, "{at}: {answer}");
            assert_eq!(answer["decision"], "deny", "{at}: {answer}");
            assert_eq!(answer["stopReason"], answer["reason"], "{at}: {answer}");
            text(&answer["stopReason"], at)
        }
        other => panic!("{at}: unknown expectation {other:?}"),
    }
}

/// The JSON on stdout, or `None` for Codex's exit-2 answer (a deny with the reason on
/// stderr), which is checked here.
fn json_answer(out: &Output, at: &str) -> Option<Value> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(2) && out.stdout.is_empty() {
        assert!(
            stderr.contains("fusebox:"),
            "{at}: the reason goes to stderr"
        );
        return None;
    }
    assert!(
        out.status.success() || out.status.code() == Some(2),
        "{at}: exit {:?}: {stderr}",
        out.status
    );
    Some(
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{at}: stdout is not JSON ({e}): {:?}", out.stdout)),
    )
}

fn text(value: &Value, at: &str) -> Option<String> {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("{at}: no text: {value}"));
    assert!(text.starts_with("fusebox"), "{at}: {text}");
    Some(text.to_owned())
}

fn run_case(stack: &HookStack, agent: Agent, name: &str) {
    let path = agent.fixtures().join("cases").join(format!("{name}.jsonl"));
    let cases = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let state = tempfile::tempdir().expect("temp dir");
    let session = format!("{name}-{}", std::process::id());
    let url = ["--nats-url", stack.nats_url.as_str()];
    for (number, line) in cases.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = format!("{}/{name}.jsonl:{}", agent.protocol(), number + 1);
        let step: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{at}: {e}"));
        if step.get("status").is_some() {
            check_status(stack, &session, &step, &at);
            continue;
        }
        let stdin = match step.get("stdin") {
            Some(Value::String(raw)) => raw.clone().into_bytes(),
            _ => serde_json::to_vec(&payload(agent, &step, &session, number)).unwrap(),
        };
        let out = hook(agent, &url, &stdin, state.path());
        let expect = step["expect"]
            .as_str()
            .expect("every hook line has an expect");
        let said = match agent {
            Agent::Codex => check_codex(expect, step["hook"].as_str().unwrap_or(""), &out, &at),
            Agent::GeminiCli => check_gemini(expect, &out, &at),
        };
        if let Some(phrase) = step["reason"].as_str() {
            let said = said.unwrap_or_else(|| String::from_utf8_lossy(&out.stderr).into_owned());
            assert!(said.contains(phrase), "{at}: {said:?} lacks {phrase:?}");
        }
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
    let out = std::process::Command::new(fusebox_e2e::bin("fusebox"))
        .args(["run", &format!("{TENANT}/{run}"), "--json"])
        .args(["--nats-url", &stack.nats_url])
        .output()
        .expect("fusebox run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: Value = serde_json::from_slice(&out.stdout).expect("status is JSON");
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

#[tokio::test]
async fn codex_cases_against_a_real_daemon() {
    let stack = HookStack::start(&Agent::Codex.fixtures().join("policy.toml")).await;
    for case in Agent::Codex.cases() {
        run_case(&stack, Agent::Codex, case);
    }
}

#[tokio::test]
async fn gemini_cli_cases_against_a_real_daemon() {
    let stack = HookStack::start(&Agent::GeminiCli.fixtures().join("policy.toml")).await;
    for case in Agent::GeminiCli.cases() {
        run_case(&stack, Agent::GeminiCli, case);
    }
}

#[test]
fn every_case_file_is_run() {
    for agent in [Agent::Codex, Agent::GeminiCli] {
        let mut on_disk: Vec<String> = std::fs::read_dir(agent.fixtures().join("cases"))
            .expect("cases dir")
            .map(|e| {
                let path = e.unwrap().path();
                path.file_stem().unwrap().to_string_lossy().into_owned()
            })
            .collect();
        on_disk.sort();
        assert_eq!(
            on_disk,
            agent.cases(),
            "{agent:?}: add the case to Agent::cases"
        );
    }
}

/// With no guard to answer, a tool call is denied within the hook's own deadline (never
/// a hang, never let through unasked) or, by choice, runs unguarded; the other events
/// need no answer (a prompt goes on: the calls after it are denied).
#[test]
fn guard_down_denies_within_the_deadline_and_allow_lets_calls_run() {
    // A listener that accepts and never speaks: the worst kind of silent guard.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("nats://{}", silent.local_addr().unwrap());
    let down = ["--nats-url", url.as_str(), "--timeout", "500ms"];
    let allow = [&down[..], &["--on-error", "allow"]].concat();
    for (agent, call, result, prompt) in [
        (
            Agent::Codex,
            "PreToolUse",
            "PostToolUse",
            "UserPromptSubmit",
        ),
        (Agent::GeminiCli, "BeforeTool", "AfterTool", "BeforeAgent"),
    ] {
        let state = tempfile::tempdir().expect("temp dir");
        // Each invocation another call (tool use id, timestamp).
        let body = |event: &str, call: &str| {
            let step = json!({"hook": event, "id": call, "at": call});
            serde_json::to_vec(&payload(agent, &step, "down", 1)).expect("JSON")
        };
        let check = |expect: &str, out: &Output, at: &str| match agent {
            Agent::Codex => check_codex(expect, result, out, at),
            Agent::GeminiCli => check_gemini(expect, out, at),
        };

        let started = Instant::now();
        let out = hook(agent, &down, &body(call, "t1"), state.path());
        let took = started.elapsed();
        let reason = check("deny", &out, "silent guard").unwrap();
        assert!(reason.contains("could not be asked"), "{agent:?}: {reason}");
        assert!(
            took < Duration::from_secs(3),
            "{agent:?}: the hook must answer near its deadline, not hang ({took:?})"
        );

        let out = hook(agent, &allow, &body(call, "t2"), state.path());
        let said = match agent {
            Agent::Codex => check("warn", &out, "allow"),
            // Gemini CLI has no context on BeforeTool: the call runs, the note follows
            // on its result.
            Agent::GeminiCli => {
                check("nothing", &out, "allow");
                let out = hook(agent, &allow, &body(result, "t3"), state.path());
                check("context", &out, "allow, the result")
            }
        };
        assert!(said.unwrap().contains("unguarded"), "{agent:?}");

        for event in ["SessionStart", prompt, "SessionEnd"] {
            let out = hook(agent, &down, &body(event, "t4"), state.path());
            check("nothing", &out, event);
        }
    }
}

/// A hook that hangs (here: the agent never closes its stdin) still answers, with a
/// refusal, before the agent's own timeout: `--timeout` + 1.5 s, against the printed 8 s.
#[test]
fn a_hung_hook_refuses_before_the_agents_timeout() {
    use std::process::{Command, Stdio};
    for agent in [Agent::Codex, Agent::GeminiCli] {
        let state = tempfile::tempdir().expect("temp dir");
        let started = Instant::now();
        let mut child = Command::new(fusebox_e2e::bin("fusebox"))
            .args([
                "hook",
                agent.protocol(),
                "--timeout",
                "500ms",
                "--state-dir",
            ])
            .arg(state.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("fusebox runs");
        let stdin = child.stdin.take();
        while child.try_wait().expect("child status").is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(8),
                "{agent:?}: still no answer after the agent's timeout"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(stdin);
        let out = child.wait_with_output().expect("hook output");
        let expect = match agent {
            Agent::Codex => "deny",
            Agent::GeminiCli => "unreadable",
        };
        let said = match agent {
            Agent::Codex => check_codex(expect, "PreToolUse", &out, "hung"),
            Agent::GeminiCli => check_gemini(expect, &out, "hung"),
        };
        let said = said.unwrap_or_else(|| String::from_utf8_lossy(&out.stderr).into_owned());
        assert!(said.contains("fusebox"), "{agent:?}: {said}");
        assert_eq!(out.status.code(), Some(2), "{agent:?}");
    }
}

/// OpenCode's sub-agents are child sessions, and a child may start its own: every event
/// of the tree is asked on its tree's subject, naming the root session's run
/// (`fusebox.gate.<tenant>.<root run>.<child run>`) from the `rootID` the plugin sends,
/// the root session's own on its plain one: so a cluster serves the whole tree on one
/// daemon. A payload of a plugin from before `rootID` names its parent as the root.
#[tokio::test]
async fn opencode_sub_agents_events_name_the_root_sessions_run_on_the_wire() {
    use futures_util::StreamExt;
    let stack = HookStack::start(&Agent::Codex.fixtures().join("policy.toml")).await;
    let watcher = async_nats::connect(&stack.nats_url).await.expect("connect");
    let mut asked = watcher
        .subscribe("fusebox.gate.>")
        .await
        .expect("subscribe");
    watcher.flush().await.expect("flush");
    let state = tempfile::tempdir().expect("temp dir");
    let state_path = state.path().to_str().expect("temp paths are UTF-8");
    let call = |session: &str, id: &str| {
        json!({"hook": "tool.execute.before", "sessionID": session, "callID": id,
               "tool": "bash", "args": {"command": format!("echo {id}")}})
    };
    let child = |mut payload: Value, parent: &str, root: Option<&str>| {
        payload["parentID"] = json!(parent);
        if let Some(root) = root {
            payload["rootID"] = json!(root);
        }
        payload
    };
    let created = |session: &str| json!({"hook": "session.created", "sessionID": session});
    let steps = [
        created("ses_root"),
        call("ses_root", "c0"),
        child(created("ses_a"), "ses_root", Some("ses_root")),
        child(call("ses_a", "c1"), "ses_root", Some("ses_root")),
        child(created("ses_b"), "ses_a", Some("ses_root")),
        child(call("ses_b", "c2"), "ses_a", Some("ses_root")),
        // An older plugin: no rootID, the parent stands for the root.
        child(call("ses_a", "c3"), "ses_root", None),
    ];
    let url = ["--nats-url", stack.nats_url.as_str()];
    for step in &steps {
        let mut args = vec!["--tenant", TENANT, "--state-dir", state_path];
        args.extend_from_slice(&url);
        let out = run_hook("opencode", &args, step.to_string().as_bytes());
        assert!(out.status.success(), "{step}: {out:?}");
    }
    let mut subjects = Vec::new();
    while subjects.len() < steps.len() {
        let message = tokio::time::timeout(Duration::from_secs(5), asked.next())
            .await
            .unwrap_or_else(|_| panic!("only {subjects:?} asked"))
            .expect("open");
        subjects.push(message.subject.to_string());
    }
    let own = format!("fusebox.gate.{TENANT}.ses_root");
    let a = format!("fusebox.gate.{TENANT}.ses_root.ses_a");
    let b = format!("fusebox.gate.{TENANT}.ses_root.ses_b");
    assert_eq!(
        subjects,
        [&own, &own, &a, &a, &b, &b, &a].map(String::as_str)
    );
}
