//! Shared test harness: moto on loopback, dummy credentials, launching tagged instances.
// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

pub use fusebox_e2e::moto;
pub mod proxy;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_ec2::config::{Credentials, Region, SharedCredentialsProvider};
use aws_sdk_ec2::types::{
    AttributeBooleanValue, InstanceType, ResourceType, Tag, TagSpecification,
};
use aws_sdk_ec2::Client;
use fusebox_watchdog::{
    Clock, Ec2Provider, ManualClock, MemorySink, SystemClock, Watchdog, WatchdogConfig,
};

/// An AMI id moto ships in its image list.
pub const AMI: &str = "ami-12c6146b";
/// A cron that never fires during a test, so only timers and explicit sweeps act.
pub const NEVER: &str = "0 0 0 1 1 * 2099";

pub fn sdk_config() -> SdkConfig {
    SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "testing", "testing", None, None, "tests",
        )))
        .region(Region::new("us-east-1"))
        .build()
}

/// A plain EC2 client for setting up and checking, straight to `endpoint`.
pub fn client(endpoint: &str, region: &str) -> Client {
    let conf = aws_sdk_ec2::config::Builder::from(&sdk_config())
        .region(Region::new(region.to_owned()))
        .endpoint_url(endpoint)
        .build();
    Client::from_conf(conf)
}

pub fn config(endpoint: &str, regions: &[&str]) -> WatchdogConfig {
    WatchdogConfig {
        endpoint_url: Some(endpoint.to_owned()),
        regions: regions.iter().map(|r| r.to_string()).collect(),
        sweep_cron: NEVER.to_owned(),
        // Most tests make a whole small fleet overdue on purpose; the blast-radius tests
        // set their own limits.
        max_termination_share: 1.0,
        ..Default::default()
    }
}

/// Ownership tags for a run, plus extras.
pub fn tags(tenant: &str, run: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut t = vec![
        ("fusebox:managed".to_owned(), "true".to_owned()),
        ("fusebox:tenant".to_owned(), tenant.to_owned()),
        ("fusebox:run".to_owned(), run.to_owned()),
    ];
    t.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    t
}

/// RunInstances with the tags in TagSpecifications, as LAUNCHING.md tells launchers to.
pub async fn launch(client: &Client, count: i32, tags: &[(String, String)]) -> Vec<String> {
    let mut req = client
        .run_instances()
        .image_id(AMI)
        .instance_type(InstanceType::T2Micro)
        .min_count(count)
        .max_count(count);
    if !tags.is_empty() {
        let spec = TagSpecification::builder()
            .resource_type(ResourceType::Instance)
            .set_tags(Some(
                tags.iter()
                    .map(|(k, v)| Tag::builder().key(k).value(v).build())
                    .collect(),
            ))
            .build();
        req = req.tag_specifications(spec);
    }
    let out = req.send().await.expect("RunInstances");
    out.instances()
        .iter()
        .map(|i| i.instance_id().unwrap().to_owned())
        .collect()
}

pub async fn protect(client: &Client, id: &str) {
    client
        .modify_instance_attribute()
        .instance_id(id)
        .disable_api_termination(AttributeBooleanValue::builder().value(true).build())
        .send()
        .await
        .expect("ModifyInstanceAttribute");
}

/// Instance id → state name, straight from the cloud.
pub async fn states(client: &Client, ids: &[String]) -> HashMap<String, String> {
    let out = client
        .describe_instances()
        .set_instance_ids(Some(ids.to_vec()))
        .send()
        .await
        .expect("describe");
    out.reservations()
        .iter()
        .flat_map(|r| r.instances())
        .map(|i| {
            let state = i
                .state()
                .and_then(|s| s.name())
                .map(|n| n.as_str().to_owned())
                .unwrap_or_default();
            (i.instance_id().unwrap().to_owned(), state)
        })
        .collect()
}

pub async fn state(client: &Client, id: &str) -> String {
    states(client, &[id.to_owned()])
        .await
        .remove(id)
        .unwrap_or_default()
}

pub fn is_done(state: &str) -> bool {
    state == "terminated" || state == "shutting-down"
}

/// Waits (real time) until `check` holds; panics with `what` after 15 s.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn real_now_ms() -> u64 {
    SystemClock.now_ms()
}

/// RFC 3339 for a Unix-ms instant.
pub fn rfc3339(ms: u64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms as i64)
        .unwrap()
        .to_rfc3339()
}

/// A watchdog on a manual clock starting at the real time (moto's LaunchTime is real).
pub struct Rig {
    pub wd: Watchdog<Ec2Provider>,
    pub clock: Arc<ManualClock>,
    pub sink: Arc<MemorySink>,
}

pub fn rig(cfg: WatchdogConfig, clock: Arc<ManualClock>) -> Rig {
    // RUST_LOG=fusebox_watchdog=debug shows the watchdog's own account of a failing test.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let sink = Arc::new(MemorySink::default());
    let provider = Ec2Provider::new(sdk_config(), &cfg);
    let wd = Watchdog::new(cfg, provider, clock.clone(), sink.clone()).expect("config");
    Rig { wd, clock, sink }
}

/// Runs the watchdog's loop in the background; dropping the guard stops it.
pub struct Running {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Running {
    pub fn start(wd: &Watchdog<Ec2Provider>) -> Running {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let wd = wd.clone();
        let task = tokio::spawn(async move {
            wd.run(async move {
                let _ = rx.await;
            })
            .await;
        });
        Running {
            stop: Some(tx),
            task: Some(task),
        }
    }

    /// Graceful stop: waits for the loop to return.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("watchdog loop panicked");
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
