//! How the guard keeps its log: snapshot cadence, retention, sled tuning.

use std::time::Duration;

use fusebox_core::sequencer::DEFAULT_MAX_HELD;

use crate::sled_log::SledOptions;

#[derive(Debug, Clone)]
pub struct GuardOptions {
    /// Take a snapshot after this many records (0: never by count). Bounds start-up
    /// replay; each snapshot costs a serialisation of the whole state (on the snapshot
    /// writer's thread, but a core all the same), so not too often.
    pub snapshot_every_records: u64,
    /// Take a snapshot after this much event time (`ts_ms`) since the last one, if any
    /// record came in (zero: never by time). Event time, not wall time, so a replay
    /// of the same log snapshots at the same points.
    pub snapshot_every_event_time: Duration,
    /// Snapshots kept (at least one); older ones are removed. More than one lets
    /// start-up fall back when the newest is damaged.
    pub snapshots_kept: usize,
    /// Closed runs whose last event is older than this (event time) are forgotten at
    /// the next snapshot; `None` keeps every run. Their ledger entries stay (see
    /// `ledger_retention`).
    pub retention: Option<Duration>,
    /// Ledger keys last written longer ago than this (event time) are forgotten at the
    /// next snapshot, and their operations may then run again; `None` (the default)
    /// keeps every key for good, so a completed operation never runs twice.
    pub ledger_retention: Option<Duration>,
    /// Events held per run while waiting for a missing `seq`.
    pub max_held: usize,
    pub sled: SledOptions,
}

impl Default for GuardOptions {
    fn default() -> Self {
        GuardOptions {
            snapshot_every_records: 100_000,
            snapshot_every_event_time: Duration::from_secs(600),
            snapshots_kept: 2,
            retention: Some(Duration::from_secs(7 * 24 * 3600)),
            ledger_retention: None,
            max_held: DEFAULT_MAX_HELD,
            sled: SledOptions::default(),
        }
    }
}
