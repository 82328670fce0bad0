//! What the daemon tells the watchdog: launches and run ends, straight from its event log.

use serde::{Deserialize, Serialize};

/// A run reported launching a cloud instance (`instance_launched` event).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceLaunched {
    pub tenant: String,
    pub run: String,
    /// Provider name; the watchdog ignores facts for providers it does not drive.
    pub provider: String,
    pub region: String,
    pub instance_id: String,
    pub max_lifetime_s: Option<u64>,
    /// When the event was recorded, Unix ms.
    pub ts_ms: u64,
}

/// A run finished, stopped or was cancelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEnded {
    pub tenant: String,
    pub run: String,
    pub ts_ms: u64,
}

/// A pass found more overdue instances than the blast-radius limit allows under
/// `on_blast_radius = "halt"`: the watchdog terminates nothing until an operator resumes
/// it (a latch, so a fleet that shrinks back under the limit is not taken as the all-clear).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Halted {
    /// When the watchdog halted, Unix ms (watchdog clock).
    pub at_ms: u64,
    /// What the pass saw, in words (the blast-radius alert's `why`).
    pub why: String,
}

/// An operator resumed a halted watchdog (`fusebox watchdog resume`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resumed {
    pub at_ms: u64,
    /// Who resumed it, as the operator said.
    pub by: String,
}

/// Any fact, for feeding a whole journal back at start-up: the daemon's launches and run
/// ends, and the watchdog's own halt and an operator's resume (so both survive a restart).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Fact {
    InstanceLaunched(InstanceLaunched),
    RunEnded(RunEnded),
    Halted(Halted),
    Resumed(Resumed),
}

impl From<InstanceLaunched> for Fact {
    fn from(f: InstanceLaunched) -> Self {
        Fact::InstanceLaunched(f)
    }
}

impl From<RunEnded> for Fact {
    fn from(f: RunEnded) -> Self {
        Fact::RunEnded(f)
    }
}

impl From<Halted> for Fact {
    fn from(f: Halted) -> Self {
        Fact::Halted(f)
    }
}

impl From<Resumed> for Fact {
    fn from(f: Resumed) -> Self {
        Fact::Resumed(f)
    }
}
