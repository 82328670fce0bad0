use std::collections::HashSet;

use serde::Serialize;

use crate::error::LogError;
use crate::keys;
use crate::log::{decode_frame, records, snapshots_found};
use crate::record::{LogOp, Record};
use crate::store::{EventLog, Tree};

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LogStats {
    /// Records in the log: events plus operations.
    pub records: u64,
    pub events: u64,
    /// Policy changes, retention prunes and forgotten ledger keys.
    pub operations: u64,
    pub decisions: u64,
    /// Frames the records are stored in (sled values of the events tree).
    pub frames: u64,
    /// Runs with events in the log (pruned runs no longer count).
    pub runs: u64,
    pub ledger_keys: u64,
    /// Complete snapshots, the ones start-up and verify read.
    pub snapshots: u64,
    pub latest_snapshot_position: Option<u64>,
    pub latest_snapshot_bytes: u64,
    /// Snapshots without their piece 0 (a write or a removal cut short by a crash): no
    /// reader sees them, and the next open of the log for writing removes their pieces.
    pub torn_snapshots: u64,
    /// Keys and values of every tree: what the log would take with no overhead.
    pub logical_bytes: u64,
    /// What sled occupies on disk.
    pub disk_bytes: u64,
}

impl LogStats {
    /// On-disk bytes per logical byte.
    pub fn space_amplification(&self) -> f64 {
        self.disk_bytes as f64 / self.logical_bytes.max(1) as f64
    }

    /// On-disk bytes per event.
    pub fn disk_bytes_per_event(&self) -> f64 {
        self.disk_bytes as f64 / self.events.max(1) as f64
    }
}

pub fn stats<L: EventLog>(log: &L) -> Result<LogStats, LogError> {
    let mut stats = LogStats::default();
    let (complete, torn) = snapshots_found(log)?;
    stats.snapshots = complete.len() as u64;
    stats.torn_snapshots = torn.len() as u64;
    stats.latest_snapshot_position = complete.last().copied();
    for tree in Tree::ALL {
        for item in log.scan(tree, &[]) {
            let (key, value) = item?;
            let (key, value) = (key.as_ref(), value.as_ref());
            stats.logical_bytes += (key.len() + value.len()) as u64;
            match tree {
                Tree::Events => {
                    stats.frames += 1;
                    let first = keys::decode_position(key).unwrap_or_default();
                    for entry in decode_frame(log, first, value)?.entries() {
                        if entry.is_op {
                            stats.operations += 1;
                        } else {
                            stats.events += 1;
                            stats.decisions += u64::from(!entry.decision.is_empty());
                        }
                    }
                }
                Tree::Ledger => stats.ledger_keys += u64::from(key != keys::LEDGER_POSITION_KEY),
                Tree::Snapshots => {
                    let pos = keys::decode_snapshot_position(key);
                    if pos.is_some() && pos == stats.latest_snapshot_position {
                        stats.latest_snapshot_bytes += value.len() as u64;
                    }
                }
                Tree::Meta => {}
            }
        }
    }
    stats.records = stats.events + stats.operations;
    stats.runs = runs(log)?;
    stats.disk_bytes = log.size_on_disk()?;
    Ok(stats)
}

/// Runs with events in the log: every event's run, less the runs pruned after it.
fn runs<L: EventLog>(log: &L) -> Result<u64, LogError> {
    let mut runs: HashSet<(String, String)> = HashSet::new();
    for item in records(log, 1) {
        match item?.1 {
            Record::Event(event) => {
                runs.insert((event.tenant, event.run));
            }
            Record::Op(LogOp::Prune { runs: pruned }) => {
                for run in pruned {
                    runs.remove(&(run.tenant, run.run));
                }
            }
            Record::Op(_) => {}
        }
    }
    Ok(runs.len() as u64)
}
