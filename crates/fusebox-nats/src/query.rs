//! Read-only operator queries, answered from the guard state by the applier (so they see
//! every event committed before them).

use std::collections::{HashMap, VecDeque};

use fusebox_core::{Decision, Engine, LedgerEntry, RunState, StopReport};

use crate::applier::RunKey;
use crate::subjects::Scope;
use crate::wire::{
    ErrorReply, LedgerItem, LedgerListing, LedgerQuery, PartitionRuns, RunStatusReply, RunSummary,
    WireError, LEDGER_LIMIT,
};

pub(crate) enum Query {
    /// The runs of what `scope` serves.
    Runs {
        scope: Scope,
    },
    Status {
        tenant: String,
        run: String,
    },
    /// The op_key ledger of what `scope` serves (`fusebox ledger list|show`).
    Ledger {
        filter: LedgerQuery,
        scope: Scope,
    },
}

fn ledger_listing(engine: &Engine, filter: &LedgerQuery, scope: Scope) -> LedgerListing {
    let limit = filter.limit.unwrap_or(LEDGER_LIMIT);
    let mut entries = Vec::new();
    let mut truncated = false;
    // One key asked for by name is looked up, not searched for (the applier answers
    // queries between batches: a scan of a big ledger would hold up the gate).
    let named: Vec<(&str, &str, &LedgerEntry)> = match (&filter.tenant, &filter.op_key) {
        (Some(tenant), Some(op_key)) => engine
            .ledger()
            .get(tenant, op_key)
            .map(|entry| (tenant.as_str(), op_key.as_str(), entry))
            .into_iter()
            .collect(),
        _ => Vec::new(),
    };
    let all: Box<dyn Iterator<Item = (&str, &str, &LedgerEntry)>> =
        match (&filter.tenant, &filter.op_key) {
            (Some(_), Some(_)) => Box::new(named.into_iter()),
            _ => Box::new(engine.ledger().iter()),
        };
    let wanted = all.filter(|(tenant, op_key, entry)| {
        filter.tenant.as_deref().is_none_or(|t| t == *tenant)
            && filter.op_key.as_deref().is_none_or(|k| k == *op_key)
            && (!filter.in_flight_only || matches!(entry, LedgerEntry::InFlight { .. }))
    });
    for (tenant, op_key, entry) in wanted {
        if entries.len() == limit {
            truncated = true;
            break;
        }
        let item = match entry {
            LedgerEntry::InFlight {
                run,
                call_id,
                since_ms,
            } => LedgerItem {
                tenant: tenant.to_owned(),
                op_key: op_key.to_owned(),
                state: "in_flight".to_owned(),
                run: run.clone(),
                call_id: call_id.clone(),
                since_ms: Some(*since_ms),
                lease_ends_ms: engine.lease_end_ms(tenant, run, *since_ms),
                result: None,
            },
            LedgerEntry::Completed {
                run,
                call_id,
                result,
            } => LedgerItem {
                tenant: tenant.to_owned(),
                op_key: op_key.to_owned(),
                state: "completed".to_owned(),
                run: run.clone(),
                call_id: call_id.clone(),
                since_ms: None,
                lease_ends_ms: None,
                result: Some(serde_json::from_str(result).unwrap_or(serde_json::Value::Null)),
            },
        };
        entries.push(item);
    }
    let (partition, partitions) = match scope {
        Scope::All => (None, None),
        Scope::Partition { index, of } => (Some(index), Some(of)),
    };
    LedgerListing {
        partition,
        partitions,
        entries,
        truncated,
    }
}

fn summary(tenant: &str, run_id: &str, run: &RunState) -> RunSummary {
    let report = run.report();
    RunSummary {
        tenant: tenant.to_owned(),
        run: run_id.to_owned(),
        agent: run.agent.clone(),
        open: run.is_open(),
        terminal_state: report.map(|r| r.terminal_state.as_str().to_owned()),
        reason: report.map(|r| r.reason.as_str().to_owned()),
        events: run.counters.events,
        steps: run.counters.steps,
        last_seq: run.last_seq,
        last_ts_ms: run.last_ts_ms,
    }
}

/// The reply body for `query`.
pub(crate) fn answer(
    engine: &Engine,
    recent: &HashMap<RunKey, VecDeque<Decision>>,
    query: &Query,
) -> Vec<u8> {
    let json = match query {
        Query::Runs { scope } => {
            let runs: Vec<RunSummary> = engine
                .runs()
                .map(|(tenant, run_id, run)| summary(tenant, run_id, run))
                .collect();
            match *scope {
                Scope::All => serde_json::to_vec(&runs),
                Scope::Partition { index, of } => serde_json::to_vec(&PartitionRuns {
                    partition: index,
                    partitions: of,
                    runs,
                }),
            }
        }
        Query::Ledger { filter, scope } => {
            serde_json::to_vec(&ledger_listing(engine, filter, *scope))
        }
        Query::Status { tenant, run } => match engine.run(tenant, run) {
            Some(state) => serde_json::to_vec(&RunStatusReply {
                summary: summary(tenant, run, state),
                counters: state.counters,
                progress_version: state.progress_version,
                report: state.report().map(|r| StopReport::clone(r)),
                last_decisions: recent
                    .get(&(tenant.clone(), run.clone()))
                    .map(|d| d.iter().cloned().collect())
                    .unwrap_or_default(),
            }),
            None => serde_json::to_vec(&ErrorReply {
                error: WireError {
                    reason: "unknown_run".to_owned(),
                    message: format!("no run {tenant}/{run} is known to this daemon"),
                    event_id: None,
                },
            }),
        },
    };
    json.expect("query answers serialise")
}
