//! One cloud watchdog per cluster (issue 49 §2), real processes on loopback only: the
//! 3-node nats-server cluster of deploy/nats/ with run partitioning on, three `fuseboxd`
//! in cluster mode with the watchdog on moto_server (an EC2 API). One daemon at a time
//! holds the watchdog role; the others keep the facts and the halt.
//!
//! * the holder SIGKILLed between two sweeps: another daemon takes the role within a
//!   sweep interval, and a run-end deadline whose facts came from a third daemon's
//!   partition still fires, once (moto shows the instance terminated; one termination
//!   is logged and announced across the cluster);
//! * the holder SIGKILLed in the middle of a pass, its TerminateInstances held in flight
//!   by a proxy in front of moto: the call never lands, the new holder's first sweep
//!   terminates the instance, moto gets one TerminateInstances, one termination is
//!   logged;
//! * a blast-radius halt on the holder: no daemon terminates anything — including the
//!   one that takes over after the holder is killed, with the overdue count back under
//!   the limit — until an operator resumes it, once, from any daemon's answer.

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_ec2::types::{InstanceType, ResourceType, Tag, TagSpecification};
use fusebox_e2e::cluster::{partition_of, wait_owners, ClusterDaemon, NatsCluster};
use fusebox_e2e::cluster_watchdog::{start_watchdog_daemon, terminated, wait_holder};
use fusebox_e2e::deploy_nats::placeholder_password;
use fusebox_e2e::ec2_proxy::Ec2Proxy;
use fusebox_e2e::fleet::TENANTS;
use fusebox_e2e::{event, now_ms, Moto};
use futures_util::StreamExt;
use serde_json::{json, Value};

/// A sweep every this many seconds: longer than a takeover (2 s lease, claims every
/// half second), so "within a sweep interval" is a real bound.
const SWEEP_S: u64 = 4;

fn ec2(endpoint: &str) -> aws_sdk_ec2::Client {
    let conf = aws_sdk_ec2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .build();
    aws_sdk_ec2::Client::from_conf(conf)
}

/// Launches a managed instance of `tenant`/`run` with the extra tag `extra`.
async fn launch(ec2: &aws_sdk_ec2::Client, tenant: &str, run: &str, extra: (&str, &str)) -> String {
    let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build();
    let out = ec2
        .run_instances()
        .image_id("ami-12c6146b")
        .instance_type(InstanceType::T3Micro)
        .min_count(1)
        .max_count(1)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::Instance)
                .tags(tag("fusebox:managed", "true"))
                .tags(tag("fusebox:tenant", tenant))
                .tags(tag("fusebox:run", run))
                .tags(tag(extra.0, extra.1))
                .build(),
        )
        .send()
        .await
        .expect("RunInstances on moto");
    out.instances()[0].instance_id().unwrap().to_owned()
}

async fn state(ec2: &aws_sdk_ec2::Client, id: &str) -> String {
    let out = ec2
        .describe_instances()
        .instance_ids(id)
        .send()
        .await
        .expect("DescribeInstances on moto");
    out.reservations()[0].instances()[0]
        .state()
        .and_then(|s| s.name())
        .map(|n| n.as_str().to_owned())
        .unwrap_or_default()
}

fn gone(state: &str) -> bool {
    state == "terminated" || state == "shutting-down"
}

