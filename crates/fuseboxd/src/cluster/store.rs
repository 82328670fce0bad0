//! One partition's [`GuardStore`]: its own `fusebox-log` guard, with every batch
//! checked against the shared ledger and replicated to `FUSEBOX_APPLIED` before it is
//! written locally (and so before anything about it is answered or acked).

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::time::{Duration, Instant};

use fusebox_core::{Decision, Engine, Event, EventBody, LedgerEntry};
use fusebox_log::{AdoptedOp, Guard};
use fusebox_nats::{GuardStore, StoreError, Submitted};

use super::applied::{ReplicateError, Replicator};
use super::mark::AppliedMark;
use super::shared_ledger::{ClaimError, Seen, SharedLedger, Touch};
use crate::store::submitted;

pub struct PartitionStore {
    pub guard: Guard,
    pub replicator: Replicator,
    pub ledger: std::sync::Arc<SharedLedger>,
    /// How far the log is known to reach into the replicated stream.
    pub mark: AppliedMark,
    /// `Some` while catching up: batches come from the replicated stream (with the
    /// entries their owner adopted, set here before each), so they are neither looked
    /// up, claimed nor replicated again.
    pub replaying: Option<Vec<AdoptedOp>>,
    /// The op_key of each call of this partition whose key is in flight, by (tenant,
    /// run, call_id): a result only names its call, and the call's key must be settled
    /// in the shared ledger, also when the result was held and released later.
    in_flight: HashMap<CallKey, String>,
    /// The stops the catch-up found (runs it closed), for the service's stop publisher.
    stops_to_publish: Vec<Decision>,
    /// Outcomes committed here but not yet written to the shared ledger (it was
    /// unreachable or electing a leader): retried on the timer until written, while
    /// the mark is held for a next owner in case this one loses the partition first.
    /// Left to a next owner alone, they stayed in flight for as long as this owner kept
    /// the partition.
    unwritten: BTreeSet<Touch>,
    last_retry: Option<Instant>,
}

/// How often unwritten outcomes are tried again.
const RETRY_UNWRITTEN_EVERY: Duration = Duration::from_secs(1);

/// (tenant, run, call_id).
pub type CallKey = (String, String, String);

/// What one batch knows of its keys in the shared ledger: the revisions the engine
/// decided on (claims check them), and the keys it touched (settled after the commit).
#[derive(Default)]
struct BatchKeys {
    seen: Seen,
    touched: Vec<Touch>,
}

