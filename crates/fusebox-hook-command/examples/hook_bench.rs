//! How long the coding-agent hooks take, as the agent sees them, against a warm
//! fuseboxd, beside the floors measured in the same run:
//!
//! - each command hook (`fusebox-hook claude-code | codex | gemini-cli | opencode |
//!   copilot-cli`, the lean binary the printed settings and the OpenCode plugin run): a
//!   whole process per hook event (spawn, connect, ask, answer, exit), beside spawning a
//!   process that does nothing (`/bin/true`), and the same hook run through the full CLI
//!   (`fusebox hook claude-code`) for comparison;
//! - the HTTP hook (`fusebox hook serve`, Claude Code's `"type": "http"`): one POST on a
//!   kept-alive connection, beside a gate request/reply from a warm client (and a raw
//!   NATS request/reply to an echo responder).
//!
//! ```text
//! cargo build --release -p fusebox-hook-command --bin fusebox-hook --example hook_bench
//! cargo build --release -p fusebox-cli --bin fusebox   # for `hook serve`
//! target/debug/fusebox-stack &   # or any fuseboxd + nats-server; note its nats_url
//! target/release/examples/hook_bench --nats-url nats://127.0.0.1:PORT \
//!     --hook target/release/fusebox-hook --fusebox target/release/fusebox --samples 500
//! ```
//!
//! Each sample is one call event (the hook on the critical path before every tool call)
//! and, not timed, its result; every call is a different command with a different
//! result, so the guard answers `execute` throughout, as for a legitimate session.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};

struct Options {
    nats_url: String,
    hook: String,
    fusebox: String,
    samples: usize,
}

fn options() -> Options {
    let mut options = Options {
        nats_url: "nats://127.0.0.1:4222".to_owned(),
        hook: "target/release/fusebox-hook".to_owned(),
        fusebox: "target/release/fusebox".to_owned(),
        samples: 500,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--nats-url" => options.nats_url = value,
            "--hook" => options.hook = value,
            "--fusebox" => options.fusebox = value,
            "--samples" => options.samples = value.parse().expect("--samples N"),
            _ => panic!("unknown flag {flag} (--nats-url, --hook, --fusebox, --samples)"),
        }
    }
    options
}

/// One agent's hook protocol: its call and result payloads, and the answer that lets
/// the call run.
#[derive(Clone, Copy)]
enum Agent {
    ClaudeCode,
    Codex,
    GeminiCli,
    /// What the OpenCode plugin awaits per hook: the same lean binary, one process.
    Opencode,
    CopilotCli,
}

impl Agent {
    fn protocol(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "claude-code",
            Agent::Codex => "codex",
            Agent::GeminiCli => "gemini-cli",
            Agent::Opencode => "opencode",
            Agent::CopilotCli => "copilot-cli",
        }
    }

    /// `args` with what the hook is told of the event: Copilot CLI's payloads do not
    /// name theirs, so its hooks are run with `--event`.
    fn args<'a>(self, args: &[&'a str], result: bool) -> Vec<&'a str> {
        let mut args = args.to_vec();
        if let Agent::CopilotCli = self {
            args.extend(["--event", if result { "postToolUse" } else { "preToolUse" }]);
        }
        args
    }

    /// Sessions of 200 calls each, well inside the default step budget.
    fn payload(self, session: &str, result: bool, i: usize) -> Vec<u8> {
        let session = format!("{session}-{}-{}", self.protocol(), i / 200);
        let command = json!({"command": format!("cat page-{i}.txt")});
        let output = format!("page {i}");
        let payload = match self {
            Agent::ClaudeCode | Agent::Codex => {
                let mut p = json!({
                    "session_id": session,
                    "hook_event_name": if result { "PostToolUse" } else { "PreToolUse" },
                    "tool_name": "Bash", "tool_input": command,
                    "tool_use_id": format!("toolu_bench_{i}"),
                });
                if result {
                    p["tool_response"] = json!({"stdout": output});
                }
                p
            }
            Agent::GeminiCli => {
                let mut p = json!({
                    "session_id": session,
                    "hook_event_name": if result { "AfterTool" } else { "BeforeTool" },
                    "timestamp": format!("2026-12-01T00:00:00.{i:06}{}Z", u8::from(result)),
                    "tool_name": "run_shell_command", "tool_input": command,
                });
                if result {
                    p["tool_response"] = json!({"llmContent": output, "returnDisplay": output});
                }
                p
            }
            Agent::CopilotCli => {
                let mut p = json!({
                    "sessionId": session, "timestamp": 1_796_000_000_000u64 + 2 * i as u64 + u64::from(result),
                    "cwd": "/w", "toolName": "bash", "toolArgs": command,
                });
                if result {
                    p["toolResult"] = json!({"resultType": "success", "textResultForLlm": output});
                }
                p
            }
            Agent::Opencode => {
                let mut p = json!({
                    "hook": if result { "tool.execute.after" } else { "tool.execute.before" },
                    "sessionID": session, "callID": format!("call_bench_{i}"),
                    "tool": "bash", "args": command,
                });
                if result {
                    p["output"] = json!(output);
                }
                p
            }
        };
        serde_json::to_vec(&payload).expect("JSON values serialise")
    }
}

