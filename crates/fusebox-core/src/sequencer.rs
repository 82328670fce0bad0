//! Admission: at-most-once and in-order delivery of each run's events to the engine.
//!
//! Producers and NATS may deliver an event twice (a retried request, a redelivered
//! message) and out of order (the gate path and the stream path race). The sequencer
//! drops re-delivered ids, holds events that arrive ahead of their run's `seq` until the
//! gap fills, and refuses a `seq` that goes backwards. Events without `seq` are applied
//! in arrival order. What it lets through, in the order it lets it through, is exactly
//! what the log records, so a rebuild never needs the sequencer again.
//!
//! Each admitted id keeps where it was recorded, a number the caller gives (the log's
//! position, see [`Sequencer::note_applied`]): the log's copy of the sequencer is then
//! also its dedup index, which answers a re-delivery with the original decision. One
//! table for both cut a replay's reading thread by 9% of its instructions (callgrind).

use std::collections::{BTreeMap, HashMap};
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
    /// false duplicate ~1e-8 likely after a million events in one run) → where it was
    /// recorded, or [`NOT_RECORDED`].
    ids: HashMap<u64, u64, FixedHasher>,
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

/// Where an admitted id was recorded, when this copy of the sequencer was not told:
/// admission's copy never is; the log's copy always is, and log positions start at 1.
const NOT_RECORDED: u64 = 0;

/// The hash an id is kept under, here and in snapshots: it must never change.
pub fn id_hash(id: &str) -> u64 {
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
        if order.ids.contains_key(&id) {
            return Ok(Admission::Duplicate);
        }
        let Some(seq) = event.seq else {
            order.ids.insert(id, NOT_RECORDED);
            return Ok(Admission::Ready(vec![event]));
        };
        let refuse_as = |reason, message: String| {
            let mut err = EventError::new(reason, message);
            err.event_id = Some(event.id.clone());
            Err(err)
        };
        let refuse = |message| refuse_as(RejectReason::SeqRegression, message);
        if seq < order.next_seq && matches!(event.body, crate::event::EventBody::RunStarted(_)) {
            // A new id (a re-sent one is a duplicate above) starting the run over: a
            // second process with the same run id. Its later ids would be the old
            // process's, answered with the old decisions, so the run is refused whole.
            return refuse_as(
                RejectReason::RunExists,
                format!(
                    "run {}/{} already exists (applied up to seq {}): a run id names one \
                     execution of an agent, and a restarted worker must start a new run id \
                     (the tenant's op_key ledger still keeps completed operations from \
                     running twice)",
                    event.tenant,
                    event.run,
                    order.next_seq - 1
                ),
            );
        }
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
            order.ids.insert(id, NOT_RECORDED);
            order.held.insert(seq, event);
            return Ok(Admission::Held { waiting_for });
        }
        order.ids.insert(id, NOT_RECORDED);
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

    /// Records an event that was recorded at `position` (≥ 1) — applied just now, or
    /// before and being replayed — so re-deliveries of it are recognised and found, and
    /// the run's order goes on from it.
    pub fn note_applied(&mut self, event: &Event, position: u64) {
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
        order.ids.insert(id_hash(&event.id), position);
        if let Some(seq) = event.seq {
            order.next_seq = order.next_seq.max(seq + 1);
        }
    }

    /// Where the event with this id was recorded, as given to `note_applied`.
    pub fn recorded_at(&self, tenant: &str, run: &str, id: &str) -> Option<u64> {
        let order = self.runs.get(tenant)?.get(run)?;
        let at = *order.ids.get(&id_hash(id))?;
        (at != NOT_RECORDED).then_some(at)
    }

    /// Every recorded id: tenant, run, id hash, where it was recorded.
    pub fn recorded(&self) -> impl Iterator<Item = (&str, &str, u64, u64)> {
        self.runs.iter().flat_map(|(tenant, runs)| {
            runs.iter().flat_map(move |(run, order)| {
                order
                    .ids
                    .iter()
                    .filter(|(_, &at)| at != NOT_RECORDED)
                    .map(move |(&hash, &at)| (tenant.as_str(), run.as_str(), hash, at))
            })
        })
    }

    /// The same runs, order and ids as `other`, whatever bound on held events each has
    /// (configuration, not state).
    pub fn same_state(&self, other: &Sequencer) -> bool {
        self.runs == other.runs
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_event;

    /// A progress report of run t/r.
    fn event(id: &str, seq: u64) -> Event {
        let fields = serde_json::json!({
            "v": 1, "id": id, "tenant": "t", "run": "r", "seq": seq, "ts_ms": 1,
            "type": "progress", "version": seq,
        });
        parse_event(fields.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn an_id_has_a_position_only_once_it_is_noted_as_recorded() {
        let mut admission = Sequencer::default();
        assert!(matches!(
            admission.admit(event("e1", 1)),
            Ok(Admission::Ready(_))
        ));
        assert!(matches!(
            admission.admit(event("e1", 1)),
            Ok(Admission::Duplicate)
        ));
        assert_eq!(admission.recorded_at("t", "r", "e1"), None);
        assert_eq!(admission.recorded().count(), 0);

        let mut applied = Sequencer::default();
        applied.note_applied(&event("e1", 1), 7);
        applied.note_applied(&event("e2", 2), 8);
        assert_eq!(applied.recorded_at("t", "r", "e2"), Some(8));
        assert_eq!(applied.recorded_at("t", "r", "e3"), None);
        assert_eq!(applied.recorded_at("t", "other", "e2"), None);
        let mut recorded: Vec<_> = applied.recorded().map(|(_, _, _, at)| at).collect();
        recorded.sort_unstable();
        assert_eq!(recorded, [7, 8]);
        // Its order goes on after what was recorded.
        assert!(matches!(
            applied.admit(event("e2", 2)),
            Ok(Admission::Duplicate)
        ));
        assert!(applied.admit(event("e9", 1)).is_err());
        assert!(!applied.same_state(&admission));

        applied.forget_run("t", "r");
        assert_eq!(applied.recorded_at("t", "r", "e1"), None);
        assert!(applied.same_state(&Sequencer::new(1)));
    }
}
