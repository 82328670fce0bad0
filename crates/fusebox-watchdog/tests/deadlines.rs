//! Deadline timers and run-end checks against moto_server, on a manual clock.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::moto::Moto;
use common::*;
use fusebox_watchdog::{InstanceLaunched, ManualClock, Outcome, Reason, RunEnded};

const REGION: &str = "us-east-1";

fn launched(run: &str, id: &str, max_lifetime_s: Option<u64>, ts_ms: u64) -> InstanceLaunched {
    InstanceLaunched {
        tenant: "acme".into(),
        run: run.into(),
        provider: "ec2".into(),
        region: REGION.into(),
        instance_id: id.into(),
        max_lifetime_s,
        ts_ms,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_live_instance_dies_at_its_absolute_deadline() {
    let moto = Moto::start();
    let ec2 = client(&moto.url(), REGION);
    // B: only the launch event's lifetime (two hours). Launched before t0 is read, because
    // a fresh moto can take seconds over its first launch and B's clock starts at LaunchTime.
    let b = launch(&ec2, 1, &tags("acme", "r1", &[])).await.remove(0);
    let t0 = real_now_ms();
    // A: absolute deadline tag in one hour.
    let a = launch(
        &ec2,
        1,
        &tags(
            "acme",
            "r1",
            &[("fusebox:deadline", &rfc3339(t0 + 3_600_000))],
        ),
    )
    .await
    .remove(0);

    let r = rig(
        config(&moto.url(), &[REGION]),
        Arc::new(ManualClock::new(t0)),
    );
    // The run reported the launches but never reported the instances live.
    r.wd.record(launched("r1", &a, None, t0));
    r.wd.record(launched("r1", &b, Some(7_200), t0));
    let running = Running::start(&r.wd);
    eventually("first sweep", || async { r.wd.stats().passes_total >= 1 }).await;

    r.clock.set(t0 + 3_600_000 - 2_000);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        state(&ec2, &a).await,
        "running",
        "terminated before its deadline"
    );

    r.clock.set(t0 + 3_600_000);
    eventually("A terminated at its deadline", || async {
        is_done(&state(&ec2, &a).await)
    })
    .await;
    assert_eq!(state(&ec2, &b).await, "running");

    // B's LaunchTime is at or before t0, so its lifetime is over at t0 + 2 h.
    r.clock.set(t0 + 7_200_000);
    eventually("B terminated at launch + event lifetime", || async {
        is_done(&state(&ec2, &b).await)
    })
    .await;
    running.stop().await;

    let rec = r.sink.snapshot();
    let by_id = |id: &str| {
        rec.terminations
            .iter()
            .filter(|t| t.instance_id == id)
            .cloned()
            .collect::<Vec<_>>()
    };
    let (ta, tb) = (by_id(&a), by_id(&b));
    assert_eq!(ta.len(), 1, "{ta:?}");
    assert_eq!(
        (ta[0].reason, ta[0].outcome),
        (Reason::Deadline, Outcome::Terminated)
    );
    assert_eq!(ta[0].deadline_ms / 1000, (t0 + 3_600_000) / 1000);
    assert!(!ta[0].dry_run);
    assert_eq!(ta[0].subject(), "fusebox.watchdog.acme.terminated");
    assert_eq!(tb.len(), 1, "{tb:?}");
    assert_eq!(
        (tb[0].reason, tb[0].outcome),
        (Reason::MaxLifetime, Outcome::Terminated)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftovers_are_terminated_grace_after_the_run_ends() {
    let moto = Moto::start();
    let ec2 = client(&moto.url(), REGION);
    let t0 = real_now_ms();
    let ended = launch(&ec2, 2, &tags("acme", "r1", &[])).await;
    let other = launch(&ec2, 1, &tags("acme", "r2", &[])).await.remove(0);

    let cfg = fusebox_watchdog::WatchdogConfig {
        grace_s: 300,
        ..config(&moto.url(), &[REGION])
    };
    let r = rig(cfg, Arc::new(ManualClock::new(t0)));
    // Only one of the two was ever reported: the verify check must find the other anyway.
    r.wd.record(launched("r1", &ended[0], None, t0));
    let running = Running::start(&r.wd);
    eventually("first sweep", || async { r.wd.stats().passes_total >= 1 }).await;
    r.wd.record(RunEnded {
        tenant: "acme".into(),
        run: "r1".into(),
        ts_ms: t0 + 1_000,
    });
    assert!(r.wd.stats().next_deadline_ms <= Some(t0 + 301_000));

    r.clock.set(t0 + 300_000);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        states(&ec2, &ended).await.values().all(|s| s == "running"),
        "terminated within grace"
    );

    r.clock.set(t0 + 301_000);
    eventually("leftovers terminated", || async {
        states(&ec2, &ended).await.values().all(|s| is_done(s))
    })
    .await;
    running.stop().await;
    assert_eq!(
        state(&ec2, &other).await,
        "running",
        "another run's instance was touched"
    );

    let rec = r.sink.snapshot();
    assert_eq!(rec.terminations.len(), 2, "{:?}", rec.terminations);
    for t in &rec.terminations {
        assert_eq!(
            (t.reason, t.outcome),
            (Reason::Leftover, Outcome::Terminated)
        );
        assert_eq!(t.run.as_deref(), Some("r1"));
    }
}
