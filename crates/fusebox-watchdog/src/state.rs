//! What the watchdog remembers between passes: the facts it was fed and its timers.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use crate::facts::{Fact, Halted, InstanceLaunched, RunEnded};
use crate::provider::{ErrorKind, ProviderError};
use crate::sink::Outcome;

/// An instance, cloud-wide: ids are unique per region.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstanceKey {
    pub region: String,
    pub instance_id: String,
}

/// A run of a tenant.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunKey {
    pub tenant: String,
    pub run: String,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Instance(InstanceKey),
    Verify(RunKey),
}

/// Facts and timers. Timers live in a heap with lazy deletion: an entry counts only while it
/// matches the armed time in `instance_at`/`verify_at`, so re-arming never needs a search.
#[derive(Debug, Default)]
pub struct State {
    pub launched: HashMap<InstanceKey, InstanceLaunched>,
    pub runs_ended: HashMap<RunKey, u64>,
    heap: BinaryHeap<Reverse<(u64, Timer)>>,
    instance_at: HashMap<InstanceKey, u64>,
    verify_at: HashMap<RunKey, u64>,
    /// Instances whose final outcome was already reported in this process.
    pub reported: HashMap<InstanceKey, Outcome>,
    /// Protected overdue instances already reported.
    pub reported_protected: HashSet<InstanceKey>,
    /// Instances whose bad tags were already logged.
    pub warned_tags: HashSet<InstanceKey>,
    /// Regions whose last listing failed: how (kind and code), and when that was last
    /// logged. A region that keeps failing the same way is logged hourly, not on every
    /// sweep.
    failing_regions: HashMap<String, FailingRegion>,
    /// Halted by the blast-radius limit (`on_blast_radius = "halt"`) until an operator
    /// resumes it.
    pub halted: Option<Halted>,
}

/// How a region's listing fails, and when that was last logged.
#[derive(Debug)]
struct FailingRegion {
    kind: ErrorKind,
    code: String,
    logged_at_ms: u64,
}

/// A region that keeps failing the same way is logged again after this long: the log
/// an operator reads when the API error alert fires still names the error.
const RELOG_FAILING_REGION_MS: u64 = 3_600_000;

/// Timers that came due together.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Due {
    pub instances: Vec<InstanceKey>,
    pub runs: Vec<RunKey>,
}

impl Due {
    pub fn is_empty(&self) -> bool {
        self.instances.is_empty() && self.runs.is_empty()
    }
}

impl State {
    /// Records a launch; arms its deadline from the event alone until the cloud says more.
    pub fn launched(&mut self, f: InstanceLaunched, default_max_lifetime_s: u64) {
        let key = InstanceKey {
            region: f.region.clone(),
            instance_id: f.instance_id.clone(),
        };
        let lifetime_s = f.max_lifetime_s.unwrap_or(default_max_lifetime_s);
        self.arm_instance_at_most(
            key.clone(),
            f.ts_ms.saturating_add(lifetime_s.saturating_mul(1000)),
        );
        self.launched.insert(key, f);
    }

    /// Records a run end and arms its verify-empty check.
    pub fn run_ended(&mut self, f: RunEnded, grace_s: u64) {
        let key = RunKey {
            tenant: f.tenant,
            run: f.run,
        };
        let prior = self.runs_ended.get(&key).copied();
        // A run ends once; a repeated event must not postpone its check.
        let end = prior.map_or(f.ts_ms, |p| p.min(f.ts_ms));
        self.runs_ended.insert(key.clone(), end);
        self.arm_verify(key, end.saturating_add(grace_s.saturating_mul(1000)));
    }

    /// Remembers that listing `region` failed at `now_ms`. True when that is worth
    /// logging as an error: the region was listed fine before, now fails in another way,
    /// or has failed so for an hour since it was last logged.
    pub fn listing_failed(&mut self, region: &str, err: &ProviderError, now_ms: u64) -> bool {
        if let Some(failing) = self.failing_regions.get(region) {
            let same = failing.kind == err.kind && failing.code == err.code;
            if same && now_ms.saturating_sub(failing.logged_at_ms) < RELOG_FAILING_REGION_MS {
                return false;
            }
        }
        let failing = FailingRegion {
            kind: err.kind,
            code: err.code.clone(),
            logged_at_ms: now_ms,
        };
        self.failing_regions.insert(region.to_owned(), failing);
        true
    }

    /// Remembers that listing `region` worked. True when it had been failing (its
    /// recovery is worth logging).
    pub fn listing_succeeded(&mut self, region: &str) -> bool {
        self.failing_regions.remove(region).is_some()
    }

