//! Pure decisions of one pass: which listed instances are overdue, which are protected, which
//! wait for a timer, and how many the blast-radius limit lets go. No I/O, no clock.

use std::collections::HashSet;

use crate::config::{BlastRadiusAction, WatchdogConfig};
use crate::deadline::{self, Deadline, DeadlineInputs, Reason};
use crate::provider::Instance;
use crate::state::{InstanceKey, RunKey, State};
use crate::tags::OwnershipTags;

/// A listed instance with everything the watchdog concluded about it.
#[derive(Debug, Clone)]
pub struct Assessed {
    pub instance: Instance,
    pub tags: OwnershipTags,
    /// Tags first, then the launch event.
    pub tenant: Option<String>,
    pub run: Option<String>,
    pub launch_ms: Option<u64>,
    pub deadline: Option<Deadline>,
}

impl Assessed {
    pub fn key(&self) -> InstanceKey {
        InstanceKey {
            region: self.instance.region.clone(),
            instance_id: self.instance.instance_id.clone(),
        }
    }

    pub fn run_key(&self) -> Option<RunKey> {
        Some(RunKey {
            tenant: self.tenant.clone()?,
            run: self.run.clone()?,
        })
    }

    /// Managed and still billing.
    pub fn is_live_managed(&self) -> bool {
        self.tags.managed && !self.instance.state.is_done()
    }
}

/// Joins what the cloud lists with what runs reported, and computes the deadline.
pub fn assess(instance: Instance, state: &State, cfg: &WatchdogConfig) -> Assessed {
    let tags = OwnershipTags::parse(&instance.tags);
    let key = InstanceKey {
        region: instance.region.clone(),
        instance_id: instance.instance_id.clone(),
    };
    let fact = state.launched.get(&key);
    let tenant = tags
        .tenant
        .clone()
        .or_else(|| fact.map(|f| f.tenant.clone()));
    let run = tags.run.clone().or_else(|| fact.map(|f| f.run.clone()));
    let launch_ms = instance.launch_ms.or(fact.map(|f| f.ts_ms));
    let run_ended_ms = match (&tenant, &run) {
        (Some(t), Some(r)) => state
            .runs_ended
            .get(&RunKey {
                tenant: t.clone(),
                run: r.clone(),
            })
            .copied(),
        _ => None,
    };
    let deadline = deadline::compute(&DeadlineInputs {
        launch_ms,
        tag_deadline_ms: tags.deadline_ms,
        tag_max_lifetime_s: tags.max_lifetime_s,
        event_max_lifetime_s: fact.and_then(|f| f.max_lifetime_s),
        default_max_lifetime_s: cfg.default_max_lifetime_s,
        run_ended_ms,
        grace_s: cfg.grace_s,
    });
    Assessed {
        instance,
        tags,
        tenant,
        run,
        launch_ms,
        deadline,
    }
}

/// An instance the pass should terminate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub key: InstanceKey,
    pub tenant: Option<String>,
    pub run: Option<String>,
    pub launch_ms: Option<u64>,
    pub deadline_ms: u64,
    pub reason: Reason,
}

/// What one pass decided.
#[derive(Debug, Default)]
pub struct Plan {
    /// Overdue and allowed by the blast-radius limit, earliest deadline first.
    pub terminate: Vec<Candidate>,
    /// Overdue but past the blast-radius limit: left for a later pass.
    pub held: Vec<Candidate>,
    /// Overdue but `fusebox:protect`ed.
    pub protected: Vec<Candidate>,
    /// Not yet due: arm a timer at the deadline.
    pub upcoming: Vec<(InstanceKey, u64)>,
    /// Instances seen shutting-down or terminated.
    pub done: Vec<InstanceKey>,
    /// The terminations the limit allowed.
    pub allowed: usize,
    /// Managed, live instances the share limit counts from.
    pub managed: usize,
    /// Nothing was terminated because the watchdog is halted (`on_blast_radius = "halt"`):
    /// halted before this pass, or by it.
    pub halted: bool,
}

