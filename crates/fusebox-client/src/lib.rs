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
//! * [`FuseboxClient::start_run`] → [`RunHandle`]: one run, its envelope (ids, `seq`,
//!   `ts_ms`, `run_started`) owned by the handle, and its kill switch checked before the
//!   first call.
//! * [`FuseboxClient::watch_stop`], [`FuseboxClient::kept_stop`]: the run's kill switch,
//!   including a stop published before the watch began, with only what a tenant user of
//!   `deploy/nats/accounts.conf` may do.
//! * [`NatsSettings`] / [`NatsArgs`]: every connection setting fuseboxd's `[nats]` takes,
//!   for every client binary ([`FuseboxClient::connect_with`]).
//! * Operator commands ([`FuseboxClient::runs`], [`FuseboxClient::run_status`],
//!   [`FuseboxClient::cancel`], [`FuseboxClient::cancel_subtree`],
//!   [`FuseboxClient::resume`], [`FuseboxClient::tail`], [`FuseboxClient::ledger`],
//!   [`FuseboxClient::resolve`], and for the operator's page and `fusebox run`
//!   [`FuseboxClient::runs_page`], [`FuseboxClient::history`],
//!   [`FuseboxClient::run_tree`]) and the gate benchmark
//!   ([`bench`]).

pub mod bench;
mod client;
mod duration;
mod error;
mod ledger;
mod ops;
mod pages;
mod route;
mod run;
mod settings;
mod stop;

pub use client::{ClientOptions, FuseboxClient, Gate, GateOnError};
pub use duration::parse_duration;
pub use error::ClientError;
pub use ledger::{LedgerView, Resolve};
pub use ops::{parse_run_ref, Cancelled, DecisionTail, RunsListing};
pub use pages::{RunsPageView, TreeNode, TreeView};
pub use run::{Delivery, RunHandle, RunOptions};
#[cfg(feature = "clap")]
pub use settings::NatsArgs;
pub use settings::{NatsSettings, DEFAULT_URL};
pub use stop::StopWatch;

pub use fusebox_nats::wire::{
    LedgerItem, LedgerQuery, RunRow, RunStatusReply, RunSummary, RunTree, WatchdogReply, WireError,
};
