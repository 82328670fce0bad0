//! The engine: all runs of all tenants and the ledger, one event in, one decision out.
//!
//! `apply` is the only way state changes, and it is a pure function of the state and the
//! event: no clock (time is `ts_ms`), no randomness. Runs live in hash maps with a fixed
//! (unseeded) hasher, FNV-1a, so nothing random enters; whatever is listed is sorted first, so no
//! map order ever reaches an output. Feeding the same
//! events in the same order to a fresh engine, or to one restored from a snapshot taken
//! anywhere in between, gives byte-identical decisions.

use std::collections::HashMap;
use std::sync::Arc;

use crate::close::decision;
use crate::decision::{Action, Decision};
use crate::event::{Event, EventBody, LedgerResolve, Resolution, RunStarted};
use crate::fixed_hash::FixedHasher;
use crate::gate;
use crate::ledger::{Ledger, LedgerEntry};
use crate::observe;
use crate::policy::PolicySet;
use crate::run::RunState;
use crate::tree::{self, Lineage};

/// Each run behind an `Arc`, changed through `Arc::make_mut`: a clone of the engine (the
/// log's snapshot view) shares every run and costs a pointer each, and only a run that
/// changes while the clone lives is copied. serde writes an `Arc<T>` as `T`, so the
/// serialised form is the same as with plain runs.
pub(crate) type Runs = HashMap<String, TenantRuns, FixedHasher>;
/// One tenant's runs, by run id.
pub(crate) type TenantRuns = HashMap<String, Arc<RunState>, FixedHasher>;

/// Serialised through `engine_form.rs` (runs refer to a table of policies).
#[derive(Debug, Clone, PartialEq)]
pub struct Engine {
    pub(crate) policies: PolicySet,
    pub(crate) runs: Runs,
    pub(crate) ledger: Ledger,
    pub(crate) scratch: Scratch,
}

/// A reusable buffer for canonical encodings; always empty between calls, so it is no
/// part of the engine's state (equal, never serialised).
#[derive(Debug, Clone, Default)]
pub(crate) struct Scratch(pub Vec<u8>);

impl PartialEq for Scratch {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Default for Engine {
    fn default() -> Self {
        Engine::new(PolicySet::default())
    }
}

impl Engine {
    pub fn new(policies: PolicySet) -> Self {
        Engine {
            policies,
            runs: Runs::default(),
            ledger: Ledger::default(),
            scratch: Scratch::default(),
        }
    }

    pub fn policies(&self) -> &PolicySet {
        &self.policies
    }

    /// New policies for runs that start from now on; running runs keep the policy they
    /// started with (a reload must not change the rules of a run mid-way).
    pub fn set_policies(&mut self, policies: PolicySet) {
        self.policies = policies;
    }

    /// Forgets a ledger key (the log's ledger retention).
    pub fn forget_operation(&mut self, tenant: &str, op_key: &str) -> bool {
        self.ledger.forget(tenant, op_key).is_some()
    }

    /// What a cluster's shared ledger says about a key that runs on other daemons
    /// touched (see [`Ledger`]'s `adopt`): the next call with this key is judged by it.
    pub fn adopt_operation(&mut self, tenant: &str, op_key: &str, entry: Option<LedgerEntry>) {
        self.ledger.adopt(tenant, op_key, entry);
    }

    /// Applies one event (already validated, deduplicated and in its run's order) and
    /// returns the guard's decision for it.
    pub fn apply(&mut self, event: &Event) -> Decision {
        self.apply_touching(event).0
    }