/// Decides a pass. `verifying` are runs whose verify-empty check is part of this pass: their
/// instances go as `leftover` whatever their deadline. `managed_floor` is the fleet size
/// known from the last full sweep, so a pass that lists only a few instances still measures
/// its share against the whole fleet. `halted`: the watchdog is halted already, so
/// nothing is terminated whatever the count.
pub fn plan(
    assessed: &[Assessed],
    now_ms: u64,
    verifying: &HashSet<RunKey>,
    managed_floor: usize,
    halted: bool,
    cfg: &WatchdogConfig,
) -> Plan {
    let mut p = Plan::default();
    let mut overdue = Vec::new();
    for a in assessed.iter().filter(|a| a.tags.managed) {
        if a.instance.state.is_done() {
            p.done.push(a.key());
            continue;
        }
        let leftover = a.run_key().is_some_and(|k| verifying.contains(&k));
        let due = match a.deadline {
            Some(d) if leftover => Some((d.at_ms.min(now_ms), Reason::Leftover)),
            Some(d) if d.at_ms <= now_ms => Some((d.at_ms, d.reason)),
            Some(d) => {
                p.upcoming.push((a.key(), d.at_ms));
                None
            }
            None if leftover => Some((now_ms, Reason::Leftover)),
            None => None,
        };
        let Some((deadline_ms, reason)) = due else {
            continue;
        };
        let c = Candidate {
            key: a.key(),
            tenant: a.tenant.clone(),
            run: a.run.clone(),
            launch_ms: a.launch_ms,
            deadline_ms,
            reason,
        };
        if a.tags.protect {
            p.protected.push(c);
        } else {
            overdue.push(c);
        }
    }
    p.managed = assessed
        .iter()
        .filter(|a| a.is_live_managed())
        .count()
        .max(managed_floor);
    p.allowed = allowed(p.managed, cfg);
    overdue.sort_by(|a, b| (a.deadline_ms, &a.key).cmp(&(b.deadline_ms, &b.key)));
    p.halted =
        halted || (cfg.on_blast_radius == BlastRadiusAction::Halt && overdue.len() > p.allowed);
    let keep = if p.halted { 0 } else { p.allowed };
    let held = overdue.split_off(overdue.len().min(keep));
    p.terminate = overdue;
    p.held = held;
    p
}

/// The blast-radius budget: the absolute cap, and the share of the fleet rounded up (so a
/// fleet of one can still lose its one overdue instance).
pub fn allowed(managed: usize, cfg: &WatchdogConfig) -> usize {
    // Fleet sizes are far below 2^52, so the f64 round trip is exact.
    let by_share = (managed as f64 * cfg.max_termination_share).ceil() as usize;
    cfg.max_terminations_per_sweep.min(by_share)
}

