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

/// Either fact, for feeding a whole log back at start-up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Fact {
    InstanceLaunched(InstanceLaunched),
    RunEnded(RunEnded),
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
