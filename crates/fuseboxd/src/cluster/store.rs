//! One partition's [`GuardStore`]: its own `fusebox-log` guard, with every batch
//! checked against the shared ledger and replicated to `FUSEBOX_APPLIED` before it is
//! written locally (and so before anything about it is answered or acked).

use std::convert::Infallible;

use fusebox_core::{Decision, Engine, Event};
use fusebox_log::{AdoptedOp, Guard};
use fusebox_nats::{GuardStore, StoreError, Submitted};

use super::applied::{ReplicateError, Replicator};
use super::shared_ledger::{self, ClaimError, SharedLedger};
use crate::store::submitted;

pub struct PartitionStore {
    pub guard: Guard,
    pub replicator: Replicator,
    pub ledger: std::sync::Arc<SharedLedger>,
    /// `Some` while catching up: batches come from the replicated stream (with the
    /// entries their owner adopted, set here before each), so they are neither looked
    /// up, claimed nor replicated again.
    pub replaying: Option<Vec<AdoptedOp>>,
}

/// Why a batch was refused before its write.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error(transparent)]
    Claim(#[from] ClaimError),
    #[error(transparent)]
    Replicate(#[from] ReplicateError),
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
        let adopted = self.ledger.look_up(self.guard.engine(), &events)?;
        let touched = shared_ledger::touched_by(self.guard.engine(), &events);
        let (ledger, replicator) = (&self.ledger, &mut self.replicator);
        let outcomes =
            self.guard
                .submit_batch_then(adopted.clone(), events, |engine, applied| {
                    ledger.claim(engine, applied)?;
                    replicator.publish(&adopted, applied)?;
                    Ok::<(), Refused>(())
                })?;
        self.ledger.settle(self.guard.engine(), &touched);
        Ok(submitted(outcomes))
    }

    fn release_gap(&mut self, tenant: &str, run: &str) -> Result<Vec<Decision>, StoreError> {
        if self.replaying.is_some() {
            return Ok(self.guard.release_gap(tenant, run)?);
        }
        let (ledger, replicator) = (&self.ledger, &mut self.replicator);
        Ok(self
            .guard
            .release_gap_then(tenant, run, |engine, applied| {
                ledger.claim(engine, applied)?;
                replicator.publish(&[], applied)?;
                Ok::<(), Refused>(())
            })?)
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

    fn close(&mut self) -> Result<(), StoreError> {
        Ok(self.guard.checkpoint()?)
    }
}