/// Why a pass was held back, in words for the alert.
pub fn why_held(p: &Plan, cfg: &WatchdogConfig) -> String {
    let overdue = p.terminate.len() + p.held.len();
    let by_count = cfg.max_terminations_per_sweep;
    let limit = if p.allowed == by_count {
        format!("max_terminations_per_sweep = {by_count}")
    } else {
        format!(
            "max_termination_share = {} of {} managed instances",
            cfg.max_termination_share, p.managed
        )
    };
    let action = match cfg.on_blast_radius {
        BlastRadiusAction::CapPerPass => format!(
            "terminated the {} with the earliest deadlines and left {} running",
            p.terminate.len(),
            p.held.len()
        ),
        BlastRadiusAction::Halt => format!(
            "on_blast_radius = \"halt\": halted, terminated none and left {} running until \
             an operator resumes the watchdog (`fusebox watchdog resume`)",
            p.held.len()
        ),
    };
    if p.halted && overdue <= p.allowed {
        return format!(
            "the watchdog is halted (on_blast_radius = \"halt\"): {overdue} overdue instances \
             left running until an operator resumes it (`fusebox watchdog resume`)"
        );
    }
    format!(
        "{overdue} instances are overdue but {limit} allows {}: {action}; check for a clock \
         jump or bad deadline tags",
        p.allowed
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::facts::{InstanceLaunched, RunEnded};
    use crate::provider::InstanceState;
    use crate::tags;

    const NOW: u64 = 10_000_000;

    fn cfg() -> WatchdogConfig {
        WatchdogConfig {
            default_max_lifetime_s: 3600,
            grace_s: 60,
            ..Default::default()
        }
    }

    fn inst(id: &str, launch_ms: u64, extra: &[(&str, &str)]) -> Instance {
        let mut tags: BTreeMap<String, String> = [
            (tags::MANAGED, "true"),
            (tags::TENANT, "acme"),
            (tags::RUN, "r1"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        for (k, v) in extra {
            tags.insert(k.to_string(), v.to_string());
        }
        Instance {
            region: "us-east-1".into(),
            instance_id: id.into(),
            state: InstanceState::Running,
            launch_ms: Some(launch_ms),
            tags,
        }
    }

    fn run(
        instances: Vec<Instance>,
        state: &State,
        verifying: &HashSet<RunKey>,
        c: &WatchdogConfig,
    ) -> Plan {
        let a: Vec<_> = instances.into_iter().map(|i| assess(i, state, c)).collect();
        plan(&a, NOW, verifying, 0, false, c)
    }

    #[test]
    fn overdue_by_lifetime_young_is_upcoming() {
        let old = inst("i-1", NOW - 3_600_001, &[]);
        let young = inst("i-2", NOW - 1_000, &[]);
        let p = run(vec![old, young], &State::default(), &HashSet::new(), &cfg());
        assert_eq!(p.terminate.len(), 1);
        assert_eq!(p.terminate[0].reason, Reason::MaxLifetime);
        assert_eq!(p.upcoming.len(), 1);
        assert_eq!(p.upcoming[0].1, NOW - 1_000 + 3_600_000);
    }

    #[test]
    fn untagged_is_invisible_and_protected_is_reported() {
        let mut untagged = inst("i-1", 0, &[]);
        untagged.tags.clear();
        let protected = inst("i-2", 0, &[(tags::PROTECT, "true")]);
        let p = run(
            vec![untagged, protected],
            &State::default(),
            &HashSet::new(),
            &cfg(),
        );
        assert!(p.terminate.is_empty());
        assert_eq!(p.protected.len(), 1);
        assert_eq!(p.managed, 1);
    }

    #[test]
    fn done_states_are_skipped_stopped_is_not() {
        let mut gone = inst("i-1", 0, &[]);
        gone.state = InstanceState::ShuttingDown;
        let mut stopped = inst("i-2", 0, &[]);
        stopped.state = InstanceState::Stopped;
        let p = run(
            vec![gone, stopped],
            &State::default(),
            &HashSet::new(),
            &cfg(),
        );
        assert_eq!(p.done.len(), 1);
        assert_eq!(p.terminate.len(), 1);
        assert_eq!(p.terminate[0].key.instance_id, "i-2");
    }

    #[test]
    fn event_lifetime_and_run_end_come_from_facts() {
        let mut s = State::default();
        s.launched(
            InstanceLaunched {
                tenant: "acme".into(),
                run: "r1".into(),
                provider: "ec2".into(),
                region: "us-east-1".into(),
                instance_id: "i-1".into(),
                max_lifetime_s: Some(5),
                ts_ms: NOW - 6_000,
            },
            3600,
        );
        let p = run(
            vec![inst("i-1", NOW - 6_000, &[])],
            &s,
            &HashSet::new(),
            &cfg(),
        );
        assert_eq!(p.terminate[0].reason, Reason::MaxLifetime);

        let mut s = State::default();
        s.run_ended(
            RunEnded {
                tenant: "acme".into(),
                run: "r1".into(),
                ts_ms: NOW - 61_000,
            },
            60,
        );
        let p = run(
            vec![inst("i-2", NOW - 100_000, &[])],
            &s,
            &HashSet::new(),
            &cfg(),
        );
        assert_eq!(p.terminate[0].reason, Reason::RunEnded);
    }

    #[test]
    fn verify_labels_leftovers() {
        let verifying: HashSet<_> = [RunKey {
            tenant: "acme".into(),
            run: "r1".into(),
        }]
        .into();
        let p = run(
            vec![inst("i-1", NOW - 1_000, &[])],
            &State::default(),
            &verifying,
            &cfg(),
        );
        assert_eq!(p.terminate[0].reason, Reason::Leftover);
    }

    #[test]
    fn blast_radius_holds_the_rest() {
        let c = WatchdogConfig {
            max_terminations_per_sweep: 3,
            max_termination_share: 1.0,
            ..cfg()
        };
        let fleet: Vec<_> = (0..10).map(|n| inst(&format!("i-{n}"), n, &[])).collect();
        let p = run(fleet, &State::default(), &HashSet::new(), &c);
        assert_eq!(p.terminate.len(), 3);
        assert_eq!(p.held.len(), 7);
        // Earliest deadlines go first.
        assert_eq!(p.terminate[0].key.instance_id, "i-0");
        assert!(why_held(&p, &c).contains("max_terminations_per_sweep = 3"));
    }

    #[test]
    fn halt_terminates_none_past_the_limit_and_all_within_it() {
        let c = WatchdogConfig {
            max_terminations_per_sweep: 3,
            max_termination_share: 1.0,
            on_blast_radius: BlastRadiusAction::Halt,
            ..cfg()
        };
        let fleet =
            |n: usize| -> Vec<_> { (0..n).map(|i| inst(&format!("i-{i}"), 0, &[])).collect() };
        let p = run(fleet(10), &State::default(), &HashSet::new(), &c);
        assert_eq!((p.terminate.len(), p.held.len()), (0, 10));
        assert!(why_held(&p, &c).contains("terminated none and left 10 running"));
        let p = run(fleet(3), &State::default(), &HashSet::new(), &c);
        assert_eq!((p.terminate.len(), p.held.len()), (3, 0));
        // Once halted, a count within the limit terminates none either.
        let a: Vec<_> = fleet(2)
            .into_iter()
            .map(|i| assess(i, &State::default(), &c))
            .collect();
        let p = plan(&a, NOW, &HashSet::new(), 0, true, &c);
        assert_eq!((p.terminate.len(), p.held.len(), p.halted), (0, 2, true));
        assert!(why_held(&p, &c).contains("halted"), "{}", why_held(&p, &c));
    }

    #[test]
    fn share_limit_rounds_up() {
        let c = WatchdogConfig {
            max_terminations_per_sweep: 100,
            max_termination_share: 0.25,
            ..cfg()
        };
        assert_eq!(allowed(1, &c), 1);
        assert_eq!(allowed(10, &c), 3);
        assert_eq!(allowed(1000, &c), 100);
        let fleet: Vec<_> = (0..8).map(|n| inst(&format!("i-{n}"), 0, &[])).collect();
        let p = run(fleet, &State::default(), &HashSet::new(), &c);
        assert_eq!(p.terminate.len(), 2);
        assert!(why_held(&p, &c).contains("max_termination_share"));
    }

    #[test]
    fn deadline_tag_in_the_past_is_overdue() {
        let i = inst("i-1", NOW, &[(tags::DEADLINE, "1970-01-01T00:00:01Z")]);
        let p = run(vec![i], &State::default(), &HashSet::new(), &cfg());
        assert_eq!(p.terminate[0].reason, Reason::Deadline);
        assert_eq!(p.terminate[0].deadline_ms, 1_000);
    }
}
