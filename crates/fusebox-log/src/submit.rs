//! Deciding a batch of events with group commit: every event goes through admission
//! and the engine, all their records are written, and ONE flush makes the batch durable
//! before any of its decisions is returned (write-ahead: a decision that lets a side
//! effect run is on disk before anyone acts on it).

use fusebox_core::{Admission, Decision, Engine, Event, EventError};

use crate::error::LogError;
use crate::guard::Guard;
use crate::keys;
use crate::record::{AdoptedOp, FrameWriter, LogOp};
use crate::snapshotter::SnapshotJob;
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

/// The writes of one batch: its records in frames, the snapshot it takes, and where the
/// decisions of the events it applied sit in the outcomes (to answer a duplicate inside
/// the batch).
#[derive(Default)]
pub(crate) struct Pending {
    pub(crate) frames: FrameWriter,
    /// Handed to the snapshot writer once the batch is durable.
    pub(crate) snapshot: Option<SnapshotJob>,
    /// (position, outcome index, index in that outcome's decisions), by position.
    applied: Vec<(u64, usize, usize)>,
    /// The applied events in application order, kept only for a `before_commit` hook.
    captured: Option<Vec<Event>>,
}

impl<L: EventLog> Guard<L> {
    /// Decides a batch and makes it durable with one flush. On `Err` nothing of the
    /// batch may be acted on, and the guard must be reopened.
    pub fn submit_batch(&mut self, events: Vec<Event>) -> Result<Vec<Outcome>, LogError> {
        self.decide_and_commit(Vec::new(), events, None::<BeforeCommit>)
    }