    /// Arms (or moves) an instance's timer to exactly `at_ms`: the cloud's view is final.
    pub fn arm_instance(&mut self, key: InstanceKey, at_ms: u64) {
        if self.instance_at.get(&key) != Some(&at_ms) {
            self.instance_at.insert(key.clone(), at_ms);
            self.heap.push(Reverse((at_ms, Timer::Instance(key))));
        }
    }

    /// Arms an instance's timer unless an earlier one is armed already.
    pub fn arm_instance_at_most(&mut self, key: InstanceKey, at_ms: u64) {
        if self.instance_at.get(&key).is_none_or(|&t| at_ms < t) {
            self.arm_instance(key, at_ms);
        }
    }

    pub fn disarm_instance(&mut self, key: &InstanceKey) {
        self.instance_at.remove(key);
    }

    pub fn arm_verify(&mut self, key: RunKey, at_ms: u64) {
        if self.verify_at.get(&key) != Some(&at_ms) {
            self.verify_at.insert(key.clone(), at_ms);
            self.heap.push(Reverse((at_ms, Timer::Verify(key))));
        }
    }

    /// The earliest armed timer.
    pub fn next_wake(&mut self) -> Option<u64> {
        while let Some(Reverse((at, timer))) = self.heap.peek() {
            if self.is_live(*at, timer) {
                return Some(*at);
            }
            self.heap.pop();
        }
        None
    }

    /// Removes and returns every timer due at `now_ms`.
    pub fn take_due(&mut self, now_ms: u64) -> Due {
        let mut due = Due::default();
        while let Some(Reverse((at, _))) = self.heap.peek() {
            if *at > now_ms {
                break;
            }
            let Some(Reverse((at, timer))) = self.heap.pop() else {
                break;
            };
            if !self.is_live(at, &timer) {
                continue;
            }
            match timer {
                Timer::Instance(k) => {
                    self.instance_at.remove(&k);
                    due.instances.push(k);
                }
                Timer::Verify(k) => {
                    self.verify_at.remove(&k);
                    due.runs.push(k);
                }
            }
        }
        due
    }

    /// The facts that rebuild this state's timers: every instance still tracked, and the
    /// end of each run that still matters — its verify-empty check is armed, an instance
    /// of it is tracked, or it ended at or after `ends_since_ms` (an instance tagged with
    /// the run and never reported may still turn up in a sweep). Sorted by time, then key.
    pub fn live_facts(&self, ends_since_ms: u64) -> Vec<Fact> {
        let runs_with_instances: HashSet<RunKey> = self
            .launched
            .values()
            .map(|f| RunKey {
                tenant: f.tenant.clone(),
                run: f.run.clone(),
            })
            .collect();
        let mut launched: Vec<&InstanceLaunched> = self.launched.values().collect();
        launched.sort_by(|a, b| {
            (a.ts_ms, &a.region, &a.instance_id).cmp(&(b.ts_ms, &b.region, &b.instance_id))
        });
        let mut ended: Vec<(&RunKey, u64)> = self
            .runs_ended
            .iter()
            .filter(|(k, &end)| {
                end >= ends_since_ms
                    || self.verify_at.contains_key(*k)
                    || runs_with_instances.contains(*k)
            })
            .map(|(k, &end)| (k, end))
            .collect();
        ended.sort_by(|a, b| (a.1, a.0).cmp(&(b.1, b.0)));
        let mut facts: Vec<Fact> = launched.into_iter().map(|f| f.clone().into()).collect();
        facts.extend(ended.into_iter().map(|(k, ts_ms)| {
            Fact::from(RunEnded {
                tenant: k.tenant.clone(),
                run: k.run.clone(),
                ts_ms,
            })
        }));
        // A halt outlives a compaction as it outlives a restart.
        facts.extend(self.halted.clone().map(Fact::from));
        facts
    }

