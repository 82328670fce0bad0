//! Read-only operator queries, answered from the guard state by the applier (so they see
//! every event committed before them).

use std::collections::{HashMap, VecDeque};

use fusebox_core::{Decision, Engine, RunState, StopReport};

use crate::applier::RunKey;
use crate::subjects::Scope;
use crate::wire::{ErrorReply, PartitionRuns, RunStatusReply, RunSummary, WireError};

pub(crate) enum Query {
    /// The runs of what `scope` serves.
    Runs {
        scope: Scope,
    },
    Status {
        tenant: String,
        run: String,
    },
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
