//! The guard state the log rebuilds: the engine, the sequencer of applied events (ids
//! and per-run order, without anything held in memory only), where each applied event
//! sits in the log (to answer a re-delivery with its original decision), when each
//! ledger key was last written, the log position and the latest event time. Start-up,
//! verify and the tests all go through `apply`, so a rebuild and a full replay cannot
//! drift apart.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use fusebox_core::sharded::ShardedMap;
use fusebox_core::{Decision, Engine, Event, EventBody, Sequencer};
use serde::{Deserialize, Serialize};

use crate::error::LogError;
use crate::record::{LogOp, Record};

/// Deterministic hashing (no random keys): equal states hash and compare alike across
/// processes. FNV-1a like the engine's run maps: SipHash was a measurable share of the
/// two index operations every event costs (a lookup on admission, an insert).
type Fixed = fusebox_core::fixed_hash::FixedHasher;

#[derive(Debug, Clone, PartialEq)]
pub struct LogState {
    pub engine: Engine,
    /// Mirrors what the log holds (fed by `note_applied`), so a snapshot of it never
    /// contains events held for a missing `seq` that the log does not have.
    pub applied: Sequencer,
    /// Event id → log position, per run. Kept in memory and in snapshots instead of an
    /// index tree written per event.
    pub index: DedupIndex,
    /// Event time each ledger key was last written (for ledger retention).
    pub ledger_times: LedgerTimes,
    /// Position of the last record applied (0: none).
    pub position: u64,
    /// Latest `ts_ms` applied: the log's clock for snapshots and retention.
    pub event_time_ms: u64,
}

/// tenant → run → FNV-1a of the event id → position. 64-bit hashes keep the index at
/// ~25 bytes an event; a lookup checks the id of the decision it finds, so a
/// collision can only miss, never answer with another event's decision. Each run's ids
/// sit behind an `Arc` (changed through `Arc::make_mut`) like the engine's runs, so the
/// snapshot view shares them; serde writes an `Arc<T>` as `T`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DedupIndex(HashMap<String, HashMap<String, Arc<RunIds>, Fixed>, Fixed>);

/// One run's id hashes and positions.
type RunIds = HashMap<u64, u64, Fixed>;

pub fn id_hash(id: &str) -> u64 {
    fusebox_core::fixed_hash::fnv1a(id.as_bytes())
}

impl DedupIndex {
    fn insert(&mut self, event: &Event, pos: u64) {
        let tenant = match self.0.get_mut(event.tenant.as_str()) {
            Some(tenant) => tenant,
            None => self.0.entry(event.tenant.clone()).or_default(),
        };
        let run = match tenant.get_mut(event.run.as_str()) {
            Some(run) => run,
            None => tenant.entry(event.run.clone()).or_default(),
        };
        Arc::make_mut(run).insert(id_hash(&event.id), pos);
    }

    /// Where the event with this id was applied, if its run is still in the log.
    pub fn get(&self, tenant: &str, run: &str, id: &str) -> Option<u64> {
        self.0.get(tenant)?.get(run)?.get(&id_hash(id)).copied()
    }

    fn forget_run(&mut self, tenant: &str, run: &str) {
        if let Some(runs) = self.0.get_mut(tenant) {
            runs.remove(run);
            if runs.is_empty() {
                self.0.remove(tenant);
            }
        }
    }

    /// Every entry: tenant, run, id hash, position.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, u64, u64)> {
        self.0.iter().flat_map(|(tenant, runs)| {
            runs.iter().flat_map(move |(run, ids)| {
                ids.iter()
                    .map(move |(&hash, &pos)| (tenant.as_str(), run.as_str(), hash, pos))
            })
        })
    }

    pub fn len(&self) -> usize {
        self.0
            .values()
            .flat_map(HashMap::values)
            .map(|ids| ids.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
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
            index: DedupIndex::default(),
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
        note_event(&mut self.applied, &mut self.index, event, self.position);
        applied
    }

    pub fn apply_op(&mut self, op: &LogOp) -> Result<(), LogError> {
        self.op_to_engine(op);
        note_op(&mut self.applied, &mut self.index, op);
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
        let op_key = op_key_touched(&self.engine, event);
        let decision = self.engine.apply(event);
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

/// The order and dedup bookkeeping of the record at `pos`: the applied-events
/// sequencer and the dedup index.
pub(crate) fn note_order(
    applied: &mut Sequencer,
    index: &mut DedupIndex,
    pos: u64,
    record: &Record,
) {
    match record {
        Record::Event(event) => note_event(applied, index, event, pos),
        Record::Op(op) => note_op(applied, index, op),
    }
}

fn note_event(applied: &mut Sequencer, index: &mut DedupIndex, event: &Event, pos: u64) {
    applied.note_applied(event);
    index.insert(event, pos);
}

fn note_op(applied: &mut Sequencer, index: &mut DedupIndex, op: &LogOp) {
    if let LogOp::Prune { runs } = op {
        for run in runs {
            applied.forget_run(&run.tenant, &run.run);
            index.forget_run(&run.tenant, &run.run);
        }
    }
}

/// The `op_key` whose ledger entry this event may change: a call's own key, or for a
/// result the key of the call it answers.
fn op_key_touched(engine: &Engine, event: &Event) -> Option<String> {
    match &event.body {
        EventBody::ToolCall(call) => call.op_key.clone(),
        EventBody::ToolResult(result) => engine
            .run(&event.tenant, &event.run)?
            .pending
            .get(&result.call_id)?
            .op_key
            .clone(),
        _ => None,
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
        assert_eq!(state.index.get("t", "r", "e1"), Some(1));
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
