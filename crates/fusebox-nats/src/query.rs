//! Read-only operator queries, answered from the guard state by the applier (so they see
//! every event committed before them).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use fusebox_core::decision::Reason;
use fusebox_core::run::RunStatus;
use fusebox_core::{Decision, Engine, LedgerEntry, RunState, StopReport, TerminalState};

use crate::applier::RunKey;
use crate::store::GuardStore;
use crate::subjects::Scope;
use crate::wire::{
    ErrorReply, Fleet, HistoryQuery, LedgerItem, LedgerListing, LedgerQuery, PartitionRuns,
    RunHistory, RunRow, RunStatusReply, RunSummary, RunTree, RunsCursor, RunsPage, RunsQuery,
    WireError, COSTLIEST_LIMIT, HISTORY_LIMIT, KNOWN_VALUES_LIMIT, LEDGER_LIMIT, RUNS_PAGE_LIMIT,
};

// One per operator request, moved once to the applier: the runs page's filters making
// that variant larger than the others costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
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

fn row(engine: &Engine, tenant: &str, run_id: &str, run: &RunState) -> RunRow {
    RunRow {
        summary: summary(tenant, run_id, run),
        first_ts_ms: run.first_ts_ms,
        calls_refused: run.counters.calls_refused,
        tokens: run.counters.tokens,
        cost_usd: run.counters.cost_usd,
        parent: run.node.parent.clone(),
        root: run
            .node
            .parent
            .is_some()
            .then(|| root_of(engine, tenant, run_id, run).to_owned()),
        depth: run.node.depth,
        stopped_by: stopped_by(engine, tenant, run).map(str::to_owned),
    }
}

/// A run's ancestors, nearest first, as far as this daemon knows them. A run's depth is
/// its parent's + 1, so no more than `depth` parents are followed (a cycle cannot hold
/// the walk).
fn ancestors<'a>(
    engine: &'a Engine,
    tenant: &'a str,
    run: &'a RunState,
) -> impl Iterator<Item = (&'a str, &'a RunState)> + 'a {
    let mut next = run.node.parent.as_deref();
    std::iter::from_fn(move || {
        let id = next?;
        let state = engine.run(tenant, id)?;
        next = state.node.parent.as_deref();
        Some((id, state))
    })
    .take(run.node.depth as usize)
}

/// The root of a run's tree (the run itself for a root).
fn root_of<'a>(engine: &'a Engine, tenant: &'a str, run_id: &'a str, run: &'a RunState) -> &'a str {
    ancestors(engine, tenant, run)
        .last()
        .map_or(run_id, |(id, _)| id)
}

/// Whose stop closed a run stopped by its tree (`ancestor_stopped`): the nearest closed
/// ancestor that was not itself closed by one above (a stop reaches the runs below one
/// level after another, so the nearest closed one may be a messenger).
fn stopped_by<'a>(engine: &'a Engine, tenant: &'a str, run: &'a RunState) -> Option<&'a str> {
    if run.report()?.reason != Reason::AncestorStopped {
        return None;
    }
    ancestors(engine, tenant, run).find_map(|(id, ancestor)| {
        let report = ancestor.report()?;
        (report.reason != Reason::AncestorStopped
            && report.terminal_state != TerminalState::Completed)
            .then_some(id)
    })
}

/// A run's children, open and closed, in the order they started. The node lists its
/// open children; closed ones are found by a pass over every run (as a runs page does),
/// made only when a run started below this one is not an open child now — never for a
/// run on its own.
fn children<'a>(
    engine: &'a Engine,
    tenant: &'a str,
    run_id: &str,
    run: &'a RunState,
) -> Vec<(&'a str, &'a RunState)> {
    let node = &run.node;
    let mut found: Vec<(&str, &RunState)> = if node.spawned == node.children.len() as u64 {
        node.children
            .iter()
            .filter_map(|id| Some((id.as_str(), engine.run(tenant, id)?)))
            .collect()
    } else {
        engine
            .runs()
            .filter(|(t, _, child)| *t == tenant && child.node.parent.as_deref() == Some(run_id))
            .map(|(_, id, child)| (id, child))
            .collect()
    };
    found.sort_unstable_by_key(|(id, child)| (child.first_ts_ms, *id));
    found
}

