//! The calibration: key by key, the strictest value that keeps the completed runs
//! untouched (or all but k of them), found by galloping up from the key's floor and
//! bisecting, and *checked by replay* at every value it accepts, so the proposal as a whole is one that was replayed and passed —
//! whatever the interplay between keys.
//!
//! Keys are lowered one at a time, each given the others' values as already lowered;
//! further passes pick up room that another key's change made (a lower
//! `warning_threshold` lets `critical_threshold` go lower), until nothing moves.
//!
//! A key the recorded runs never come near — even its floor stops none of them, say a
//! cost budget in a history without a priced model turn — has no evidence behind any
//! value, and is left as it is rather than lowered to the floor.

use std::collections::BTreeMap;

use fusebox_core::{Policy, PolicySet};
use serde_json::Value;

use crate::tune::history::{Evaluation, History};
use crate::tune::keys::{self, policy_set, Key};

/// Passes over the keys at most; each after the first only follows an ordering rule
/// (warning < critical < breaker) one step down.
const PASSES: usize = 6;

/// What was decided for one key.
#[derive(Debug, Clone)]
pub struct Proposal {
    pub key: Key,
    pub was: u64,
    pub proposed: u64,
    /// Some completed run is interfered with at the key's floor: the data constrains it.
    pub evidence: bool,
    /// At one unit stricter than proposed, with every other key as proposed: how many
    /// completed runs would be interfered with, and the first of them (none when the
    /// proposal is the floor).
    pub one_stricter: Option<(usize, String)>,
    /// This key alone at its proposed value, everything else as it was: how many of
    /// the scope's recorded runaways stop sooner than recorded, and by how many calls in
    /// all.
    pub runaways_sooner: usize,
    pub calls_sooner: u64,
}

/// A policy being calibrated: how to turn it into the full policy set that would be
/// deployed, and which evaluations are acceptable.
pub struct Scope<'a> {
    pub build: Box<dyn Fn(&Policy) -> PolicySet + 'a>,
    pub accept: Box<dyn Fn(&Evaluation) -> bool + 'a>,
    /// Evaluations may stop counting after this many interfered runs.
    pub give_up_after: usize,
    /// The runs the policy is for (all of them for `[policy]`, an agent's for its own).
    pub covers: Box<dyn Fn(usize) -> bool + 'a>,
}

