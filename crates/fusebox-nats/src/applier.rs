//! The one ordered applier. Gate requests, stream messages, operator commands and ticks
//! all meet here, on one thread that owns the store, so a run's events are applied in
//! `seq` order whichever path they came by (the core sequencer orders them) and every
//! batch is durable before anything about it leaves the process.
//!
//! Group commit: the thread takes whatever is queued (up to `max_batch`) and submits it
//! as one batch, so under load one flush covers many events, and with one request in
//! flight the batch is that request alone.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::Subject;
use bytes::Bytes;
use fusebox_core::event::Tick;
use fusebox_core::{Action, Decision, Event, EventBody, TerminalState};
use tokio::sync::mpsc::{Receiver, UnboundedSender};

use crate::dispatch::{Outbox, Output};
use crate::gap_probe::{Answer, Probe};
use crate::observer::Observer;
use crate::query::{self, Query};
use crate::reject::{reject, Origin};
use crate::stall::Busy;
use crate::store::{GuardStore, StoreError, Submitted};
use crate::subjects;
use crate::ticks::Wakes;

pub(crate) type RunKey = (String, String);
type EventKey = (String, String, String);

pub(crate) enum Input {
    Event {
        event: Event,
        origin: Origin,
    },
    Query {
        query: Query,
        reply: Subject,
    },
    /// Periodic: probe timed-out gaps, write due ticks, refresh gauges.
    Timer,
    /// What the events stream holds for a gap that timed out.
    Probed {
        probe: Probe,
        answer: Answer,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct ApplierOptions {
    pub max_batch: usize,
    pub gap_timeout: Duration,
    pub recent_decisions: usize,
}

pub(crate) struct Applier<S> {
    store: S,
    /// Where a timed-out gap is asked about (`gap_probe.rs`); `None` without JetStream
    /// (tests), where a timed-out gap is released at once.
    probes: Option<UnboundedSender<Probe>>,
    /// Runs whose gap is being asked about.
    probing: HashSet<RunKey>,
    out: UnboundedSender<Outbox>,
    /// What the batch being handled will send, handed over once it is durable.
    outbox: Outbox,
    observer: Arc<dyn Observer>,
    options: ApplierOptions,
    /// Inputs whose event is held (waiting for a gap): answered once it is applied.
    waiters: HashMap<EventKey, Vec<Origin>>,
    gap_since: HashMap<RunKey, Instant>,
    /// When each open run needs a tick.
    wakes: Wakes,
    recent: HashMap<RunKey, VecDeque<Decision>>,
    /// Runs whose stop is on the kill switch.
    stopped: HashSet<RunKey>,
    /// Runs stopped or cancelled in the batch in hand: their open descendants are told.
    closed_trees: Vec<RunKey>,
    /// When the batch in hand was started, for the service's stall check.
    busy: Arc<Busy>,
}

/// A decision's JSON, serialised once for its reply, its publish and its stop. On the
/// applier thread, whose time per batch bounds the gate's throughput: `write_json`
/// writes serde's bytes without serde's per-field machinery (fusebox-core's cases test
/// holds the two equal).
fn encode(decision: &Decision) -> Bytes {
    let mut json = Vec::with_capacity(256);
    decision.write_json(&mut json);
    json.into()
}

fn event_key(event: &Event) -> EventKey {
    (event.tenant.clone(), event.run.clone(), event.id.clone())
}

impl<S: GuardStore> Applier<S> {
    pub(crate) fn new(
        mut store: S,
        probes: Option<UnboundedSender<Probe>>,
        out: UnboundedSender<Outbox>,
        observer: Arc<dyn Observer>,
        options: ApplierOptions,
        busy: Arc<Busy>,
    ) -> Self {
        // Runs already closed in the rebuilt state have their stop kept in the stream.
        let stopped = store
            .engine()
            .runs()
            .filter(|(_, _, run)| !run.is_open())
            .map(|(t, r, _)| (t.to_owned(), r.to_owned()))
            .collect();
        let owed = Outbox {
            answers: Vec::new(),
            publishes: store
                .take_stops_to_publish()
                .iter()
                .map(|decision| Output::Stop {
                    tenant: decision.tenant.clone(),
                    run: decision.run.clone(),
                    body: encode(decision),
                })
                .collect(),
        };
        owed.send(&out);
        let wakes = Wakes::rebuilt(store.engine(), Instant::now());
        Applier {
            store,
            probes,
            probing: HashSet::new(),
            out,
            outbox: Outbox::default(),
            observer,
            options,
            waiters: HashMap::new(),
            gap_since: HashMap::new(),
            wakes,
            recent: HashMap::new(),
            stopped,
            closed_trees: Vec::new(),
            busy,
        }
    }

    /// Runs until every sender is gone (shutdown), then returns: everything received was
    /// committed and answered.
    pub(crate) fn run(mut self, mut rx: Receiver<Input>) -> Result<(), StoreError> {
        // Kept across batches: made afresh from the first input, it grew by doubling
        // and copied a full batch's inputs about twice over.
        let mut inputs = Vec::with_capacity(self.options.max_batch);
        while let Some(first) = rx.blocking_recv() {
            inputs.push(first);
            while inputs.len() < self.options.max_batch {
                match rx.try_recv() {
                    Ok(input) => inputs.push(input),
                    Err(_) => break,
                }
            }
            self.busy.start();
            let handled = self.handle(&mut inputs);
            if handled.is_err() {
                self.hand_back_held();
            }
            // Whatever was committed before a failure is durable and is answered.
            std::mem::take(&mut self.outbox).send(&self.out);
            self.busy.done();
            handled?;
        }
        self.store.close()
    }

    /// One batch: `inputs` is left empty.
    fn handle(&mut self, inputs: &mut Vec<Input>) -> Result<(), StoreError> {
        let mut events = Vec::with_capacity(inputs.len());
        let mut queries = Vec::new();
        let mut timer = false;
        let mut probed = Vec::new();
        for input in inputs.drain(..) {
            match input {
                Input::Event { event, origin } => events.push((event, origin)),
                Input::Query { query, reply } => queries.push((query, reply)),
                Input::Timer => timer = true,
                Input::Probed { probe, answer } => probed.push((probe, answer)),
            }
        }
        let mut touched = HashSet::new();
        if !events.is_empty() {
            self.submit(events, &mut touched)?;
        }
        for (probe, answer) in probed {
            self.on_probed(probe, answer, &mut touched)?;
        }
        if timer {
            self.on_timer(&mut touched)?;
        }
        self.stop_descendants(&mut touched)?;
        self.settle_stops(&touched);
        for (query, reply) in queries {
            let body = query::answer(&self.store, &self.recent, &query);
            self.outbox.answers.push(Output::Reply {
                to: reply,
                body: body.into(),
                gate_received: None,
            });
        }
        Ok(())
    }

    fn submit(
        &mut self,
        events: Vec<(Event, Origin)>,
        touched: &mut HashSet<RunKey>,
    ) -> Result<(), StoreError> {
        let mut meta = Vec::with_capacity(events.len());
        let mut batch = Vec::with_capacity(events.len());
        for (mut event, origin) in events {
            if matches!(origin, Origin::Control { .. }) {
                // An operator command takes effect at the run's own event time: stamping
                // it with our wall clock would move the run's clock (producers' clocks
                // are theirs) and could spend its time budget on the spot.
                if let Some(run) = self.store.engine().run(&event.tenant, &event.run) {
                    event.ts_ms = run.last_ts_ms;
                }
            }
            meta.push((event_key(&event), event.type_name(), origin));
            batch.push(event);
        }
        let started = Instant::now();
        let outcomes = match self.store.submit_batch(batch) {
            Ok(outcomes) => outcomes,
            Err(err) => {
                // Nothing of the batch was committed and this applier stops: stream
                // messages go back for redelivery at once (to whoever serves next),
                // gate requests are left to their clients' retries.
                for (_, _, origin) in meta {
                    if let Origin::Stream(message) = origin {
                        self.outbox.answers.push(Output::Nak(message));
                    }
                }
                return Err(err);
            }
        };
        self.observer.log_commit(started.elapsed());
        for ((key, event_type, origin), outcome) in meta.into_iter().zip(outcomes) {
            match outcome {
                Submitted::Applied(decisions) => {
                    self.observer.event(&key.0, event_type);
                    self.waiters.entry(key).or_default().push(origin);
                    for decision in decisions {
                        self.decided(decision, touched);
                    }
                }
                Submitted::Held { waiting_for } => {
                    tracing::debug!(tenant = %key.0, run = %key.1, waiting_for, "event held for an earlier seq");
                    self.observer.event(&key.0, event_type);
                    self.gap_since
                        .entry((key.0.clone(), key.1.clone()))
                        .or_insert_with(Instant::now);
                    self.waiters.entry(key).or_default().push(origin);
                }
                Submitted::Duplicate(Some(decision)) => {
                    let body = encode(&decision);
                    self.outbox.answers.extend(origin.answer(&body));
                }
                Submitted::Duplicate(None) => {
                    self.waiters.entry(key).or_default().push(origin);
                }
                Submitted::Rejected(err) => reject(&mut self.outbox, &*self.observer, origin, &err),
            }
        }
        Ok(())
    }

    /// The applier is failing: stream messages held for a gap go back for redelivery.
    fn hand_back_held(&mut self) {
        for origins in std::mem::take(&mut self.waiters).into_values() {
            for origin in origins {
                if let Origin::Stream(message) = origin {
                    self.outbox.answers.push(Output::Nak(message));
                }
            }
        }
    }

    /// One committed decision: publish what must be published, then answer everyone
    /// waiting for it.
    fn decided(&mut self, decision: Decision, touched: &mut HashSet<RunKey>) {
        let run_key = (decision.tenant.clone(), decision.run.clone());
        self.observer.decision(&decision);
        self.wakes.applied(run_key.clone(), Instant::now());
        let body = encode(&decision);
        if decision.is_notable() {
            self.outbox.publishes.push(Output::Publish {
                subject: subjects::decisions(&decision.tenant, &decision.run),
                body: body.clone(),
            });
            let recent = self.recent.entry(run_key.clone()).or_default();
            if recent.len() == self.options.recent_decisions {
                recent.pop_front();
            }
            recent.push_back(decision.clone());
        }
        if let Some(report) = decision.stop_report() {
            // Only the decision that closes the run goes on the kill switch: the stream
            // keeps one message per run, and the latched answers to later calls (same
            // report) would otherwise replace it under a worker that is still catching up.
            if self.stopped.insert(run_key.clone()) {
                self.observer.run_stopped(
                    &decision.tenant,
                    report.terminal_state.as_str(),
                    report.reason.as_str(),
                );
                if decision.action == Action::Stop {
                    if report.terminal_state != TerminalState::Completed {
                        self.closed_trees.push(run_key.clone());
                    }
                    self.outbox.publishes.push(Output::Stop {
                        tenant: decision.tenant.clone(),
                        run: decision.run.clone(),
                        body: body.clone(),
                    });
                }
            }
        }
        let event_key = (decision.tenant, decision.run, decision.event_id);
        for origin in self.waiters.remove(&event_key).unwrap_or_default() {
            self.outbox.answers.extend(origin.answer(&body));
        }
        touched.insert(run_key);
    }

    /// A stop reaches the whole subtree (guard contract §6): for each run stopped or
    /// cancelled in this batch, a `tick` for each of its open descendants, which the
    /// engine answers with that descendant's own stop (`ancestor_stopped`, naming the
    /// ancestor) — logged, so a replay stops them too, and published on each one's kill
    /// switch. Their calls were refused already (the latch looks up the tree); the tick
    /// tells the workers that make no call.
    fn stop_descendants(&mut self, touched: &mut HashSet<RunKey>) -> Result<(), StoreError> {
        while !self.closed_trees.is_empty() {
            let mut ticks = Vec::new();
            for (tenant, ancestor) in std::mem::take(&mut self.closed_trees) {
                let engine = self.store.engine();
                for child in engine.open_descendants(&tenant, &ancestor) {
                    let ts_ms = engine.run(&tenant, &child).map_or(0, |run| run.last_ts_ms);
                    ticks.push((
                        Event {
                            v: 1,
                            // Deterministic: the same ancestor's stop told again is a
                            // duplicate.
                            id: format!("tick-tree-{ancestor}"),
                            tenant: tenant.clone(),
                            run: child,
                            seq: None,
                            ts_ms,
                            body: EventBody::Tick(Tick {}),
                        },
                        Origin::Internal,
                    ));
                }
            }
            if ticks.is_empty() {
                break;
            }
            // The descendants' own stops come back through `decided`, which would list
            // them here again: they have no open descendants left, so the loop ends.
            self.submit(ticks, touched)?;
        }
        Ok(())
    }

    /// A run that was stopped and is open again after this batch (an accepted resume)
    /// must not leave its old stop on the kill switch.
    fn settle_stops(&mut self, touched: &HashSet<RunKey>) {
        for key in touched {
            let reopened = self.stopped.contains(key)
                && self
                    .store
                    .engine()
                    .run(&key.0, &key.1)
                    .is_some_and(|run| run.is_open());
            if reopened {
                self.stopped.remove(key);
                self.outbox.publishes.push(Output::ClearStop {
                    tenant: key.0.clone(),
                    run: key.1.clone(),
                });
            }
        }
    }

    fn release(
        &mut self,
        tenant: &str,
        run: &str,
        touched: &mut HashSet<RunKey>,
    ) -> Result<(), StoreError> {
        self.gap_since.remove(&(tenant.to_owned(), run.to_owned()));
        for decision in self.store.release_gap(tenant, run)? {
            self.decided(decision, touched);
        }
        Ok(())
    }

    fn still_missing(&self, probe: &Probe) -> bool {
        self.store
            .waiting()
            .iter()
            .any(|(t, r, seq)| *t == probe.tenant && *r == probe.run && *seq == probe.seq)
    }

    /// A timed-out gap as the events stream answered it: its missing event applied from
    /// the stream's copy, or the held events applied without it when the stream does
    /// not hold it (see `gap_probe.rs`); asked again at a later tick when unanswered.
    fn on_probed(
        &mut self,
        probe: Probe,
        answer: Answer,
        touched: &mut HashSet<RunKey>,
    ) -> Result<(), StoreError> {
        self.probing
            .remove(&(probe.tenant.clone(), probe.run.clone()));
        if !self.still_missing(&probe) {
            return Ok(());
        }
        let Probe { tenant, run, seq } = &probe;
        match answer {
            Answer::Holds(event) => {
                tracing::warn!(%tenant, %run, missing_seq = seq, "gap timed out; the events stream holds the missing event its consumer has not delivered: applying the stream's copy");
                self.submit(vec![(*event, Origin::Internal)], touched)?;
                if self.still_missing(&probe) {
                    // The stream's copy was refused: it can never fill the gap.
                    self.release(tenant, run, touched)?;
                }
            }
            Answer::Absent => {
                tracing::warn!(%tenant, %run, missing_seq = seq, "gap timed out and the events stream does not hold the missing event; applying the held events without it");
                self.release(tenant, run, touched)?;
            }
            Answer::Unanswered(err) => {
                tracing::debug!(%tenant, %run, missing_seq = seq, %err, "the events stream did not answer for a missing event; asking again");
            }
        }
        Ok(())
    }

    fn on_timer(&mut self, touched: &mut HashSet<RunKey>) -> Result<(), StoreError> {
        let now = Instant::now();
        let waiting = self.store.waiting();
        let still: HashSet<RunKey> = waiting
            .iter()
            .map(|(t, r, _)| (t.clone(), r.clone()))
            .collect();
        self.gap_since.retain(|key, _| still.contains(key));
        for (tenant, run, seq) in waiting {
            let since = *self
                .gap_since
                .entry((tenant.clone(), run.clone()))
                .or_insert(now);
            if now.duration_since(since) < self.options.gap_timeout {
                continue;
            }
            let key = (tenant.clone(), run.clone());
            match &self.probes {
                Some(_) if self.probing.contains(&key) => {}
                Some(probes) => {
                    if probes.send(Probe { tenant, run, seq }).is_ok() {
                        self.probing.insert(key);
                    }
                }
                None => {
                    tracing::warn!(%tenant, %run, missing_seq = seq, "gap timed out; applying the held events without it");
                    self.release(&tenant, &run, touched)?;
                }
            }
        }
        self.store.on_timer();
        let due = self.wakes.due(self.store.engine(), now);
        if !due.is_empty() {
            tracing::info!(
                runs = due.len(),
                "time budget expired on idle runs; writing ticks"
            );
            let events = due.into_iter().map(|e| (e, Origin::Internal)).collect();
            self.submit(events, touched)?;
        }
        self.observer.runs_active(self.wakes.open_runs() as u64);
        self.observer.subagents_active(self.wakes.open_subagents());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use fusebox_core::parse_event;
    use tokio::sync::mpsc::unbounded_channel;

    use super::*;
    use crate::observer::NoopObserver;
    use crate::store::MemoryStore;

    /// A memory store that owes the kill switch the stops it was given.
    struct Owing {
        inner: MemoryStore,
        stops: Vec<Decision>,
    }

    impl GuardStore for Owing {
        fn submit_batch(&mut self, events: Vec<Event>) -> Result<Vec<Submitted>, StoreError> {
            self.inner.submit_batch(events)
        }
        fn release_gap(&mut self, tenant: &str, run: &str) -> Result<Vec<Decision>, StoreError> {
            self.inner.release_gap(tenant, run)
        }
        fn waiting(&self) -> Vec<(String, String, u64)> {
            self.inner.waiting()
        }
        fn engine(&self) -> &fusebox_core::Engine {
            self.inner.engine()
        }
        fn take_stops_to_publish(&mut self) -> Vec<Decision> {
            std::mem::take(&mut self.stops)
        }
    }

    fn cancelled_run() -> (MemoryStore, Decision) {
        let mut store = MemoryStore::default();
        let events = [
            r#"{"v":1,"id":"e1","tenant":"acme","run":"r1","seq":1,"ts_ms":1,"type":"run_started","agent":"a"}"#,
            r#"{"v":1,"id":"e2","tenant":"acme","run":"r1","ts_ms":2,"type":"cancel","by":"oncall","reason":"test"}"#,
        ]
        .map(|json| parse_event(json.as_bytes()).unwrap());
        let outcomes = store.submit_batch(events.to_vec()).unwrap();
        let Some(Submitted::Applied(decisions)) = outcomes.into_iter().nth(1) else {
            panic!("cancel not applied")
        };
        let stop = decisions.into_iter().next().unwrap();
        assert_eq!(stop.action, Action::Stop);
        (store, stop)
    }

    #[test]
    fn the_stops_a_store_owes_are_sent_to_the_kill_switch_before_anything_else() {
        let (inner, stop) = cancelled_run();
        let store = Owing {
            inner,
            stops: vec![stop.clone()],
        };
        let (out, mut sent) = unbounded_channel();
        let options = ApplierOptions {
            max_batch: 8,
            gap_timeout: Duration::from_secs(5),
            recent_decisions: 8,
        };
        let _applier = Applier::new(
            store,
            None,
            out,
            Arc::new(NoopObserver),
            options,
            Arc::new(Busy::default()),
        );
        let first = sent.try_recv().expect("the owed stops are sent at once");
        assert!(first.answers.is_empty());
        let [Output::Stop { tenant, run, body }] = first.publishes.as_slice() else {
            panic!("one stop expected");
        };
        assert_eq!((tenant.as_str(), run.as_str()), ("acme", "r1"));
        assert_eq!(body, &encode(&stop));
        assert!(sent.try_recv().is_err(), "nothing else before input");
    }

    /// A cancel of a root reaches its open descendants in the same batch: each gets its
    /// own stop on its own kill switch, naming the ancestor; a finished child and a
    /// stranger do not.
    #[test]
    fn a_stopped_root_stops_every_open_descendant_on_its_kill_switch() {
        let (out, mut sent) = unbounded_channel();
        let options = ApplierOptions {
            max_batch: 8,
            gap_timeout: Duration::from_secs(5),
            recent_decisions: 8,
        };
        let mut applier = Applier::new(
            MemoryStore::default(),
            None,
            out,
            Arc::new(NoopObserver),
            options,
            Arc::new(Busy::default()),
        );
        let event = |json: &str| Input::Event {
            event: parse_event(json.as_bytes()).unwrap(),
            origin: Origin::Internal,
        };
        let mut inputs = vec![
            event(r#"{"v":1,"id":"s","tenant":"t","run":"root","ts_ms":1,"type":"run_started"}"#),
            event(
                r#"{"v":1,"id":"s","tenant":"t","run":"kid","ts_ms":2,"type":"run_started","parent":"root"}"#,
            ),
            event(
                r#"{"v":1,"id":"s","tenant":"t","run":"grandkid","ts_ms":3,"type":"run_started","parent":"kid"}"#,
            ),
            event(
                r#"{"v":1,"id":"s","tenant":"t","run":"done","ts_ms":3,"type":"run_started","parent":"root"}"#,
            ),
            event(r#"{"v":1,"id":"f","tenant":"t","run":"done","ts_ms":4,"type":"run_finished"}"#),
            event(
                r#"{"v":1,"id":"s","tenant":"t","run":"stranger","ts_ms":3,"type":"run_started"}"#,
            ),
        ];
        applier.handle(&mut inputs).unwrap();
        std::mem::take(&mut applier.outbox).send(&applier.out);
        while sent.try_recv().is_ok() {}

        let mut inputs = vec![event(
            r#"{"v":1,"id":"c","tenant":"t","run":"root","ts_ms":5,"type":"cancel","by":"oncall"}"#,
        )];
        applier.handle(&mut inputs).unwrap();
        std::mem::take(&mut applier.outbox).send(&applier.out);
        let sent = sent.try_recv().expect("the batch is sent");
        let stopped: Vec<(&str, String)> = sent
            .publishes
            .iter()
            .filter_map(|output| match output {
                Output::Stop { run, body, .. } => {
                    let decision: serde_json::Value = serde_json::from_slice(body).unwrap();
                    Some((
                        run.as_str(),
                        decision["reason"].as_str().unwrap().to_owned(),
                    ))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            stopped,
            [
                ("root", "cancelled".to_owned()),
                ("kid", "ancestor_stopped".to_owned()),
                ("grandkid", "ancestor_stopped".to_owned()),
            ]
        );
        let engine = applier.store.engine();
        assert!(engine.run("t", "stranger").unwrap().is_open());
        let grandkid = engine.run("t", "grandkid").unwrap().report().unwrap();
        assert!(
            grandkid.detail.as_deref().unwrap().contains("run "),
            "{grandkid:?}"
        );
    }
}
