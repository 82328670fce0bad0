//! # fusebox-client
//!
//! What a Rust agent needs to sit behind the fusebox guard, and what an operator needs
//! to drive it:
//!
//! * [`FuseboxClient::gate`]: ask before a tool runs. A daemon that does not answer in
//!   time means the tool does **not** run, unless the client is configured
//!   [`GateOnError::Allow`].
//! * [`FuseboxClient::report`]: everything else (results, progress, model turns) goes to
//!   JetStream, deduplicated by event id.
//! * [`FuseboxClient::watch_stop`]: the run's kill switch, including a stop published
//!   before the watch began.
//! * Operator commands ([`FuseboxClient::runs`], [`FuseboxClient::run_status`],
//!   [`FuseboxClient::cancel`], [`FuseboxClient::resume`], [`FuseboxClient::tail`]) and
//!   the gate benchmark ([`bench`]).

pub mod bench;
mod client;
mod error;
mod ops;
mod run;
mod settings;
mod stop;

pub use client::{ClientOptions, FuseboxClient, Gate, GateOnError};
pub use error::ClientError;
pub use ops::{parse_run_ref, DecisionTail, RunsListing};
pub use run::{Delivery, RunHandle, RunOptions};
#[cfg(feature = "clap")]
pub use settings::NatsArgs;
pub use settings::{NatsSettings, DEFAULT_URL};
pub use stop::StopWatch;

pub use fusebox_nats::wire::{RunStatusReply, RunSummary, WireError};
