//! Cluster daemons with the cloud watchdog on moto_server (`e2e_cluster_watchdog`), and
//! who holds the watchdog role according to their logs.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::cluster::{write_cluster_config, ClusterDaemon};
use crate::paths::{bin, read};
use crate::proc::Proc;

/// The cluster test config with `[watchdog]` on moto: us-east-1 only, a sweep every
/// `sweep_s` seconds, and `extra` TOML lines.
pub fn write_watchdog_config(
    dir: &Path,
    node_id: &str,
    moto: &str,
    sweep_s: u64,
    extra: &str,
) -> std::path::PathBuf {
    let path = write_cluster_config(dir, node_id);
    let mut doc: toml::Table = toml::from_str(&read(&path)).unwrap();
    let watchdog: toml::Table = toml::from_str(&format!(
        "enabled = true\nregions = [\"us-east-1\"]\nendpoint_url = \"{moto}\"\n\
         sweep_cron = \"*/{sweep_s} * * * * *\"\nrecheck_after_s = 1\n{extra}"
    ))
    .unwrap();
    doc.insert("watchdog".into(), toml::Value::Table(watchdog));
    std::fs::write(&path, toml::to_string(&doc).unwrap()).unwrap();
    path
}

/// Starts `fuseboxd` `node_id` in cluster mode with its watchdog on moto (test
/// credentials, no instance-metadata lookups), data in `dir/<node_id>`.
pub fn start_watchdog_daemon(
    dir: &Path,
    node_id: &str,
    urls: &[String],
    moto: &str,
    sweep_s: u64,
    extra: &str,
) -> ClusterDaemon {
    let config = write_watchdog_config(dir, node_id, moto, sweep_s, extra);
    let mut cmd = Command::new(bin("fuseboxd"));
    cmd.arg("--config")
        .arg(&config)
        .arg("--nats-url")
        .arg(urls.join(","))
        .args(["--metrics-listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join(node_id))
        .env("RUST_LOG", "info,async_nats=warn")
        .env("NO_COLOR", "1")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    let proc = Proc::spawn(
        &format!("fuseboxd {node_id}"),
        cmd,
        &dir.join(format!("{node_id}.log")),
    );
    ClusterDaemon {
        node_id: node_id.to_owned(),
        config,
        proc,
    }
}

/// What a daemon logs when it takes the watchdog role.
pub const ROLE_TAKEN: &str = "watchdog role taken";

/// Whether the daemon's log says it holds the watchdog role now: its last role line is
/// a taking, not a loss or a release.
pub fn holds_role(daemon: &ClusterDaemon) -> bool {
    let ends = [
        ROLE_TAKEN,
        "watchdog role lost",
        "watchdog role not renewed",
        "watchdog role released",
        "releasing the watchdog role failed",
    ];
    daemon
        .logs()
        .lines()
        .rev()
        .find_map(|line| ends.iter().find(|end| line.contains(*end)))
        .is_some_and(|last| *last == ROLE_TAKEN)
}

/// Waits until exactly one of the live `daemons` (those not in `dead`) holds the role;
/// returns its index.
pub async fn wait_holder(daemons: &[ClusterDaemon], dead: &[usize], within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let holders: Vec<usize> = (0..daemons.len())
            .filter(|i| !dead.contains(i) && holds_role(&daemons[*i]))
            .collect();
        if let [one] = holders[..] {
            return one;
        }
        assert!(
            Instant::now() < deadline,
            "no single watchdog role holder within {within:?}: {holders:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The terminations a daemon's log reports with `outcome=Terminated` (each is one
/// TerminateInstances the cloud acknowledged), by instance id.
pub fn terminated(daemon: &ClusterDaemon) -> Vec<String> {
    daemon
        .logs()
        .lines()
        .filter(|line| line.contains("watchdog termination") && line.contains("outcome=Terminated"))
        .filter(|line| line.contains("late_ms="))
        .filter_map(|line| {
            let at = line.find(" instance=")? + " instance=".len();
            Some(line[at..].split_whitespace().next()?.to_owned())
        })
        .collect()
}
