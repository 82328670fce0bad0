//! Outcomes leave the watchdog through a sink: the daemon logs each as an event, publishes it
//! on `fusebox.watchdog.<tenant>.terminated` and counts it in metrics.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Serialize;

use crate::deadline::Reason;
use crate::facts::Halted;

/// What became of one instance the watchdog acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// TerminateInstances accepted it (now shutting-down or terminated).
    Terminated,
    /// The cloud says it does not exist any more.
    AlreadyGone,
    /// `dry_run = true`: it would have been terminated.
    WouldTerminate,
    /// EC2 termination protection (`OperationNotPermitted`); left alone, never unprotected.
    TerminationProtected,
    /// The call failed after retries; the instance is retried on the next pass.
    Failed,
}

/// One termination (or "would terminate", or failed attempt) with why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Termination {
    /// From the `fusebox:tenant` tag (or the launch event); `None` when neither says.
    pub tenant: Option<String>,
    pub run: Option<String>,
    pub provider: String,
    pub region: String,
    pub instance_id: String,
    pub reason: Reason,
    /// The deadline that passed, Unix ms.
    pub deadline_ms: u64,
    /// When the outcome was known, Unix ms (watchdog clock).
    pub at_ms: u64,
    pub dry_run: bool,
    pub outcome: Outcome,
    /// The API error for `Failed`.
    pub error: Option<String>,
}

impl Termination {
    /// The NATS subject this record belongs on; `_unknown` stands in for a missing tenant.
    pub fn subject(&self) -> String {
        format!(
            "fusebox.watchdog.{}.terminated",
            self.tenant.as_deref().unwrap_or("_unknown")
        )
    }
}

/// An overdue instance that `fusebox:protect=true` kept alive. Reported once per process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProtectedInstance {
    pub tenant: Option<String>,
    pub run: Option<String>,
    pub region: String,
    pub instance_id: String,
    pub deadline_ms: u64,
    pub reason: Reason,
}

/// A pass hit the blast-radius limit and left overdue instances running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlastRadiusAlert {
    pub at_ms: u64,
    /// Overdue instances found in the pass.
    pub overdue: usize,
    /// Terminations the limit allows in one pass (with `on_blast_radius = "halt"` none
    /// were attempted).
    pub allowed: usize,
    /// Overdue instances left running by this pass, by reason.
    pub held: BTreeMap<Reason, usize>,
    /// Managed, live instances the share was computed from.
    pub managed: usize,
    /// Human-readable explanation, e.g. which limit bit.
    pub why: String,
}

/// Receives every outcome. Called from the watchdog's task: implementations should hand
/// the record off (channel, log append) rather than block for long.
pub trait WatchdogSink: Send + Sync + 'static {
    fn termination(&self, t: &Termination);
    fn protected(&self, p: &ProtectedInstance);
    fn blast_radius(&self, a: &BlastRadiusAlert);
    /// The watchdog halted (`on_blast_radius = "halt"`): the sink must make it durable
    /// as a [`Fact::Halted`](crate::facts::Fact), so the halt survives a restart.
    fn halted(&self, h: &Halted);
}

/// A sink that keeps everything in memory: for the CLI and tests.
#[derive(Debug, Default)]
pub struct MemorySink {
    inner: Mutex<Recorded>,
}

/// Everything a `MemorySink` received, in order.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Recorded {
    pub terminations: Vec<Termination>,
    pub protected: Vec<ProtectedInstance>,
    pub alerts: Vec<BlastRadiusAlert>,
    pub halts: Vec<Halted>,
}

impl MemorySink {
    pub fn snapshot(&self) -> Recorded {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        // A panic elsewhere while holding the lock leaves plain data behind; keep going.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl WatchdogSink for MemorySink {
    fn termination(&self, t: &Termination) {
        self.lock().terminations.push(t.clone());
    }
    fn protected(&self, p: &ProtectedInstance) {
        self.lock().protected.push(p.clone());
    }
    fn blast_radius(&self, a: &BlastRadiusAlert) {
        self.lock().alerts.push(a.clone());
    }
    fn halted(&self, h: &Halted) {
        self.lock().halts.push(h.clone());
    }
}