    /// [`Engine::apply`], also naming the `op_key` whose ledger entry the event may have
    /// changed: a call's own key, or for a result the key of the call it answers (the
    /// log keeps when each key was last written, for ledger retention).
    pub fn apply_touching(&mut self, event: &Event) -> (Decision, Option<String>) {
        let Engine {
            policies,
            runs,
            ledger,
            scratch,
        } = self;
        if !runs.contains_key(event.tenant.as_str()) {
            runs.insert(event.tenant.clone(), HashMap::default());
        }
        let tenant_runs = runs.get_mut(event.tenant.as_str()).expect("inserted above");
        let lineage = lineage(tenant_runs, event);
        let run = match tenant_runs.get_mut(event.run.as_str()) {
            Some(run) => Arc::make_mut(run),
            None => {
                let agent = match &event.body {
                    EventBody::RunStarted(started) => started.agent.clone(),
                    _ => None,
                };
                let policy = policies.for_agent(agent.as_deref()).clone();
                let run = tenant_runs
                    .entry(event.run.clone())
                    .or_insert_with(|| Arc::new(RunState::new(policy, agent, event.ts_ms)));
                Arc::make_mut(run)
            }
        };
        run.counters.events += 1;
        run.advance_clock(event.ts_ms);
        if event.seq.is_some() {
            run.last_seq = event.seq;
        }
        let before = tree::own(run);
        let reserved = run.reserved.total();
        let was_open = run.is_open();
        let had_parent = run.node.parent.is_some();
        let (decided, touched) = match &event.body {
            EventBody::ToolCall(call) => (
                gate::gate(run, ledger, &mut scratch.0, event, call, &lineage),
                call.op_key.clone(),
            ),
            EventBody::ToolResult(result) => {
                observe::tool_result(run, ledger, &mut scratch.0, event, result)
            }
            EventBody::RunStarted(started) => {
                (run_started(run, policies, event, started, &lineage), None)
            }
            EventBody::Progress(update) => (observe::progress(run, event, update), None),
            EventBody::ModelTurn(turn) => (observe::model_turn(run, event, turn, &lineage), None),
            EventBody::Compaction(c) => (observe::compaction(run, event, c), None),
            EventBody::Cancel(cancel) => (observe::cancel(run, event, cancel), None),
            EventBody::Resume(resume) => (observe::resume(run, event, resume), None),
            EventBody::RunFinished(finished) => (observe::run_finished(run, event, finished), None),
            EventBody::Tick(_) => (observe::tick(run, ledger, event, &lineage), None),
            EventBody::LedgerResolve(resolve) => (
                ledger_resolve(ledger, event, resolve),
                Some(resolve.op_key.clone()),
            ),
            EventBody::InstanceLaunched(_) => (decision(event, None, Action::Continue), None),
            EventBody::Prompt(_) => (observe::prompt(run, event), None),
            EventBody::ModelCall(call) => (observe::model_call(run, event, call, &lineage), None),
        };
        // What the run spent or became, for the runs above it.
        if run.node.parent.is_some() {
            let change = tree::Change::between(&before, reserved, was_open, run);
            let parent = (lineage.is_empty() && !change.is_nothing())
                .then(|| run.node.parent.clone())
                .flatten();
            if !had_parent {
                tree::join(tenant_runs, &event.run, &lineage);
            }
            // The events that bear on the tree read the ancestors already; the others
            // (a result, a cancel, a finish) look them up only when they change them.
            let ancestors = match parent {
                Some(parent) => Lineage::of(tenant_runs, Some(&parent), false),
                None => lineage,
            };
            tree::carry_up(tenant_runs, &event.run, &ancestors, change);
        } else if let Some(parent) = refused_spawn(&event.body, &decided) {
            tree::spawn_refused(tenant_runs, parent, &event.run, &decided);
        }
        (decided, touched)
    }

    /// The open runs below a run, nearest first: a stop of the run reaches each of them
    /// (the daemon writes a `tick` for each, which its latch answers with the stop).
    pub fn open_descendants(&self, tenant: &str, run: &str) -> Vec<String> {
        self.runs
            .get(tenant)
            .map(|runs| tree::open_descendants(runs, run))
            .unwrap_or_default()
    }

    pub fn run(&self, tenant: &str, run: &str) -> Option<&RunState> {
        self.runs.get(tenant)?.get(run).map(|run| &**run)
    }

    /// Every run, ordered by tenant then run id.
    pub fn runs(&self) -> impl Iterator<Item = (&str, &str, &RunState)> {
        let mut all: Vec<(&str, &str, &RunState)> = self
            .runs
            .iter()
            .flat_map(|(tenant, runs)| {
                runs.iter()
                    .map(move |(id, run)| (tenant.as_str(), id.as_str(), &**run))
            })
            .collect();
        all.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        all.into_iter()
    }

    pub fn run_count(&self) -> usize {
        self.runs.values().map(HashMap::len).sum()
    }