    /// [`Guard::submit_batch`] for a cluster daemon: `adopted` (what the shared ledger
    /// says of the batch's `op_key`s) is applied first, as one logged record, and
    /// `before_commit` is called on the events the batch applied, in application order,
    /// after they are decided and before anything of the batch is written. A cluster daemon replicates them there, so the replicated
    /// stream always holds at least what the local log holds. An `Err` from the hook
    /// fails the batch like a failed flush: nothing is written, the guard is poisoned.
    pub fn submit_batch_then<E>(
        &mut self,
        adopted: Vec<AdoptedOp>,
        events: Vec<Event>,
        before_commit: impl FnOnce(&Engine, &[Event]) -> Result<(), E>,
    ) -> Result<Vec<Outcome>, LogError>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        self.decide_and_commit(adopted, events, Some(boxed_hook(before_commit)))
    }

    fn decide_and_commit(
        &mut self,
        adopted: Vec<AdoptedOp>,
        events: Vec<Event>,
        before_commit: Option<BeforeCommit<'_>>,
    ) -> Result<Vec<Outcome>, LogError> {
        self.guarded(|guard| {
            let durable = guard.state.position;
            let mut pending = Pending {
                captured: before_commit.is_some().then(Vec::new),
                ..Pending::default()
            };
            guard.maintain(&mut pending)?;
            if !adopted.is_empty() {
                let op = LogOp::AdoptOperations {
                    operations: adopted,
                };
                guard.stage_op(&mut pending, op)?;
            }
            let mut outcomes = Vec::with_capacity(events.len());
            let mut duplicates = Vec::new();
            for event in events {
                // Where an earlier copy was applied (this batch included), looked up
                // before admission takes the event; the id is kept only for those.
                let seen = guard
                    .state
                    .applied
                    .recorded_at(&event.tenant, &event.run, &event.id)
                    .map(|pos| Seen {
                        outcome: outcomes.len(),
                        pos,
                        tenant: event.tenant.clone(),
                        run: event.run.clone(),
                        id: event.id.clone(),
                    });
                let outcome = match guard.admission.admit(event) {
                    Err(error) => Outcome::Rejected(error),
                    Ok(Admission::Held { waiting_for }) => Outcome::Held { waiting_for },
                    Ok(Admission::Duplicate) => {
                        duplicates.extend(seen);
                        Outcome::Duplicate(None)
                    }
                    Ok(Admission::Ready(ready)) => {
                        Outcome::Applied(guard.stage_events(&mut pending, ready, outcomes.len())?)
                    }
                };
                outcomes.push(outcome);
            }
            guard.answer_duplicates(&pending, durable, duplicates, &mut outcomes)?;
            if let Some(hook) = before_commit {
                hook(
                    &guard.state.engine,
                    pending.captured.as_deref().unwrap_or_default(),
                )?;
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
        self.release_gap_inner(tenant, run, None)
    }

    /// [`Guard::release_gap`] with a `before_commit` hook, as in
    /// [`Guard::submit_batch_then`].
    pub fn release_gap_then<E>(
        &mut self,
        tenant: &str,
        run: &str,
        before_commit: impl FnOnce(&Engine, &[Event]) -> Result<(), E>,
    ) -> Result<Vec<Decision>, LogError>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        self.release_gap_inner(tenant, run, Some(boxed_hook(before_commit)))
    }

    fn release_gap_inner(
        &mut self,
        tenant: &str,
        run: &str,
        before_commit: Option<BeforeCommit<'_>>,
    ) -> Result<Vec<Decision>, LogError> {
        self.guarded(|guard| {
            let mut pending = Pending {
                captured: before_commit.is_some().then(Vec::new),
                ..Pending::default()
            };
            let released = guard.admission.release_gap(tenant, run);
            let decisions = guard.stage_events(&mut pending, released, 0)?;
            if let Some(hook) = before_commit {
                hook(
                    &guard.state.engine,
                    pending.captured.as_deref().unwrap_or_default(),
                )?;
            }
            guard.commit(pending)?;
            Ok(decisions)
        })
    }

    /// Writes the batch's frames in one atomic write (the commit point) and flushes
    /// once; then hands its snapshot, if any, to the snapshot writer.
    pub(crate) fn commit(&mut self, pending: Pending) -> Result<(), LogError> {
        let mut batch = WriteBatch::default();
        for (first, frame) in pending.frames.into_frames() {
            batch.insert(Tree::Events, keys::position(first), frame);
        }
        if !batch.is_empty() {
            self.log.write(batch)?;
            self.log.flush()?;
        }
        if let Some(job) = pending.snapshot {
            self.snapshots.write(job);
        }
        Ok(())
    }

    /// Fills in the original decision of each duplicate: from this batch's outcomes,
    /// or from the log (the decision stored next to the event). Done after staging, so
    /// no decision is cloned for the common batch without duplicates.
    fn answer_duplicates(
        &self,
        pending: &Pending,
        durable: u64,
        duplicates: Vec<Seen>,
        outcomes: &mut [Outcome],
    ) -> Result<(), LogError> {
        for seen in duplicates {
            let original = if seen.pos > durable {
                pending
                    .applied
                    .binary_search_by_key(&seen.pos, |a| a.0)
                    .ok()
                    .and_then(|at| {
                        let (_, outcome, index) = pending.applied[at];
                        match &outcomes[outcome] {
                            Outcome::Applied(decisions) => decisions.get(index).cloned(),
                            _ => None,
                        }
                    })
            } else {
                self.stored_decision(seen.pos, &seen.tenant, &seen.run, &seen.id)?
            };
            outcomes[seen.outcome] = Outcome::Duplicate(original);
        }
        Ok(())
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
            let (decision, op_key) = self.state.apply_event_touching(&event);
            let pos = self.state.position;
            if let Some(op_key) = op_key {
                self.ledger_changed.insert((event.tenant.clone(), op_key));
            }
            pending.frames.push_event(pos, &event, &decision)?;
            pending.applied.push((pos, outcome, decisions.len()));
            decisions.push(decision);
            if let Some(captured) = &mut pending.captured {
                captured.push(event);
            }
        }
        Ok(decisions)
    }

    /// Applies and stages an operation record.
    pub(crate) fn stage_op(&mut self, pending: &mut Pending, op: LogOp) -> Result<(), LogError> {
        match &op {
            LogOp::Prune { runs } => {
                for run in runs {
                    self.admission.forget_run(&run.tenant, &run.run);
                }
            }
            LogOp::ForgetOperations { operations } => self.ledger_changed.extend(
                operations
                    .iter()
                    .map(|op| (op.tenant.clone(), op.op_key.clone())),
            ),
            LogOp::AdoptOperations { operations } => self.ledger_changed.extend(
                operations
                    .iter()
                    .map(|op| (op.tenant.clone(), op.op_key.clone())),
            ),
            LogOp::SetPolicies { .. } => {}
        }
        self.state.apply_op(&op)?;
        pending.frames.push_op(self.state.position, &op)
    }
}

/// A hook run after a batch is decided and before it is written.
type BeforeCommit<'a> = Box<dyn FnOnce(&Engine, &[Event]) -> Result<(), LogError> + 'a>;

fn boxed_hook<'a, E>(hook: impl FnOnce(&Engine, &[Event]) -> Result<(), E> + 'a) -> BeforeCommit<'a>
where
    E: std::error::Error + Send + Sync + 'static,
{
    Box::new(move |engine, applied| {
        hook(engine, applied).map_err(|err| LogError::BeforeCommit(Box::new(err)))
    })
}

/// A submitted event whose id the dedup index knows.
struct Seen {
    outcome: usize,
    pos: u64,
    tenant: String,
    run: String,
    id: String,
}
