//! # fusebox-watchdog — the cloud cost watchdog
//!
//! A job that launched a cloud instance and never reached "live" never fires its
//! state-based shutdown, and the instance bills forever. The watchdog pairs every managed
//! instance with an **absolute deadline** that depends on no state transition, and checks
//! the cloud's own instance list, not the job's belief.
//!
//! ## Ownership
//!
//! Only instances tagged `fusebox:managed=true` are ever touched (see [`tags`]). Their
//! deadline is the earliest of the `fusebox:deadline` tag, launch time + max lifetime (the
//! `fusebox:max-lifetime` tag, else the launch event's `max_lifetime_s`, else
//! `default_max_lifetime_s`), and run end + `grace_s` ([`deadline::compute`]). The
//! instance's state does not matter: pending, running, stopping and stopped all bill.
//! `fusebox:protect=true` instances are reported, never terminated; so are instances with
//! EC2 termination protection, which is never switched off. Launchers put the tags in
//! RunInstances' `TagSpecifications`: see `LAUNCHING.md` next to this crate's manifest.
//!
//! ## When it acts
//!
//! * a cron sweep (default every minute) over every configured region;
//! * a one-shot timer at each known deadline, so an instance outlives its deadline by
//!   about a second, not a sweep interval;
//! * a verify-empty check `grace_s` after each run ends: any instance of the run still
//!   listed is terminated as a `leftover`.
//!
//! Each pass is bounded by a blast-radius limit (`max_terminations_per_sweep`,
//! `max_termination_share`): past it nothing more is terminated, the alert is raised and
//! the reason is given, so a clock jump or a bad tag cannot wipe a fleet. What the pass
//! does with the overdue instances past the limit is the operator's choice
//! (`on_blast_radius`): terminate up to the limit and hold the rest (`cap_per_pass`, the
//! default), or terminate none of them and page (`halt`). A halt latches: the watchdog
//! terminates nothing more until an operator resumes it (`fusebox watchdog resume`,
//! recorded as a [`Fact::Resumed`]), even when the overdue count fits the limit again —
//! what tripped it (a clock jump, bad tags) is for a person to rule out.
//!
//! ## Wiring it into the daemon
//!
//! ```no_run
//! use std::sync::Arc;
//! use fusebox_watchdog::{Ec2Provider, MemorySink, SystemClock, Watchdog, WatchdogConfig};
//! use fusebox_watchdog::facts::{Fact, InstanceLaunched, RunEnded};
//!
//! # async fn daemon(facts_from_log: Vec<Fact>) -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = WatchdogConfig::from_fusebox_toml(&std::fs::read_to_string("config/fusebox.toml")?)?;
//! let provider = Ec2Provider::from_env(&cfg).await;
//! // The daemon's sink logs, publishes on `Termination::subject()` and counts; this one collects.
//! let sink = Arc::new(MemorySink::default());
//! let wd = Watchdog::new(cfg, provider, Arc::new(SystemClock), sink)?;
//! for check in wd.check_permissions().await {
//!     println!("{}", check.describe());
//! }
//! wd.restore(facts_from_log);                 // rebuild timers from the log
//! let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
//! let task = tokio::spawn({
//!     let wd = wd.clone();
//!     async move { wd.run(async move { let _ = stop_rx.wait_for(|s| *s).await; }).await }
//! });
//! // Live facts as they are applied:
//! wd.record(InstanceLaunched {
//!     tenant: "acme".into(), run: "r1".into(), provider: "ec2".into(),
//!     region: "us-east-1".into(), instance_id: "i-0123456789abcdef0".into(),
//!     max_lifetime_s: Some(3600), ts_ms: 1_700_000_000_000,
//! });
//! wd.record(RunEnded { tenant: "acme".into(), run: "r1".into(), ts_ms: 1_700_000_100_000 });
//! let metrics = wd.stats();                   // gauges and counters for /metrics
//! # let _ = metrics;
//! stop_tx.send(true)?;                        // graceful shutdown
//! task.await?;
//! # Ok(()) }
//! ```
//!
//! The `fusebox-watchdog` binary (`list`, `sweep [--dry-run]`, `check`) is the operator's
//! view of the same engine; `fusebox watchdog …` forwards to it.

mod calls;
pub mod clock;
pub mod config;
pub mod deadline;
pub mod ec2;
mod engine;
#[cfg(test)]
mod engine_tests;
pub mod facts;
mod inventory;
mod pass;
mod permissions;
mod plan;
pub mod provider;
pub mod sink;
mod state;
mod stats;
pub mod tags;
mod terminate;

pub use clock::{Clock, ManualClock, SteadyClock, SystemClock};
pub use config::{BlastRadiusAction, ConfigError, RetryConfig, WatchdogConfig};
pub use deadline::{Deadline, Reason};
pub use ec2::Ec2Provider;
pub use engine::Watchdog;
pub use facts::{Fact, Halted, InstanceLaunched, Resumed, RunEnded};
pub use inventory::{Inventory, InventoryItem};
pub use pass::{PassKind, PassReport};
pub use permissions::{PermissionCheck, PermissionStatus};
pub use provider::{Instance, InstanceState, Op, Provider, ProviderError, Selector};
pub use sink::{
    BlastRadiusAlert, MemorySink, Outcome, ProtectedInstance, Termination, WatchdogSink,
};
pub use stats::WatchdogStats;
