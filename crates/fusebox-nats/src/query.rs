//! Read-only operator queries, answered from the guard state by the applier (so they see
//! every event committed before them).

use std::collections::{HashMap, VecDeque};

use fusebox_core::{Decision, Engine, LedgerEntry, RunState, StopReport};

use crate::applier::RunKey;
use crate::store::GuardStore;
use crate::subjects::Scope;
use crate::wire::{
    ErrorReply, HistoryQuery, LedgerItem, LedgerListing, LedgerQuery, PartitionRuns, RunHistory,
    RunRow, RunStatusReply, RunSummary, RunsPage, RunsQuery, WireError, HISTORY_LIMIT,
    LEDGER_LIMIT, RUNS_PAGE_LIMIT,
};

pub(crate) enum Query {
    /// The runs of what `scope` serves.
    Runs {
        scope: Scope,
    },
    /// One page of the runs of what `scope` serves (the operator's page).
    RunsPage {
        query: RunsQuery,
        scope: Scope,
    },
    Status {
        tenant: String,
        run: String,
    },
    /// A run's applied events with their decisions (answered from the store's log).
    History {
        tenant: String,
        run: String,
        query: HistoryQuery,
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
            && filter.run.as_deref().is_none_or(|r| r == entry_run(entry))
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

fn entry_run(entry: &LedgerEntry) -> &str {
    match entry {
        LedgerEntry::InFlight { run, .. } | LedgerEntry::Completed { run, .. } => run,
    }
}

fn row(tenant: &str, run_id: &str, run: &RunState) -> RunRow {
    RunRow {
        summary: summary(tenant, run_id, run),
        first_ts_ms: run.first_ts_ms,
        calls_refused: run.counters.calls_refused,
        tokens: run.counters.tokens,
        cost_usd: run.counters.cost_usd,
    }
}

/// `OPEN` or the run's terminal state, without building its row.
fn state_of(run: &RunState) -> &'static str {
    run.report().map_or("OPEN", |r| r.terminal_state.as_str())
}

/// A run on its way to a page: its place in the order, and its state.
type PageRow<'a> = (std::cmp::Reverse<u64>, &'a str, &'a str, &'a RunState);

fn page_order(a: &PageRow<'_>, b: &PageRow<'_>) -> std::cmp::Ordering {
    (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2))
}

