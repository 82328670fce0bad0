//! Facts for the watchdog, taken from what the guard applied.
//!
//! [`FeedStore`] wraps the daemon's [`GuardStore`]: it passes every call through and looks
//! at the decisions that come back, each of which stands for one applied (durable) event.
//! An applied `instance_launched` becomes an [`InstanceLaunched`] fact; a decision carrying
//! a stop report (the run closed: stopped, completed, cancelled) and an applied
//! `run_finished` become a [`RunEnded`] fact, at the event's own `ts_ms`. The guard core
//! decides when a run ends; this only reacts to its decisions.
//!
//! Events held for a missing `seq` are applied later (by a later batch or `release_gap`),
//! so the events a decision may refer to are remembered until their decision arrives.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use fusebox_core::{Decision, Engine, Event, EventBody};
use fusebox_nats::{GuardStore, StoreError, Submitted};
use fusebox_watchdog::{Fact, InstanceLaunched, RunEnded};

/// Where facts go: journaled durably, then handed to the watchdog.
pub trait FactSink: Send + Sync + 'static {
    fn facts(&self, facts: Vec<Fact>);
}

/// Held events remembered at most; a run that never fills its gap must not grow this
/// forever (the oldest is forgotten first).
const MAX_REMEMBERED: usize = 100_000;

/// What a decision needs from its event.
struct Seen {
    ts_ms: u64,
    launched: Option<fusebox_core::event::InstanceLaunched>,
    finished: bool,
}

type EventKey = (String, String, String);

pub struct FeedStore<S> {
    inner: S,
    sink: Option<Arc<dyn FactSink>>,
    /// Events of held outcomes, by (tenant, run, event id), until their decision arrives.
    held: HashMap<EventKey, Seen>,
    held_order: VecDeque<EventKey>,
    /// Runs already reported ended: a looping agent keeps getting `stop` decisions after
    /// its run closed, and the watchdog keeps the first end anyway, so repeats are dropped
    /// here rather than journaled on every batch.
    ended: HashSet<(String, String)>,
}