fn run_tree(engine: &Engine, tenant: &str, run_id: &str, run: &RunState) -> RunTree {
    let mut children = children(engine, tenant, run_id, run);
    let more_children = children.len() > RUNS_PAGE_LIMIT;
    children.truncate(RUNS_PAGE_LIMIT);
    RunTree {
        parent: run.node.parent.clone(),
        depth: run.node.depth,
        root: root_of(engine, tenant, run_id, run).to_owned(),
        stopped_by: stopped_by(engine, tenant, run).map(str::to_owned),
        spawned: run.node.spawned,
        open_below: run.node.open_below,
        below: run.node.below,
        children: children
            .into_iter()
            .map(|(id, child)| row(engine, tenant, id, child))
            .collect(),
        more_children,
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

/// `needle` (lower case already) anywhere in `hay`, in any ASCII case, without
/// allocating: the pass over every run calls it once per run and filter.
fn contains_folded(hay: &str, needle: &str) -> bool {
    let (hay, needle) = (hay.as_bytes(), needle.as_bytes());
    needle.is_empty()
        || hay
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

/// A text filter of a runs query: exact (or a substring, for the run id), or in a
/// `loose` query any part in any case.
struct TextFilter {
    wanted: Option<String>,
    loose: bool,
    substring: bool,
}

impl TextFilter {
    fn new(wanted: &Option<String>, loose: bool, substring: bool) -> TextFilter {
        TextFilter {
            wanted: wanted.as_deref().map(|w| {
                if loose {
                    w.to_ascii_lowercase()
                } else {
                    w.to_owned()
                }
            }),
            loose,
            substring,
        }
    }

    fn matches(&self, value: Option<&str>) -> bool {
        let Some(wanted) = &self.wanted else {
            return true;
        };
        let Some(value) = value else {
            return false;
        };
        if self.loose {
            contains_folded(value, wanted)
        } else if self.substring {
            value.contains(wanted.as_str())
        } else {
            value == wanted
        }
    }
}

/// The fleet's figures, counted in the same pass as the page.
struct FleetTally<'a> {
    since_ms: u64,
    states: BTreeMap<&'static str, u64>,
    stop_reasons: BTreeMap<&'static str, u64>,
    /// (cost, tenant, run, state), at most [`COSTLIEST_LIMIT`], in no order until done.
    costliest: Vec<(f64, &'a str, &'a str, &'a RunState)>,
    tenants: BTreeSet<&'a str>,
    agents: BTreeSet<&'a str>,
    reasons: BTreeSet<&'static str>,
    truncated: bool,
}

/// Adds `value` to a known-values set unless the set is full (then says so).
fn know<'a>(set: &mut BTreeSet<&'a str>, value: &'a str, truncated: &mut bool) {
    if set.len() < KNOWN_VALUES_LIMIT {
        set.insert(value);
    } else if !set.contains(value) {
        *truncated = true;
    }
}

impl<'a> FleetTally<'a> {
    fn new(since_ms: u64) -> Self {
        FleetTally {
            since_ms,
            states: BTreeMap::new(),
            stop_reasons: BTreeMap::new(),
            costliest: Vec::with_capacity(COSTLIEST_LIMIT + 1),
            tenants: BTreeSet::new(),
            agents: BTreeSet::new(),
            reasons: BTreeSet::new(),
            truncated: false,
        }
    }

    fn count(&mut self, tenant: &'a str, run_id: &'a str, run: &'a RunState) {
        // Runs come tenant by tenant: the set is asked only when the tenant changes.
        if self.tenants.last() != Some(&tenant) {
            know(&mut self.tenants, tenant, &mut self.truncated);
        }
        if let Some(agent) = run.agent.as_deref() {
            know(&mut self.agents, agent, &mut self.truncated);
        }
        let report = run.report();
        if let Some(report) = report {
            self.reasons.insert(report.reason.as_str());
        }
        if run.last_ts_ms >= self.since_ms {
            *self.states.entry(state_of(run)).or_insert(0) += 1;
            if let Some(report) = report.filter(|r| r.terminal_state != TerminalState::Completed) {
                *self.stop_reasons.entry(report.reason.as_str()).or_insert(0) += 1;
            }
        }
        let cost = run.counters.cost_usd;
        if report.is_none() && cost > 0.0 {
            if self.costliest.len() < COSTLIEST_LIMIT {
                self.costliest.push((cost, tenant, run_id, run));
            } else if let Some(cheapest) = self
                .costliest
                .iter_mut()
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .filter(|c| c.0 < cost)
            {
                *cheapest = (cost, tenant, run_id, run);
            }
        }
    }

    fn done(mut self, engine: &Engine) -> Fleet {
        self.costliest
            .sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        let owned = |set: BTreeSet<&str>| set.into_iter().map(str::to_owned).collect();
        Fleet {
            states: self
                .states
                .into_iter()
                .map(|(k, n)| (k.to_owned(), n))
                .collect(),
            stop_reasons: self
                .stop_reasons
                .into_iter()
                .map(|(k, n)| (k.to_owned(), n))
                .collect(),
            costliest: self
                .costliest
                .into_iter()
                .map(|(_, tenant, run_id, run)| row(engine, tenant, run_id, run))
                .collect(),
            tenants: owned(self.tenants),
            agents: owned(self.agents),
            reasons: owned(self.reasons),
            known_truncated: self.truncated,
        }
    }
}

/// One page of runs: a pass over every run (filters, counts per state, and when asked
/// the fleet's figures), then only the page's rows are built and sorted. Newest
/// activity first; ties by tenant and run.
fn runs_page(engine: &Engine, query: &RunsQuery, scope: Scope) -> RunsPage {
    use std::cmp::Reverse;
    let limit = query.limit.unwrap_or(RUNS_PAGE_LIMIT).min(RUNS_PAGE_LIMIT);
    let mut states: BTreeMap<&'static str, u64> = Default::default();
    let mut matched = 0;
    let mut ahead = 0;
    let mut page: Vec<PageRow<'_>> = Vec::new();
    let cursor = |c: &'_ RunsCursor| (Reverse(c.last_ts_ms), c.tenant.clone(), c.run.clone());
    let after = query.after.as_ref().map(cursor);
    let before = query
        .before
        .as_ref()
        .filter(|_| after.is_none())
        .map(cursor);
    let tenant_filter = TextFilter::new(&query.tenant, query.loose, false);
    let agent_filter = TextFilter::new(&query.agent, query.loose, false);
    let reason_filter = TextFilter::new(&query.reason, query.loose, false);
    let run_filter = TextFilter::new(&query.run_contains, query.loose, true);
    let mut fleet = query.fleet_since_ms.map(FleetTally::new);
    for (tenant, run_id, run) in engine.runs() {
        if let Some(fleet) = fleet.as_mut() {
            fleet.count(tenant, run_id, run);
        }
        let reason = run.report().map(|r| r.reason.as_str());
        let others_match = tenant_filter.matches(Some(tenant))
            && agent_filter.matches(run.agent.as_deref())
            && reason_filter.matches(reason)
            && run_filter.matches(Some(run_id))
            && query
                .active_since_ms
                .is_none_or(|since| run.last_ts_ms >= since)
            && query
                .active_until_ms
                .is_none_or(|until| run.first_ts_ms <= until)
            && query
                .root
                .as_deref()
                .is_none_or(|root| root_of(engine, tenant, run_id, run) == root);
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
        if let Some((ts, t, r)) = &after {
            if key <= (*ts, t.as_str(), r.as_str()) {
                ahead += 1;
                continue;
            }
        }
        if let Some((ts, t, r)) = &before {
            if key >= (*ts, t.as_str(), r.as_str()) {
                continue;
            }
        }
        page.push((key.0, key.1, key.2, run));
    }
    if page.len() > limit {
        if before.is_some() {
            // The rows just ahead of the cursor: the last `limit` in the order.
            let skipped = page.len() - limit;
            if limit > 0 {
                page.select_nth_unstable_by(skipped, page_order);
            }
            page.drain(..skipped);
            ahead = skipped as u64;
        } else if limit == 0 {
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
            .map(|(_, tenant, run_id, run)| row(engine, tenant, run_id, run))
            .collect(),
        matched,
        states: states
            .into_iter()
            .map(|(state, n)| (state.to_owned(), n))
            .collect(),
        ahead,
        fleet: fleet.map(|f| f.done(engine)),
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
                stop_message: match &state.status {
                    RunStatus::Closed { message, .. } => Some(message.clone()),
                    RunStatus::Open => None,
                },
                last_decisions: recent
                    .get(&(tenant.clone(), run.clone()))
                    .map(|d| d.iter().cloned().collect())
                    .unwrap_or_default(),
                reserved: state.reserved.total(),
                tree: Some(run_tree(engine, tenant, run, state)),
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

    /// A tree (`root` → k1 → g1, k2, k3; k3 finished), a stranger, and the root
    /// cancelled, its open descendants told nearest first as the applier tells them.
    fn tree_engine() -> Engine {
        let mut engine = Engine::default();
        let events = [
            ("root", 1, r#""type":"run_started""#),
            ("k1", 2, r#""type":"run_started","parent":"root""#),
            ("k2", 3, r#""type":"run_started","parent":"root""#),
            ("k3", 4, r#""type":"run_started","parent":"root""#),
            ("g1", 5, r#""type":"run_started","parent":"k1""#),
            ("stranger", 5, r#""type":"run_started""#),
            (
                "g1",
                6,
                r#""type":"tool_call","call_id":"c","tool":"t","args":{}"#,
            ),
            ("k3", 7, r#""type":"run_finished","status":"done""#),
            ("root", 8, r#""type":"cancel","by":"ops""#),
            ("k1", 8, r#""type":"tick""#),
            ("k2", 8, r#""type":"tick""#),
            ("g1", 8, r#""type":"tick""#),
        ];
        for (i, (run, ts, body)) in events.into_iter().enumerate() {
            let json =
                format!(r#"{{"v":1,"id":"e{i}","tenant":"t","run":"{run}","ts_ms":{ts},{body}}}"#);
            engine.apply(&parse_event(json.as_bytes()).unwrap());
        }
        engine
    }

    /// A run's place as one line: parent, depth, root, stopped_by, spawned, and its
    /// children with their states and reasons.
    fn place(tree: &RunTree) -> String {
        let children: Vec<String> = tree
            .children
            .iter()
            .map(|c| {
                format!(
                    "{} {} {}",
                    c.summary.run,
                    c.state(),
                    c.summary.reason.as_deref().unwrap_or("")
                )
            })
            .collect();
        format!(
            "parent={} depth={} root={} stopped_by={} spawned={} children={children:?}",
            tree.parent.as_deref().unwrap_or("-"),
            tree.depth,
            tree.root,
            tree.stopped_by.as_deref().unwrap_or("-"),
            tree.spawned,
        )
    }

    #[test]
    fn a_runs_status_places_it_in_its_tree() {
        let engine = tree_engine();
        let cases = [
            (
                "root",
                r#"parent=- depth=0 root=root stopped_by=- spawned=4 children=["k1 CANCELLED ancestor_stopped", "k2 CANCELLED ancestor_stopped", "k3 COMPLETED completed"]"#,
            ),
            (
                "k1",
                r#"parent=root depth=1 root=root stopped_by=root spawned=1 children=["g1 CANCELLED ancestor_stopped"]"#,
            ),
            // g1 was told of the stop by its parent's: the stop came from the root.
            (
                "g1",
                "parent=k1 depth=2 root=root stopped_by=root spawned=0 children=[]",
            ),
            (
                "k3",
                "parent=root depth=1 root=root stopped_by=- spawned=0 children=[]",
            ),
            (
                "stranger",
                "parent=- depth=0 root=stranger stopped_by=- spawned=0 children=[]",
            ),
        ];
        for (run, want) in cases {
            let tree = run_tree(&engine, "t", run, engine.run("t", run).unwrap());
            assert_eq!(place(&tree), want, "{run}");
            assert_eq!(tree.open_below, 0, "{run}");
            assert!(tree
                .children
                .iter()
                .all(|c| c.parent.as_deref() == Some(run)));
        }
        // The root's tree spent what g1 did (one step).
        let root = engine.run("t", "root").unwrap();
        assert_eq!(run_tree(&engine, "t", "root", root).below.steps, 1);
    }

    #[test]
    fn open_children_are_listed_from_the_node_alone() {
        let mut engine = Engine::default();
        for (i, (run, parent)) in [("p", None), ("b", Some("p")), ("a", Some("p"))]
            .into_iter()
            .enumerate()
        {
            let parent = parent.map_or(String::new(), |p| format!(r#","parent":"{p}""#));
            let json = format!(
                r#"{{"v":1,"id":"e{i}","tenant":"t","run":"{run}","ts_ms":{i},"type":"run_started"{parent}}}"#
            );
            engine.apply(&parse_event(json.as_bytes()).unwrap());
        }
        let p = engine.run("t", "p").unwrap();
        let tree = run_tree(&engine, "t", "p", p);
        let listed: Vec<&str> = tree
            .children
            .iter()
            .map(|c| c.summary.run.as_str())
            .collect();
        assert_eq!(listed, ["b", "a"], "in the order they started");
        assert_eq!((tree.spawned, tree.open_below), (2, 2));
        assert!(tree.children.iter().all(|c| c.summary.open && c.depth == 1));
    }

    #[test]
    fn a_runs_page_lists_one_tree() {
        let engine = tree_engine();
        let cases = [
            ("root", vec!["t/g1", "t/k1", "t/k2", "t/root", "t/k3"]),
            ("k1", vec![]),
            ("stranger", vec!["t/stranger"]),
            ("nobody", vec![]),
        ];
        for (root, want) in cases {
            let query = RunsQuery {
                root: Some(root.into()),
                ..Default::default()
            };
            let page = runs_page(&engine, &query, Scope::All);
            assert_eq!(names(&page), want, "{root}");
        }
        let page = runs_page(&engine, &RunsQuery::default(), Scope::All);
        let g1 = page.runs.iter().find(|r| r.summary.run == "g1").unwrap();
        assert_eq!((g1.parent.as_deref(), g1.depth), (Some("k1"), 2));
        assert_eq!(g1.stopped_by.as_deref(), Some("root"));
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

    #[test]
    fn loose_filters_time_ranges_and_pages_backwards() {
        let engine = engine();
        let cursor = |ts, tenant: &str, run: &str| RunsCursor {
            last_ts_ms: ts,
            tenant: tenant.to_owned(),
            run: run.to_owned(),
        };
        let loose = |f: fn(&mut RunsQuery)| {
            let mut query = RunsQuery {
                loose: true,
                ..Default::default()
            };
            f(&mut query);
            query
        };
        // (query, rows, matched, ahead)
        let cases: Vec<(RunsQuery, Vec<&str>, u64, u64)> = vec![
            (
                loose(|q| q.tenant = Some("U".into())),
                vec!["u/d", "u/c"],
                2,
                0,
            ),
            (
                loose(|q| q.reason = Some("CANCEL".into())),
                vec!["t/b"],
                1,
                0,
            ),
            (
                loose(|q| q.run_contains = Some("D".into())),
                vec!["u/d"],
                1,
                0,
            ),
            (
                RunsQuery {
                    tenant: Some("U".into()),
                    ..Default::default()
                },
                vec![],
                0,
                0,
            ),
            (
                RunsQuery {
                    active_since_ms: Some(20),
                    active_until_ms: Some(25),
                    ..Default::default()
                },
                vec!["u/c"],
                1,
                0,
            ),
            (
                RunsQuery {
                    after: Some(cursor(30, "u", "d")),
                    limit: Some(1),
                    ..Default::default()
                },
                vec!["u/c"],
                4,
                2,
            ),
            // The page before `t/a`: the two rows just ahead of it, one more ahead.
            (
                RunsQuery {
                    before: Some(cursor(10, "t", "a")),
                    limit: Some(2),
                    ..Default::default()
                },
                vec!["u/d", "u/c"],
                4,
                1,
            ),
            (
                RunsQuery {
                    before: Some(cursor(30, "u", "d")),
                    limit: Some(2),
                    ..Default::default()
                },
                vec!["t/b"],
                4,
                0,
            ),
        ];
        for (query, want, matched, ahead) in cases {
            let page = runs_page(&engine, &query, Scope::All);
            assert_eq!(names(&page), want, "{query:?}");
            assert_eq!((page.matched, page.ahead), (matched, ahead), "{query:?}");
            assert!(page.fleet.is_none());
        }
    }

    #[test]
    fn the_fleet_figures_count_every_run_whatever_the_filters() {
        let mut engine = engine();
        for (run, cost) in [("a", "0.5"), ("c", "2.0")] {
            let tenant = if run == "a" { "t" } else { "u" };
            let turn = format!(
                r#"{{"v":1,"id":"{run}-t","tenant":"{tenant}","run":"{run}","ts_ms":40,"type":"model_turn","stop_reason":"end_turn","cost_usd":{cost}}}"#
            );
            engine.apply(&parse_event(turn.as_bytes()).unwrap());
        }
        let query = RunsQuery {
            tenant: Some("nobody".into()),
            fleet_since_ms: Some(25),
            ..Default::default()
        };
        let page = runs_page(&engine, &query, Scope::All);
        assert_eq!(page.matched, 0);
        let fleet = page.fleet.unwrap();
        // Active since 25: a and c (their turns at 40), b and d (at 30).
        assert_eq!(fleet.states["OPEN"], 3);
        assert_eq!(fleet.states["CANCELLED"], 1);
        assert_eq!(fleet.stop_reasons["cancelled"], 1);
        let costliest: Vec<&str> = fleet
            .costliest
            .iter()
            .map(|r| r.summary.run.as_str())
            .collect();
        assert_eq!(costliest, ["c", "a"]);
        assert_eq!(fleet.tenants, ["t", "u"]);
        assert_eq!(fleet.agents, ["x", "y"]);
        assert_eq!(fleet.reasons, ["cancelled"]);
    }
}
