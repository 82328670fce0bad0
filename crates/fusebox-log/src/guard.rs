//! The durable guard: the engine, the sequencer and the log, kept in step.
//!
//! Opening rebuilds the state from the latest valid snapshot plus the log's tail;
//! `submit_batch` (in `submit.rs`) decides a batch and makes it durable with one flush
//! before any decision is returned. The type is plain blocking code with `&mut self`:
//! the daemon owns it on a dedicated thread (or behind a mutex in `spawn_blocking`).
//! Snapshots are encoded and written by a thread the guard owns (`snapshotter.rs`);
//! dropping the guard waits for the snapshots handed to it.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use fusebox_core::fixed_hash::FixedHasher;
use fusebox_core::{Decision, Engine, PolicySet, Sequencer};
use tracing::info;

use crate::error::LogError;
use crate::keys;
use crate::log::{self, check_format, rebuild, repair_tail};
use crate::options::GuardOptions;
use crate::record::{self, LogOp};
use crate::sled_log::SledLog;
use crate::snapshotter::Snapshotter;
use crate::state::LogState;
use crate::store::{EventLog, Tree, WriteBatch};
use crate::submit::Pending;

pub struct Guard<L: EventLog = SledLog> {
    /// Writes snapshots on a thread of its own. First, so that a dropped guard finishes
    /// the snapshots handed over before anything else of it goes.
    pub(crate) snapshots: Snapshotter,
    pub(crate) log: L,
    pub(crate) state: LogState,
    /// Admission of new events: the applied events' sequencer plus what is held.
    pub(crate) admission: Sequencer,
    pub(crate) options: GuardOptions,
    /// Position and event time of the last snapshot (or of the start of the log).
    pub(crate) last_snapshot: (u64, u64),
    /// Ledger keys (tenant, op_key) changed since the last snapshot. The ledger tree is
    /// written by the snapshot writer and on open only, not per batch: it is a view the
    /// log can rebuild, and its writes were a large part of a batch's cost.
    pub(crate) ledger_changed: HashSet<(String, String), FixedHasher>,
    pub(crate) poisoned: bool,
}

impl Guard<SledLog> {
    /// Opens the sled log at `path` (created if absent) and rebuilds the guard state.
    pub fn open(path: &Path, policies: PolicySet, options: GuardOptions) -> Result<Self, LogError> {
        let log = SledLog::open(path, &options.sled)?;
        Guard::with_log(log, policies, options)
    }
}

