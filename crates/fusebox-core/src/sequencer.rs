//! Admission: at-most-once and in-order delivery of each run's events to the engine.
//!
//! Producers and NATS may deliver an event twice (a retried request, a redelivered
//! message) and out of order (the gate path and the stream path race). The sequencer
//! drops re-delivered ids, holds events that arrive ahead of their run's `seq` until the
//! gap fills, and refuses a `seq` that goes backwards. Events without `seq` are applied
//! in arrival order. What it lets through, in the order it lets it through, is exactly
//! what the log records, so a rebuild never needs the sequencer again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::event::Event;
use crate::fixed_hash::{fnv1a, FixedHasher};
use crate::parse::{EventError, RejectReason};

/// Events held per run while waiting for a missing `seq`, at most.
pub const DEFAULT_MAX_HELD: usize = 1024;

#[derive(Debug)]
pub enum Admission {
    /// These events are next in their run's order: apply them, in this order.
    Ready(Vec<Event>),
    /// Held until the run's missing `seq` arrives (or the gap is given up on).
    Held { waiting_for: u64 },
    /// This id was admitted before: apply nothing (answer with the original decision).
    Duplicate,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
struct RunOrder {
    /// The next `seq` this run expects.
    next_seq: u64,
    /// FNV-1a of every admitted id (ids are unique per run in practice; 64 bits make a
    /// false duplicate ~1e-8 likely after a million events in one run).
    ids: HashSet<u64, FixedHasher>,
    held: BTreeMap<u64, Event>,
}

impl RunOrder {
    /// A run nothing of which was admitted yet.
    fn starting() -> Self {
        RunOrder {
            next_seq: 1,
            ..RunOrder::default()
        }
    }
}

/// Each run's order behind an `Arc`, changed through `Arc::make_mut`: a clone (the log's
/// snapshot view, or admission's copy of the applied order) shares the runs until they
/// change. serde writes an `Arc<T>` as `T`, so the serialised form is unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sequencer {
    runs: HashMap<String, HashMap<String, Arc<RunOrder>, FixedHasher>, FixedHasher>,
    max_held: usize,
}

impl Default for Sequencer {
    fn default() -> Self {
        Sequencer::new(DEFAULT_MAX_HELD)
    }
}

fn id_hash(id: &str) -> u64 {
    fnv1a(id.as_bytes())
}

impl Sequencer {
    pub fn new(max_held: usize) -> Self {
        Sequencer {
            runs: HashMap::default(),
            max_held,
        }
    }

    fn order(&mut self, tenant: &str, run: &str) -> &mut RunOrder {
        if !self.runs.contains_key(tenant) {
            self.runs.insert(tenant.to_owned(), HashMap::default());
        }
        let runs = self.runs.get_mut(tenant).expect("inserted above");
        if !runs.contains_key(run) {
            runs.insert(run.to_owned(), Arc::new(RunOrder::starting()));
        }
        Arc::make_mut(runs.get_mut(run).expect("inserted above"))
    }

    pub fn admit(&mut self, event: Event) -> Result<Admission, EventError> {
        let max_held = self.max_held;
        let order = self.order(&event.tenant, &event.run);
        let id = id_hash(&event.id);
        if order.ids.contains(&id) {
            return Ok(Admission::Duplicate);
        }
        let Some(seq) = event.seq else {
            order.ids.insert(id);
            return Ok(Admission::Ready(vec![event]));
        };
        let refuse = |message: String| {
            let mut err = EventError::new(RejectReason::SeqRegression, message);
            err.event_id = Some(event.id.clone());
            Err(err)
        };
        if seq < order.next_seq {
            return refuse(format!(
                "seq {seq} goes backwards: run {} already applied up to seq {}",
                event.run,
                order.next_seq - 1
            ));
        }
        if seq > order.next_seq {
            if let Some(other) = order.held.get(&seq) {
                return refuse(format!(
                    "seq {seq} is already taken by event {:?}",
                    other.id
                ));
            }
            if order.held.len() >= max_held {
                return refuse(format!(
                    "run {} is waiting for seq {} with {} later events held already",
                    event.run,
                    order.next_seq,
                    order.held.len()
                ));
            }
            let waiting_for = order.next_seq;
            order.ids.insert(id);
            order.held.insert(seq, event);
            return Ok(Admission::Held { waiting_for });
        }
        order.ids.insert(id);
        order.next_seq = seq + 1;
        let mut ready = vec![event];
        while let Some(next) = order.held.remove(&order.next_seq) {
            order.next_seq += 1;
            ready.push(next);
        }
        Ok(Admission::Ready(ready))
    }

    /// Gives up waiting for a run's missing `seq`: its held events become ready, in
    /// `seq` order, and the missing ones count as skipped (arriving later, they are
    /// refused as going backwards).
    pub fn release_gap(&mut self, tenant: &str, run: &str) -> Vec<Event> {
        let Some(order) = self.runs.get_mut(tenant).and_then(|runs| runs.get_mut(run)) else {
            return Vec::new();
        };
        let order = Arc::make_mut(order);
        let held = std::mem::take(&mut order.held);
        if let Some(last) = held.keys().next_back() {
            order.next_seq = last + 1;
        }
        held.into_values().collect()
    }

    /// Runs that have events waiting for a gap to fill, with the `seq` they wait for,
    /// ordered by tenant and run.
    pub fn waiting(&self) -> impl Iterator<Item = (&str, &str, u64)> {
        let mut waiting: Vec<(&str, &str, u64)> = self
            .runs
            .iter()
            .flat_map(|(tenant, runs)| {
                runs.iter()
                    .filter(|(_, order)| !order.held.is_empty())
                    .map(move |(run, order)| (tenant.as_str(), run.as_str(), order.next_seq))
            })
            .collect();
        waiting.sort_unstable();
        waiting.into_iter()
    }

    /// Records an event that was applied before (a log being replayed at start-up), so
    /// re-deliveries of it are recognised and the run's order goes on from it.
    pub fn note_applied(&mut self, event: &Event) {
        // One lookup per level when the run is known (every event of a replay but its
        // run's first), which `order` cannot do: it returns the borrow.
        let runs = match self.runs.get_mut(event.tenant.as_str()) {
            Some(runs) => runs,
            None => self.runs.entry(event.tenant.clone()).or_default(),
        };
        let order = match runs.get_mut(event.run.as_str()) {
            Some(order) => order,
            None => runs
                .entry(event.run.clone())
                .or_insert_with(|| Arc::new(RunOrder::starting())),
        };
        let order = Arc::make_mut(order);
        order.ids.insert(id_hash(&event.id));
        if let Some(seq) = event.seq {
            order.next_seq = order.next_seq.max(seq + 1);
        }
    }

    /// Forgets a run (retention).
    pub fn forget_run(&mut self, tenant: &str, run: &str) {
        if let Some(runs) = self.runs.get_mut(tenant) {
            runs.remove(run);
            if runs.is_empty() {
                self.runs.remove(tenant);
            }
        }
    }
}