/// One process, stdin in, stdout read to the end: what the agent waits for.
fn spawn(program: &str, args: &[&str], stdin: &[u8]) -> (Duration, Vec<u8>) {
    let start = Instant::now();
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    // /bin/true may exit before reading its stdin; that is not an error here.
    let _ = child.stdin.take().expect("piped").write_all(stdin);
    let output = child.wait_with_output().expect("child runs");
    (start.elapsed(), output.stdout)
}

fn percentiles(name: &str, mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{name:<48} p50 {:>7.2} ms   p99 {:>7.2} ms   (n={})",
        ms(at(0.5)),
        ms(at(0.99)),
        samples.len()
    );
    at(0.5)
}

/// A kept-alive HTTP/1.1 connection to `fusebox hook serve`.
struct HttpHook {
    reader: BufReader<TcpStream>,
    port: u16,
}

impl HttpHook {
    fn connect(port: u16) -> HttpHook {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("endpoint listens");
        stream.set_nodelay(true).expect("nodelay");
        HttpHook {
            reader: BufReader::new(stream),
            port,
        }
    }

    fn post(&mut self, body: &[u8]) -> Vec<u8> {
        let head = format!(
            "POST /claude-code HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.port,
            body.len()
        );
        let stream = self.reader.get_mut();
        stream.write_all(head.as_bytes()).expect("request sent");
        stream.write_all(body).expect("request sent");
        let mut length = 0;
        let mut status = String::new();
        self.reader.read_line(&mut status).expect("status line");
        assert!(status.contains(" 200 "), "endpoint answered {status}");
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).expect("header line");
            if line == "\r\n" {
                break;
            }
            if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = value.trim().parse().expect("a length");
            }
        }
        let mut answer = vec![0; length];
        self.reader.read_exact(&mut answer).expect("body");
        answer
    }
}

