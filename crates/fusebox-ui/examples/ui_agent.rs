//! The agents the operator's page is tested with (tests/ui/), behind the real gate:
//!
//! * `--mode loop`: a model turn, then the same search again and again, its query
//!   carrying markup (`<script>…`), after a compaction — a runaway the guard warns,
//!   blocks and stops with STOPPED_LOOP_GUARD;
//! * `--mode steady`: a new page of a listing each step, with progress, until stopped
//!   from outside (the page's cancel button);
//! * `--mode hold`: one call with an op_key that is allowed and never reports its result,
//!   so the key stays in flight for an operator to resolve;
//! * `--mode tree`: a small tree of runs — the run, two sub-agents `<run>-a` and
//!   `<run>-b`, and `<run>-a-1` below the first — each with a model turn ($0.01), the
//!   last with a model call in flight (1000 tokens, $0.02 held), then steady steps in
//!   turn until stopped from outside (the page's cancel of a node);
//! * `--mode done`: two steps, then `run_finished` — a run that completed;
//! * `--mode crowd`: `--max-calls` runs `<run>-<n>` that only start (agent `crowd`),
//!   enough to fill more than one page of the runs list; prints `STARTED <n>`.
//!
//! Prints one line per answer, and `STOPPED <terminal state> <reason>` once it knows
//! the run is stopped (in tree mode one line per run, its id last); `--pause-ms` between
//! calls keeps a run going long enough to be watched.

use std::time::Duration;

use clap::{Parser, ValueEnum};
use fusebox_client::{ClientOptions, FuseboxClient, Gate, NatsArgs, RunHandle, RunOptions};
use fusebox_core::event::{
    Args as CallArgs, ModelTurn, Output, ResultKind, ToolCall, ToolResult, Usage,
};
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Mode {
    Loop,
    Steady,
    Hold,
    Tree,
    Done,
    Crowd,
}

#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    nats: NatsArgs,
    #[arg(long, value_enum)]
    mode: Mode,
    #[arg(long)]
    tenant: String,
    #[arg(long)]
    run: String,
    #[arg(long, default_value_t = 300)]
    pause_ms: u64,
    /// Give up after this many calls.
    #[arg(long, default_value_t = 200)]
    max_calls: u64,
}

fn success(call_id: String, tool: &str, output: Value, progress: Option<u64>) -> ToolResult {
    ToolResult {
        call_id,
        tool: tool.to_owned(),
        kind: ResultKind::Success,
        code: None,
        retry_after_ms: None,
        terminal: None,
        output: Some(Output::Json(output)),
        progress,
    }
}

fn say(gate: &Gate) {
    match gate {
        Gate::Decided(d) => println!(
            "{} {}",
            d.action.as_str(),
            d.reason.map(|r| r.as_str()).unwrap_or("")
        ),
        Gate::Refused(e) => println!("refused {}", e.message),
        Gate::Unanswered { error, .. } => println!("unanswered {error}"),
    }
}

/// One steady step: the next page of a listing, with progress; false once it may not run.
async fn step(run: &RunHandle, page: u64) -> Result<bool, Box<dyn std::error::Error>> {
    let (call_id, gate) = run.call("list_issues", json!({"page": page})).await;
    say(&gate);
    if !gate.may_run() {
        return Ok(false);
    }
    let output = json!({"issues": [format!("ISSUE-{page}")]});
    run.tool_result(success(call_id, "list_issues", output, Some(page)))
        .await?;
    Ok(true)
}

fn say_stopped(stop: &fusebox_core::Decision, run: Option<&str>) {
    let report = stop.report.as_ref();
    println!(
        "STOPPED {} {}{}",
        report.map_or("?", |r| r.terminal_state.as_str()),
        report.map_or("?", |r| r.reason.as_str()),
        run.map_or(String::new(), |r| format!(" {r}"))
    );
}

