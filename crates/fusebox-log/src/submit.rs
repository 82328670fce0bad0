//! Deciding a batch of events with group commit: every event goes through admission
//! and the engine, all their records are written, and ONE flush makes the batch durable
//! before any of its decisions is returned (write-ahead: a decision that lets a side
//! effect run is on disk before anyone acts on it).

use fusebox_core::{Admission, Decision, Event, EventBody, EventError};

use crate::error::LogError;
use crate::guard::{encode_json, Guard};
use crate::keys;
use crate::record::LogOp;
use crate::store::{EventLog, Tree, WriteBatch};

/// What became of one submitted event.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Applied: its decision first, then those of events it released from the hold
    /// (later `seq`s of its run that were waiting for it), in the order applied.
    Applied(Vec<Decision>),
    /// This id was applied before: the original decision, unchanged. `None` while the
    /// first copy is still held for a missing `seq` (it has no decision yet).
    Duplicate(Option<Decision>),
    /// Held until the run's `seq` `waiting_for` arrives. Nothing is durable yet: do
    /// not acknowledge it to the producer or the stream.
    Held { waiting_for: u64 },
    /// Refused by admission (a `seq` going backwards, too many held).
    Rejected(EventError),
}

/// The writes of one batch and the events it applied.
#[derive(Default)]
struct Pending {
    batch: WriteBatch,
    applied: Vec<Applied>,
}

/// An event applied in the batch: its ids key and position, and where its decision
/// sits in the outcomes (to answer a duplicate inside the same batch).
struct Applied {
    id: Vec<u8>,
    pos: u64,
    outcome: usize,
    index: usize,
}

impl<L: EventLog> Guard<L> {
    /// Decides a batch and makes it durable with one flush. On `Err` nothing of the
    /// batch may be acted on, and the guard must be reopened.
    pub fn submit_batch(&mut self, events: Vec<Event>) -> Result<Vec<Outcome>, LogError> {
        self.guarded(|guard| {
            let mut pending = Pending::default();
            guard.maintain(&mut pending.batch)?;
            let mut outcomes = Vec::with_capacity(events.len());
            for event in events {
                let id = keys::event_id(&event.tenant, &event.run, &event.id);
                let outcome = match guard.admission.admit(event) {
                    Err(error) => Outcome::Rejected(error),
                    Ok(Admission::Held { waiting_for }) => Outcome::Held { waiting_for },
                    Ok(Admission::Duplicate) => {
                        Outcome::Duplicate(guard.original(&pending, &outcomes, &id)?)
                    }
                    Ok(Admission::Ready(ready)) => {
                        Outcome::Applied(guard.stage_events(&mut pending, ready, outcomes.len())?)
                    }
                };
                outcomes.push(outcome);
            }
            guard.commit(pending)?;
            Ok(outcomes)
        })
    }

    /// One event, durable on return. Prefer batches: each call costs a flush.
    pub fn submit(&mut self, event: Event) -> Result<Outcome, LogError> {
        let mut outcomes = self.submit_batch(vec![event])?;
        Ok(outcomes.remove(0))
    }

    /// Gives up waiting for a run's missing `seq`: its held events are applied in `seq`
    /// order and made durable; their decisions are returned.
    pub fn release_gap(&mut self, tenant: &str, run: &str) -> Result<Vec<Decision>, LogError> {
        self.guarded(|guard| {
            let mut pending = Pending::default();
            let released = guard.admission.release_gap(tenant, run);
            let decisions = guard.stage_events(&mut pending, released, 0)?;
            guard.commit(pending)?;
            Ok(decisions)
        })
    }

    fn commit(&mut self, pending: Pending) -> Result<(), LogError> {
        let mut batch = pending.batch;
        for applied in pending.applied {
            batch.insert(Tree::Ids, applied.id, keys::position(applied.pos).to_vec());
        }
        if batch.is_empty() {
            return Ok(());
        }
        self.log.write(batch)?;
        self.log.flush()
    }

    /// The decision of an id applied before: in this batch, or in the log.
    fn original(
        &self,
        pending: &Pending,
        outcomes: &[Outcome],
        id: &[u8],
    ) -> Result<Option<Decision>, LogError> {
        if let Some(applied) = pending.applied.iter().find(|applied| applied.id == id) {
            return Ok(match outcomes.get(applied.outcome) {
                Some(Outcome::Applied(decisions)) => decisions.get(applied.index).cloned(),
                _ => None,
            });
        }
        match self.log.get(Tree::Ids, id)? {
            Some(pos) => match keys::decode_position(pos.as_ref()) {
                Some(pos) => crate::log::decision_at(&self.log, pos),
                None => Ok(None),
            },
            None => Ok(None),
        }
    }

    /// Applies and stages events; `outcome` is the index their decisions will have in
    /// the batch's outcomes.
    fn stage_events(
        &mut self,
        pending: &mut Pending,
        events: Vec<Event>,
        outcome: usize,
    ) -> Result<Vec<Decision>, LogError> {
        let mut decisions = Vec::with_capacity(events.len());
        for event in events {
            let op_key = self.op_key_touched(&event);
            let decision = self.state.apply_event(&event);
            let pos = self.state.position;
            let key = keys::position(pos);
            if let Some(op_key) = op_key {
                let ledger_key = keys::ledger(&event.tenant, &op_key);
                match self.state.engine.ledger().get(&event.tenant, &op_key) {
                    Some(entry) => pending.batch.insert(
                        Tree::Ledger,
                        ledger_key,
                        encode_json(entry, "a ledger entry")?,
                    ),
                    None => pending.batch.remove(Tree::Ledger, ledger_key),
                }
            }
            pending
                .batch
                .insert(Tree::Decisions, key, encode_json(&decision, "a decision")?);
            pending
                .batch
                .insert(Tree::Events, key, encode_json(&event, "an event")?);
            pending.applied.push(Applied {
                id: keys::event_id(&event.tenant, &event.run, &event.id),
                pos,
                outcome,
                index: decisions.len(),
            });
            decisions.push(decision);
        }
        Ok(decisions)
    }

    /// The `op_key` whose ledger entry this event may change: a call's own key, or for
    /// a result the key of the call it answers.
    fn op_key_touched(&self, event: &Event) -> Option<String> {
        match &event.body {
            EventBody::ToolCall(call) => call.op_key.clone(),
            EventBody::ToolResult(result) => self
                .state
                .engine
                .run(&event.tenant, &event.run)?
                .pending
                .get(&result.call_id)?
                .op_key
                .clone(),
            _ => None,
        }
    }

    /// Applies and stages an operation record.
    pub(crate) fn stage_op(&mut self, batch: &mut WriteBatch, op: LogOp) -> Result<(), LogError> {
        if let LogOp::Prune { runs } = &op {
            for run in runs {
                self.admission.forget_run(&run.tenant, &run.run);
                for item in self
                    .log
                    .scan_prefix(Tree::Ids, &keys::run_prefix(&run.tenant, &run.run))
                {
                    batch.remove(Tree::Ids, item?.0.as_ref());
                }
            }
        }
        let bytes = encode_json(&op, "a log operation")?;
        self.state.apply_op(&op)?;
        batch.insert(Tree::Events, keys::position(self.state.position), bytes);
        Ok(())
    }
}