impl<L: EventLog> Guard<L> {
    /// Rebuilds the guard state from `log`. When `policies` differ from those the log
    /// was running with, the change is logged (new runs get them; started runs keep
    /// theirs), so replaying the log reproduces every decision.
    pub fn with_log(
        mut log: L,
        policies: PolicySet,
        options: GuardOptions,
    ) -> Result<Self, LogError> {
        let started = std::time::Instant::now();
        check_format(&mut log)?;
        repair_tail(&mut log)?;
        let state = rebuild(&log, options.max_held)?;
        let positions = log::snapshot_positions(&log)?;
        let last_snapshot = positions
            .first()
            .map_or((0, state.event_time_ms), |&pos| (pos, state.event_time_ms));
        let snapshots = Snapshotter::spawn(
            log.path(),
            log.side_writer(),
            positions,
            options.snapshots_kept,
        )?;
        let mut guard = Guard {
            snapshots,
            admission: state.applied.clone(),
            log,
            state,
            options,
            last_snapshot,
            ledger_changed: HashSet::default(),
            poisoned: false,
        };
        guard.reconcile_ledger()?;
        if guard.state.position == 0 || guard.state.engine.policies() != &policies {
            guard.append_op(LogOp::SetPolicies { policies })?;
        }
        info!(
            path = %guard.log.path().display(),
            position = guard.state.position,
            runs = guard.state.engine.run_count(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "fusebox log open"
        );
        Ok(guard)
    }

    pub fn engine(&self) -> &Engine {
        &self.state.engine
    }

    /// The state the log holds (engine, applied sequencer, position, event time).
    pub fn state(&self) -> &LogState {
        &self.state
    }

    /// Position of the last durable record.
    pub fn position(&self) -> u64 {
        self.state.position
    }

    pub fn log(&self) -> &L {
        &self.log
    }

    /// Runs with events held for a missing `seq`, with the `seq` they wait for: the
    /// daemon gives up on a gap with [`Guard::release_gap`] after its timeout.
    pub fn waiting(&self) -> impl Iterator<Item = (&str, &str, u64)> {
        self.admission.waiting()
    }

    /// The decision recorded for an applied event, for answering a re-delivery.
    pub fn lookup_decision(
        &self,
        tenant: &str,
        run: &str,
        id: &str,
    ) -> Result<Option<Decision>, LogError> {
        match self.state.applied.recorded_at(tenant, run, id) {
            Some(pos) => self.stored_decision(pos, tenant, run, id),
            None => Ok(None),
        }
    }

    /// The decision stored at `pos`, if it is that event's (the index keys ids by a
    /// 64-bit hash: a collision must not answer with another event's decision).
    pub(crate) fn stored_decision(
        &self,
        pos: u64,
        tenant: &str,
        run: &str,
        id: &str,
    ) -> Result<Option<Decision>, LogError> {
        Ok(log::decision_at(&self.log, pos)?
            .filter(|d| d.event_id == id && d.tenant == tenant && d.run == run))
    }

    /// Takes a snapshot now and waits until it (and any snapshot still being written)
    /// is durable: call on graceful shutdown so the next start replays nothing.
    pub fn checkpoint(&mut self) -> Result<(), LogError> {
        self.guarded(|guard| {
            let mut pending = Pending::default();
            guard.snapshot_into(&mut pending);
            guard.commit(pending)?;
            guard.snapshots.wait()
        })
    }

    /// Runs `f`; any failure poisons the guard, since memory may be ahead of the disk.
    pub(crate) fn guarded<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, LogError>,
    ) -> Result<T, LogError> {
        if self.poisoned {
            return Err(LogError::Poisoned {
                path: self.log.path().to_owned(),
            });
        }
        let result = f(self);
        if result.is_err() {
            self.poisoned = true;
        }
        result
    }

    fn append_op(&mut self, op: LogOp) -> Result<(), LogError> {
        self.guarded(|guard| {
            let mut pending = Pending::default();
            guard.stage_op(&mut pending, op)?;
            guard.commit(pending)
        })
    }

    /// Makes the ledger tree equal to the engine's ledger at the current position: the
    /// tree lags behind the log since the last snapshot, or may hold the writes of a
    /// batch that never committed.
    fn reconcile_ledger(&mut self) -> Result<(), LogError> {
        let mut wanted = BTreeMap::new();
        for (tenant, op_key, entry) in self.state.engine.ledger().iter() {
            wanted.insert(
                keys::ledger(tenant, op_key),
                record::encode(entry, "a ledger entry")?,
            );
        }
        wanted.insert(
            keys::LEDGER_POSITION_KEY.to_vec(),
            keys::position(self.state.position).to_vec(),
        );
        let mut batch = WriteBatch::default();
        for item in self.log.scan(Tree::Ledger, &[]) {
            let (key, value) = item?;
            match wanted.remove(key.as_ref()) {
                Some(entry) if entry == value.as_ref() => {}
                Some(entry) => batch.insert(Tree::Ledger, key.as_ref(), entry),
                None => batch.remove(Tree::Ledger, key.as_ref()),
            }
        }
        for (key, entry) in wanted {
            batch.insert(Tree::Ledger, key, entry);
        }
        if !batch.is_empty() {
            self.log.write(batch)?;
            self.log.flush()?;
        }
        Ok(())
    }
}
