//! Run trees (guard contract §6): a run that names a `parent` in its `run_started` is a
//! sub-agent of that run. Budgets of a node count its whole subtree, caps bound how
//! many runs a node may start, how many may be open at once and how deep, a stop of a
//! node reaches every open descendant, and a sub-task that ends the same again and
//! again is a loop of its parent.
//!
//! The engine decides one event of one run at a time; what the rest of the tree says
//! is read before ([`Lineage`]: the run's ancestors as they stand) and what the run
//! spent or became is carried up after ([`carry_up`]). Both walk at most the tree's
//! depth, which `max_depth` bounds.

use std::sync::Arc;

use crate::close::Closing;
use crate::decision::{Decision, Reason, StopReport, TerminalState};
use crate::engine::TenantRuns;
use crate::fingerprint::Fingerprint;
use crate::fixed_hash::fnv1a;
use crate::policy::Policy;
use crate::run::{add, push_bounded, Below, RunState, CHILD_MEMORY};

/// Longest chain of parents followed: a cycle or a broken chain ends the walk.
const MAX_WALK: usize = 64;

/// One ancestor of a run, as it stood before the event being decided.
pub(crate) struct Ancestor {
    pub id: String,
    pub policy: Arc<Policy>,
    pub report: Option<Arc<StopReport>>,
    pub depth: u32,
    pub spawned: u64,
    pub open_below: u32,
    /// Its own spending plus its subtree's.
    pub spent: Below,
    /// What model calls in flight hold, its own and its subtree's.
    pub reserved: Below,
    pub child_outcomes: Vec<(u64, u64, u32)>,
}

/// A run's ancestors, nearest first (empty for a root).
#[derive(Default)]
pub(crate) struct Lineage {
    pub ancestors: Vec<Ancestor>,
}

/// What a run spent itself plus what its subtree spent, in the task's terms.
pub(crate) fn spent(run: &RunState) -> Below {
    Below {
        steps: run.task.steps + run.node.below.steps,
        model_turns: run.task.model_turns + run.node.below.model_turns,
        tokens: run.counters.tokens.saturating_add(run.node.below.tokens),
        cost_usd: run.counters.cost_usd + run.node.below.cost_usd,
    }
}

impl Lineage {
    /// The ancestors of a run whose parent is `parent`; with the parent's memory of its
    /// children's sub-tasks when `outcomes`.
    pub fn of(runs: &TenantRuns, parent: Option<&str>, outcomes: bool) -> Lineage {
        let mut ancestors = Vec::new();
        let mut next = parent;
        while let Some(id) = next {
            let Some(run) = runs.get(id) else { break };
            if ancestors.len() == MAX_WALK || ancestors.iter().any(|a: &Ancestor| a.id == id) {
                break;
            }
            ancestors.push(Ancestor {
                id: id.to_owned(),
                policy: run.policy.clone(),
                report: run.report().cloned(),
                depth: run.node.depth,
                spawned: run.node.spawned,
                open_below: run.node.open_below,
                spent: spent(run),
                reserved: run.reserved.total(),
                child_outcomes: if outcomes && ancestors.is_empty() {
                    run.node.child_outcomes.clone()
                } else {
                    Vec::new()
                },
            });
            next = run.node.parent.as_deref();
        }
        Lineage { ancestors }
    }

    pub fn is_empty(&self) -> bool {
        self.ancestors.is_empty()
    }

