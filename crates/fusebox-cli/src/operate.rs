//! Operator commands against a running fuseboxd, over NATS: list runs, show one, cancel,
//! resume, follow decisions, and the gate benchmark.

use std::io::{self, Write};
use std::time::Duration;

use fusebox_client::{parse_run_ref, ClientError, ClientOptions, FuseboxClient, NatsSettings};
use fusebox_core::Decision;
use serde::Serialize;

/// Where fuseboxd is, and how to print.
pub struct Target {
    pub nats: NatsSettings,
    pub timeout: Duration,
    pub json: bool,
}

pub enum Op {
    Runs,
    Run {
        run: String,
    },
    Cancel {
        run: String,
        reason: Option<String>,
    },
    Resume {
        run: String,
        evidence: String,
    },
    Tail {
        run: Option<String>,
    },
    BenchGate {
        options: fusebox_client::bench::BenchOptions,
    },
    Ledger(crate::ledger::LedgerOp),
    WatchdogStatus,
    WatchdogResume {
        by: String,
    },
}

pub(crate) fn print_json(value: &impl Serialize) -> Result<(), String> {
    let mut out = io::stdout().lock();
    serde_json::to_writer(&mut out, value).map_err(|e| e.to_string())?;
    writeln!(out).map_err(|e| e.to_string())
}

fn print_watchdog(reply: &fusebox_client::WatchdogReply, json: bool) -> Result<(), String> {
    if json {
        return print_json(reply);
    }
    let state = if reply.halted { "HALTED" } else { "running" };
    println!("watchdog {state}: {}", reply.message);
    Ok(())
}

pub(crate) fn print_decision(decision: &Decision, json: bool) -> Result<(), String> {
    if json {
        return print_json(decision);
    }
    let reason = decision.reason.map(|r| r.as_str()).unwrap_or("");
    println!(
        "{}/{} {} {} {}",
        decision.tenant,
        decision.run,
        decision.action.as_str(),
        reason,
        decision.message.as_deref().unwrap_or("")
    );
    Ok(())
}

pub fn run(target: &Target, op: Op) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let options = ClientOptions {
            timeout: target.timeout,
            ..ClientOptions::default()
        };
        let client = FuseboxClient::connect_with(&target.nats, options)
            .await
            .map_err(|e| e.to_string())?;
        let split = |reference: &str| parse_run_ref(reference).map_err(|e| e.to_string());
        match op {
            Op::Runs => {
                let listing = client.runs_listing().await.map_err(|e| e.to_string())?;
                if !listing.unanswered.is_empty() {
                    eprintln!(
                        "warning: partitions {:?} did not answer within {:?}; their runs are missing",
                        listing.unanswered, target.timeout
                    );
                }
                let runs = listing.runs;
                if target.json {
                    return runs.iter().try_for_each(print_json);
                }
                println!(
                    "{:<40} {:<8} {:<36} {:>7} {:>7}",
                    "RUN", "STATE", "OUTCOME", "EVENTS", "STEPS"
                );
                for run in &runs {
                    let outcome = match (&run.terminal_state, &run.reason) {
                        (Some(state), Some(reason)) => format!("{state} ({reason})"),
                        _ => String::new(),
                    };
                    println!(
                        "{:<40} {:<8} {:<36} {:>7} {:>7}",
                        format!("{}/{}", run.tenant, run.run),
                        if run.open { "open" } else { "closed" },
                        outcome,
                        run.events,
                        run.steps
                    );
                }
                Ok(())
            }
            Op::Run { run } => {
                let (tenant, run) = split(&run)?;
                let status = client
                    .run_status(&tenant, &run)
                    .await
                    .map_err(|e| e.to_string())?;
                if target.json {
                    return print_json(&status);
                }
                let in_tree = status
                    .tree
                    .as_ref()
                    .filter(|t| t.parent.is_some() || t.spawned > 0);
                let tree = match in_tree {
                    Some(place) => Some(
                        client
                            .run_tree(&tenant, &place.root)
                            .await
                            .map_err(|e| e.to_string())?,
                    ),
                    None => None,
                };
                print!(
                    "{}",
                    crate::run_view::render(&tenant, &run, &status, tree.as_ref())
                );
                Ok(())
            }
            Op::Cancel { run, reason } => {
                let (tenant, run) = split(&run)?;
                let by = std::env::var("USER").ok();
                let cancelled = client
                    .cancel_subtree(&tenant, &run, by.as_deref(), reason.as_deref())
                    .await
                    .map_err(|e| e.to_string())?;
                print_decision(&cancelled.decision, target.json)?;
                let below = crate::run_view::cancelled_below(&tenant, &run, cancelled.open_below);
                if let (false, Some(below)) = (target.json, below) {
                    println!("{below}");
                }
                Ok(())
            }
            Op::Resume { run, evidence } => {
                let (tenant, run) = split(&run)?;
                let evidence: serde_json::Value = serde_json::from_str(&evidence)
                    .map_err(|e| format!("--evidence must be a JSON object: {e}"))?;
                if !evidence.is_object() {
                    return Err(
                        "--evidence must be a JSON object, e.g. '{\"approval_id\":\"A-1\"}'"
                            .to_owned(),
                    );
                }
                let by = std::env::var("USER").ok();
                let decision = client
                    .resume(&tenant, &run, by.as_deref(), evidence)
                    .await
                    .map_err(|e| e.to_string())?;
                print_decision(&decision, target.json)
            }
            Op::Tail { run } => {
                let (tenant, run) = match run.as_deref() {
                    None => (None, None),
                    Some(reference) if !reference.contains('/') => {
                        (Some(reference.to_owned()), None)
                    }
                    Some(reference) => {
                        let (t, r) = split(reference)?;
                        (Some(t), Some(r))
                    }
                };
                let mut tail = client
                    .tail(tenant.as_deref(), run.as_deref())
                    .await
                    .map_err(|e| e.to_string())?;
                // Subscribed (and not refused): from here on nothing is missed.
                eprintln!("following decisions (Ctrl-C to stop)");
                while let Some(decision) = tail.next().await {
                    print_decision(&decision, target.json)?;
                }
                Ok(())
            }
            Op::BenchGate { options } => {
                let report = fusebox_client::bench::run(&client, &target.nats, &options)
                    .await
                    .map_err(|e| match e {
                        // The operator may not put events in: the benchmark has a user
                        // of its own in the deploy configs.
                        ClientError::PermissionDenied { .. } => format!(
                            "{e}; the benchmark runs as the `bench` user of \
                             deploy/nats/accounts.conf, with inbox prefix `_INBOX.bench` \
                             (--nats-user bench --nats-inbox-prefix _INBOX.bench)"
                        ),
                        e => e.to_string(),
                    })?;
                println!("{report}");
                Ok(())
            }
            Op::Ledger(op) => crate::ledger::run(&client, target, op).await,
            Op::WatchdogStatus => {
                let replies = client.watchdog_status().await.map_err(|e| e.to_string())?;
                replies
                    .iter()
                    .try_for_each(|r| print_watchdog(r, target.json))
            }
            Op::WatchdogResume { by } => {
                let replies = client
                    .watchdog_resume(&by)
                    .await
                    .map_err(|e| e.to_string())?;
                replies
                    .iter()
                    .try_for_each(|r| print_watchdog(r, target.json))?;
                match replies.iter().filter(|r| r.halted).count() {
                    0 => Ok(()),
                    n => Err(format!("{n} watchdog(s) still halted")),
                }
            }
        }
    })
}
