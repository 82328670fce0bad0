//! The guard state the log rebuilds: the engine, the sequencer of applied events (per-run
//! order, without anything held in memory only, and each id with where it sits in the
//! log, to answer a re-delivery with its original decision), when each ledger key was
//! last written, the log position and the latest event time. Start-up,
//! verify and the tests all go through `apply`, so a rebuild and a full replay cannot
//! drift apart.

use std::collections::BTreeMap;

use fusebox_core::sharded::ShardedMap;
use fusebox_core::{Decision, Engine, Event, Sequencer};
use serde::{Deserialize, Serialize};

use crate::error::LogError;
use crate::record::{LogOp, Record};

#[derive(Debug, Clone, PartialEq)]
pub struct LogState {
    pub engine: Engine,
    /// Mirrors what the log holds (fed by `note_applied`), so a snapshot of it never
    /// contains events held for a missing `seq` that the log does not have. It is also
    /// the dedup index: where each applied event id sits in the log (in memory and in
    /// snapshots, instead of an index tree written per event). Ids are kept as 64-bit
    /// hashes; a lookup checks the id of the decision it finds, so a collision can only
    /// miss, never answer with another event's decision.
    pub applied: Sequencer,
    /// Event time each ledger key was last written (for ledger retention).
    pub ledger_times: LedgerTimes,
    /// Position of the last record applied (0: none).
    pub position: u64,
    /// Latest `ts_ms` applied: the log's clock for snapshots and retention.
    pub event_time_ms: u64,
}

/// tenant → op_key → `ts_ms` of the event that last wrote the ledger entry. Each
/// tenant's keys in a `ShardedMap`, like the engine's ledger, for the snapshot view.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LedgerTimes(BTreeMap<String, ShardedMap<u64>>);

impl LedgerTimes {
    /// Allocates only for a key it does not hold yet (most writes are the second of a
    /// call and its result).
    fn set(&mut self, tenant: &str, op_key: &str, ts_ms: Option<u64>) {
        let Some(ts) = ts_ms else {
            return self.forget(tenant, op_key);
        };
        let keys = match self.0.get_mut(tenant) {
            Some(keys) => keys,
            None => self.0.entry(tenant.to_owned()).or_default(),
        };
        match keys.get_mut(op_key) {
            Some(at) => *at = ts,
            None => {
                keys.insert(op_key.to_owned(), ts);
            }
        }
    }

    fn forget(&mut self, tenant: &str, op_key: &str) {
        if let Some(keys) = self.0.get_mut(tenant) {
            keys.remove(op_key);
            if keys.is_empty() {
                self.0.remove(tenant);
            }
        }
    }

    /// Keys last written at or before `cutoff_ms`, in order.
    pub fn older_than(&self, cutoff_ms: u64) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().flat_map(move |(tenant, keys)| {
            keys.iter()
                .filter(move |(_, &ts)| ts <= cutoff_ms)
                .map(move |(key, _)| (tenant.as_str(), key))
        })
    }
}

impl LogState {
    pub fn new(max_held: usize) -> Self {
        LogState {
            engine: Engine::default(),
            applied: Sequencer::new(max_held),
            ledger_times: LedgerTimes::default(),
            position: 0,
            event_time_ms: 0,
        }
    }

    pub fn apply_event(&mut self, event: &Event) -> Decision {
        self.apply_event_touching(event).0
    }

    /// Applies an event; also returns the `op_key` whose ledger entry it may have
    /// changed (the guard writes that entry to the ledger tree).
    pub fn apply_event_touching(&mut self, event: &Event) -> (Decision, Option<String>) {
        let applied = self.event_to_engine(event);
        self.applied.note_applied(event, self.position);
        applied
    }

    pub fn apply_op(&mut self, op: &LogOp) -> Result<(), LogError> {
        self.op_to_engine(op);
        note_op(&mut self.applied, op);
        Ok(())
    }

    /// Applies one record; an event's decision is returned.
    pub fn apply(&mut self, record: &Record) -> Result<Option<Decision>, LogError> {
        match record {
            Record::Event(event) => Ok(Some(self.apply_event(event))),
            Record::Op(op) => self.apply_op(op).map(|()| None),
        }
    }

