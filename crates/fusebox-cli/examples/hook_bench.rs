//! How long `fusebox hook claude-code` takes, as Claude Code sees it: a whole process
//! per hook event (spawn, connect, ask, answer, exit), against a warm fuseboxd, beside
//! the floors measured in the same run: spawning a process that does nothing
//! (`/bin/true`), and a raw NATS request/reply on a warm connection to an echo responder.
//!
//! ```text
//! cargo build --release -p fusebox-cli --bin fusebox --example hook_bench
//! target/release/fusebox-stack &   # or any fuseboxd + nats-server; note its nats_url
//! target/release/examples/hook_bench --nats-url nats://127.0.0.1:PORT \
//!     --fusebox target/release/fusebox --samples 500
//! ```
//!
//! Each sample is one PreToolUse (the hook on the critical path before every tool call)
//! and, not timed, its PostToolUse; every call is a different command with a different
//! result, so the guard answers `execute` throughout, as for a legitimate session.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;

struct Options {
    nats_url: String,
    fusebox: String,
    samples: usize,
}

fn options() -> Options {
    let mut options = Options {
        nats_url: "nats://127.0.0.1:4222".to_owned(),
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
            "--fusebox" => options.fusebox = value,
            "--samples" => options.samples = value.parse().expect("--samples N"),
            _ => panic!("unknown flag {flag} (--nats-url, --fusebox, --samples)"),
        }
    }
    options
}

/// Sessions of 200 calls each, well inside the default step budget.
fn payload(session: &str, event: &str, i: usize) -> Vec<u8> {
    let mut payload = serde_json::json!({
        "session_id": format!("{session}-{}", i / 200),
        "hook_event_name": event,
        "tool_name": "Bash",
        "tool_input": {"command": format!("cat page-{i}.txt")},
        "tool_use_id": format!("toolu_bench_{i}"),
    });
    if event == "PostToolUse" {
        payload["tool_response"] = serde_json::json!({"stdout": format!("page {i}")});
    }
    serde_json::to_vec(&payload).expect("JSON values serialise")
}

/// One process, stdin in, stdout read to the end: what Claude Code waits for.
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

fn percentiles(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{name:<44} p50 {:>7.2} ms   p99 {:>7.2} ms   (n={})",
        ms(at(0.5)),
        ms(at(0.99)),
        samples.len()
    );
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
    let hook_args = [
        "hook",
        "claude-code",
        "--nats-url",
        options.nats_url.as_str(),
    ];

    // Warm up: the daemon's run exists, the binary is in the page cache.
    for i in 0..10 {
        spawn(
            &options.fusebox,
            &hook_args,
            &payload(&session, "PreToolUse", i),
        );
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
    let body = payload(&session, "PreToolUse", 0);
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
            &serde_json::to_vec(&serde_json::json!({
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

    let mut hook = Vec::new();
    for i in 10..options.samples + 10 {
        let (took, answer) = spawn(
            &options.fusebox,
            &hook_args,
            &payload(&session, "PreToolUse", i),
        );
        assert_eq!(
            answer,
            b"{}\n",
            "the guard must let a legitimate call run: {}",
            String::from_utf8_lossy(&answer)
        );
        hook.push(took);
        spawn(
            &options.fusebox,
            &hook_args,
            &payload(&session, "PostToolUse", i),
        );
    }

    println!(
        "fusebox hook claude-code, whole process, warm daemon ({})",
        options.nats_url
    );
    percentiles("spawn floor: /bin/true", spawn_floor);
    percentiles("raw NATS request/reply (warm connection)", raw);
    percentiles("gate request/reply (warm client, incl. commit)", gate);
    percentiles("hook process, PreToolUse -> execute", hook);
}