    fn is_live(&self, at: u64, timer: &Timer) -> bool {
        match timer {
            Timer::Instance(k) => self.instance_at.get(k) == Some(&at),
            Timer::Verify(k) => self.verify_at.get(k) == Some(&at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> InstanceKey {
        InstanceKey {
            region: "r".into(),
            instance_id: id.into(),
        }
    }

    /// A region's listings in order (region, minutes since start, the failure or `None`
    /// for a listing that worked), and which of them are logged: the first failure, a
    /// failure of another kind, the recovery, and the same failure an hour after it was
    /// last logged; not the same failure again within the hour.
    #[test]
    fn a_region_failing_the_same_way_is_logged_hourly() {
        let no_credentials =
            ProviderError::new(ErrorKind::Transport, "Transport", "no credentials");
        let no_credentials_again =
            ProviderError::new(ErrorKind::Transport, "Transport", "same, new text");
        let refused =
            ProviderError::new(ErrorKind::Unauthorized, "UnauthorizedOperation", "denied");
        let mut s = State::default();
        let mut logged = Vec::new();
        for (region, minute, outcome) in [
            ("r", 0, Some(&no_credentials)),
            ("r", 1, Some(&no_credentials_again)),
            ("q", 1, Some(&no_credentials)),
            ("r", 2, Some(&refused)),
            ("r", 3, None),
            ("r", 4, None),
            ("r", 5, Some(&refused)),
            ("r", 64, Some(&refused)),
            ("r", 65, Some(&refused)),
            ("q", 61, Some(&no_credentials)),
        ] {
            logged.push(match outcome {
                Some(err) => s.listing_failed(region, err, minute * 60_000),
                None => s.listing_succeeded(region),
            });
        }
        let expected = [
            true, false, true, true, true, false, true, false, true, true,
        ];
        assert_eq!(logged, expected);
    }

    #[test]
    fn rearming_replaces_the_old_timer() {
        let mut s = State::default();
        s.arm_instance(key("a"), 100);
        s.arm_instance(key("a"), 50);
        s.arm_instance(key("b"), 70);
        assert_eq!(s.next_wake(), Some(50));
        assert_eq!(s.take_due(60).instances, vec![key("a")]);
        assert_eq!(s.take_due(1_000).instances, vec![key("b")]);
        assert_eq!(s.next_wake(), None);
    }

    #[test]
    fn live_facts_keep_tracked_instances_and_the_run_ends_that_matter() {
        let launch = |run: &str, id: &str, ts_ms| InstanceLaunched {
            tenant: "t".into(),
            run: run.into(),
            provider: "ec2".into(),
            region: "r".into(),
            instance_id: id.into(),
            max_lifetime_s: None,
            ts_ms,
        };
        let end = |run: &str, ts_ms| RunEnded {
            tenant: "t".into(),
            run: run.into(),
            ts_ms,
        };
        let mut s = State::default();
        s.launched(launch("has-instance", "i-1", 10), 3600);
        s.run_ended(end("has-instance", 20), 5);
        s.run_ended(end("verified-long-ago", 30), 5);
        s.run_ended(end("verify-pending", 40), 1_000_000);
        s.run_ended(end("recent", 50_000), 5);
        // The verify checks of everything but "verify-pending" have run.
        s.take_due(60_000);
        s.run_ended(end("verify-pending", 40), 1_000_000);
        let facts = s.live_facts(10_000);
        assert_eq!(
            facts,
            vec![
                launch("has-instance", "i-1", 10).into(),
                end("has-instance", 20).into(),
                end("verify-pending", 40).into(),
                end("recent", 50_000).into(),
            ]
        );
        // Fed back, they rebuild the same facts.
        let mut rebuilt = State::default();
        for f in facts.clone() {
            match f {
                Fact::InstanceLaunched(f) => rebuilt.launched(f, 3600),
                Fact::RunEnded(f) => rebuilt.run_ended(f, 5),
                Fact::Halted(_) | Fact::Resumed(_) => unreachable!("not halted"),
            }
        }
        assert_eq!(rebuilt.live_facts(10_000), facts);
    }

    #[test]
    fn at_most_keeps_the_earlier() {
        let mut s = State::default();
        s.arm_instance_at_most(key("a"), 100);
        s.arm_instance_at_most(key("a"), 200);
        assert_eq!(s.next_wake(), Some(100));
    }

    #[test]
    fn launch_and_run_end_arm_timers() {
        let mut s = State::default();
        s.launched(
            InstanceLaunched {
                tenant: "t".into(),
                run: "r1".into(),
                provider: "ec2".into(),
                region: "r".into(),
                instance_id: "i-1".into(),
                max_lifetime_s: Some(10),
                ts_ms: 1_000,
            },
            3600,
        );
        s.run_ended(
            RunEnded {
                tenant: "t".into(),
                run: "r1".into(),
                ts_ms: 2_000,
            },
            5,
        );
        s.run_ended(
            RunEnded {
                tenant: "t".into(),
                run: "r1".into(),
                ts_ms: 9_000,
            },
            5,
        );
        let due = s.take_due(100_000);
        assert_eq!(due.instances, vec![key("i-1")]);
        assert_eq!(
            due.runs,
            vec![RunKey {
                tenant: "t".into(),
                run: "r1".into()
            }]
        );
        assert_eq!(
            s.runs_ended.values().copied().collect::<Vec<_>>(),
            vec![2_000]
        );
    }
}
