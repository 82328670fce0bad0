//! Housekeeping at the start of a batch, written in the same commit as the batch:
//! retention (a logged `prune`, so replay forgets the same runs at the same point),
//! ledger retention (a logged `forget_operations`, likewise), and a view of the state
//! right after them, which the snapshot writer (`snapshotter.rs`) turns into a snapshot
//! and the ledger tree's catching up once the batch is durable.

use fusebox_core::Engine;

use crate::error::LogError;
use crate::guard::Guard;
use crate::record::{LogOp, OpRef, RunRef};
use crate::snapshotter::SnapshotJob;
use crate::store::EventLog;
use crate::submit::Pending;

impl<L: EventLog> Guard<L> {
    pub(crate) fn maintain(&mut self, pending: &mut Pending) -> Result<(), LogError> {
        if !self.snapshot_due() {
            return Ok(());
        }
        if let Some(retention) = self.options.retention {
            let runs = expired_runs(
                &self.state.engine,
                self.state.event_time_ms,
                retention.as_millis() as u64,
            );
            if !runs.is_empty() {
                tracing::info!(runs = runs.len(), "pruning closed runs past retention");
                self.stage_op(pending, LogOp::Prune { runs })?;
            }
        }
        if let Some(retention) = self.options.ledger_retention {
            let cutoff = self
                .state
                .event_time_ms
                .checked_sub(retention.as_millis() as u64);
            let operations: Vec<OpRef> = cutoff
                .into_iter()
                .flat_map(|cutoff| self.state.ledger_times.older_than(cutoff))
                .map(|(tenant, op_key)| OpRef {
                    tenant: tenant.to_owned(),
                    op_key: op_key.to_owned(),
                })
                .collect();
            if !operations.is_empty() {
                tracing::info!(
                    keys = operations.len(),
                    "forgetting ledger keys past ledger retention"
                );
                self.stage_op(pending, LogOp::ForgetOperations { operations })?;
            }
        }
        self.snapshot_into(pending);
        Ok(())
    }

    fn snapshot_due(&self) -> bool {
        let (pos, time) = self.last_snapshot;
        let records = self.state.position - pos;
        let every = self.options.snapshot_every_records;
        let every_ms = self.options.snapshot_every_event_time.as_millis() as u64;
        (every > 0 && records >= every)
            || (every_ms > 0 && records > 0 && self.state.event_time_ms - time >= every_ms)
    }

    /// Keeps a view of the current state and the ledger keys changed since the last
    /// one for the snapshot writer, which gets them when the batch has committed
    /// (`Guard::commit`).
    pub(crate) fn snapshot_into(&mut self, pending: &mut Pending) {
        pending.snapshot = Some(SnapshotJob {
            view: self.state.clone(),
            ledger_changed: std::mem::take(&mut self.ledger_changed),
        });
        self.last_snapshot = (self.state.position, self.state.event_time_ms);
    }
}

/// Closed runs whose last event is at least `retention_ms` older than `now_ms`.
pub fn expired_runs(engine: &Engine, now_ms: u64, retention_ms: u64) -> Vec<RunRef> {
    engine
        .runs()
        .filter(|(_, _, run)| {
            !run.is_open() && now_ms.saturating_sub(run.last_ts_ms) >= retention_ms
        })
        .map(|(tenant, run, _)| RunRef {
            tenant: tenant.to_owned(),
            run: run.to_owned(),
        })
        .collect()
}
