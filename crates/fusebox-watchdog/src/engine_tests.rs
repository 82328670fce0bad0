//! Engine behaviour that moto cannot stage (eventual consistency, exhausted retries), on an
//! in-memory cloud. Everything that moto can stage is tested against moto in `tests/`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::ManualClock;
use crate::config::{BlastRadiusAction, RetryConfig, WatchdogConfig};
use crate::engine::Watchdog;
use crate::facts::{Fact, InstanceLaunched, Resumed, RunEnded};
use crate::provider::{
    ErrorKind, Instance, InstanceState, Op, Page, Provider, ProviderError, Selector, Terminated,
};
use crate::sink::{MemorySink, Outcome};
use crate::tags;

const NOW: u64 = 1_800_000_000_000;
const REGION: &str = "us-east-1";

#[derive(Default)]
struct FakeCloud {
    instances: Mutex<Vec<Instance>>,
    /// Errors the next TerminateInstances calls return, in order.
    terminate_errors: Mutex<VecDeque<ProviderError>>,
}

struct Fake(Arc<FakeCloud>);

impl Provider for Fake {
    fn name(&self) -> &str {
        "ec2"
    }

    async fn describe_page(
        &self,
        region: &str,
        selector: &Selector,
        _: Option<String>,
    ) -> Result<Page, ProviderError> {
        let all = self.0.instances.lock().unwrap();
        let instances = all
            .iter()
            .filter(|i| {
                i.region == region && i.tags.get(tags::MANAGED).map(String::as_str) == Some("true")
            })
            .filter(|i| match selector {
                Selector::AllManaged => true,
                Selector::Ids(ids) => ids.contains(&i.instance_id),
                Selector::Runs(runs) => i.tags.get(tags::RUN).is_some_and(|r| runs.contains(r)),
            })
            .cloned()
            .collect();
        Ok(Page {
            instances,
            next_token: None,
        })
    }

    async fn terminate(&self, _: &str, ids: &[String]) -> Result<Terminated, ProviderError> {
        if let Some(e) = self.0.terminate_errors.lock().unwrap().pop_front() {
            return Err(e);
        }
        let mut all = self.0.instances.lock().unwrap();
        let mut out = Vec::new();
        for i in all.iter_mut().filter(|i| ids.contains(&i.instance_id)) {
            i.state = InstanceState::Terminated;
            out.push((i.instance_id.clone(), i.state.clone()));
        }
        Ok(out)
    }

    async fn dry_run(&self, _: &str, _: Op, _: Option<&str>) -> Result<(), ProviderError> {
        Ok(())
    }
}