    /// The part of applying a record that needs the engine; the rest (`note_order`)
    /// depends on the records alone, so a replay runs it on its decoding thread.
    pub(crate) fn apply_to_engine(&mut self, record: &Record) {
        match record {
            Record::Event(event) => drop(self.event_to_engine(event)),
            Record::Op(op) => self.op_to_engine(op),
        }
    }

    fn event_to_engine(&mut self, event: &Event) -> (Decision, Option<String>) {
        let (decision, op_key) = self.engine.apply_touching(event);
        self.position += 1;
        self.event_time_ms = self.event_time_ms.max(event.ts_ms);
        if let Some(op_key) = &op_key {
            let kept = self.engine.ledger().get(&event.tenant, op_key).is_some();
            self.ledger_times
                .set(&event.tenant, op_key, kept.then_some(event.ts_ms));
        }
        (decision, op_key)
    }

    fn op_to_engine(&mut self, op: &LogOp) {
        match op {
            LogOp::SetPolicies { policies } => self.engine.set_policies(policies.clone()),
            LogOp::Prune { runs } => {
                for run in runs {
                    self.engine.forget_run(&run.tenant, &run.run);
                }
            }
            LogOp::ForgetOperations { operations } => {
                for op in operations {
                    self.engine.forget_operation(&op.tenant, &op.op_key);
                    self.ledger_times.forget(&op.tenant, &op.op_key);
                }
            }
            LogOp::AdoptOperations { operations } => {
                for op in operations {
                    self.engine
                        .adopt_operation(&op.tenant, &op.op_key, op.entry.clone());
                    let kept = self.engine.ledger().get(&op.tenant, &op.op_key).is_some();
                    self.ledger_times.set(
                        &op.tenant,
                        &op.op_key,
                        kept.then_some(self.event_time_ms),
                    );
                }
            }
        }
        self.position += 1;
    }
}

/// The order and dedup bookkeeping of the record at `pos`, in the applied-events
/// sequencer.
pub(crate) fn note_order(applied: &mut Sequencer, pos: u64, record: &Record) {
    match record {
        Record::Event(event) => applied.note_applied(event, pos),
        Record::Op(op) => note_op(applied, op),
    }
}

fn note_op(applied: &mut Sequencer, op: &LogOp) {
    if let LogOp::Prune { runs } = op {
        for run in runs {
            applied.forget_run(&run.tenant, &run.run);
        }
    }
}

#[cfg(test)]
mod tests {
    use fusebox_core::{parse_event, PolicySet, Preset};

    use super::*;
    use crate::record::OpRef;

    #[test]
    fn a_policy_change_keeps_runs_and_ledger_and_forgetting_a_key_frees_it() {
        let mut state = LogState::new(16);
        let event = parse_event(
            br#"{"v":1,"id":"e1","tenant":"t","run":"r","ts_ms":1,"type":"tool_call","call_id":"c","tool":"send","args":{},"op_key":"k"}"#,
        )
        .unwrap();
        state.apply_event(&event);
        assert_eq!(state.applied.recorded_at("t", "r", "e1"), Some(1));
        assert_eq!(state.ledger_times.older_than(1).count(), 1);
        let before = state.engine.clone();

        let strict = PolicySet::new(Preset::Strict.policy());
        state
            .apply_op(&LogOp::SetPolicies {
                policies: strict.clone(),
            })
            .unwrap();
        assert_eq!(state.engine.policies(), &strict);
        assert_eq!(state.engine.runs().count(), 1);
        assert_eq!(state.engine.ledger(), before.ledger());

        state
            .apply_op(&LogOp::ForgetOperations {
                operations: vec![OpRef {
                    tenant: "t".into(),
                    op_key: "k".into(),
                }],
            })
            .unwrap();
        assert!(state.engine.ledger().is_empty());
        assert_eq!(state.ledger_times.older_than(u64::MAX).count(), 0);
        assert_eq!(state.position, 3);
    }
}