/// `--mode tree`: the runs start parent first, then step in turn until each is stopped.
async fn tree(client: &FuseboxClient, args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let root = args.run.as_str();
    let (a, b, a1) = (
        format!("{root}-a"),
        format!("{root}-b"),
        format!("{root}-a-1"),
    );
    let shape = [
        (root, None, "planner"),
        (a.as_str(), Some(root), "researcher"),
        (b.as_str(), Some(root), "writer"),
        (a1.as_str(), Some(a.as_str()), "fetcher"),
    ];
    let mut runs = Vec::new();
    for (id, parent, agent) in shape {
        let options = RunOptions {
            agent: Some(agent.to_owned()),
            parent: parent.map(str::to_owned),
            ..RunOptions::default()
        };
        let run = client.start_run(&args.tenant, id, options).await?;
        run.model_turn(ModelTurn {
            stop_reason: "tool_use".to_owned(),
            usage: None,
            cost_usd: Some(0.01),
            valid: None,
        })
        .await?;
        runs.push(run);
    }
    // The grandchild's next model call is in flight (never answered): its reservation
    // is held by it and every run above it.
    if let Some(grandchild) = runs.last() {
        grandchild.model_call(Some(1000), Some(0.02)).await?;
    }
    let pause = Duration::from_millis(args.pause_ms);
    for page in 1..=args.max_calls {
        let mut going = false;
        for run in runs.iter().filter(|r| r.stopped().is_none()) {
            going |= step(run, page).await?;
        }
        if !going {
            break;
        }
        tokio::time::sleep(pause).await;
    }
    for run in &runs {
        if let Ok(stop) = tokio::time::timeout(Duration::from_secs(10), run.wait_stopped()).await {
            say_stopped(&stop, Some(run.run()));
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let client =
        FuseboxClient::connect_with(&args.nats.settings()?, ClientOptions::default()).await?;
    let agent = match args.mode {
        Mode::Loop => "researcher",
        Mode::Steady => "triager",
        Mode::Hold => "mailer",
        Mode::Tree => return tree(&client, &args).await,
        Mode::Done => "summariser",
        Mode::Crowd => {
            for n in 1..=args.max_calls {
                let options = RunOptions {
                    agent: Some("crowd".to_owned()),
                    ..RunOptions::default()
                };
                client
                    .start_run(&args.tenant, &format!("{}-{n}", args.run), options)
                    .await?;
            }
            println!("STARTED {}", args.max_calls);
            return Ok(());
        }
    };
    let run = client
        .start_run(
            &args.tenant,
            &args.run,
            RunOptions {
                agent: Some(agent.to_owned()),
                ..RunOptions::default()
            },
        )
        .await?;
    let pause = Duration::from_millis(args.pause_ms);
    match args.mode {
        Mode::Hold => {
            let call = ToolCall {
                call_id: run.next_call_id().await,
                tool: "send_invoice".to_owned(),
                args: CallArgs::Json(json!({"to": "billing@example.invalid"})),
                op_key: Some(format!("{}-invoice", args.run)),
                effect: None,
            };
            let gate = run.tool_call(call).await;
            say(&gate);
            // The result never comes: the key stays in flight.
            println!("HOLDING");
            return Ok(());
        }
        Mode::Loop => {
            let turn = ModelTurn {
                stop_reason: "tool_use".to_owned(),
                usage: Some(Usage {
                    input_tokens: Some(1200),
                    output_tokens: Some(80),
                    ..Usage::default()
                }),
                cost_usd: Some(0.0042),
                valid: None,
            };
            run.model_turn(turn).await?;
            // A compaction, then progress (which ends the post-compaction watch), so the
            // loop that follows is caught by the loop detectors: warn, block, stop.
            run.compaction(Some("context_full".to_owned())).await?;
            run.progress(1, Some("plan made".to_owned())).await?;
        }
        Mode::Done => {
            for page in 1..=2 {
                step(&run, page).await?;
            }
            let finished = run.finish(Some("all issues triaged".to_owned())).await?;
            let action = finished.as_ref().map_or("?", |d| d.action.as_str());
            println!("FINISHED {action}");
            return Ok(());
        }
        Mode::Steady | Mode::Tree | Mode::Crowd => {}
    }
    let mut calls = 0;
    while calls < args.max_calls && run.stopped().is_none() {
        calls += 1;
        match args.mode {
            Mode::Loop => {
                let (call_id, gate) = run
                    .call(
                        "search",
                        json!({"query": "<script>alert('pwned')</script> weather tokyo", "notes": "x".repeat(300)}),
                    )
                    .await;
                say(&gate);
                if gate.may_run() {
                    let output = json!({"hits": ["jma.go.jp"]});
                    run.tool_result(success(call_id, "search", output, None))
                        .await?;
                }
            }
            _ => {
                step(&run, calls).await?;
            }
        }
        tokio::time::sleep(pause).await;
    }
    if let Ok(stop) = tokio::time::timeout(Duration::from_secs(10), run.wait_stopped()).await {
        say_stopped(&stop, None);
    }
    Ok(())
}