fn managed(id: &str, launch_ms: u64, deadline: &str) -> Instance {
    let tags: BTreeMap<String, String> = [
        (tags::MANAGED, "true"),
        (tags::TENANT, "acme"),
        (tags::RUN, "r1"),
        (tags::DEADLINE, deadline),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    Instance {
        region: REGION.into(),
        instance_id: id.into(),
        state: InstanceState::Running,
        launch_ms: Some(launch_ms),
        tags,
    }
}

struct Rig {
    cloud: Arc<FakeCloud>,
    clock: Arc<ManualClock>,
    sink: Arc<MemorySink>,
    wd: Watchdog<Fake>,
}

fn config() -> WatchdogConfig {
    WatchdogConfig {
        max_termination_share: 1.0,
        retry: RetryConfig {
            max_attempts: 3,
            initial_backoff_ms: 100,
            max_backoff_ms: 1_000,
        },
        ..Default::default()
    }
}

fn rig(instances: Vec<Instance>) -> Rig {
    rig_with(config(), instances)
}

fn rig_with(cfg: WatchdogConfig, instances: Vec<Instance>) -> Rig {
    let cloud = Arc::new(FakeCloud {
        instances: Mutex::new(instances),
        ..Default::default()
    });
    let clock = Arc::new(ManualClock::new(NOW));
    let sink = Arc::new(MemorySink::default());
    let wd = Watchdog::new(cfg, Fake(cloud.clone()), clock.clone(), sink.clone()).unwrap();
    Rig {
        cloud,
        clock,
        sink,
        wd,
    }
}

fn not_found(id: &str) -> ProviderError {
    ProviderError::new(
        ErrorKind::NotFound,
        "InvalidInstanceID.NotFound",
        format!("The instance ID '{id}' does not exist"),
    )
}

const PAST: &str = "2020-01-01T00:00:00Z";

#[tokio::test(start_paused = true)]
async fn young_instance_not_found_is_rechecked_not_forgotten() {
    let r = rig(vec![managed("i-0a", NOW - 10_000, PAST)]);
    r.cloud
        .terminate_errors
        .lock()
        .unwrap()
        .push_back(not_found("i-0a"));
    let report = r.wd.sweep().await;
    assert!(report.terminations.is_empty(), "{:?}", report.terminations);
    assert_eq!(r.wd.stats().next_deadline_ms, Some(NOW + 10_000));

    r.clock.advance(Duration::from_secs(10));
    let report = r.wd.fire_due_timers().await.expect("recheck timer");
    assert_eq!(report.terminations.len(), 1);
    assert_eq!(report.terminations[0].outcome, Outcome::Terminated);
}

#[tokio::test(start_paused = true)]
async fn old_instance_not_found_is_already_gone() {
    let r = rig(vec![
        managed("i-0a", NOW - 3_600_000, PAST),
        managed("i-0b", NOW - 3_600_000, PAST),
    ]);
    r.cloud
        .terminate_errors
        .lock()
        .unwrap()
        .push_back(not_found("i-0a"));
    let report = r.wd.sweep().await;
    let outcome = |id: &str| {
        report
            .terminations
            .iter()
            .find(|t| t.instance_id == id)
            .map(|t| t.outcome)
    };
    assert_eq!(outcome("i-0a"), Some(Outcome::AlreadyGone));
    // The rest of the batch went through on the second call.
    assert_eq!(outcome("i-0b"), Some(Outcome::Terminated));
    assert_eq!(
        r.wd.stats().api_errors_by_op.get("TerminateInstances"),
        None
    );
}

#[tokio::test(start_paused = true)]
async fn exhausted_retries_fail_then_the_instance_is_retried() {
    let r = rig(vec![managed("i-0a", NOW - 3_600_000, PAST)]);
    let throttled = ProviderError::new(ErrorKind::Throttled, "RequestLimitExceeded", "slow down");
    r.cloud
        .terminate_errors
        .lock()
        .unwrap()
        .extend((0..3).map(|_| throttled.clone()));
    let report = r.wd.sweep().await;
    assert_eq!(report.terminations.len(), 1);
    assert_eq!(report.terminations[0].outcome, Outcome::Failed);
    assert!(report.terminations[0]
        .error
        .as_deref()
        .unwrap()
        .contains("RequestLimitExceeded"));
    let stats = r.wd.stats();
    assert_eq!(stats.api_errors_by_op.get("TerminateInstances"), Some(&3));
    assert_eq!(stats.api_calls_by_op.get("TerminateInstances"), Some(&3));

    r.clock.advance(Duration::from_secs(10));
    let report = r.wd.fire_due_timers().await.expect("retry timer");
    assert_eq!(report.terminations[0].outcome, Outcome::Terminated);
    assert_eq!(
        r.cloud.instances.lock().unwrap()[0].state,
        InstanceState::Terminated
    );
}

#[tokio::test(start_paused = true)]
async fn reported_launch_not_yet_listed_is_rechecked_while_young() {
    let r = rig(vec![]);
    r.wd.record(InstanceLaunched {
        tenant: "acme".into(),
        run: "r1".into(),
        provider: "ec2".into(),
        region: REGION.into(),
        instance_id: "i-0a".into(),
        max_lifetime_s: Some(1),
        ts_ms: NOW - 5_000,
    });
    let report = r.wd.fire_due_timers().await.expect("deadline timer");
    assert_eq!(report.listed, 0);
    assert_eq!(
        r.wd.stats().next_deadline_ms,
        Some(NOW + 10_000),
        "forgotten while young"
    );

    // Now it shows up, overdue: the recheck terminates it.
    r.cloud
        .instances
        .lock()
        .unwrap()
        .push(managed("i-0a", NOW - 5_000, PAST));
    r.clock.advance(Duration::from_secs(10));
    let report = r.wd.fire_due_timers().await.expect("recheck timer");
    assert_eq!(report.terminations.len(), 1);
    assert!(r
        .sink
        .snapshot()
        .terminations
        .iter()
        .all(|t| t.instance_id == "i-0a"));
}

#[tokio::test(start_paused = true)]
async fn launch_fact_for_another_provider_is_ignored() {
    let r = rig(vec![]);
    r.wd.record(InstanceLaunched {
        tenant: "acme".into(),
        run: "r1".into(),
        provider: "gce".into(),
        region: REGION.into(),
        instance_id: "i-0a".into(),
        max_lifetime_s: Some(1),
        ts_ms: NOW,
    });
    assert_eq!(r.wd.stats().next_deadline_ms, None);
}

/// `on_blast_radius = "halt"` latches (issue 25 §3): once a pass finds more overdue
/// instances than the limit allows, the watchdog terminates nothing — also when the
/// overdue count fits again, and after a restart fed the journaled halt — until an
/// operator's resume is recorded.
#[tokio::test(start_paused = true)]
async fn a_halt_holds_until_an_operator_resumes_the_watchdog() {
    let cfg = WatchdogConfig {
        max_terminations_per_sweep: 2,
        on_blast_radius: BlastRadiusAction::Halt,
        ..config()
    };
    let fleet: Vec<_> = (0..5)
        .map(|n| managed(&format!("i-{n}"), NOW - 10_000, PAST))
        .collect();
    let r = rig_with(cfg.clone(), fleet);
    let report = r.wd.sweep().await;
    assert_eq!((report.terminations.len(), report.held), (0, 5));
    let halted = r.wd.halted().expect("the sweep halts the watchdog");
    assert!(r.wd.stats().halted);
    assert_eq!(r.sink.snapshot().halts, vec![halted.clone()]);

    // Someone else cleaned up three: two overdue fit the limit, but the halt holds.
    r.cloud.instances.lock().unwrap().truncate(2);
    let report = r.wd.sweep().await;
    assert_eq!((report.terminations.len(), report.held), (0, 2));
    assert!(report
        .alert
        .expect("held, so alerted")
        .why
        .contains("halted"));
    assert_eq!(r.sink.snapshot().halts.len(), 1, "one halt, reported once");

    // A restart: the journal's facts (the halt among them) rebuild a halted watchdog.
    let restarted = Watchdog::new(
        cfg,
        Fake(r.cloud.clone()),
        r.clock.clone(),
        Arc::new(MemorySink::default()),
    )
    .unwrap();
    restarted.restore(r.wd.live_facts());
    assert_eq!(restarted.halted(), Some(halted));
    assert_eq!(restarted.sweep().await.terminations.len(), 0);

    restarted.record(Resumed {
        at_ms: restarted.now_ms(),
        by: "oncall".into(),
    });
    assert_eq!(restarted.halted(), None);
    assert!(!restarted.stats().halted);
    let report = restarted.sweep().await;
    assert_eq!((report.terminations.len(), report.held), (2, 0));
    assert!(report
        .terminations
        .iter()
        .all(|t| t.outcome == Outcome::Terminated));
}

/// A cluster's daemons hear every fact on the shared stream, their own included: a fact
/// already recorded is known (not journaled again), a later run end is not news, an
/// earlier one is.
#[tokio::test(start_paused = true)]
async fn a_fact_already_recorded_is_known() {
    let r = rig(vec![]);
    let launch = InstanceLaunched {
        tenant: "acme".into(),
        run: "r1".into(),
        provider: "ec2".into(),
        region: REGION.into(),
        instance_id: "i-0a".into(),
        max_lifetime_s: Some(60),
        ts_ms: NOW,
    };
    let end = |ts_ms| {
        Fact::RunEnded(RunEnded {
            tenant: "acme".into(),
            run: "r1".into(),
            ts_ms,
        })
    };
    assert!(!r.wd.knows(&launch.clone().into()));
    r.wd.record(launch.clone());
    assert!(r.wd.knows(&launch.clone().into()));
    let relaunched = InstanceLaunched {
        max_lifetime_s: Some(30),
        ..launch
    };
    assert!(!r.wd.knows(&relaunched.into()));
    assert!(!r.wd.knows(&end(NOW + 10)));
    r.wd.record(end(NOW + 10));
    assert!(r.wd.knows(&end(NOW + 10)) && r.wd.knows(&end(NOW + 20)));
    assert!(!r.wd.knows(&end(NOW + 5)));
}