impl<S: GuardStore> FeedStore<S> {
    /// `sink = None` (watchdog disabled) makes this a plain pass-through.
    pub fn new(inner: S, sink: Option<Arc<dyn FactSink>>) -> Self {
        FeedStore {
            inner,
            sink,
            held: HashMap::new(),
            held_order: VecDeque::new(),
            ended: HashSet::new(),
        }
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    pub fn inner_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    fn remember(&mut self, key: EventKey, seen: Seen) {
        if self.held.len() >= MAX_REMEMBERED {
            if let Some(oldest) = self.held_order.pop_front() {
                self.held.remove(&oldest);
            }
        }
        self.held_order.push_back(key.clone());
        self.held.insert(key, seen);
    }

    /// The facts of a decision whose event is `seen`.
    fn facts_of(&mut self, decision: &Decision, seen: &Seen, facts: &mut Vec<Fact>) {
        if let Some(l) = &seen.launched {
            facts.push(
                InstanceLaunched {
                    tenant: decision.tenant.clone(),
                    run: decision.run.clone(),
                    provider: l.provider.clone(),
                    region: l.region.clone(),
                    instance_id: l.instance_id.clone(),
                    max_lifetime_s: l.max_lifetime_s,
                    ts_ms: seen.ts_ms,
                }
                .into(),
            );
        }
        if (decision.report.is_some() || seen.finished) && self.first_end(decision) {
            facts.push(run_ended(decision, seen.ts_ms));
        }
    }

    /// The facts of the decision of an event that was held, looked up in `held`.
    fn facts_of_released(&mut self, decision: &Decision, facts: &mut Vec<Fact>) {
        let key = (
            decision.tenant.clone(),
            decision.run.clone(),
            decision.event_id.clone(),
        );
        match self.held.remove(&key) {
            Some(seen) => self.facts_of(decision, &seen, facts),
            // Every released decision answers a remembered event; one that does not (the
            // oldest forgotten, or a store change) still ends its run, at the wall-clock
            // time.
            None => {
                if decision.report.is_some() && self.first_end(decision) {
                    facts.push(run_ended(decision, now_ms()));
                }
            }
        }
    }

    fn forget_released(&mut self) {
        if self.held_order.len() != self.held.len() {
            self.held_order.retain(|k| self.held.contains_key(k));
        }
    }

    fn first_end(&mut self, decision: &Decision) -> bool {
        if self.ended.len() >= MAX_REMEMBERED {
            // Forgetting only costs a repeated fact, which the watchdog ignores.
            self.ended.clear();
        }
        self.ended
            .insert((decision.tenant.clone(), decision.run.clone()))
    }

    fn emit(&self, facts: Vec<Fact>) {
        if let (Some(sink), false) = (&self.sink, facts.is_empty()) {
            sink.facts(facts);
        }
    }
}

fn run_ended(decision: &Decision, ts_ms: u64) -> Fact {
    RunEnded {
        tenant: decision.tenant.clone(),
        run: decision.run.clone(),
        ts_ms,
    }
    .into()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn seen(event: &Event) -> Seen {
    Seen {
        ts_ms: event.ts_ms,
        launched: match &event.body {
            EventBody::InstanceLaunched(l) => Some(l.clone()),
            _ => None,
        },
        finished: matches!(event.body, EventBody::RunFinished(_)),
    }
}

impl<S: GuardStore> GuardStore for FeedStore<S> {
    fn submit_batch(&mut self, events: Vec<Event>) -> Result<Vec<Submitted>, StoreError> {
        if self.sink.is_none() {
            return self.inner.submit_batch(events);
        }
        // What each event's decision needs, taken before the events move into the store.
        // The key only for an event with a `seq`: only those can be held for a gap, and
        // the common batch then copies no strings at all.
        let seen: Vec<(Seen, Option<EventKey>)> = events
            .iter()
            .map(|e| {
                let key = e
                    .seq
                    .map(|_| (e.tenant.clone(), e.run.clone(), e.id.clone()));
                (seen(e), key)
            })
            .collect();
        let outcomes = self.inner.submit_batch(events)?;
        let mut facts = Vec::new();
        for ((seen, key), outcome) in seen.into_iter().zip(&outcomes) {
            match outcome {
                // The event's own decision first, then those of the held events it
                // released (`Submitted::Applied`).
                Submitted::Applied(applied) => {
                    let mut applied = applied.iter();
                    if let Some(own) = applied.next() {
                        self.facts_of(own, &seen, &mut facts);
                    }
                    for released in applied {
                        self.facts_of_released(released, &mut facts);
                    }
                }
                Submitted::Held { .. } => {
                    if let Some(key) = key {
                        self.remember(key, seen);
                    }
                }
                // A duplicate was applied (and fed) the first time; a rejection never was.
                Submitted::Duplicate(_) | Submitted::Rejected(_) => {}
            }
        }
        self.forget_released();
        self.emit(facts);
        Ok(outcomes)
    }

    fn take_stops_to_publish(&mut self) -> Vec<Decision> {
        self.inner.take_stops_to_publish()
    }

    fn on_timer(&mut self) {
        self.inner.on_timer();
    }

    fn release_gap(&mut self, tenant: &str, run: &str) -> Result<Vec<Decision>, StoreError> {
        let decisions = self.inner.release_gap(tenant, run)?;
        if self.sink.is_some() {
            let mut facts = Vec::new();
            for decision in &decisions {
                self.facts_of_released(decision, &mut facts);
            }
            self.forget_released();
            self.emit(facts);
        }
        Ok(decisions)
    }

    fn waiting(&self) -> Vec<(String, String, u64)> {
        self.inner.waiting()
    }

    fn engine(&self) -> &Engine {
        self.inner.engine()
    }

    fn history(
        &self,
        tenant: &str,
        run: &str,
        after: u64,
        limit: usize,
    ) -> Result<Option<fusebox_nats::wire::RunHistory>, StoreError> {
        self.inner.history(tenant, run, after, limit)
    }

    fn close(&mut self) -> Result<(), StoreError> {
        self.inner.close()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use fusebox_core::{parse_event, PolicySet};
    use fusebox_nats::MemoryStore;

    use super::*;

    #[derive(Clone, Default)]
    struct Collect(Arc<Mutex<Vec<Fact>>>);

    impl FactSink for Collect {
        fn facts(&self, facts: Vec<Fact>) {
            self.0.lock().unwrap().extend(facts);
        }
    }

    fn event(json: &str) -> Event {
        parse_event(json.as_bytes()).unwrap()
    }

    fn store() -> (FeedStore<MemoryStore>, Collect) {
        let collect = Collect::default();
        let engine = Engine::new(PolicySet::default());
        let store = FeedStore::new(MemoryStore::new(engine), Some(Arc::new(collect.clone())));
        (store, collect)
    }

    #[test]
    fn launches_and_run_ends_become_facts_once() {
        let (mut store, facts) = store();
        let batch = vec![
            event(
                r#"{"v":1,"id":"e1","tenant":"t","run":"r","seq":1,"ts_ms":1000,"type":"run_started"}"#,
            ),
            event(
                r#"{"v":1,"id":"e2","tenant":"t","run":"r","seq":2,"ts_ms":2000,"type":"instance_launched","provider":"ec2","region":"us-east-1","instance_id":"i-1","max_lifetime_s":60}"#,
            ),
        ];
        store.submit_batch(batch.clone()).unwrap();
        // A redelivered batch is a duplicate: no second fact.
        store.submit_batch(batch).unwrap();
        store
            .submit_batch(vec![event(
                r#"{"v":1,"id":"e3","tenant":"t","run":"r","seq":3,"ts_ms":3000,"type":"run_finished"}"#,
            )])
            .unwrap();
        let facts = facts.0.lock().unwrap().clone();
        assert_eq!(
            facts,
            vec![
                Fact::InstanceLaunched(InstanceLaunched {
                    tenant: "t".into(),
                    run: "r".into(),
                    provider: "ec2".into(),
                    region: "us-east-1".into(),
                    instance_id: "i-1".into(),
                    max_lifetime_s: Some(60),
                    ts_ms: 2000,
                }),
                Fact::RunEnded(RunEnded {
                    tenant: "t".into(),
                    run: "r".into(),
                    ts_ms: 3000,
                }),
            ]
        );
    }

    #[test]
    fn a_held_launch_is_fed_when_its_gap_is_released() {
        let (mut store, facts) = store();
        store
            .submit_batch(vec![event(
                r#"{"v":1,"id":"e1","tenant":"t","run":"r","seq":1,"ts_ms":1000,"type":"run_started"}"#,
            )])
            .unwrap();
        let out = store
            .submit_batch(vec![event(
                r#"{"v":1,"id":"e3","tenant":"t","run":"r","seq":3,"ts_ms":3000,"type":"instance_launched","provider":"ec2","region":"us-east-1","instance_id":"i-3"}"#,
            )])
            .unwrap();
        assert!(matches!(out[0], Submitted::Held { .. }), "{out:?}");
        assert!(facts.0.lock().unwrap().is_empty());
        store.release_gap("t", "r").unwrap();
        let facts = facts.0.lock().unwrap().clone();
        assert!(
            matches!(&facts[..], [Fact::InstanceLaunched(l)] if l.instance_id == "i-3" && l.ts_ms == 3000),
            "{facts:?}"
        );
    }

    /// A launch held for a missing `seq` is fed with its own time once the missing event
    /// arrives: in a later batch, or later in the same batch.
    #[test]
    fn a_held_launch_is_fed_when_the_missing_seq_arrives() {
        let started =
            r#"{"v":1,"id":"e1","tenant":"t","run":"r","seq":1,"ts_ms":1000,"type":"run_started"}"#;
        let missing = r#"{"v":1,"id":"e2","tenant":"t","run":"r","seq":2,"ts_ms":2000,"type":"progress","version":1}"#;
        let launched = r#"{"v":1,"id":"e3","tenant":"t","run":"r","seq":3,"ts_ms":3000,"type":"instance_launched","provider":"ec2","region":"us-east-1","instance_id":"i-3"}"#;
        for batches in [
            vec![vec![started], vec![launched], vec![missing]],
            vec![vec![started], vec![launched, missing]],
        ] {
            let (mut store, facts) = store();
            for batch in &batches {
                store
                    .submit_batch(batch.iter().map(|json| event(json)).collect())
                    .unwrap();
            }
            let facts = facts.0.lock().unwrap().clone();
            assert!(
                matches!(&facts[..], [Fact::InstanceLaunched(l)] if l.instance_id == "i-3" && l.ts_ms == 3000),
                "{batches:?}: {facts:?}"
            );
            assert!(store.held.is_empty() && store.held_order.is_empty());
        }
    }
}
