//! `fusebox ledger list | show | resolve`: the op_key ledger for operators. A resolve is
//! a command to the run holding the key, so it is an event in that run's log: replay
//! repeats it, and the decision (also on `fusebox.decisions.*`) says who did it.

use fusebox_client::{FuseboxClient, LedgerItem, LedgerQuery, LedgerView, Resolve};
use serde_json::Value;

use crate::operate::{print_decision, print_json, Target};

pub enum LedgerOp {
    List {
        tenant: Option<String>,
        in_flight_only: bool,
        limit: Option<usize>,
    },
    Show {
        tenant: String,
        op_key: String,
    },
    Resolve {
        tenant: String,
        op_key: String,
        /// `Some(JSON)`: completed with this result; `None`: released.
        completed: Option<String>,
        run: Option<String>,
        by: Option<String>,
        reason: Option<String>,
    },
}

fn warn_partial(view: &LedgerView) {
    if !view.unanswered.is_empty() {
        eprintln!(
            "warning: partitions {:?} did not answer in time; their entries are missing",
            view.unanswered
        );
    }
    if view.truncated {
        eprintln!("warning: more entries than shown; narrow with a tenant or --in-flight, or raise --limit");
    }
}

fn print_table(view: &LedgerView) {
    println!(
        "{:<14} {:<32} {:<10} {:<28} {:>16}",
        "TENANT", "OP_KEY", "STATE", "RUN / CALL", "LEASE ENDS (ms)"
    );
    for (_, item) in &view.entries {
        let lease = item
            .lease_ends_ms
            .map(|t| t.to_string())
            .unwrap_or_default();
        println!(
            "{:<14} {:<32} {:<10} {:<28} {:>16}",
            item.tenant,
            item.op_key,
            item.state,
            format!("{} / {}", item.run, item.call_id),
            lease
        );
    }
}

/// The entry a resolve goes to: the one key, as the daemons hold it. In a cluster,
/// partitions that saw the key agree on who holds it unless it just moved; an entry
/// in flight names the holder.
fn holder(view: &LedgerView) -> Option<&LedgerItem> {
    let items = || view.entries.iter().map(|(_, item)| item);
    items()
        .find(|item| item.state == "in_flight")
        .or_else(|| items().next())
}

pub async fn run(client: &FuseboxClient, target: &Target, op: LedgerOp) -> Result<(), String> {
    match op {
        LedgerOp::List {
            tenant,
            in_flight_only,
            limit,
        } => {
            let query = LedgerQuery {
                tenant,
                op_key: None,
                in_flight_only,
                limit,
                run: None,
            };
            let view = client.ledger(&query).await.map_err(|e| e.to_string())?;
            warn_partial(&view);
            if target.json {
                return view
                    .entries
                    .iter()
                    .try_for_each(|(_, item)| print_json(item));
            }
            print_table(&view);
            Ok(())
        }
        LedgerOp::Show { tenant, op_key } => {
            let view = client
                .ledger(&LedgerQuery {
                    tenant: Some(tenant.clone()),
                    op_key: Some(op_key.clone()),
                    ..Default::default()
                })
                .await
                .map_err(|e| e.to_string())?;
            warn_partial(&view);
            if view.entries.is_empty() {
                return Err(format!(
                    "op_key {op_key:?} of tenant {tenant} is not in the ledger"
                ));
            }
            for (partition, item) in &view.entries {
                if target.json {
                    print_json(item)?;
                } else {
                    if let Some(p) = partition {
                        println!("partition {p}:");
                    }
                    println!(
                        "{}",
                        serde_json::to_string_pretty(item).map_err(|e| e.to_string())?
                    );
                }
            }
            Ok(())
        }
        LedgerOp::Resolve {
            tenant,
            op_key,
            completed,
            run,
            by,
            reason,
        } => {
            let resolve = match completed {
                Some(text) => {
                    let output: Value = serde_json::from_str(&text)
                        .map_err(|e| format!("--completed must be JSON (the result): {e}"))?;
                    Resolve::Completed { output }
                }
                None => Resolve::Released,
            };
            let run = match run {
                Some(run) => run,
                None => {
                    let view = client
                        .ledger(&LedgerQuery {
                            tenant: Some(tenant.clone()),
                            op_key: Some(op_key.clone()),
                            ..Default::default()
                        })
                        .await
                        .map_err(|e| e.to_string())?;
                    match holder(&view) {
                        Some(item) => item.run.clone(),
                        None => {
                            return Err(format!(
                                "op_key {op_key:?} of tenant {tenant} is not in the ledger; name the run to record it under with --run"
                            ))
                        }
                    }
                }
            };
            let by = by.or_else(|| std::env::var("USER").ok());
            let decision = client
                .resolve(
                    &tenant,
                    &run,
                    &op_key,
                    resolve,
                    by.as_deref(),
                    reason.as_deref(),
                )
                .await
                .map_err(|e| e.to_string())?;
            print_decision(&decision, target.json)
        }
    }
}
