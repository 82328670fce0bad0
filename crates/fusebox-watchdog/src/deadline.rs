//! Pure deadline arithmetic: no clock, no I/O. Every instance's deadline is decided here.

use serde::{Deserialize, Serialize};

/// Why an instance is (or would be) terminated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The `fusebox:deadline` tag passed.
    Deadline,
    /// Launch time + max lifetime passed.
    MaxLifetime,
    /// The run ended more than `grace_s` ago (found by a sweep or a deadline timer).
    RunEnded,
    /// Found by the verify-empty check after its run ended.
    Leftover,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Deadline => "deadline",
            Reason::MaxLifetime => "max_lifetime",
            Reason::RunEnded => "run_ended",
            Reason::Leftover => "leftover",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything known about one instance that bears on its deadline. Times are Unix ms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadlineInputs {
    /// Launch time: the cloud's `LaunchTime`, else the launch event's timestamp.
    pub launch_ms: Option<u64>,
    pub tag_deadline_ms: Option<u64>,
    pub tag_max_lifetime_s: Option<u64>,
    pub event_max_lifetime_s: Option<u64>,
    pub default_max_lifetime_s: u64,
    pub run_ended_ms: Option<u64>,
    pub grace_s: u64,
}

/// When an instance must be gone, and which limit said so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deadline {
    pub at_ms: u64,
    pub reason: Reason,
}

/// The earliest of the tag deadline, launch + lifetime, and run end + grace.
///
/// The lifetime is the tag's, else the launch event's, else the config default: the most
/// specific source wins, even when it is longer, because a launcher that set it meant it.
/// On a tie the more explicit limit names the reason (deadline, then max lifetime, then run
/// end). `None` only when nothing at all is known (no launch time, no tag, no run end).
pub fn compute(i: &DeadlineInputs) -> Option<Deadline> {
    let lifetime_s = i
        .tag_max_lifetime_s
        .or(i.event_max_lifetime_s)
        .unwrap_or(i.default_max_lifetime_s);
    let candidates = [
        i.tag_deadline_ms.map(|at| (at, Reason::Deadline)),
        i.launch_ms.map(|l| {
            (
                l.saturating_add(lifetime_s.saturating_mul(1000)),
                Reason::MaxLifetime,
            )
        }),
        i.run_ended_ms.map(|e| {
            (
                e.saturating_add(i.grace_s.saturating_mul(1000)),
                Reason::RunEnded,
            )
        }),
    ];
    candidates
        .into_iter()
        .flatten()
        .min()
        .map(|(at_ms, reason)| Deadline { at_ms, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> DeadlineInputs {
        DeadlineInputs {
            launch_ms: Some(1_000_000),
            default_max_lifetime_s: 3600,
            grace_s: 60,
            ..Default::default()
        }
    }

    #[test]
    fn default_lifetime_applies_without_tags() {
        let d = compute(&base()).unwrap();
        assert_eq!(
            d,
            Deadline {
                at_ms: 1_000_000 + 3_600_000,
                reason: Reason::MaxLifetime
            }
        );
    }

    #[test]
    fn tag_lifetime_beats_event_and_default() {
        let d = compute(&DeadlineInputs {
            tag_max_lifetime_s: Some(7200),
            event_max_lifetime_s: Some(10),
            ..base()
        })
        .unwrap();
        assert_eq!(d.at_ms, 1_000_000 + 7_200_000);
        let d = compute(&DeadlineInputs {
            event_max_lifetime_s: Some(10),
            ..base()
        })
        .unwrap();
        assert_eq!(d.at_ms, 1_010_000);
    }

    #[test]
    fn earliest_wins() {
        let d = compute(&DeadlineInputs {
            tag_deadline_ms: Some(1_500_000),
            ..base()
        })
        .unwrap();
        assert_eq!(
            d,
            Deadline {
                at_ms: 1_500_000,
                reason: Reason::Deadline
            }
        );
        let d = compute(&DeadlineInputs {
            run_ended_ms: Some(1_100_000),
            ..base()
        })
        .unwrap();
        assert_eq!(
            d,
            Deadline {
                at_ms: 1_160_000,
                reason: Reason::RunEnded
            }
        );
    }

    #[test]
    fn late_run_end_does_not_extend() {
        let d = compute(&DeadlineInputs {
            run_ended_ms: Some(9_000_000_000),
            ..base()
        })
        .unwrap();
        assert_eq!(d.reason, Reason::MaxLifetime);
    }

    #[test]
    fn tie_names_the_explicit_limit() {
        let d = compute(&DeadlineInputs {
            tag_deadline_ms: Some(4_600_000),
            ..base()
        })
        .unwrap();
        assert_eq!(d.reason, Reason::Deadline);
    }

    #[test]
    fn deadline_tag_alone_without_launch_time() {
        let d = compute(&DeadlineInputs {
            launch_ms: None,
            tag_deadline_ms: Some(5),
            ..base()
        })
        .unwrap();
        assert_eq!(d.at_ms, 5);
        assert_eq!(
            compute(&DeadlineInputs {
                launch_ms: None,
                ..base()
            }),
            None
        );
    }

    #[test]
    fn huge_values_saturate() {
        let d = compute(&DeadlineInputs {
            launch_ms: Some(u64::MAX - 1),
            tag_max_lifetime_s: Some(u64::MAX),
            ..base()
        })
        .unwrap();
        assert_eq!(d.at_ms, u64::MAX);
    }
}
