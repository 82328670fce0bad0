//! A read-only view of the managed fleet with deadlines, for `fusebox-watchdog list`.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::deadline::Deadline;
use crate::engine::Watchdog;
use crate::plan;
use crate::provider::{InstanceState, Provider, Selector};

/// One managed instance as the watchdog sees it.
#[derive(Debug, Clone, Serialize)]
pub struct InventoryItem {
    pub region: String,
    pub instance_id: String,
    pub state: InstanceState,
    pub tenant: Option<String>,
    pub run: Option<String>,
    pub launch_ms: Option<u64>,
    pub deadline: Option<Deadline>,
    /// Milliseconds until the deadline; negative when overdue.
    pub time_left_ms: Option<i64>,
    pub protected: bool,
    pub tag_problems: Vec<String>,
}

/// Every managed instance in every region, and the regions that could not be listed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Inventory {
    pub items: Vec<InventoryItem>,
    pub region_errors: BTreeMap<String, String>,
}

impl<P: Provider> Watchdog<P> {
    /// Lists and assesses without terminating anything, soonest deadline first.
    pub async fn inventory(&self) -> Inventory {
        let mut inv = Inventory::default();
        for region in &self.inner.cfg.regions {
            match self.inner.describe_all(region, &Selector::AllManaged).await {
                Ok(instances) => {
                    let now = self.inner.clock.now_ms();
                    let state = self.inner.state();
                    for i in instances {
                        let a = plan::assess(i, &state, &self.inner.cfg);
                        if !a.tags.managed {
                            continue;
                        }
                        let time_left_ms = a.deadline.map(|d| signed(d.at_ms) - signed(now));
                        inv.items.push(InventoryItem {
                            region: a.instance.region,
                            instance_id: a.instance.instance_id,
                            state: a.instance.state,
                            tenant: a.tenant,
                            run: a.run,
                            launch_ms: a.launch_ms,
                            deadline: a.deadline,
                            time_left_ms,
                            protected: a.tags.protect,
                            tag_problems: a.tags.problems,
                        });
                    }
                }
                Err(e) => {
                    inv.region_errors.insert(region.clone(), e.to_string());
                }
            }
        }
        inv.items.sort_by_key(|i| {
            (
                i.state.is_done(),
                i.deadline.map(|d| d.at_ms),
                i.instance_id.clone(),
            )
        });
        inv
    }
}

fn signed(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}