/// Why a batch was refused before its write.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error(transparent)]
    Claim(#[from] ClaimError),
    #[error(transparent)]
    Replicate(#[from] ReplicateError),
}

impl PartitionStore {
    /// A store that replays (catches up) until [`PartitionStore::serve`].
    pub fn catching_up(
        guard: Guard,
        replicator: Replicator,
        ledger: std::sync::Arc<SharedLedger>,
        mark: AppliedMark,
    ) -> Self {
        PartitionStore {
            guard,
            replicator,
            ledger,
            mark,
            replaying: Some(Vec::new()),
            in_flight: HashMap::new(),
            stops_to_publish: Vec::new(),
            unwritten: BTreeSet::new(),
            last_retry: None,
        }
    }

    /// Ends catching up: from now on batches are looked up, claimed and replicated.
    /// `stops` (those of the runs the catch-up closed) go out on the kill switch first.
    pub fn serve(&mut self, stops: Vec<Decision>) {
        self.replaying = None;
        self.stops_to_publish = stops;
        let engine = self.guard.engine();
        self.in_flight = engine
            .ledger()
            .iter()
            .filter_map(|(tenant, op_key, entry)| match entry {
                LedgerEntry::InFlight { run, call_id, .. } if engine.run(tenant, run).is_some() => {
                    Some((
                        (tenant.to_owned(), run.clone(), call_id.clone()),
                        op_key.to_owned(),
                    ))
                }
                _ => None,
            })
            .collect();
    }

    /// Writes a committed batch's outcomes back to the shared ledger, then moves the
    /// mark; an outcome not written holds the mark before this batch (see
    /// [`AppliedMark::hold`]), so the next owner's catch-up writes it back.
    fn settle_then_mark(&mut self, touched: &[Touch]) {
        let unwritten = self
            .ledger
            .settle(self.replicator.fence(), self.guard.engine(), touched);
        self.owe(unwritten);
        self.mark
            .committed(self.replicator.last(), self.guard.position());
    }

    /// Outcomes not written: held mark, retried later.
    fn owe(&mut self, unwritten: Vec<Touch>) {
        if !unwritten.is_empty() {
            self.mark.hold();
            self.unwritten.extend(unwritten);
        }
    }

    /// Writes the owed outcomes again; once all are written the mark may move again.
    fn retry_unwritten(&mut self) {
        let due = self
            .last_retry
            .is_none_or(|last| last.elapsed() >= RETRY_UNWRITTEN_EVERY);
        if self.unwritten.is_empty() || !due {
            return;
        }
        self.last_retry = Some(Instant::now());
        let owed: Vec<Touch> = std::mem::take(&mut self.unwritten).into_iter().collect();
        let count = owed.len();
        let unwritten = self
            .ledger
            .settle(self.replicator.fence(), self.guard.engine(), &owed);
        if unwritten.is_empty() {
            tracing::info!(
                outcomes = count,
                "owed outcomes written to the shared ledger"
            );
            self.mark.release_hold();
        } else {
            self.unwritten.extend(unwritten);
        }
    }

    /// After a catch-up: writes back the outcomes of the calls it read (`calls`:
    /// (tenant, run, call_id) of each call and result in the batches read, applied or
    /// already in the log) that the shared ledger may still hold in flight — the last
    /// owner committed them but lost the ledger (its fence) before writing them.
    /// `op_calls`: the read calls that named an op_key (a key their result released
    /// is no longer in the local ledger to be found by its call).
    pub fn write_back(&mut self, calls: &BTreeSet<CallKey>, op_calls: Vec<Touch>) {
        let engine = self.guard.engine();
        let mut touched: BTreeSet<Touch> = op_calls.into_iter().collect();
        for (tenant, op_key, entry) in engine.ledger().iter() {
            let (LedgerEntry::InFlight { run, call_id, .. }
            | LedgerEntry::Completed { run, call_id, .. }) = entry;
            let call = (tenant.to_owned(), run.clone(), call_id.clone());
            if calls.contains(&call) {
                touched.insert((call.0, op_key.to_owned(), call.1, call.2));
            }
        }
        let touched: Vec<Touch> = touched.into_iter().collect();
        let unwritten = self
            .ledger
            .settle(self.replicator.fence(), engine, &touched);
        self.owe(unwritten);
    }

    /// Claims and replicates a decided batch, and says which keys it touched.
    fn before_commit(
        ledger: &SharedLedger,
        replicator: &mut Replicator,
        in_flight: &mut HashMap<CallKey, String>,
        keys: &mut BatchKeys,
        adopted: &[AdoptedOp],
        engine: &Engine,
        applied: &[Event],
    ) -> Result<(), Refused> {
        ledger.claim(replicator.fence(), engine, applied, &mut keys.seen)?;
        replicator.publish(adopted, applied)?;
        for event in applied {
            let (call_id, op_key) = match &event.body {
                EventBody::ToolCall(call) => match &call.op_key {
                    Some(op_key) => (&call.call_id, op_key.clone()),
                    None => continue,
                },
                EventBody::ToolResult(result) => {
                    let key = (
                        event.tenant.clone(),
                        event.run.clone(),
                        result.call_id.clone(),
                    );
                    match in_flight.remove(&key) {
                        Some(op_key) => (&result.call_id, op_key),
                        None => continue,
                    }
                }
                _ => continue,
            };
            let key = (event.tenant.clone(), event.run.clone(), call_id.clone());
            let runs_now = matches!(
                engine.ledger().get(&event.tenant, &op_key),
                Some(LedgerEntry::InFlight { run, call_id: c, .. }) if *run == event.run && c == call_id
            );
            if runs_now {
                in_flight.insert(key.clone(), op_key.clone());
            }
            keys.touched.push((key.0, op_key, key.1, key.2));
        }
        Ok(())
    }
}

impl GuardStore for PartitionStore {
    fn submit_batch(&mut self, events: Vec<Event>) -> Result<Vec<Submitted>, StoreError> {
        if let Some(adopted) = &mut self.replaying {
            let adopted = std::mem::take(adopted);
            let outcomes = self
                .guard
                .submit_batch_then(adopted, events, |_, _| Ok::<(), Infallible>(()))?;
            return Ok(submitted(outcomes));
        }
        let fence = self.replicator.fence();
        let (adopted, seen, claimed) = self.ledger.look_up(fence, self.guard.engine(), &events)?;
        let mut keys = BatchKeys {
            seen,
            touched: Vec::new(),
        };
        let (ledger, replicator, in_flight) =
            (&self.ledger, &mut self.replicator, &mut self.in_flight);
        let outcomes =
            self.guard
                .submit_batch_then(adopted.clone(), events, |engine, applied| {
                    let keys = &mut keys;
                    Self::before_commit(
                        ledger, replicator, in_flight, keys, &adopted, engine, applied,
                    )
                })?;
        for touch in claimed {
            if !keys.touched.contains(&touch) {
                keys.touched.push(touch);
            }
        }
        self.settle_then_mark(&keys.touched);
        Ok(submitted(outcomes))
    }

    fn release_gap(&mut self, tenant: &str, run: &str) -> Result<Vec<Decision>, StoreError> {
        if self.replaying.is_some() {
            return Ok(self.guard.release_gap(tenant, run)?);
        }
        let mut keys = BatchKeys::default();
        let (ledger, replicator, in_flight) =
            (&self.ledger, &mut self.replicator, &mut self.in_flight);
        let decisions = self
            .guard
            .release_gap_then(tenant, run, |engine, applied| {
                let keys = &mut keys;
                Self::before_commit(ledger, replicator, in_flight, keys, &[], engine, applied)
            })?;
        self.settle_then_mark(&keys.touched);
        Ok(decisions)
    }

    fn on_timer(&mut self) {
        self.retry_unwritten();
    }

    fn take_stops_to_publish(&mut self) -> Vec<Decision> {
        std::mem::take(&mut self.stops_to_publish)
    }

    fn waiting(&self) -> Vec<(String, String, u64)> {
        self.guard
            .waiting()
            .map(|(t, r, seq)| (t.to_owned(), r.to_owned(), seq))
            .collect()
    }

    fn engine(&self) -> &Engine {
        self.guard.engine()
    }

    fn history(
        &self,
        tenant: &str,
        run: &str,
        after: u64,
        limit: usize,
    ) -> Result<Option<fusebox_nats::wire::RunHistory>, StoreError> {
        Ok(Some(crate::history::run_history(
            &self.guard,
            tenant,
            run,
            after,
            limit,
        )?))
    }

    fn close(&mut self) -> Result<(), StoreError> {
        self.guard.checkpoint()?;
        self.mark
            .write(self.replicator.last(), self.guard.position());
        Ok(())
    }
}