    /// An ancestor that was stopped or cancelled: the run is over too.
    pub fn stopped(&self) -> Option<Closing> {
        let closed = |a: &'_ Ancestor| {
            let report = a.report.as_ref()?;
            (report.terminal_state != TerminalState::Completed).then_some(report.clone())
        };
        // Named: the run whose own stop it was, not one that only passed it on.
        let (ancestor, report) = self
            .ancestors
            .iter()
            .filter_map(|a| closed(a).map(|r| (a, r)))
            .find(|(_, r)| r.reason != Reason::AncestorStopped)
            .or_else(|| {
                self.ancestors
                    .iter()
                    .find_map(|a| closed(a).map(|r| (a, r)))
            })?;
        Some(Closing::new(
            TerminalState::Cancelled,
            Reason::AncestorStopped,
            Some(format!(
                "run {} above this one was closed ({} {})",
                ancestor.id,
                report.terminal_state.as_str(),
                report.reason.as_str()
            )),
        ))
    }

    /// A budget of an ancestor, counted over its subtree, spent — or about to be by
    /// `adding` (a model turn's spending, which the ancestors do not hold yet).
    pub fn budget_spent(&self, adding: Below) -> Option<Closing> {
        self.ancestors.iter().find_map(|a| {
            let spent = Below {
                steps: a.spent.steps + adding.steps,
                model_turns: a.spent.model_turns + adding.model_turns,
                tokens: a.spent.tokens.saturating_add(adding.tokens),
                cost_usd: a.spent.cost_usd + adding.cost_usd,
            };
            let which = budget_spent(&a.policy, spent)?;
            Some(Closing::new(
                TerminalState::StoppedLoopGuard,
                Reason::TreeBudget,
                Some(format!(
                    "the {} of run {} is spent by its tree of runs ({})",
                    budget_name(which),
                    a.id,
                    spent_text(&a.policy, spent)
                )),
            ))
        })
    }

    /// A model call reserving `reservation` that a budget of an ancestor would not have
    /// room for: its subtree's spending, what its model calls in flight hold, and this
    /// one, past its token, cost or model-turn budget (or one of those already spent).
    pub fn model_call_refused(&self, reservation: Below) -> Option<Closing> {
        self.ancestors.iter().find_map(|a| {
            let (which, total) = model_call_refused(&a.policy, a.spent, a.reserved, reservation)?;
            Some(Closing::new(
                TerminalState::StoppedLoopGuard,
                Reason::TreeBudget,
                Some(format!(
                    "the {} of run {} has no room for this model call: its tree of runs spent and holds for model calls in flight {}, and this call reserves {}",
                    budget_name(which),
                    a.id,
                    spent_text(&a.policy, total),
                    reservation_text(reservation)
                )),
            ))
        })
    }

    /// The caps of every ancestor for one more run below them, at `depth`.
    pub fn refuse_spawn(&self, depth: u32) -> Option<Closing> {
        self.ancestors.iter().find_map(|a| {
            let p = &a.policy;
            let (reason, why) = if depth - a.depth > p.max_depth {
                (
                    Reason::DepthLimit,
                    format!(
                        "it would be {} levels below run {} (max_depth {})",
                        depth - a.depth,
                        a.id,
                        p.max_depth
                    ),
                )
            } else if a.spawned >= p.max_children {
                (
                    Reason::SpawnLimit,
                    format!(
                        "run {} has started {} sub-agents (max_children {})",
                        a.id, a.spawned, p.max_children
                    ),
                )
            } else if a.open_below >= p.max_open_children {
                (
                    Reason::ConcurrencyLimit,
                    format!(
                        "run {} has {} sub-agents running (max_open_children {}); wait for one to finish",
                        a.id, a.open_below, p.max_open_children
                    ),
                )
            } else {
                return None;
            };
            Some(Closing::new(
                TerminalState::StoppedLoopGuard,
                reason,
                Some(format!("sub-agent not started: {why}")),
            ))
        })
    }

    /// The parent's children ran this sub-task `limit` times already, ending the same.
    pub fn subtask_repeated(&self, subtask: u64, limit: u32) -> Option<Closing> {
        let parent = self.ancestors.first()?;
        let (_, _, times) = parent
            .child_outcomes
            .iter()
            .filter(|(s, _, _)| *s == subtask)
            .max_by_key(|(_, _, n)| *n)?;
        (*times >= limit).then(|| {
            Closing::new(
                TerminalState::StoppedLoopGuard,
                Reason::SubtaskRepeat,
                Some(format!(
                    "run {} already ran this sub-task {} times in sub-agents that all ended the same way; starting it again will not change that",
                    parent.id, times
                )),
            )
        })
    }
}

/// Which budget of `policy` a subtree's spending has reached, if any: the one
/// definition of "spent" for a run's own budgets and its ancestors'.
pub(crate) fn budget_spent(policy: &Policy, spent: Below) -> Option<Reason> {
    if spent.steps >= policy.max_steps {
        Some(Reason::StepBudget)
    } else if spent.model_turns > policy.max_model_turns {
        Some(Reason::TurnBudget)
    } else if spent.tokens >= policy.max_tokens {
        Some(Reason::TokenBudget)
    } else if spent.cost_usd >= policy.max_cost_usd {
        Some(Reason::CostBudget)
    } else {
        None
    }
}

