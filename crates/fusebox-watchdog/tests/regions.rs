//! Several regions, throttling and a failing region, through a fault-injecting proxy.

mod common;

use std::sync::Arc;

use common::moto::Moto;
use common::proxy::{FaultProxy, Faults};
use common::*;
use fusebox_watchdog::{ManualClock, RetryConfig, WatchdogConfig};

const REGIONS: [&str; 3] = ["us-east-1", "eu-west-1", "ap-southeast-2"];

fn overdue(run: &str) -> Vec<(String, String)> {
    tags("acme", run, &[("fusebox:deadline", "2020-01-01T00:00:00Z")])
}

fn fast_retries(endpoint: &str, attempts: u32) -> WatchdogConfig {
    WatchdogConfig {
        retry: RetryConfig {
            max_attempts: attempts,
            initial_backoff_ms: 10,
            max_backoff_ms: 50,
        },
        ..config(endpoint, &REGIONS)
    }
}

/// Launches two overdue instances in every region; returns (region, ids).
async fn fleet(url: &str) -> Vec<(&'static str, Vec<String>)> {
    let mut out = Vec::new();
    for region in REGIONS {
        out.push((
            region,
            launch(&client(url, region), 2, &overdue("r1")).await,
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_region_is_swept() {
    let moto = Moto::start();
    let fleet = fleet(&moto.url()).await;
    let r = rig(
        config(&moto.url(), &REGIONS),
        Arc::new(ManualClock::new(real_now_ms())),
    );
    let report = r.wd.sweep().await;
    assert!(
        report.region_errors.is_empty(),
        "{:?}",
        report.region_errors
    );
    for (region, ids) in &fleet {
        let s = states(&client(&moto.url(), region), ids).await;
        assert!(s.values().all(|s| is_done(s)), "{region}: {s:?}");
    }
    let rec = r.sink.snapshot();
    assert_eq!(rec.terminations.len(), 6);
    for (region, ids) in &fleet {
        for id in ids {
            let t = rec
                .terminations
                .iter()
                .find(|t| &t.instance_id == id)
                .expect("reported");
            assert_eq!(t.region, *region);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_retried_until_it_succeeds() {
    let moto = Moto::start();
    let fleet = fleet(&moto.url()).await;
    let proxy = FaultProxy::start(
        moto.port,
        Faults {
            throttle_next: 4,
            ..Default::default()
        },
    )
    .await;
    let r = rig(
        fast_retries(&proxy.url(), 6),
        Arc::new(ManualClock::new(real_now_ms())),
    );
    let report = r.wd.sweep().await;
    assert!(
        report.region_errors.is_empty(),
        "{:?}",
        report.region_errors
    );
    for (region, ids) in &fleet {
        let s = states(&client(&moto.url(), region), ids).await;
        assert!(s.values().all(|s| is_done(s)), "{region}: {s:?}");
    }
    let faulted: u64 = proxy.counts.lock().unwrap().faulted.values().sum();
    assert_eq!(faulted, 4);
    let errors: u64 = r.wd.stats().api_errors_by_op.values().sum();
    assert_eq!(
        errors, 4,
        "every throttled request is counted as an API error"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_region_does_not_stop_the_others() {
    let moto = Moto::start();
    let fleet = fleet(&moto.url()).await;
    let faults = Faults {
        fail_region: Some("eu-west-1".into()),
        ..Default::default()
    };
    let proxy = FaultProxy::start(moto.port, faults).await;
    let r = rig(
        fast_retries(&proxy.url(), 3),
        Arc::new(ManualClock::new(real_now_ms())),
    );
    let report = r.wd.sweep().await;
    assert_eq!(
        report.region_errors.keys().collect::<Vec<_>>(),
        vec!["eu-west-1"]
    );
    for (region, ids) in &fleet {
        let s = states(&client(&moto.url(), region), ids).await;
        let want_done = *region != "eu-west-1";
        assert!(
            s.values().all(|s| is_done(s) == want_done),
            "{region}: {s:?}"
        );
    }
    // Bounded: three attempts for the one listing of the failing region.
    assert_eq!(
        proxy.counts.lock().unwrap().by_region.get("eu-west-1"),
        Some(&3)
    );
    assert_eq!(
        r.wd.stats().api_errors_by_op.get("DescribeInstances"),
        Some(&3)
    );

    // When the region recovers, the next sweep finishes the job.
    proxy.faults.lock().unwrap().fail_region = None;
    let report = r.wd.sweep().await;
    assert!(report.region_errors.is_empty());
    let ids = &fleet[1].1;
    assert!(states(&client(&moto.url(), "eu-west-1"), ids)
        .await
        .values()
        .all(|s| is_done(s)));
}
