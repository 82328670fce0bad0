//! What the watchdog holds, for `fusebox.control.watchdog` ([`super::control`]) and the
//! operator's page. The instances are the cloud's
//! own list assessed as `fusebox watchdog list` does (one DescribeInstances per region
//! per question, so the answer is the truth, not the launch events' belief); the
//! terminations are the latest this daemon journaled, kept in memory and seeded from the
//! journal at start.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use fusebox_nats::wire::{WatchdogInstance, WatchdogReply, WatchdogTermination};
use fusebox_watchdog::{Inventory, Termination};

/// Terminations an answer carries, newest first.
pub const KEEP_RECENT: usize = 100;

/// The latest terminations, newest first; cheap to clone, clones share.
#[derive(Clone, Default)]
pub struct Recent(Arc<Mutex<VecDeque<WatchdogTermination>>>);

impl Recent {
    /// Seeded with the journal's records (oldest first); unreadable ones are skipped.
    pub fn from_journal(records: Vec<serde_json::Value>) -> Recent {
        let recent = Recent::default();
        for record in records {
            match serde_json::from_value(record) {
                Ok(t) => recent.push(t),
                Err(err) => {
                    tracing::debug!(%err, "an old termination record left out of the recent list")
                }
            }
        }
        recent
    }

    pub fn push(&self, t: WatchdogTermination) {
        let mut list = self.0.lock().unwrap_or_else(|p| p.into_inner());
        list.push_front(t);
        list.truncate(KEEP_RECENT);
    }

    pub fn record(&self, t: &Termination) {
        match wire_termination(t) {
            Ok(t) => self.push(t),
            Err(err) => tracing::error!(%err, "cannot keep a termination for the recent list"),
        }
    }

    fn newest_first(&self) -> Vec<WatchdogTermination> {
        let list = self.0.lock().unwrap_or_else(|p| p.into_inner());
        list.iter().cloned().collect()
    }
}

/// The published record, field for field: the wire type is its reader.
fn wire_termination(t: &Termination) -> Result<WatchdogTermination, serde_json::Error> {
    serde_json::from_value(serde_json::to_value(t)?)
}

/// Fills a reply with what the watchdog holds: the cloud's instances as `inventory`
/// assessed them, and the recent terminations.
pub fn fill(reply: &mut WatchdogReply, inventory: Inventory, recent: &Recent) {
    reply.instances = inventory
        .items
        .into_iter()
        .map(|i| WatchdogInstance {
            done: i.state.is_done(),
            state: i.state.as_str().to_owned(),
            region: i.region,
            instance_id: i.instance_id,
            tenant: i.tenant,
            run: i.run,
            launch_ms: i.launch_ms,
            deadline_ms: i.deadline.map(|d| d.at_ms),
            reason: i.deadline.map(|d| d.reason.as_str().to_owned()),
            time_left_ms: i.time_left_ms,
            protected: i.protected,
            tag_problems: i.tag_problems,
        })
        .collect();
    reply.region_errors = inventory.region_errors;
    reply.terminations = recent.newest_first();
}

#[cfg(test)]
mod tests {
    use fusebox_watchdog::{Outcome, Reason};

    use super::*;

    fn termination(instance_id: &str) -> Termination {
        Termination {
            tenant: Some("acme".into()),
            run: None,
            provider: "ec2".into(),
            region: "us-east-1".into(),
            instance_id: instance_id.into(),
            reason: Reason::MaxLifetime,
            deadline_ms: 10,
            at_ms: 11,
            dry_run: false,
            outcome: Outcome::AlreadyGone,
            error: None,
        }
    }

    #[test]
    fn the_published_record_reads_as_the_wire_type() {
        let t = wire_termination(&termination("i-1")).unwrap();
        assert_eq!(
            (t.reason.as_str(), t.outcome.as_str(), t.run),
            ("max_lifetime", "already_gone", None)
        );
    }

    #[test]
    fn recent_keeps_the_newest_first_and_a_bounded_number() {
        let journal: Vec<serde_json::Value> = (0..KEEP_RECENT + 5)
            .map(|n| serde_json::to_value(termination(&format!("i-{n}"))).unwrap())
            .chain([serde_json::json!({"shape": "of another version"})])
            .collect();
        let recent = Recent::from_journal(journal);
        recent.record(&termination("i-last"));
        let list = recent.newest_first();
        assert_eq!(list.len(), KEEP_RECENT);
        assert_eq!(list[0].instance_id, "i-last");
        assert_eq!(list[1].instance_id, format!("i-{}", KEEP_RECENT + 4));
    }
}