/// Which budget of `policy` a model call reserving `reservation` has no room in, and
/// the spending and holdings it was judged on: one already spent (as for any call), or
/// one that spent + held + this reservation would pass. A model call counts as one
/// model turn; "pass" is the model turn's own test (`model_turns` above the budget,
/// tokens or cost above it — a call that would land exactly on a token or cost budget
/// may run, the turn that lands there closes the run as it always did).
pub(crate) fn model_call_refused(
    policy: &Policy,
    spent: Below,
    reserved: Below,
    reservation: Below,
) -> Option<(Reason, Below)> {
    // Steps are the gate's: a model call after the last step may still give the answer.
    let spent = Below { steps: 0, ..spent };
    let total = add(add(spent, reserved), reservation);
    let which = budget_spent(policy, spent).or(if total.model_turns > policy.max_model_turns {
        Some(Reason::TurnBudget)
    } else if total.tokens > policy.max_tokens {
        Some(Reason::TokenBudget)
    } else if total.cost_usd > policy.max_cost_usd {
        Some(Reason::CostBudget)
    } else {
        None
    })?;
    Some((which, total))
}

/// A model call reserving `reservation` that a budget of the run itself (counted over
/// its subtree) has no room for.
pub(crate) fn model_call_refused_own(run: &RunState, reservation: Below) -> Option<Closing> {
    let (which, total) =
        model_call_refused(&run.policy, spent(run), run.reserved.total(), reservation)?;
    let mut closing = Closing::guard(which);
    closing.detail = Some(format!(
        "the {} has no room for this model call: this run and its sub-agents spent and hold for model calls in flight {}, and this call reserves {}",
        budget_name(which),
        spent_text(&run.policy, total),
        reservation_text(reservation)
    ));
    Some(closing)
}

/// A model call's reservation, in a report's words.
pub(crate) fn reservation_text(reservation: Below) -> String {
    format!(
        "1 model turn, {} tokens, ${:.2}",
        reservation.tokens, reservation.cost_usd
    )
}

/// A budget's reason in the words of a report's detail.
fn budget_name(reason: Reason) -> &'static str {
    match reason {
        Reason::StepBudget => "step budget",
        Reason::TurnBudget => "model turn budget",
        Reason::TokenBudget => "token budget",
        _ => "cost budget",
    }
}

pub(crate) fn spent_text(policy: &Policy, spent: Below) -> String {
    format!(
        "{} of {} steps, {} of {} model turns, {} of {} tokens, ${:.2} of ${:.2}",
        spent.steps,
        policy.max_steps,
        spent.model_turns,
        policy.max_model_turns,
        spent.tokens,
        policy.max_tokens,
        spent.cost_usd,
        policy.max_cost_usd
    )
}

/// A run's sub-task: its agent and its first call.
pub(crate) fn subtask(agent: Option<&str>, first_call: Fingerprint) -> u64 {
    fnv1a(agent.unwrap_or("").as_bytes()) ^ (first_call as u64).rotate_left(29)
}

/// How a run ended, for its parent: terminal state, reason and its last answer.
pub(crate) fn outcome(run: &RunState) -> u64 {
    let Some(report) = run.report() else { return 0 };
    let last_answer = run
        .detection
        .window
        .iter()
        .rev()
        .find_map(|e| e.result)
        .map_or(0, |(fp, _)| fp as u64);
    fnv1a(
        format!(
            "{}:{}",
            report.terminal_state.as_str(),
            report.reason.as_str()
        )
        .as_bytes(),
    ) ^ last_answer
}

/// What changed in a run while one of its events was decided, for its ancestors.
pub(crate) struct Change {
    pub spent: Below,
    /// What the run (and its subtree) held for model calls in flight, before and after.
    pub reserved: (Below, Below),
    /// It closed (with this report) or reopened.
    pub closed: Option<Arc<StopReport>>,
    pub reopened: bool,
    pub subtask: Option<u64>,
    pub outcome: u64,
}

impl Change {
    pub fn between(before: &Below, reserved: Below, was_open: bool, run: &RunState) -> Change {
        let now = own(run);
        Change {
            spent: Below {
                steps: now.steps.saturating_sub(before.steps),
                model_turns: now.model_turns.saturating_sub(before.model_turns),
                tokens: now.tokens.saturating_sub(before.tokens),
                cost_usd: (now.cost_usd - before.cost_usd).max(0.0),
            },
            reserved: (reserved, run.reserved.total()),
            closed: if was_open {
                run.report().cloned()
            } else {
                None
            },
            reopened: !was_open && run.is_open(),
            subtask: run.node.subtask,
            outcome: outcome(run),
        }
    }

    pub fn is_nothing(&self) -> bool {
        self.spent == Below::default()
            && self.reserved.0 == self.reserved.1
            && self.closed.is_none()
            && !self.reopened
    }
}

/// A run's own spending, counted across its tasks (what its ancestors hold of it).
pub(crate) fn own(run: &RunState) -> Below {
    Below {
        steps: run.counters.steps,
        model_turns: run.counters.model_turns,
        tokens: run.counters.tokens,
        cost_usd: run.counters.cost_usd,
    }
}

