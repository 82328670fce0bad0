//! The start-up permission check uses EC2's DryRun flag and names what is missing.

mod common;

use std::sync::Arc;

use common::moto::Moto;
use common::proxy::{FaultProxy, Faults};
use common::*;
use fusebox_watchdog::{ManualClock, Op, PermissionStatus};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_permission_check() {
    let moto = Moto::start();
    launch(
        &client(&moto.url(), "us-east-1"),
        1,
        &tags("acme", "r1", &[]),
    )
    .await;
    let r = rig(
        config(&moto.url(), &["us-east-1"]),
        Arc::new(ManualClock::new(real_now_ms())),
    );
    let checks = r.wd.check_permissions().await;
    assert_eq!(checks.len(), 2);
    assert!(
        checks.iter().all(|c| c.status == PermissionStatus::Granted),
        "{checks:?}"
    );

    let faults = Faults {
        deny_dry_run: Some("TerminateInstances".into()),
        ..Default::default()
    };
    let proxy = FaultProxy::start(moto.port, faults).await;
    let r = rig(
        config(&proxy.url(), &["us-east-1"]),
        Arc::new(ManualClock::new(real_now_ms())),
    );
    let checks = r.wd.check_permissions().await;
    let term = checks
        .iter()
        .find(|c| c.op == Op::TerminateInstances)
        .unwrap();
    assert!(
        matches!(term.status, PermissionStatus::Missing(_)),
        "{term:?}"
    );
    assert!(
        term.describe().contains("MISSING ec2:TerminateInstances"),
        "{}",
        term.describe()
    );
    let desc = checks
        .iter()
        .find(|c| c.op == Op::DescribeInstances)
        .unwrap();
    assert_eq!(desc.status, PermissionStatus::Granted);
    // The check terminated nothing.
    assert_eq!(
        proxy
            .counts
            .lock()
            .unwrap()
            .forwarded
            .get("TerminateInstances"),
        None
    );
}
