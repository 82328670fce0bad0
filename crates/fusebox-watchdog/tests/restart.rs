//! A restart mid-way: a new watchdog fed the same facts forgets nothing and repeats nothing.

mod common;

use std::sync::Arc;

use common::moto::Moto;
use common::*;
use fusebox_watchdog::{Fact, InstanceLaunched, ManualClock, Reason, RunEnded, WatchdogConfig};

const REGION: &str = "us-east-1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_neither_repeats_nor_forgets() {
    let moto = Moto::start();
    let ec2 = client(&moto.url(), REGION);
    let t0 = real_now_ms();
    let deadline = |mins: u64| rfc3339(t0 + mins * 60_000);
    let a = launch(
        &ec2,
        1,
        &tags("acme", "r1", &[("fusebox:deadline", &deadline(10))]),
    )
    .await
    .remove(0);
    let b = launch(
        &ec2,
        1,
        &tags("acme", "r1", &[("fusebox:deadline", &deadline(20))]),
    )
    .await
    .remove(0);
    let c = launch(&ec2, 1, &tags("acme", "r3", &[])).await.remove(0);

    let launched = |run: &str, id: &str| {
        Fact::InstanceLaunched(InstanceLaunched {
            tenant: "acme".into(),
            run: run.into(),
            provider: "ec2".into(),
            region: REGION.into(),
            instance_id: id.into(),
            max_lifetime_s: None,
            ts_ms: t0,
        })
    };
    let mut log = vec![launched("r1", &a), launched("r1", &b), launched("r3", &c)];
    let clock = Arc::new(ManualClock::new(t0));
    let cfg = WatchdogConfig {
        grace_s: 900,
        ..config(&moto.url(), &[REGION])
    };

    // First life: A's deadline passes, r3 ends, then the daemon stops before r3's grace.
    let first = rig(cfg.clone(), clock.clone());
    first.wd.restore(log.clone());
    let running = Running::start(&first.wd);
    eventually("first sweep", || async {
        first.wd.stats().passes_total >= 1
    })
    .await;
    clock.set(t0 + 10 * 60_000);
    eventually("A terminated", || async { is_done(&state(&ec2, &a).await) }).await;
    let end = RunEnded {
        tenant: "acme".into(),
        run: "r3".into(),
        ts_ms: t0 + 11 * 60_000,
    };
    first.wd.record(end.clone());
    log.push(Fact::RunEnded(end));
    clock.set(t0 + 12 * 60_000);
    running.stop().await;
    assert_eq!(first.sink.snapshot().terminations.len(), 1);

    // Second life: same log, same cloud.
    let second = rig(cfg, clock.clone());
    second.wd.restore(log);
    let running = Running::start(&second.wd);
    eventually("first sweep", || async {
        second.wd.stats().passes_total >= 1
    })
    .await;
    assert!(
        second.sink.snapshot().terminations.is_empty(),
        "A reported again after restart"
    );
    assert_eq!(state(&ec2, &b).await, "running");
    assert_eq!(state(&ec2, &c).await, "running");

    clock.set(t0 + 20 * 60_000);
    eventually("B terminated after restart", || async {
        is_done(&state(&ec2, &b).await)
    })
    .await;
    clock.set(t0 + 26 * 60_000);
    eventually("r3's leftover terminated after restart", || async {
        is_done(&state(&ec2, &c).await)
    })
    .await;
    running.stop().await;

    let rec = second.sink.snapshot();
    let reasons: Vec<_> = rec
        .terminations
        .iter()
        .map(|t| (t.instance_id.clone(), t.reason))
        .collect();
    assert_eq!(
        reasons,
        vec![(b.clone(), Reason::Deadline), (c.clone(), Reason::Leftover)]
    );
}
