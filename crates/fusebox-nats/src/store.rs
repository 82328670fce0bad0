//! Where events go to be decided: the log-backed engine behind one small trait.
//!
//! The daemon's implementation is durable (`fusebox-log`, one flush per batch before it
//! returns); [`MemoryStore`] is the same contract without a disk, for tests.

use std::collections::HashMap;

use fusebox_core::{Admission, Decision, Engine, Event, EventError, Sequencer};

pub type StoreError = Box<dyn std::error::Error + Send + Sync>;

/// What became of one submitted event.
#[derive(Debug)]
pub enum Submitted {
    /// Applied and durable: this event's decision and those of any held events it
    /// released, in the order they were applied.
    Applied(Vec<Decision>),
    /// Waiting for an earlier `seq` of its run.
    Held { waiting_for: u64 },
    /// Seen before: its original decision, or `None` while it is still held.
    Duplicate(Option<Decision>),
    /// Refused by admission (e.g. `seq` going backwards).
    Rejected(EventError),
}

pub trait GuardStore: Send + 'static {
    /// Admits and applies a batch. Everything applied is durable when this returns.
    fn submit_batch(&mut self, events: Vec<Event>) -> Result<Vec<Submitted>, StoreError>;
    /// Gives up waiting for a run's missing `seq`; returns the decisions of the held
    /// events, now applied and durable.
    fn release_gap(&mut self, tenant: &str, run: &str) -> Result<Vec<Decision>, StoreError>;
    /// Runs with held events, and the `seq` each waits for.
    fn waiting(&self) -> Vec<(String, String, u64)>;
    /// The guard state, for reads (status queries, deadlines).
    fn engine(&self) -> &Engine;
    /// The run's applied events with their decisions, in applied order: the entries
    /// after log position `after`, at most `limit` (the operator's page of one run).
    /// `None`: this store keeps no log to read them from.
    fn history(
        &self,
        _tenant: &str,
        _run: &str,
        _after: u64,
        _limit: usize,
    ) -> Result<Option<crate::wire::RunHistory>, StoreError> {
        Ok(None)
    }
    /// Stops this store owes the kill switch when its service starts: a cluster
    /// partition's catch-up closed their runs, and nobody may have published them. The
    /// applier hands them to the stop publisher before anything else, which retries
    /// them across a NATS outage like any other stop (a claim must not fail, and lose
    /// them with the catch-up it did, because JetStream is electing a leader).
    fn take_stops_to_publish(&mut self) -> Vec<Decision> {
        Vec::new()
    }
    /// Called on the applier's timer, between batches: work the store owes outside any
    /// batch (a cluster partition writes back to the shared ledger the outcomes it
    /// could not write when their batch committed).
    fn on_timer(&mut self) {}
    /// Called once after the last batch on a clean shutdown (e.g. to snapshot, so the
    /// next start replays nothing).
    fn close(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Engine + sequencer in memory, remembering every decision for duplicates.
#[derive(Default)]
pub struct MemoryStore {
    engine: Engine,
    sequencer: Sequencer,
    decisions: HashMap<(String, String, String), Decision>,
}

impl MemoryStore {
    pub fn new(engine: Engine) -> Self {
        MemoryStore {
            engine,
            ..MemoryStore::default()
        }
    }

    fn apply(&mut self, events: Vec<Event>) -> Vec<Decision> {
        events
            .into_iter()
            .map(|event| {
                let decision = self.engine.apply(&event);
                self.decisions
                    .insert((event.tenant, event.run, event.id), decision.clone());
                decision
            })
            .collect()
    }
}

impl GuardStore for MemoryStore {
    fn submit_batch(&mut self, events: Vec<Event>) -> Result<Vec<Submitted>, StoreError> {
        let mut out = Vec::with_capacity(events.len());
        for event in events {
            let key = (event.tenant.clone(), event.run.clone(), event.id.clone());
            out.push(match self.sequencer.admit(event) {
                Ok(Admission::Ready(ready)) => Submitted::Applied(self.apply(ready)),
                Ok(Admission::Held { waiting_for }) => Submitted::Held { waiting_for },
                Ok(Admission::Duplicate) => Submitted::Duplicate(self.decisions.get(&key).cloned()),
                Err(err) => Submitted::Rejected(err),
            });
        }
        Ok(out)
    }

    fn release_gap(&mut self, tenant: &str, run: &str) -> Result<Vec<Decision>, StoreError> {
        let released = self.sequencer.release_gap(tenant, run);
        Ok(self.apply(released))
    }

    fn waiting(&self) -> Vec<(String, String, u64)> {
        self.sequencer
            .waiting()
            .map(|(t, r, seq)| (t.to_owned(), r.to_owned(), seq))
            .collect()
    }

    fn engine(&self) -> &Engine {
        &self.engine
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_core::parse_event;

    fn event(id: &str, seq: u64) -> Event {
        let json = format!(
            r#"{{"v":1,"id":"{id}","tenant":"t","run":"r","seq":{seq},"ts_ms":1,"type":"progress","version":{seq}}}"#
        );
        parse_event(json.as_bytes()).unwrap()
    }

    #[test]
    fn holds_out_of_order_events_and_answers_duplicates_with_the_original() {
        let mut store = MemoryStore::default();
        let out = store
            .submit_batch(vec![event("b", 2), event("b", 2)])
            .unwrap();
        assert!(matches!(out[0], Submitted::Held { waiting_for: 1 }));
        assert!(matches!(out[1], Submitted::Duplicate(None)));
        let out = store.submit_batch(vec![event("a", 1)]).unwrap();
        let Submitted::Applied(decisions) = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!(decisions.len(), 2);
        assert_eq!(decisions[1].event_id, "b");
        let out = store.submit_batch(vec![event("b", 2)]).unwrap();
        assert!(matches!(&out[0], Submitted::Duplicate(Some(d)) if d == &decisions[1]));
        assert!(matches!(
            &store.submit_batch(vec![event("c", 1)]).unwrap()[0],
            Submitted::Rejected(_)
        ));
    }
}
