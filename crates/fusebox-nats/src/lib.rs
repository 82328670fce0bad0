//! # fusebox-nats
//!
//! The NATS adapter of the guard: everything between the wire and the durable log.
//!
//! ```text
//! fusebox.gate.<t>.<r>     ──request──┐
//! fusebox.events.<t>.<r>   ──JetStream┼──▶ applier thread ──▶ GuardStore::submit_batch
//! fusebox.control.<t>.<r>.*──request──┘   (one ordered,      (dedup, seq order, engine,
//!                                          group commit)      one flush per batch)
//!                                              │
//!                    replies, acks, fusebox.decisions.*, fusebox.stop.* (FUSEBOX_STOPS),
//!                    fusebox.dlq.<t>  ◀──dispatcher◀──┘
//! ```
//!
//! Decisions are computed only by `fusebox-core` behind the [`GuardStore`]; this crate
//! routes events in and results out, and never decides anything itself.

mod applier;
mod backlog;
mod control;
mod dispatch;
mod gap_probe;
mod gate;
mod inbound;
mod ingest;
mod observer;
mod query;
mod reject;
mod service;
pub mod setup;
mod stall;
mod store;
pub mod subjects;
mod ticks;
pub mod wire;

pub use inbound::{check_watched, WATCHDOG_DRIVERS};
pub use observer::{NoopObserver, Observer};
pub use service::{Service, ServiceError, ServiceOptions};
pub use setup::SetupError;
pub use store::{GuardStore, MemoryStore, StoreError, Submitted};
