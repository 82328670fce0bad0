//! # fusebox-log
//!
//! The durable, append-only log of fusebox on sled, and the guard that keeps the
//! engine in step with it.
//!
//! ```text
//! events ──Guard::submit_batch──▶ Sequencer ──▶ Engine::apply ──▶ WriteBatch ──flush──▶ decisions
//!                                                                   │
//!            sled trees: events (records) · decisions · ids · ledger · snapshots · meta
//! ```
//!
//! * Every applied event and its decision get the next log position (big-endian key),
//!   in the order applied; operations on the state (a policy change, a retention prune)
//!   are records of their own at their position, so replay repeats them.
//! * Group commit: a batch's records are written and flushed once, before any of its
//!   decisions is returned.
//! * Start-up: the newest snapshot that verifies, plus the records after it; this
//!   equals a replay of the whole log (tested by property).
//! * [`inspect`] holds `fusebox log stats | verify | export`.

mod error;
mod guard;
pub mod inspect;
mod keys;
pub mod log;
mod maintain;
mod options;
pub mod record;
mod sled_log;
mod snapshot;
mod state;
mod store;
mod submit;
pub mod workload;

pub use error::LogError;
pub use guard::Guard;
pub use maintain::expired_runs;
pub use options::GuardOptions;
pub use record::{LogOp, Record, RunRef};
pub use sled_log::{SledLog, SledOptions};
pub use state::LogState;
pub use store::{EventLog, Tree, WriteBatch};
pub use submit::Outcome;