/// Lowers every key of `start` as far as `scope` accepts.
pub fn descend(history: &History, start: &Policy, scope: &Scope<'_>) -> Policy {
    let keys = keys::keys(start);
    let mut policy = start.clone();
    let passes = |policy: &Policy| {
        let evaluation = history.evaluate(&(scope.build)(policy), Some(scope.give_up_after), false);
        !evaluation.gave_up && (scope.accept)(&evaluation)
    };
    for _ in 0..PASSES {
        let mut changed = false;
        for key in &keys {
            history.note(&key.path);
            let current = key.get(&policy);
            let floor = key.get(&key.set(&policy, 0));
            if floor >= current || passes(&key.set(&policy, floor)) {
                // At its floor already, or no evidence: nothing recorded reaches it.
                continue;
            }
            // The floor fails and `current` passes. Gallop up from the floor, then
            // bisect: a failing replay stops at the first run it interferes with, so
            // probing from below costs less than from above, where every probe passes
            // and replays everything.
            let (mut lo, mut hi) = (floor, current);
            let mut step = 1;
            while lo + step < hi {
                if passes(&key.set(&policy, lo + step)) {
                    hi = lo + step;
                    break;
                }
                lo += step;
                step *= 2;
            }
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if passes(&key.set(&policy, mid)) {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            // `hi` is the current value or one that was replayed and passed.
            if hi < current {
                policy = key.set(&policy, hi);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    policy
}

/// The per-key account of a calibration from `start` to `proposed`.
pub fn proposals(
    history: &History,
    start: &Policy,
    proposed: &Policy,
    scope: &Scope<'_>,
) -> Vec<Proposal> {
    keys::keys(start)
        .into_iter()
        .map(|key| {
            let was = key.get(start);
            let value = key.get(proposed);
            let floor = key.get(&key.set(proposed, 0));
            let interfered_at = |units: u64| {
                let trial = key.set(proposed, units);
                let evaluation = history.evaluate(&(scope.build)(&trial), None, false);
                let first = evaluation
                    .interfered
                    .first()
                    .map(|&r| format!("{}/{}", history.runs[r].tenant, history.runs[r].run))
                    .unwrap_or_default();
                (evaluation.interfered.len(), first)
            };
            let one_stricter = (value > floor).then(|| interfered_at(value - 1));
            let evidence = match &one_stricter {
                Some((count, _)) if value - 1 == floor => *count > 0,
                _ => value > floor && interfered_at(floor).0 > 0,
            };
            let alone = if value < was {
                history.evaluate(&(scope.build)(&key.set(start, value)), None, true)
            } else {
                Evaluation::default()
            };
            let sooner: Vec<u64> = alone
                .sooner
                .iter()
                .filter(|(r, _)| (scope.covers)(*r))
                .map(|(_, calls)| *calls)
                .collect();
            Proposal {
                key,
                was,
                proposed: value,
                evidence,
                one_stricter,
                runaways_sooner: sooner.len(),
                calls_sooner: sooner.iter().sum(),
            }
        })
        .collect()
}

/// A whole calibration: the base policy, then each agent with enough completed runs.
pub struct Calibration {
    pub base: Policy,
    pub base_proposals: Vec<Proposal>,
    /// The `[agents.<name>.policy]` patches of the proposal (the recorded ones, plus
    /// calibrated keys).
    pub agents: BTreeMap<String, Value>,
    pub agent_proposals: BTreeMap<String, Vec<Proposal>>,
    /// Completed runs per agent ("-" for runs without one).
    pub completed_by_agent: BTreeMap<String, usize>,
    pub completed: usize,
}

impl Calibration {
    pub fn policy_set(&self) -> PolicySet {
        policy_set(&self.base, &self.agents)
    }
}

/// Calibrates the policies `history` ends with. `k`: completed runs a scope may
/// interfere with; `min_runs`: completed runs an agent needs for a policy of its own.
pub fn calibrate(history: &History, k: usize, min_runs: usize) -> Result<Calibration, String> {
    let (start_base, start_agents) = keys::split(&history.policies);
    let start_set = policy_set(&start_base, &start_agents);
    let already = history.evaluate(&start_set, None, false);
    if !already.interfered.is_empty() {
        let r = &history.runs[already.interfered[0]];
        return Err(format!(
            "the policies to start from already stop or refuse calls of {} completed run(s) (first: {}/{}), which ran under other policies; name the policy to start from with --baseline FILE",
            already.interfered.len(),
            r.tenant,
            r.run
        ));
    }
    let mut completed_by_agent: BTreeMap<String, usize> = BTreeMap::new();
    for run in history.completed() {
        *completed_by_agent
            .entry(run.agent.clone().unwrap_or_else(|| "-".to_owned()))
            .or_default() += 1;
    }
    let completed = completed_by_agent.values().sum();

    let base_scope = Scope {
        build: Box::new(|p: &Policy| policy_set(p, &start_agents)),
        accept: Box::new(|e: &Evaluation| e.interfered.len() <= k),
        give_up_after: k,
        covers: Box::new(|_| true),
    };
    let base = descend(history, &start_base, &base_scope);
    let base_proposals = proposals(history, &start_base, &base, &base_scope);

    let mut agents = start_agents.clone();
    let mut agent_proposals = BTreeMap::new();
    for (agent, &count) in &completed_by_agent {
        if agent == "-" || count < min_runs {
            continue;
        }
        let current = policy_set(&base, &agents);
        let before = history.evaluate(&current, None, false).interfered.len();
        let start = (**current.for_agent(Some(agent))).clone();
        let others = agents.clone();
        let base_ref = &base;
        let is_agent = |r: usize| history.runs[r].agent.as_deref() == Some(agent.as_str());
        let scope = Scope {
            build: Box::new(move |p: &Policy| {
                let mut with = others.clone();
                with.insert(agent.clone(), diff(base_ref, p));
                policy_set(base_ref, &with)
            }),
            // This agent's runs may lose up to k; no other run may be touched more than
            // it already is.
            accept: Box::new(move |e: &Evaluation| {
                let own = e.interfered.iter().filter(|&&r| is_agent(r)).count();
                own <= k && e.interfered.len() - own <= before
            }),
            give_up_after: before + k,
            covers: Box::new(is_agent),
        };
        let tuned = descend(history, &start, &scope);
        let list = proposals(history, &start, &tuned, &scope);
        agents.insert(agent.clone(), diff(&base, &tuned));
        agent_proposals.insert(agent.clone(), list);
    }
    history.done();
    Ok(Calibration {
        base,
        base_proposals,
        agents,
        agent_proposals,
        completed_by_agent,
        completed,
    })
}

/// The patch that layered over `base` gives `policy`.
fn diff(base: &Policy, policy: &Policy) -> Value {
    let base = serde_json::to_value(base).expect("a policy serialises");
    let Value::Object(fields) = serde_json::to_value(policy).expect("a policy serialises") else {
        unreachable!("a policy serialises to an object")
    };
    Value::Object(
        fields
            .into_iter()
            .filter(|(k, v)| base.get(k.as_str()) != Some(v))
            .collect(),
    )
}