/// Waits until moto says `id` is gone (terminating or terminated).
async fn wait_gone(
    ec2: &aws_sdk_ec2::Client,
    id: &str,
    within: Duration,
    logs: impl Fn() -> String,
) {
    let deadline = Instant::now() + within;
    loop {
        let now = state(ec2, id).await;
        if gone(&now) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{id} still {now} after {within:?}:\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `fusebox watchdog <args> --json` as the operator; the answers, one JSON per line.
fn fusebox_watchdog(nats: &NatsCluster, args: &[&str]) -> (bool, Vec<Value>, String) {
    let out = Command::new(fusebox_e2e::bin("fusebox"))
        .arg("watchdog")
        .args(args)
        .arg("--json")
        .args(["--nats-url", &nats.urls().join(",")])
        .args(["--nats-user", "operator"])
        .args(["--nats-password", &placeholder_password("operator")])
        .output()
        .expect("running fusebox watchdog");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let text = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let answers = stdout
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    (out.status.success(), answers, text)
}

fn all_logs(daemons: &[ClusterDaemon]) -> String {
    daemons
        .iter()
        .map(|d| format!("===== {} =====\n{}", d.node_id, d.logs()))
        .collect()
}

/// Waits until `daemon`'s log has a line containing every one of `words`.
async fn wait_logged(daemon: &ClusterDaemon, words: &[&str], within: Duration) {
    let deadline = Instant::now() + within;
    while !daemon
        .logs()
        .lines()
        .any(|line| words.iter().all(|w| line.contains(w)))
    {
        assert!(
            Instant::now() < deadline,
            "{} never logged {words:?}:\n{}",
            daemon.node_id,
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Three daemons whose watchdogs call EC2 at `endpoint`.
fn start_three(
    dir: &std::path::Path,
    nats: &NatsCluster,
    endpoint: &str,
    extra: &str,
) -> Vec<ClusterDaemon> {
    ["d1", "d2", "d3"]
        .into_iter()
        .map(|node| start_watchdog_daemon(dir, node, &nats.urls(), endpoint, SWEEP_S, extra))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_killed_between_sweeps_the_deadline_still_fires_once() {
    let started = Instant::now();
    let moto = Moto::start();
    let nats = NatsCluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    // The run's end + grace is the deadline: only facts say when it is (the instance's
    // own tags allow an hour), so it fires only where the facts arrived.
    let grace_s = 15;
    let mut daemons = start_three(
        dir.path(),
        &nats,
        &moto.url(),
        &format!("grace_s = {grace_s}\n"),
    );
    let owners = wait_owners(
        &mut daemons.iter_mut().collect::<Vec<_>>(),
        Duration::from_secs(60),
    )
    .await;
    let holder = wait_holder(&daemons, &[], Duration::from_secs(30)).await;
    let operator = nats.connect("operator", None).await;
    let mut announced = operator
        .subscribe("fusebox.watchdog.*.terminated")
        .await
        .unwrap();
    operator.flush().await.unwrap();

    // A run served by another daemon than the holder: its facts reach the holder only
    // through the shared stream.
    let tenant = TENANTS[0];
    let run = (0..)
        .map(|i| format!("wd-{i}"))
        .find(|run| owners[partition_of(tenant, run) as usize] != daemons[holder].node_id)
        .unwrap();
    let ec2 = ec2(&moto.url());
    let instance = launch(&ec2, tenant, &run, ("fusebox:max-lifetime", "3600")).await;
    let client = nats.tenant_client(tenant, Duration::from_secs(10)).await;
    let t = now_ms();
    let events = [
        json!({"type":"run_started","agent":"builder"}),
        json!({"type":"instance_launched","provider":"ec2","region":"us-east-1","instance_id":instance}),
        json!({"type":"run_finished"}),
    ];
    for (seq, body) in (1u64..).zip(events) {
        let mut e = json!({"v":1,"id":format!("{run}-{seq}"),"tenant":tenant,"run":run,"seq":seq,"ts_ms":t + seq});
        e.as_object_mut()
            .unwrap()
            .extend(body.as_object().unwrap().clone());
        let e = event(e);
        assert!(
            client.gate(&e).await.decision().is_some(),
            "{e:?} not decided:\n{}",
            all_logs(&daemons)
        );
    }
    for (i, daemon) in daemons.iter().enumerate() {
        if owners[partition_of(tenant, &run) as usize] != daemon.node_id {
            let why = if i == holder { "holder" } else { "standby" };
            eprintln!("waiting for the facts on the {why} {}", daemon.node_id);
            wait_logged(
                daemon,
                &["watchdog fact from another daemon", "RunEnded", &run],
                Duration::from_secs(10),
            )
            .await;
        }
    }

    // Between two of the holder's sweeps: after one has ended, half an interval on.
    let passes = |d: &ClusterDaemon| d.logs().matches("watchdog pass").count();
    let before = passes(&daemons[holder]);
    let deadline = Instant::now() + Duration::from_secs(2 * SWEEP_S);
    while passes(&daemons[holder]) == before {
        assert!(
            Instant::now() < deadline,
            "the holder does not sweep:\n{}",
            daemons[holder].logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(SWEEP_S * 500)).await;
    let killed_at = Instant::now();
    // The deadline is the run end's `ts_ms` + grace; the takeover must also fit before it.
    let deadline_ms = t + 3 + grace_s * 1000;
    assert!(
        now_ms() + SWEEP_S * 1000 < deadline_ms,
        "too slow: the deadline comes before a takeover could"
    );
    daemons[holder].kill();
    let next = wait_holder(&daemons, &[holder], Duration::from_secs(3 * SWEEP_S)).await;
    let takeover = killed_at.elapsed();
    eprintln!(
        "role: {} killed, {} took over in {:.2} s (sweep every {SWEEP_S} s)",
        daemons[holder].node_id,
        daemons[next].node_id,
        takeover.as_secs_f64()
    );
    assert!(
        takeover < Duration::from_secs(SWEEP_S),
        "takeover took {takeover:?}"
    );

    wait_gone(
        &ec2,
        &instance,
        Duration::from_secs(grace_s + 3 * SWEEP_S),
        || all_logs(&daemons),
    )
    .await;
    // From the run end as the event says it (its `ts_ms`), which the deadline counts from.
    let fired = Duration::from_millis(now_ms() - (t + 3));
    // Two more sweeps: nobody terminates it again.
    tokio::time::sleep(Duration::from_secs(2 * SWEEP_S + 1)).await;
    let by_daemon: Vec<(String, Vec<String>)> = daemons
        .iter()
        .map(|d| (d.node_id.clone(), terminated(d)))
        .collect();
    let all: Vec<&String> = by_daemon.iter().flat_map(|(_, ids)| ids).collect();
    assert_eq!(
        all,
        vec![&instance],
        "{by_daemon:?}\n{}",
        all_logs(&daemons)
    );
    assert_eq!(
        by_daemon[next].1,
        vec![instance.clone()],
        "not terminated by the new holder"
    );
    let mut announcements = Vec::new();
    while let Ok(Some(message)) =
        tokio::time::timeout(Duration::from_millis(500), announced.next()).await
    {
        let record: Value = serde_json::from_slice(&message.payload).unwrap();
        announcements.push(record);
    }
    let terminations: Vec<&Value> = announcements
        .iter()
        .filter(|r| r["outcome"] == "terminated")
        .collect();
    assert_eq!(terminations.len(), 1, "{announcements:?}");
    assert_eq!(terminations[0]["instance_id"], instance.as_str());
    assert_eq!(terminations[0]["reason"], "leftover", "{announcements:?}");
    eprintln!(
        "deadline fired {:.1} s after the run end (grace {grace_s} s); whole test {:.1} s",
        fired.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halt_on_the_holder_stops_every_daemon_until_resumed() {
    let started = Instant::now();
    let moto = Moto::start();
    let ec2 = ec2(&moto.url());
    let past = ("fusebox:deadline", "2020-01-01T00:00:00Z");
    let first = launch(&ec2, TENANTS[0], "old-1", past).await;
    let second = launch(&ec2, TENANTS[0], "old-2", past).await;
    let nats = NatsCluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let extra =
        "on_blast_radius = \"halt\"\nmax_terminations_per_sweep = 1\nmax_termination_share = 1.0\n";
    let mut daemons = start_three(dir.path(), &nats, &moto.url(), extra);
    wait_owners(
        &mut daemons.iter_mut().collect::<Vec<_>>(),
        Duration::from_secs(60),
    )
    .await;
    let holder = wait_holder(&daemons, &[], Duration::from_secs(30)).await;

    // Two overdue against a limit of one: the holder halts, and every daemon hears it.
    for (i, daemon) in daemons.iter().enumerate() {
        let line = if i == holder {
            "watchdog halted (journaled)"
        } else {
            "the cluster's watchdog is HALTED"
        };
        wait_logged(daemon, &[line], Duration::from_secs(3 * SWEEP_S)).await;
    }
    let (ok, answers, text) = fusebox_watchdog(&nats, &["status"]);
    assert!(
        ok && answers.len() == 1 && answers[0]["halted"] == true,
        "{text}"
    );

    // One goes by other hands; the other fits the limit now. The holder dies; the
    // daemon taking over starts halted and leaves it alone.
    ec2.terminate_instances()
        .instance_ids(&first)
        .send()
        .await
        .expect("TerminateInstances on moto");
    daemons[holder].kill();
    let next = wait_holder(&daemons, &[holder], Duration::from_secs(3 * SWEEP_S)).await;
    wait_logged(&daemons[next], &["watchdog active"], Duration::from_secs(5)).await;
    let passes = |d: &ClusterDaemon| d.logs().matches("watchdog pass").count();
    let before = passes(&daemons[next]);
    let deadline = Instant::now() + Duration::from_secs(4 * SWEEP_S);
    while passes(&daemons[next]) < before + 2 {
        assert!(
            Instant::now() < deadline,
            "the new holder does not sweep:\n{}",
            daemons[next].logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        state(&ec2, &second).await,
        "running",
        "{}",
        all_logs(&daemons)
    );
    let (ok, answers, text) = fusebox_watchdog(&nats, &["status"]);
    assert!(
        ok && answers.len() == 1 && answers[0]["halted"] == true,
        "{text}"
    );

    let (ok, answers, text) = fusebox_watchdog(&nats, &["resume", "--by", "oncall"]);
    assert!(
        ok && answers.len() == 1 && answers[0]["resumed"] == true,
        "{text}"
    );
    wait_gone(&ec2, &second, Duration::from_secs(3 * SWEEP_S), || {
        all_logs(&daemons)
    })
    .await;
    for (i, daemon) in daemons.iter().enumerate() {
        if i != holder && i != next {
            wait_logged(
                daemon,
                &["the cluster's watchdog was resumed"],
                Duration::from_secs(5),
            )
            .await;
        }
    }
    let all: Vec<String> = daemons.iter().flat_map(terminated).collect();
    assert_eq!(all, vec![second.clone()], "{}", all_logs(&daemons));
    let (ok, answers, text) = fusebox_watchdog(&nats, &["status"]);
    assert!(
        ok && answers.len() == 1 && answers[0]["halted"] == false,
        "{text}"
    );
    eprintln!("whole test {:.1} s", started.elapsed().as_secs_f64());
}

/// The holder killed in the middle of a pass, its TerminateInstances in flight: a proxy
/// in front of moto holds the call (never forwards it, never answers), the holder is
/// SIGKILLed while it waits, and the daemon taking over terminates the instance at its
/// first sweep. moto gets one TerminateInstances, and one termination is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_killed_mid_pass_the_deadline_still_fires_once() {
    let started = Instant::now();
    let moto = Moto::start();
    let proxy = Ec2Proxy::start(moto.port).await;
    let nats = NatsCluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut daemons = start_three(dir.path(), &nats, &proxy.url(), "");
    wait_owners(
        &mut daemons.iter_mut().collect::<Vec<_>>(),
        Duration::from_secs(60),
    )
    .await;
    let holder = wait_holder(&daemons, &[], Duration::from_secs(30)).await;

    // Overdue 15 s after its launch, by its own tag: the holder's sweep finds it and
    // arms its timer; the timer's pass is the one that dies.
    let ec2 = ec2(&moto.url());
    proxy.hold();
    let instance = launch(&ec2, TENANTS[0], "mid-1", ("fusebox:max-lifetime", "15")).await;
    let deadline = Instant::now() + Duration::from_secs(15 + 3 * SWEEP_S);
    while proxy.state.held.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the holder never called TerminateInstances:\n{}",
            daemons[holder].logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed_at = Instant::now();
    daemons[holder].kill();
    proxy.lift();
    let next = wait_holder(&daemons, &[holder], Duration::from_secs(3 * SWEEP_S)).await;
    let takeover = killed_at.elapsed();
    assert!(
        takeover < Duration::from_secs(SWEEP_S),
        "takeover took {takeover:?}"
    );
    wait_gone(&ec2, &instance, Duration::from_secs(3 * SWEEP_S), || {
        all_logs(&daemons)
    })
    .await;
    let fired = killed_at.elapsed();
    // Two more sweeps: nobody terminates it again.
    tokio::time::sleep(Duration::from_secs(2 * SWEEP_S + 1)).await;
    assert_eq!(
        proxy.state.forwarded.load(Ordering::SeqCst),
        1,
        "TerminateInstances reaching moto"
    );
    let by_daemon: Vec<Vec<String>> = daemons.iter().map(terminated).collect();
    assert_eq!(
        by_daemon.concat(),
        vec![instance.clone()],
        "{by_daemon:?}\n{}",
        all_logs(&daemons)
    );
    assert_eq!(
        by_daemon[next],
        vec![instance.clone()],
        "not terminated by the new holder"
    );
    eprintln!(
        "mid-pass kill of {}: {} took over in {:.2} s and terminated {instance} {:.2} s after the kill; whole test {:.1} s",
        daemons[holder].node_id,
        daemons[next].node_id,
        takeover.as_secs_f64(),
        fired.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}