/// One page of runs: a pass over every run (filters, counts per state), then only the
/// page's rows are built and sorted. Newest activity first; ties by tenant and run.
fn runs_page(engine: &Engine, query: &RunsQuery, scope: Scope) -> RunsPage {
    use std::cmp::Reverse;
    let limit = query.limit.unwrap_or(RUNS_PAGE_LIMIT).min(RUNS_PAGE_LIMIT);
    let mut states: std::collections::BTreeMap<&'static str, u64> = Default::default();
    let mut matched = 0;
    let mut page: Vec<PageRow<'_>> = Vec::new();
    let after = query
        .after
        .as_ref()
        .map(|c| (Reverse(c.last_ts_ms), c.tenant.as_str(), c.run.as_str()));
    for (tenant, run_id, run) in engine.runs() {
        let reason = run.report().map(|r| r.reason.as_str());
        let others_match = query.tenant.as_deref().is_none_or(|t| t == tenant)
            && query
                .agent
                .as_deref()
                .is_none_or(|a| run.agent.as_deref() == Some(a))
            && query.reason.as_deref().is_none_or(|r| reason == Some(r))
            && query
                .run_contains
                .as_deref()
                .is_none_or(|needle| run_id.contains(needle));
        if !others_match {
            continue;
        }
        let state = state_of(run);
        *states.entry(state).or_insert(0) += 1;
        if query.state.as_deref().is_some_and(|s| s != state) {
            continue;
        }
        matched += 1;
        let key = (Reverse(run.last_ts_ms), tenant, run_id);
        if after.is_some_and(|a| key <= a) {
            continue;
        }
        page.push((key.0, key.1, key.2, run));
    }
    if page.len() > limit {
        if limit == 0 {
            page.clear();
        } else {
            page.select_nth_unstable_by(limit - 1, page_order);
            page.truncate(limit);
        }
    }
    page.sort_unstable_by(page_order);
    let (partition, partitions) = match scope {
        Scope::All => (None, None),
        Scope::Partition { index, of } => (Some(index), Some(of)),
    };
    RunsPage {
        partition,
        partitions,
        runs: page
            .into_iter()
            .map(|(_, tenant, run_id, run)| row(tenant, run_id, run))
            .collect(),
        matched,
        states: states
            .into_iter()
            .map(|(state, n)| (state.to_owned(), n))
            .collect(),
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

fn error_reply(reason: &str, message: String) -> ErrorReply {
    ErrorReply {
        error: WireError {
            reason: reason.to_owned(),
            message,
            event_id: None,
        },
    }
}

/// A run's timeline from the store's log: an unknown run is refused like `status`.
fn history(
    store: &dyn HistoryStore,
    tenant: &str,
    run: &str,
    query: &HistoryQuery,
) -> Result<RunHistory, ErrorReply> {
    if store.engine().run(tenant, run).is_none() {
        return Err(error_reply(
            "unknown_run",
            format!("no run {tenant}/{run} is known to this daemon"),
        ));
    }
    let limit = query.limit.unwrap_or(HISTORY_LIMIT).clamp(1, HISTORY_LIMIT);
    match store.history(tenant, run, query.after.unwrap_or(0), limit) {
        Ok(Some(history)) => Ok(history),
        Ok(None) => Err(error_reply(
            "history_unavailable",
            "this daemon keeps no log to read a run's history from".to_owned(),
        )),
        Err(err) => Err(error_reply(
            "history_unreadable",
            format!("reading the history of {tenant}/{run}: {err}"),
        )),
    }
}

/// What a history query needs of the store, object-safe.
pub(crate) trait HistoryStore {
    fn engine(&self) -> &Engine;
    fn history(
        &self,
        tenant: &str,
        run: &str,
        after: u64,
        limit: usize,
    ) -> Result<Option<RunHistory>, crate::store::StoreError>;
}

impl<S: GuardStore> HistoryStore for S {
    fn engine(&self) -> &Engine {
        GuardStore::engine(self)
    }
    fn history(
        &self,
        tenant: &str,
        run: &str,
        after: u64,
        limit: usize,
    ) -> Result<Option<RunHistory>, crate::store::StoreError> {
        GuardStore::history(self, tenant, run, after, limit)
    }
}

/// The reply body for `query`.
pub(crate) fn answer(
    store: &dyn HistoryStore,
    recent: &HashMap<RunKey, VecDeque<Decision>>,
    query: &Query,
) -> Vec<u8> {
    let engine = store.engine();
    let json = match query {
        Query::History { tenant, run, query } => match history(store, tenant, run, query) {
            Ok(history) => serde_json::to_vec(&history),
            Err(refusal) => serde_json::to_vec(&refusal),
        },
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
        Query::RunsPage { query, scope } => serde_json::to_vec(&runs_page(engine, query, *scope)),
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
            None => serde_json::to_vec(&error_reply(
                "unknown_run",
                format!("no run {tenant}/{run} is known to this daemon"),
            )),
        },
    };
    json.expect("query answers serialise")
}

#[cfg(test)]
mod tests {
    use fusebox_core::parse_event;

    use super::*;
    use crate::wire::RunsCursor;

    /// Runs (tenant, run, agent, last event time, cancelled?).
    fn engine() -> Engine {
        let mut engine = Engine::default();
        let runs = [
            ("t", "a", "x", 10, false),
            ("t", "b", "y", 30, true),
            ("u", "c", "x", 20, false),
            ("u", "d", "x", 30, false),
        ];
        for (tenant, run, agent, ts, cancelled) in runs {
            let started = format!(
                r#"{{"v":1,"id":"{run}-1","tenant":"{tenant}","run":"{run}","seq":1,"ts_ms":{ts},"type":"run_started","agent":"{agent}"}}"#
            );
            engine.apply(&parse_event(started.as_bytes()).unwrap());
            if cancelled {
                let cancel = format!(
                    r#"{{"v":1,"id":"{run}-2","tenant":"{tenant}","run":"{run}","seq":2,"ts_ms":{ts},"type":"cancel","by":"ops"}}"#
                );
                engine.apply(&parse_event(cancel.as_bytes()).unwrap());
            }
        }
        engine
    }

    fn names(page: &RunsPage) -> Vec<String> {
        page.runs
            .iter()
            .map(|r| format!("{}/{}", r.summary.tenant, r.summary.run))
            .collect()
    }

    #[test]
    fn runs_pages_filter_count_and_continue_after_their_cursor() {
        let engine = engine();
        let cursor = RunsCursor {
            last_ts_ms: 30,
            tenant: "u".to_owned(),
            run: "d".to_owned(),
        };
        let cases: Vec<(RunsQuery, Vec<&str>, u64)> = vec![
            (RunsQuery::default(), vec!["t/b", "u/d", "u/c", "t/a"], 4),
            (
                RunsQuery {
                    limit: Some(2),
                    ..Default::default()
                },
                vec!["t/b", "u/d"],
                4,
            ),
            (
                RunsQuery {
                    after: Some(cursor),
                    limit: Some(2),
                    ..Default::default()
                },
                vec!["u/c", "t/a"],
                4,
            ),
            (
                RunsQuery {
                    tenant: Some("u".into()),
                    ..Default::default()
                },
                vec!["u/d", "u/c"],
                2,
            ),
            (
                RunsQuery {
                    agent: Some("x".into()),
                    ..Default::default()
                },
                vec!["u/d", "u/c", "t/a"],
                3,
            ),
            (
                RunsQuery {
                    state: Some("CANCELLED".into()),
                    ..Default::default()
                },
                vec!["t/b"],
                1,
            ),
            (
                RunsQuery {
                    state: Some("OPEN".into()),
                    tenant: Some("t".into()),
                    ..Default::default()
                },
                vec!["t/a"],
                1,
            ),
            (
                RunsQuery {
                    reason: Some("cancelled".into()),
                    ..Default::default()
                },
                vec!["t/b"],
                1,
            ),
            (
                RunsQuery {
                    run_contains: Some("c".into()),
                    ..Default::default()
                },
                vec!["u/c"],
                1,
            ),
            (
                RunsQuery {
                    limit: Some(0),
                    ..Default::default()
                },
                vec![],
                4,
            ),
        ];
        for (query, want, matched) in cases {
            let page = runs_page(&engine, &query, Scope::All);
            assert_eq!(names(&page), want, "{query:?}");
            assert_eq!(page.matched, matched, "{query:?}");
        }
        // Counts per state ignore the state filter (they are what the filter chooses from).
        let page = runs_page(
            &engine,
            &RunsQuery {
                state: Some("CANCELLED".into()),
                ..Default::default()
            },
            Scope::Partition { index: 1, of: 3 },
        );
        assert_eq!(page.states["OPEN"], 3);
        assert_eq!(page.states["CANCELLED"], 1);
        assert_eq!((page.partition, page.partitions), (Some(1), Some(3)));
    }
}
