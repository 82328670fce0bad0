//! # fusebox-core
//!
//! The guard engine of fusebox as a sans-IO state machine: events in, decisions out.
//! No tokio, no I/O, no clock, no randomness — time is the events' `ts_ms`, maps are
//! ordered, and the same events in the same order always give the same decisions, byte
//! for byte. Adapters (the log, NATS, the CLI) own everything else.
//!
//! The flow of one event:
//!
//! ```text
//! bytes ──parse──▶ Event ──Sequencer (dedup, seq order)──▶ Engine::apply ──▶ Decision
//! ```
//!
//! Inside `Engine::apply`, a `tool_call` goes through the gate (`gate.rs`: latch, budget
//! fuse, error contract, loop detection in `detect.rs`, side-effect gate over
//! `ledger.rs`); every other event through `observe.rs`. A run that stops is latched by
//! `close.rs` with a report.

pub mod agents;
mod close;
pub mod decision;
mod detect;
pub mod engine;
mod engine_form;
pub mod event;
pub mod fingerprint;
pub mod fixed_hash;
mod gate;
pub mod ledger;
mod message;
mod observe;
pub mod parse;
pub mod policy;
pub mod run;
pub mod sequencer;
pub mod sharded;
mod tree;
pub mod volatile;

pub use decision::{
    Action, Decision, Detector, Reason, ResumeCondition, StopReport, TerminalState,
};
pub use engine::Engine;
pub use event::{Event, EventBody};
pub use ledger::LedgerEntry;
pub use parse::{check_event, parse_event, parse_event_bounded, EventError, RejectReason};
pub use policy::{Policy, PolicySet, Preset};
pub use run::RunState;
pub use sequencer::{Admission, Sequencer};
