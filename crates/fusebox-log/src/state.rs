//! The guard state the log rebuilds: the engine, the sequencer of applied events (ids
//! and per-run order, without anything held in memory only), the log position and the
//! latest event time. Start-up, verify and the tests all go through `apply`, so a
//! rebuild and a full replay cannot drift apart.

use fusebox_core::{Decision, Engine, Event, PolicySet, Sequencer};
use serde::Serialize;

use crate::error::LogError;
use crate::record::{LogOp, Record};

#[derive(Debug, Clone, PartialEq)]
pub struct LogState {
    pub engine: Engine,
    /// Mirrors what the log holds (fed by `note_applied`), so a snapshot of it never
    /// contains events held for a missing `seq` that the log does not have.
    pub applied: Sequencer,
    /// Position of the last record applied (0: none).
    pub position: u64,
    /// Latest `ts_ms` applied: the log's clock for snapshots and retention.
    pub event_time_ms: u64,
}

impl LogState {
    pub fn new(max_held: usize) -> Self {
        LogState {
            engine: Engine::default(),
            applied: Sequencer::new(max_held),
            position: 0,
            event_time_ms: 0,
        }
    }

    pub fn apply_event(&mut self, event: &Event) -> Decision {
        let decision = self.engine.apply(event);
        self.applied.note_applied(event);
        self.position += 1;
        self.event_time_ms = self.event_time_ms.max(event.ts_ms);
        decision
    }

    pub fn apply_op(&mut self, op: &LogOp) -> Result<(), LogError> {
        match op {
            LogOp::SetPolicies { policies } => {
                let engine = std::mem::take(&mut self.engine);
                self.engine = with_policies(engine, policies.clone())?;
            }
            LogOp::Prune { runs } => {
                for run in runs {
                    self.engine.forget_run(&run.tenant, &run.run);
                    self.applied.forget_run(&run.tenant, &run.run);
                }
            }
        }
        self.position += 1;
        Ok(())
    }

    /// Applies one record; an event's decision is returned.
    pub fn apply(&mut self, record: &Record) -> Result<Option<Decision>, LogError> {
        match record {
            Record::Event(event) => Ok(Some(self.apply_event(event))),
            Record::Op(op) => self.apply_op(op).map(|()| None),
        }
    }
}

/// The engine with new policies for runs that start from now on.
///
/// fusebox-core has no setter for the policies, so the engine is rebuilt through its
/// serialised form (the same form a snapshot uses) with the policies swapped. It runs
/// once per configuration change, never per event.
fn with_policies(engine: Engine, policies: PolicySet) -> Result<Engine, LogError> {
    if engine.run_count() == 0 && engine.ledger().is_empty() {
        return Ok(Engine::new(policies));
    }
    #[derive(Serialize)]
    struct Parts<'a> {
        policies: &'a PolicySet,
        runs: std::collections::BTreeMap<
            &'a str,
            std::collections::BTreeMap<&'a str, &'a fusebox_core::RunState>,
        >,
        ledger: &'a fusebox_core::ledger::Ledger,
    }
    let mut runs: std::collections::BTreeMap<_, std::collections::BTreeMap<_, _>> =
        std::collections::BTreeMap::new();
    for (tenant, run, state) in engine.runs() {
        runs.entry(tenant).or_default().insert(run, state);
    }
    let encode = |source| LogError::Encode {
        what: "the engine with new policies",
        source,
    };
    let bytes = serde_json::to_vec(&Parts {
        policies: &policies,
        runs,
        ledger: engine.ledger(),
    })
    .map_err(encode)?;
    serde_json::from_slice(&bytes).map_err(encode)
}

#[cfg(test)]
mod tests {
    use fusebox_core::{parse_event, Policy, Preset};

    use super::*;

    #[test]
    fn a_policy_change_keeps_runs_and_ledger() {
        let mut state = LogState::new(16);
        let event = parse_event(
            br#"{"v":1,"id":"e1","tenant":"t","run":"r","ts_ms":1,"type":"tool_call","call_id":"c","tool":"send","args":{},"op_key":"k"}"#,
        )
        .unwrap();
        state.apply_event(&event);
        let before = state.engine.clone();

        let strict = PolicySet::new(Preset::Strict.policy());
        let changed = with_policies(before.clone(), strict.clone()).unwrap();
        assert_eq!(changed.policies(), &strict);
        assert_eq!(changed.runs().count(), 1);
        assert_eq!(changed.ledger(), before.ledger());

        let back = with_policies(changed, before.policies().clone()).unwrap();
        assert_eq!(back, before);
        assert_eq!(
            with_policies(Engine::default(), PolicySet::new(Policy::default())).unwrap(),
            Engine::default()
        );
    }
}
