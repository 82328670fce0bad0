//! Measurements for the watchdog against a private moto_server on loopback:
//!
//! 1. how long past its deadline an instance lives with the one-shot timer (system clock);
//! 2. a sweep over 2,000 managed instances in 3 regions: wall time and API requests, with
//!    nothing overdue and with everything overdue.
//!
//! `cargo run --release -p fusebox-watchdog --example bench [-- INSTANCES]`
//! Needs `moto_server` on PATH (scripts/setup.sh). Prints figures; asserts nothing.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::moto::Moto;
use common::proxy::{FaultProxy, Faults};
use common::*;
use fusebox_watchdog::{
    Clock, Ec2Provider, InstanceLaunched, ManualClock, MemorySink, SystemClock, Watchdog,
    WatchdogConfig,
};

const REGIONS: [&str; 3] = ["us-east-1", "eu-west-1", "ap-southeast-2"];
const TIMER_SAMPLES: u64 = 20;

#[tokio::main]
async fn main() {
    let fleet: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000);
    let moto = Moto::start();
    timer_lateness(&moto).await;
    sweep_cost(&moto, fleet).await;
}

/// Instances with deadlines 5 s ahead and then one a second, watched by a running watchdog
/// on the system clock.
async fn timer_lateness(moto: &Moto) {
    let ec2 = client(&moto.url(), REGIONS[0]);
    // A fresh moto takes seconds over its first launch; warm it so no deadline passes
    // before the watchdog starts.
    launch(&ec2, 1, &[]).await;
    let t0 = SystemClock.now_ms();
    let mut facts = Vec::new();
    for n in 0..TIMER_SAMPLES {
        let deadline = t0 + 5_000 + n * 1_000;
        let id = launch(
            &ec2,
            1,
            &tags(
                "bench",
                "timers",
                &[("fusebox:deadline", &rfc3339(deadline))],
            ),
        )
        .await
        .remove(0);
        facts.push(InstanceLaunched {
            tenant: "bench".into(),
            run: "timers".into(),
            provider: "ec2".into(),
            region: REGIONS[0].into(),
            instance_id: id,
            max_lifetime_s: None,
            ts_ms: t0,
        });
    }
    let sink = Arc::new(MemorySink::default());
    let cfg = WatchdogConfig {
        max_termination_share: 1.0,
        ..config(&moto.url(), &REGIONS[..1])
    };
    let wd = Watchdog::new(
        cfg.clone(),
        Ec2Provider::new(sdk_config(), &cfg),
        Arc::new(SystemClock),
        sink.clone(),
    )
    .expect("config");
    wd.restore(facts.into_iter().map(Into::into));
    let running = Running::start(&wd);
    let give_up = Instant::now() + Duration::from_secs(60);
    while sink.snapshot().terminations.len() < TIMER_SAMPLES as usize && Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running.stop().await;
    // `at_ms` is taken when TerminateInstances has answered: the instance is shutting down.
    let mut late: Vec<u64> = sink
        .snapshot()
        .terminations
        .iter()
        .map(|t| t.at_ms.saturating_sub(t.deadline_ms))
        .collect();
    late.sort_unstable();
    println!(
        "one-shot timer: {} of {TIMER_SAMPLES} instances terminated",
        late.len()
    );
    if let (Some(min), Some(max)) = (late.first(), late.last()) {
        println!(
            "  time past deadline until TerminateInstances answered: min {min} ms, median {} ms, max {max} ms",
            late[late.len() / 2]
        );
    }
}

async fn sweep_cost(moto: &Moto, fleet: usize) {
    let started = Instant::now();
    for (n, region) in REGIONS.iter().enumerate() {
        let ec2 = client(&moto.url(), region);
        let mut left = fleet / REGIONS.len() + usize::from(n < fleet % REGIONS.len());
        while left > 0 {
            let batch = left.min(100);
            launch(
                &ec2,
                batch as i32,
                &tags("bench", &format!("sweep-{region}"), &[]),
            )
            .await;
            left -= batch;
        }
    }
    println!(
        "\nsweep: launched {fleet} managed instances in {} regions in {:.1} s",
        REGIONS.len(),
        secs(started)
    );

    let proxy = FaultProxy::start(moto.port, Faults::default()).await;
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let cfg = WatchdogConfig {
        max_terminations_per_sweep: fleet,
        max_termination_share: 1.0,
        terminate_batch_size: 100,
        ..config(&proxy.url(), &REGIONS)
    };
    let wd = Watchdog::new(
        cfg.clone(),
        Ec2Provider::new(sdk_config(), &cfg),
        clock.clone(),
        Arc::new(MemorySink::default()),
    )
    .expect("config");

    for round in 1..=3 {
        let before = requests(&proxy);
        let t = Instant::now();
        let r = wd.sweep().await;
        println!(
            "  sweep {round}, nothing overdue: {:.0} ms, {} managed listed, {} API requests, errors {:?}",
            secs(t) * 1000.0,
            r.listed,
            requests(&proxy) - before,
            r.region_errors
        );
    }
    // Two days later every instance is past its 24 h default lifetime.
    clock.advance(Duration::from_secs(2 * 86_400));
    let before = requests(&proxy);
    let t = Instant::now();
    let r = wd.sweep().await;
    println!(
        "  sweep, all {} overdue: {:.0} ms, {} terminated, {} API requests ({:?})",
        r.overdue,
        secs(t) * 1000.0,
        r.terminations.len(),
        requests(&proxy) - before,
        proxy.counts.lock().unwrap().forwarded
    );
}

fn requests(p: &FaultProxy) -> u64 {
    let c = p.counts.lock().unwrap();
    c.forwarded.values().sum::<u64>() + c.faulted.values().sum::<u64>()
}

fn secs(since: Instant) -> f64 {
    since.elapsed().as_secs_f64()
}
