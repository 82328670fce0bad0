//! What the watchdog must never do, against moto_server.

mod common;

use std::sync::Arc;

use common::moto::Moto;
use common::*;
use fusebox_watchdog::{ManualClock, Outcome, Reason, WatchdogConfig};

const REGION: &str = "us-east-1";

/// A deadline tag already passed.
fn overdue(tenant: &str, run: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut extra = extra.to_vec();
    extra.push(("fusebox:deadline", "2020-01-01T00:00:00Z"));
    tags(tenant, run, &extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untagged_and_protected_instances_survive() {
    let moto = Moto::start();
    let ec2 = client(&moto.url(), REGION);
    let control = launch(&ec2, 1, &overdue("acme", "r1", &[])).await.remove(0);
    let untagged = launch(&ec2, 1, &[]).await.remove(0);
    let unmanaged = launch(
        &ec2,
        1,
        &[
            ("fusebox:managed".to_owned(), "false".to_owned()),
            (
                "fusebox:deadline".to_owned(),
                "2020-01-01T00:00:00Z".to_owned(),
            ),
        ],
    )
    .await
    .remove(0);
    let protected = launch(
        &ec2,
        1,
        &overdue("acme", "r1", &[("fusebox:protect", "true")]),
    )
    .await
    .remove(0);

    let r = rig(
        config(&moto.url(), &[REGION]),
        Arc::new(ManualClock::new(real_now_ms())),
    );
    let report = r.wd.sweep().await;
    assert!(
        is_done(&state(&ec2, &control).await),
        "the overdue control instance survived"
    );
    for id in [&untagged, &unmanaged, &protected] {
        assert_eq!(state(&ec2, id).await, "running", "{id} was touched");
    }
    assert_eq!(report.protected, 1);
    let rec = r.sink.snapshot();
    assert_eq!(rec.protected.len(), 1);
    assert_eq!(rec.protected[0].instance_id, protected);
    assert_eq!(rec.terminations.len(), 1);
    assert_eq!(r.wd.stats().protected_overdue_total, 1);
    assert_eq!(r.wd.stats().protected_instances, 1);

    // Reported once, not on every sweep.
    r.wd.sweep().await;
    assert_eq!(r.sink.snapshot().protected.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_terminates_nothing_and_reports_once() {
    let moto = Moto::start();
    let ec2 = client(&moto.url(), REGION);
    let ids = launch(&ec2, 3, &overdue("acme", "r1", &[])).await;
    let cfg = WatchdogConfig {
        dry_run: true,
        ..config(&moto.url(), &[REGION])
    };
    let r = rig(cfg, Arc::new(ManualClock::new(real_now_ms())));
    let report = r.wd.sweep().await;
    assert_eq!(report.overdue, 3);
    assert!(
        states(&ec2, &ids).await.values().all(|s| s == "running"),
        "dry run terminated something"
    );
    let rec = r.sink.snapshot();
    assert_eq!(rec.terminations.len(), 3);
    assert!(rec
        .terminations
        .iter()
        .all(|t| t.dry_run && t.outcome == Outcome::WouldTerminate));
    r.wd.sweep().await;
    assert_eq!(
        r.sink.snapshot().terminations.len(),
        3,
        "would-terminate reported twice"
    );
    assert_eq!(r.wd.stats().api_calls_by_op.get("TerminateInstances"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn termination_protection_is_reported_never_forced() {
    let moto = Moto::start();
    let ec2 = client(&moto.url(), REGION);
    let ids = launch(&ec2, 3, &overdue("acme", "r1", &[])).await;
    protect(&ec2, &ids[1]).await;
    let r = rig(
        config(&moto.url(), &[REGION]),
        Arc::new(ManualClock::new(real_now_ms())),
    );
    r.wd.sweep().await;
    let s = states(&ec2, &ids).await;
    assert!(is_done(&s[&ids[0]]) && is_done(&s[&ids[2]]), "{s:?}");
    assert_eq!(s[&ids[1]], "running");
    let attr = ec2
        .describe_instance_attribute()
        .instance_id(&ids[1])
        .attribute(aws_sdk_ec2::types::InstanceAttributeName::DisableApiTermination)
        .send()
        .await
        .unwrap();
    assert_eq!(
        attr.disable_api_termination().and_then(|v| v.value()),
        Some(true),
        "protection was removed"
    );
    let rec = r.sink.snapshot();
    let outcome = |id: &str| {
        rec.terminations
            .iter()
            .find(|t| t.instance_id == id)
            .map(|t| t.outcome)
    };
    assert_eq!(outcome(&ids[1]), Some(Outcome::TerminationProtected));
    assert_eq!(outcome(&ids[0]), Some(Outcome::Terminated));
    assert_eq!(outcome(&ids[2]), Some(Outcome::Terminated));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blast_radius_limit_holds_when_the_whole_fleet_looks_overdue() {
    let moto = Moto::start();
    let ec2 = client(&moto.url(), REGION);
    let t0 = real_now_ms();
    let fleet = launch(&ec2, 10, &tags("acme", "r1", &[])).await;
    let cfg = WatchdogConfig {
        max_terminations_per_sweep: 3,
        ..config(&moto.url(), &[REGION])
    };
    let r = rig(cfg, Arc::new(ManualClock::new(t0)));
    r.wd.sweep().await;
    assert_eq!(r.wd.stats().instances_by_state.get("running"), Some(&10));
    // A clock jump of two days makes every instance look past its 24 h default lifetime.
    r.clock.set(t0 + 2 * 86_400_000);
    let report = r.wd.sweep().await;
    let s = states(&ec2, &fleet).await;
    assert_eq!(s.values().filter(|s| is_done(s)).count(), 3, "{s:?}");
    assert_eq!((report.overdue, report.held), (10, 7));
    let alert = report.alert.expect("alert in the report");
    assert!(
        alert.why.contains("max_terminations_per_sweep = 3"),
        "{}",
        alert.why
    );
    assert_eq!(r.sink.snapshot().alerts.len(), 1);
    let stats = r.wd.stats();
    assert!(stats.blast_radius_alert);
    assert_eq!(stats.blast_radius_trips_total, 1);
    assert!(r
        .sink
        .snapshot()
        .terminations
        .iter()
        .all(|t| t.reason == Reason::MaxLifetime));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_limit_counts_the_whole_fleet() {
    let moto = Moto::start();
    let ec2 = client(&moto.url(), REGION);
    let bad = launch(&ec2, 8, &overdue("acme", "r1", &[])).await;
    launch(&ec2, 12, &tags("acme", "r2", &[])).await;
    let cfg = WatchdogConfig {
        max_termination_share: 0.25,
        ..config(&moto.url(), &[REGION])
    };
    let r = rig(cfg, Arc::new(ManualClock::new(real_now_ms())));
    let report = r.wd.sweep().await;
    // 25 % of 20 managed instances is 5.
    assert_eq!(
        states(&ec2, &bad)
            .await
            .values()
            .filter(|s| is_done(s))
            .count(),
        5
    );
    assert_eq!(report.held, 3);
    assert!(report.alert.unwrap().why.contains("max_termination_share"));
}
