//! A demo agent behind the fusebox gate.
//!
//! `--mode loop`: searches the same thing again and again (the classic stuck agent).
//! `--mode paginate`: walks the pages of a listing, each new, then finishes.
//!
//! Tool calls go through the gate (request/reply); results are reported to JetStream;
//! a watcher task listens on the run's kill switch. Every event carries `seq`, so the
//! daemon applies the two paths in order.
//!
//! `--instance REGION/ID`: the run reports an EC2 instance it launched (`instance_launched`)
//! right after `run_started`, so the daemon's cloud watchdog tears it down once the run
//! ends, should the agent itself never get to it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use fusebox_client::{ClientOptions, FuseboxClient, Gate};
use fusebox_core::{parse_event, Event};
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Mode {
    Loop,
    Paginate,
}

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats: String,
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
    client: FuseboxClient,
    tenant: String,
    run: String,
    seq: u64,
    tag: &'static str,
}

impl Agent {
    fn event(&mut self, body: Value) -> Event {
        self.seq += 1;
        let ts_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let mut event = json!({"v":1,"id":format!("{}-{}", self.run, self.seq),"tenant":self.tenant,
            "run":self.run,"seq":self.seq,"ts_ms":ts_ms});
        event
            .as_object_mut()
            .unwrap()
            .extend(body.as_object().unwrap().clone());
        parse_event(event.to_string().as_bytes()).expect("a valid event")
    }

    fn say(&self, line: impl AsRef<str>) {
        println!("[{} {}] {}", self.tag, self.run, line.as_ref());
    }

    /// Gates one call; returns whether the tool may run.
    async fn call(&mut self, tool: &str, args: Value) -> bool {
        let call_id = format!("c{}", self.seq + 1);
        let event =
            self.event(json!({"type":"tool_call","call_id":call_id,"tool":tool,"args":args}));
        let gate = self.client.gate(&event).await;
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
        gate.may_run()
    }

    async fn report(&mut self, body: Value) {
        let event = self.event(body);
        if let Err(err) = self.client.report(&event).await {
            self.say(format!("report failed: {err}"));
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let client = FuseboxClient::connect(&args.nats, ClientOptions::default()).await?;
    let tag = match args.mode {
        Mode::Loop => "looping agent",
        Mode::Paginate => "paging agent ",
    };
    let stopped = Arc::new(AtomicBool::new(false));
    let mut watch = client.watch_stop(&args.tenant, &args.run).await?;
    let flag = stopped.clone();
    let run = args.run.clone();
    tokio::spawn(async move {
        if let Some(Ok(stop)) = watch.next().await {
            let report = stop.report.as_ref();
            println!(
                "[kill switch  {run}] STOP received: {} / {} — {}",
                report.map_or("?", |r| r.terminal_state.as_str()),
                report.map_or("?", |r| r.reason.as_str()),
                stop.message.as_deref().unwrap_or("")
            );
            flag.store(true, Ordering::SeqCst);
        }
    });
    let mut agent = Agent {
        client,
        tenant: args.tenant,
        run: args.run,
        seq: 0,
        tag,
    };
    let agent_name = match args.mode {
        Mode::Loop => "researcher",
        Mode::Paginate => "triager",
    };
    agent
        .report(json!({"type":"run_started","agent":agent_name}))
        .await;
    if let Some((region, id)) = args.instance.as_deref().and_then(|i| i.split_once('/')) {
        agent
            .report(json!({"type":"instance_launched","provider":"ec2","region":region,"instance_id":id}))
            .await;
        agent.say(format!(
            "launched EC2 instance {id} in {region} (reported to the guard)"
        ));
    }
    let mut step = 0;
    while step < args.max_iterations && !stopped.load(Ordering::SeqCst) {
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
                agent
                    .report(json!({"type":"run_finished","status":"all pages read"}))
                    .await;
                agent.say("finished: read 7 pages, run closed normally");
                break;
            }
        };
        if !agent.call(tool, call_args).await {
            // Refused: do not run it; a real agent would change course here.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let call_id = format!("c{}", agent.seq);
        agent
            .report(json!({"type":"tool_result","call_id":call_id,"tool":tool,"kind":"SUCCESS","output":output}))
            .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Give the kill switch a moment to arrive for the reader of the demo.
    tokio::time::sleep(Duration::from_millis(300)).await;
    if stopped.load(Ordering::SeqCst) {
        agent.say("halted by the kill switch");
    }
    Ok(())
}