    /// Forgets a run (retention). Its ledger entries stay: an operation that completed
    /// must not run again because its run was pruned.
    pub fn forget_run(&mut self, tenant: &str, run: &str) -> Option<Arc<RunState>> {
        let runs = self.runs.get_mut(tenant)?;
        let removed = runs.remove(run);
        if runs.is_empty() {
            self.runs.remove(tenant);
        }
        removed
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// When the lease of a key in flight since `since_ms` ends, by the policy of the run
    /// holding it; `None` when that run is not known (pruned, or on another daemon).
    pub fn lease_end_ms(&self, tenant: &str, run: &str, since_ms: u64) -> Option<u64> {
        let run = self.run(tenant, run)?;
        Some(gate::lease_end_ms(&run.policy, since_ms))
    }

    /// Event time at which an open run needs a `tick` if nothing else arrives: its time
    /// budget's end, or sooner the end of the lease of a call of its own in flight (when
    /// its policy stops the run for an unknown outcome). The daemon's ticks follow this.
    pub fn wake_ms(&self, tenant: &str, run_id: &str, run: &RunState) -> u64 {
        observe::held_leases(run, &self.ledger, tenant, run_id)
            .map(|(_, _, since_ms)| gate::lease_end_ms(&run.policy, since_ms))
            .fold(run.deadline_ms(), u64::min)
    }
}

/// An operator's word on an op_key. It changes the ledger only, never the run it is
/// sent to (that run may be closed; an accepted resume reopens it, as ever).
fn ledger_resolve(ledger: &mut Ledger, event: &Event, resolve: &LedgerResolve) -> Decision {
    let result = match resolve.resolution {
        Resolution::Completed => Some(match &resolve.output {
            Some(value) => crate::message::compact_json(value),
            None => "null".to_owned(),
        }),
        Resolution::Released => None,
    };
    let before = ledger.resolve(
        &event.tenant,
        &resolve.op_key,
        result,
        &event.run,
        &event.id,
    );
    let mut decided = decision(event, None, Action::Continue);
    decided.message = Some(crate::message::resolved(resolve, before.as_ref()));
    decided
}

/// The ancestors of the event's run, for the events the tree bears on (a call, a model
/// call or turn, a tick, a start that names a parent). Empty for a root.
fn lineage(runs: &TenantRuns, event: &Event) -> Lineage {
    let bears = matches!(
        event.body,
        EventBody::ToolCall(_)
            | EventBody::ModelCall(_)
            | EventBody::ModelTurn(_)
            | EventBody::Tick(_)
            | EventBody::RunStarted(_)
    );
    if !bears {
        return Lineage::default();
    }
    let known = runs.get(event.run.as_str());
    let parent = match (&event.body, known) {
        (_, Some(run)) if run.node.parent.is_some() => run.node.parent.as_deref(),
        // A run joins a tree when it starts, not later: its spending so far would be
        // missing from every budget above it.
        (EventBody::RunStarted(started), known)
            if known.is_none_or(|run| run.counters.events == 0) =>
        {
            started.parent.as_deref()
        }
        _ => None,
    };
    match parent {
        Some(parent) => {
            // The parent's memory of sub-task outcomes matters only before the run's
            // first call names its sub-task.
            let first_call = known.is_none_or(|run| run.node.subtask.is_none());
            let lineage = Lineage::of(runs, Some(parent), first_call);
            // A parent below this run would make a cycle: no tree, then.
            if lineage.ancestors.iter().any(|a| a.id == event.run) {
                return Lineage::default();
            }
            lineage
        }
        _ => Lineage::default(),
    }
}

/// The parent a refused sub-agent named, when the decision refused its start.
fn refused_spawn<'a>(body: &'a EventBody, decided: &Decision) -> Option<&'a str> {
    match body {
        EventBody::RunStarted(started) if decided.action == Action::Stop => {
            started.parent.as_deref()
        }
        _ => None,
    }
}

/// `run_started` may come first or late (without `seq`, order is the producer's); either
/// way it sets the agent, the tool list and the run's own policy overrides. A start that
/// names a parent joins the parent's tree, unless a run above is stopped or a cap of one
/// refuses one more sub-agent: then the run is closed at once, saying why.
fn run_started(
    run: &mut RunState,
    policies: &PolicySet,
    event: &Event,
    started: &RunStarted,
    lineage: &Lineage,
) -> Decision {
    if started.agent.is_some() {
        run.agent = started.agent.clone();
    }
    let agent_policy = policies.for_agent(run.agent.as_deref());
    run.policy = match &started.policy {
        // Checked at parse time (`parse::check_run_policy`), so layering cannot fail here
        // on shape; a failure would be a bug, and the agent's policy is the safe answer.
        Some(patch) => agent_policy
            .layered(patch, "run_started.policy")
            .map(|(policy, _)| Arc::new(policy))
            .unwrap_or_else(|_| agent_policy.clone()),
        None => agent_policy.clone(),
    };
    if let Some(tools) = &started.tools {
        let mut tools = tools.clone();
        tools.sort();
        tools.dedup();
        run.allowed_tools = Some(tools);
    }
    if let Some(decided) = crate::close::latched(run, event, None) {
        return decided;
    }
    if let (Some(parent), None) = (lineage.ancestors.first(), &run.node.parent) {
        let depth = parent.depth + 1;
        if let Some(closing) = lineage.stopped().or_else(|| lineage.refuse_spawn(depth)) {
            return crate::close::close(run, event, None, closing);
        }
        run.node.parent = Some(parent.id.clone());
        run.node.depth = depth;
    }
    let mut decided = decision(event, None, Action::Continue);
    if let (Some(parent), None) = (&started.parent, &run.node.parent) {
        // Not refused: the parent may live on another daemon of a cluster, or start late.
        decided.message = Some(format!(
            "run {parent}, named as this run's parent, is not known to this guard (not started, or served by another daemon): this run is a root, with budgets of its own"
        ));
    }
    decided
}
