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

    /// The facts of `decisions`, looking their events up in `batch` first, then in `held`.
    fn facts(&mut self, decisions: &[&Decision], batch: &HashMap<EventKey, Seen>) -> Vec<Fact> {
        let mut facts = Vec::new();
        for decision in decisions {
            let key = (
                decision.tenant.clone(),
                decision.run.clone(),
                decision.event_id.clone(),
            );
            let from_hold = self.held.remove(&key);
            let Some(seen) = batch.get(&key).or(from_hold.as_ref()) else {
                // Every decision answers an event of this batch or of a hold; one that
                // does not (a store change) still ends its run, at the wall-clock time.
                if decision.report.is_some() && self.first_end(decision) {
                    facts.push(run_ended(decision, now_ms()));
                }
                continue;
            };
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
        if self.held_order.len() != self.held.len() {
            self.held_order.retain(|k| self.held.contains_key(k));
        }
        facts
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
        let keys: Vec<EventKey> = events
            .iter()
            .map(|e| (e.tenant.clone(), e.run.clone(), e.id.clone()))
            .collect();
        let mut batch: HashMap<EventKey, Seen> =
            keys.iter().cloned().zip(events.iter().map(seen)).collect();
        let outcomes = self.inner.submit_batch(events)?;
        let mut decisions = Vec::new();
        for (key, outcome) in keys.into_iter().zip(&outcomes) {
            match outcome {
                Submitted::Applied(applied) => decisions.extend(applied),
                Submitted::Held { .. } => {
                    if let Some(s) = batch.remove(&key) {
                        self.remember(key, s);
                    }
                }
                // A duplicate was applied (and fed) the first time; a rejection never was.
                Submitted::Duplicate(_) | Submitted::Rejected(_) => {}
            }
        }
        let facts = self.facts(&decisions, &batch);
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
            let refs: Vec<&Decision> = decisions.iter().collect();
            let facts = self.facts(&refs, &HashMap::new());
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
}
