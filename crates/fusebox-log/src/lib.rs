//! # fusebox-log
//!
//! The durable, append-only log of fusebox on sled, and the guard that keeps the
//! engine in step with it.
//!
//! ```text
//! events ──Guard::submit_batch──▶ Sequencer ──▶ Engine::apply ──▶ WriteBatch ──flush──▶ decisions
//!                                                                   │
//!            sled trees: events (frames of records + decisions) · ledger · snapshots · meta
//! ```
//!
//! * Every applied event and its decision get the next log position, in the order
//!   applied; operations on the state (a policy change, a retention prune, forgotten
//!   ledger keys) are records of their own at their position, so replay repeats them.
//!   Consecutive positions share a frame keyed by the first one (big-endian).
//! * Group commit: a batch's frames are written and flushed once, before any of its
//!   decisions is returned.
//! * A re-delivered event gets its original decision from an in-memory index (event id
//!   → position) that snapshots carry and replay rebuilds.
//! * Snapshots are encoded and written by a thread of their own, from a copy-on-write
//!   view of the state taken in the batch and handed over once the batch is durable.
//! * Start-up: the newest snapshot that verifies, plus the records after it; this
//!   equals a replay of the whole log (tested by property).
//! * [`inspect`] holds `fusebox log stats | verify | export`.

mod error;
mod guard;
pub mod inspect;
pub mod keys;
pub mod log;
mod maintain;
mod options;
pub mod record;
mod sled_log;
pub mod snapshot;
mod snapshotter;
mod state;
mod store;
mod stored;
mod submit;
mod wal;
pub mod workload;

pub use error::LogError;
pub use guard::Guard;
pub use maintain::expired_runs;
pub use options::GuardOptions;
pub use record::{AdoptedOp, LogOp, OpRef, Record, RunRef};
pub use sled_log::{SledLog, SledOptions};
pub use state::{LedgerTimes, LogState};
pub use store::{EventLog, SideWriter, Tree, WriteBatch};
pub use submit::Outcome;
pub use wal::FILE as COMMIT_FILE;