/// Carries a run's change up to its ancestors: their subtree spending, their open
/// counts, the parent's list of open children and memory of sub-task outcomes, and the
/// note that tells the parent's model a child was stopped.
pub(crate) fn carry_up(runs: &mut TenantRuns, run_id: &str, lineage: &Lineage, change: Change) {
    if change.is_nothing() {
        return;
    }
    for (i, ancestor) in lineage.ancestors.iter().enumerate() {
        let Some(slot) = runs.get_mut(&ancestor.id) else {
            break;
        };
        let ancestor = Arc::make_mut(slot);
        let below = &mut ancestor.node.below;
        below.steps += change.spent.steps;
        below.model_turns += change.spent.model_turns;
        below.tokens = below.tokens.saturating_add(change.spent.tokens);
        below.cost_usd += change.spent.cost_usd;
        if change.reserved.0 != change.reserved.1 {
            let (before, after) = change.reserved;
            let held = &mut ancestor.reserved.below;
            held.model_turns =
                (held.model_turns + after.model_turns).saturating_sub(before.model_turns);
            held.tokens = held
                .tokens
                .saturating_add(after.tokens)
                .saturating_sub(before.tokens);
            // Sums of floats do not come back to exactly 0 by subtraction.
            held.cost_usd = if held.model_turns == 0 {
                0.0
            } else {
                (held.cost_usd + after.cost_usd - before.cost_usd).max(0.0)
            };
        }
        if change.closed.is_some() {
            ancestor.node.open_below = ancestor.node.open_below.saturating_sub(1);
        }
        if change.reopened {
            ancestor.node.open_below += 1;
        }
        if i == 0 {
            note_child(ancestor, run_id, &change);
        }
    }
}

fn note_child(parent: &mut RunState, child: &str, change: &Change) {
    let node = &mut parent.node;
    if let Some(report) = &change.closed {
        node.children.retain(|c| c != child);
        if let Some(subtask) = change.subtask {
            match node
                .child_outcomes
                .iter_mut()
                .find(|(s, o, _)| *s == subtask && *o == change.outcome)
            {
                Some((_, _, times)) => *times += 1,
                None => push_bounded(
                    &mut node.child_outcomes,
                    (subtask, change.outcome, 1),
                    CHILD_MEMORY,
                ),
            }
        }
        let told = matches!(
            report.terminal_state,
            TerminalState::Completed | TerminalState::Failed
        ) || report.reason == Reason::AncestorStopped;
        if !told {
            let note = format!(
                "{child} ({} {})",
                report.terminal_state.as_str(),
                report.reason.as_str()
            );
            push_bounded(&mut node.stopped_children, note, CHILD_MEMORY);
        }
    }
    if change.reopened && !node.children.iter().any(|c| c == child) {
        node.children.push(child.to_owned());
    }
}

/// A child joins its parent's tree: every ancestor counts one more run started and open
/// below it, and the parent lists it.
pub(crate) fn join(runs: &mut TenantRuns, child: &str, lineage: &Lineage) {
    for (i, ancestor) in lineage.ancestors.iter().enumerate() {
        let Some(slot) = runs.get_mut(&ancestor.id) else {
            break;
        };
        let run = Arc::make_mut(slot);
        run.node.spawned += 1;
        run.node.open_below += 1;
        if i == 0 {
            run.node.children.push(child.to_owned());
        }
    }
}

/// The open runs below `run`, nearest first: where its stop must go.
pub(crate) fn open_descendants(runs: &TenantRuns, run: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut next = vec![run.to_owned()];
    while let Some(id) = next.pop() {
        let Some(state) = runs.get(&id) else { continue };
        for child in &state.node.children {
            if found.len() >= 10_000 || found.iter().any(|f| f == child) {
                continue;
            }
            if runs.get(child).is_some_and(|c| c.is_open()) {
                found.push(child.clone());
            }
            next.push(child.clone());
        }
    }
    found
}

/// A sub-agent the caps refused to start: its parent's model is told at its next call.
pub(crate) fn spawn_refused(runs: &mut TenantRuns, parent: &str, child: &str, decided: &Decision) {
    let Some(slot) = runs.get_mut(parent) else {
        return;
    };
    let node = &mut Arc::make_mut(slot).node;
    let reason = decided.reason.map_or("refused", |r| r.as_str());
    let note = format!("{child} (not started: {reason})");
    push_bounded(&mut node.stopped_children, note, CHILD_MEMORY);
}
