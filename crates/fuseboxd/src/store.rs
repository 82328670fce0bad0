//! The daemon's [`GuardStore`]: `fusebox-log`'s durable guard (sled, group commit).

use fusebox_core::{Decision, Engine, Event};
use fusebox_log::{Guard, Outcome};
use fusebox_nats::wire::RunHistory;
use fusebox_nats::{GuardStore, StoreError, Submitted};

pub struct DurableStore(pub Guard);

/// The log's outcomes in the service's terms.
pub fn submitted(outcomes: Vec<Outcome>) -> Vec<Submitted> {
    outcomes
        .into_iter()
        .map(|outcome| match outcome {
            Outcome::Applied(decisions) => Submitted::Applied(decisions),
            Outcome::Duplicate(decision) => Submitted::Duplicate(decision),
            Outcome::Held { waiting_for } => Submitted::Held { waiting_for },
            Outcome::Rejected(err) => Submitted::Rejected(err),
        })
        .collect()
}

impl GuardStore for DurableStore {
    fn submit_batch(&mut self, events: Vec<Event>) -> Result<Vec<Submitted>, StoreError> {
        Ok(submitted(self.0.submit_batch(events)?))
    }

    fn release_gap(&mut self, tenant: &str, run: &str) -> Result<Vec<Decision>, StoreError> {
        Ok(self.0.release_gap(tenant, run)?)
    }

    fn waiting(&self) -> Vec<(String, String, u64)> {
        self.0
            .waiting()
            .map(|(t, r, seq)| (t.to_owned(), r.to_owned(), seq))
            .collect()
    }

    fn engine(&self) -> &Engine {
        self.0.engine()
    }

    fn history(
        &self,
        tenant: &str,
        run: &str,
        after: u64,
        limit: usize,
    ) -> Result<Option<RunHistory>, StoreError> {
        Ok(Some(crate::history::run_history(
            &self.0, tenant, run, after, limit,
        )?))
    }

    fn close(&mut self) -> Result<(), StoreError> {
        Ok(self.0.checkpoint()?)
    }
}
