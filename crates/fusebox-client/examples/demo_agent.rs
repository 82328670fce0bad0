//! A demo agent behind the fusebox gate.
//!
//! `--mode loop`: searches the same thing again and again (the classic stuck agent).
//! `--mode paginate`: walks the pages of a listing, each new, then finishes.
//!
//! The run handle (`FuseboxClient::start_run`) owns the envelope — ids, `seq`, `ts_ms`,
//! `run_started` — and the kill switch: the agent only says which tool it wants and
//! what came back. Tool calls go through the gate; results go inline as well (the
//! handle's default), so the guard answers each in order.
//!
//! `--instance REGION/ID`: the run reports an EC2 instance it launched (`instance_launched`)
//! right after `run_started`, so the daemon's cloud watchdog tears it down once the run
//! ends, should the agent itself never get to it.

use std::time::Duration;

use clap::{Parser, ValueEnum};
use fusebox_client::{ClientOptions, FuseboxClient, Gate, NatsArgs, RunHandle, RunOptions};
use fusebox_core::event::{InstanceLaunched, Output, ResultKind, ToolResult};
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Mode {
    Loop,
    Paginate,
}

#[derive(Debug, Parser)]
struct Args {
    /// How to reach NATS (the same flags and environment as the `fusebox` CLI).
    #[command(flatten)]
    nats: NatsArgs,
    #[arg(long, value_enum)]
    mode: Mode,
    #[arg(long, default_value = "demo")]
    tenant: String,
    #[arg(long)]
    run: String,
    /// Give up after this many steps (the loop agent would otherwise never stop itself).
    #[arg(long, default_value_t = 50)]
    max_iterations: u64,
    /// An EC2 instance this run launched, as REGION/INSTANCE_ID.
    #[arg(long)]
    instance: Option<String>,
}

struct Agent {
    run: RunHandle,
    tag: &'static str,
}

impl Agent {
    fn say(&self, line: impl AsRef<str>) {
        println!("[{} {}] {}", self.tag, self.run.run(), line.as_ref());
    }

    /// Gates one call; returns its call id when the tool may run.
    async fn call(&self, tool: &str, args: Value) -> Option<String> {
        let (call_id, gate) = self.run.call(tool, args.clone()).await;
        match &gate {
            Gate::Decided(d) => {
                let why = d.message.as_deref().unwrap_or("");
                self.say(format!("gate {tool}({args}) → {} {why}", d.action.as_str()));
            }
            Gate::Refused(e) => self.say(format!("gate refused the event: {}", e.message)),
            Gate::Unanswered { error, .. } => {
                self.say(format!("gate unanswered ({error}): not running the tool"))
            }
        }
        gate.may_run().then_some(call_id)
    }

    async fn succeeded(&self, call_id: String, tool: &str, output: Value) {
        let result = ToolResult {
            call_id,
            tool: tool.to_owned(),
            kind: ResultKind::Success,
            code: None,
            retry_after_ms: None,
            terminal: None,
            output: Some(Output::Json(output)),
            progress: None,
        };
        if let Err(err) = self.run.tool_result(result).await {
            self.say(format!("report failed: {err}"));
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let client =
        FuseboxClient::connect_with(&args.nats.settings()?, ClientOptions::default()).await?;
    let (tag, agent_name) = match args.mode {
        Mode::Loop => ("looping agent", "researcher"),
        Mode::Paginate => ("paging agent ", "triager"),
    };
    // Watches the kill switch (a stop kept from before included), then run_started.
    let run = client
        .start_run(
            &args.tenant,
            &args.run,
            RunOptions {
                agent: Some(agent_name.to_owned()),
                ..RunOptions::default()
            },
        )
        .await?;
    let agent = Agent { run, tag };
    if let Some((region, id)) = args.instance.as_deref().and_then(|i| i.split_once('/')) {
        let launched = InstanceLaunched {
            provider: "ec2".to_owned(),
            region: region.to_owned(),
            instance_id: id.to_owned(),
            max_lifetime_s: None,
        };
        if let Err(err) = agent.run.instance_launched(launched).await {
            agent.say(format!("report failed: {err}"));
        }
        agent.say(format!(
            "launched EC2 instance {id} in {region} (reported to the guard)"
        ));
    }
    let mut step = 0;
    while step < args.max_iterations && agent.run.stopped().is_none() {
        step += 1;
        let (tool, call_args, output) = match args.mode {
            Mode::Loop => (
                "search",
                json!({"query":"weather tokyo"}),
                json!({"hits":["jma.go.jp"]}),
            ),
            Mode::Paginate if step <= 7 => (
                "list_issues",
                json!({"page": step}),
                json!({"issues":[format!("ISSUE-{}", step * 10), format!("ISSUE-{}", step * 10 + 1)],"next": step < 7}),
            ),
            Mode::Paginate => {
                if let Err(err) = agent.run.finish(Some("all pages read".to_owned())).await {
                    agent.say(format!("report failed: {err}"));
                }
                agent.say("finished: read 7 pages, run closed normally");
                break;
            }
        };
        // Refused: do not run it; a real agent would change course here.
        if let Some(call_id) = agent.call(tool, call_args).await {
            agent.succeeded(call_id, tool, output).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Give the kill switch a moment to arrive for the reader of the demo.
    if let Ok(stop) =
        tokio::time::timeout(Duration::from_millis(300), agent.run.wait_stopped()).await
    {
        let report = stop.report.as_ref();
        println!(
            "[kill switch  {}] STOP received: {} / {} — {}",
            agent.run.run(),
            report.map_or("?", |r| r.terminal_state.as_str()),
            report.map_or("?", |r| r.reason.as_str()),
            stop.message.as_deref().unwrap_or("")
        );
        agent.say("halted by the kill switch");
    }
    Ok(())
}