fn start_endpoint(options: &Options, state_dir: &str) -> (Child, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new(&options.fusebox)
        .args(["hook", "serve", "--nats-url", &options.nats_url])
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--state-dir",
            state_dir,
        ])
        .stderr(Stdio::null())
        .spawn()
        .expect("fusebox hook serve starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "fusebox hook serve did not listen"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, port)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let options = options();
    let session = format!(
        "bench-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_millis()
    );
    let state = std::env::temp_dir().join(format!("fusebox-hook-bench-{}", std::process::id()));
    let state_dir = state.to_string_lossy().into_owned();
    let hook_args = |agent: Agent| {
        [
            agent.protocol().to_owned(),
            "--nats-url".to_owned(),
            options.nats_url.clone(),
            "--state-dir".to_owned(),
            state_dir.clone(),
        ]
    };
    let agents = [
        Agent::ClaudeCode,
        Agent::Codex,
        Agent::GeminiCli,
        Agent::Opencode,
        Agent::CopilotCli,
    ];

    // Warm up: the daemon's runs exist, the binary is in the page cache.
    for agent in agents {
        let args = hook_args(agent);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        for i in 0..10 {
            spawn(
                &options.hook,
                &agent.args(&args, false),
                &agent.payload(&session, false, i),
            );
            spawn(
                &options.hook,
                &agent.args(&args, true),
                &agent.payload(&session, true, i),
            );
        }
    }

    let mut spawn_floor = Vec::new();
    for _ in 0..options.samples {
        spawn_floor.push(spawn("/bin/true", &[], b"").0);
    }

    let nats = async_nats::connect(&options.nats_url)
        .await
        .expect("NATS reachable");
    let mut echo = nats.subscribe("bench.hook.echo").await.expect("subscribe");
    let responder = nats.clone();
    tokio::spawn(async move {
        while let Some(message) = echo.next().await {
            if let Some(reply) = message.reply {
                let _ = responder.publish(reply, message.payload).await;
            }
        }
    });
    let body = Agent::ClaudeCode.payload(&session, false, 0);
    let mut raw = Vec::new();
    for _ in 0..options.samples {
        let start = Instant::now();
        nats.request("bench.hook.echo", body.clone().into())
            .await
            .expect("echo answers");
        raw.push(start.elapsed());
    }

    let client = fusebox_client::FuseboxClient::new(nats.clone(), Default::default());
    let mut gate = Vec::new();
    for i in 0..options.samples {
        let event = fusebox_core::parse_event(
            &serde_json::to_vec(&json!({
                "v": 1, "id": format!("bench-gate-{i}"), "tenant": "default",
                "run": format!("{session}-gate-{}", i / 200), "ts_ms": 1,
                "type": "tool_call", "call_id": format!("c{i}"), "tool": "Bash",
                "args": {"command": format!("cat page-{i}.txt")},
            }))
            .expect("JSON values serialise"),
        )
        .expect("a valid event");
        let start = Instant::now();
        let answer = client.gate(&event).await;
        gate.push(start.elapsed());
        assert!(answer.may_run(), "the guard must let a legitimate call run");
    }

    println!("fusebox hooks, warm daemon ({})", options.nats_url);
    let spawn_p50 = percentiles("spawn floor: /bin/true", spawn_floor);
    percentiles("raw NATS request/reply (warm connection)", raw);
    let gate_p50 = percentiles("gate request/reply (warm client, incl. commit)", gate);

    // The lean binary for each agent, then the full CLI running the same hook (in
    // sessions of its own: the same ids would be answered from the daemon's dedup).
    let full_cli = {
        let mut args = vec!["hook".to_owned()];
        args.extend(hook_args(Agent::ClaudeCode));
        (
            options.fusebox.as_str(),
            args,
            Agent::ClaudeCode,
            "fusebox hook",
            format!("{session}-cli"),
        )
    };
    let runs = agents
        .iter()
        .map(|&agent| {
            let args = hook_args(agent).to_vec();
            (
                options.hook.as_str(),
                args,
                agent,
                "fusebox-hook",
                session.clone(),
            )
        })
        .chain([full_cli]);
    for (program, args, agent, name, session) in runs {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut hook = Vec::new();
        for i in 10..options.samples + 10 {
            let (took, answer) = spawn(
                program,
                &agent.args(&args, false),
                &agent.payload(&session, false, i),
            );
            let answer: Value = serde_json::from_slice(&answer).expect("the answer is JSON");
            assert_eq!(
                answer,
                json!({}),
                "the guard must let a legitimate call run"
            );
            hook.push(took);
            spawn(
                program,
                &agent.args(&args, true),
                &agent.payload(&session, true, i),
            );
        }
        let p50 = percentiles(
            &format!("{name} {} process, call -> execute", agent.protocol()),
            hook,
        );
        println!(
            "{:<48} {:.2}x the spawn floor, +{:.2} ms; gate +{:.2} ms",
            "",
            p50.as_secs_f64() / spawn_p50.as_secs_f64(),
            (p50.as_secs_f64() - spawn_p50.as_secs_f64()) * 1e3,
            (p50.as_secs_f64() - gate_p50.as_secs_f64()) * 1e3
        );
    }

    let (mut endpoint, port) = start_endpoint(&options, &state_dir);
    let mut http = HttpHook::connect(port);
    let http_session = format!("{session}-http");
    for i in 0..10 {
        http.post(&Agent::ClaudeCode.payload(&http_session, false, i));
    }
    let mut posts = Vec::new();
    for i in 10..options.samples + 10 {
        let start = Instant::now();
        let answer = http.post(&Agent::ClaudeCode.payload(&http_session, false, i));
        posts.push(start.elapsed());
        assert_eq!(answer, b"{}", "the guard must let a legitimate call run");
        http.post(&Agent::ClaudeCode.payload(&http_session, true, i));
    }
    let p50 = percentiles("hook serve, HTTP POST PreToolUse -> execute", posts);
    println!(
        "{:<48} gate +{:.2} ms",
        "",
        (p50.as_secs_f64() - gate_p50.as_secs_f64()) * 1e3
    );
    let _ = endpoint.kill();
    let _ = endpoint.wait();
    let _ = std::fs::remove_dir_all(&state);
}
