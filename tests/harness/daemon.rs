//! A real `fuseboxd` on a test's config and data dir, and the whole single-daemon setup
//! (nats-server, config, data dir, daemon).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use fusebox_client::{ClientOptions, FuseboxClient};
use tempfile::TempDir;

use crate::nats::NatsServer;
use crate::paths::{bin, repo_dir};
use crate::ports::free_port;
use crate::proc::Proc;

/// The shipped config with the test's daemon settings (short gap timeout, small max
/// event size so `too_large` can be sent through NATS) and the cloud watchdog off: these
/// tests have no EC2 to talk to and must stay on loopback (no instance-metadata lookups);
/// `monitoring.rs` turns it on against moto_server.
pub fn write_config(dir: &Path) -> PathBuf {
    let shipped = repo_dir().join("config/fusebox.toml");
    let mut doc: toml::Table = toml::from_str(&std::fs::read_to_string(shipped).unwrap()).unwrap();
    let guard = doc.get_mut("guard").unwrap().as_table_mut().unwrap();
    guard.insert("max_event_bytes".into(), toml::Value::Integer(8192));
    let mut daemon = toml::Table::new();
    daemon.insert("gap_timeout_ms".into(), toml::Value::Integer(1000));
    daemon.insert("timer_interval_ms".into(), toml::Value::Integer(100));
    doc.insert("daemon".into(), toml::Value::Table(daemon));
    let watchdog = doc.get_mut("watchdog").unwrap().as_table_mut().unwrap();
    watchdog.insert("enabled".into(), toml::Value::Boolean(false));
    let path = dir.join("fusebox.toml");
    std::fs::write(&path, toml::to_string(&doc).unwrap()).unwrap();
    path
}

pub struct Daemon {
    pub proc: Proc,
    /// Where its `/metrics`, `/healthz` and `/readyz` answer.
    pub metrics_port: u16,
}

impl Daemon {
    /// Starts `fuseboxd` and waits until it answers on `fusebox.control.runs`.
    pub async fn start(nats: &str, config: &Path, data_dir: &Path) -> Daemon {
        Daemon::start_with(nats, config, data_dir, |_| {}).await
    }

    /// [`Daemon::start`] with the command changed first (environment, extra flags, a
    /// wrapper such as libfaketime).
    pub async fn start_with(
        nats: &str,
        config: &Path,
        data_dir: &Path,
        adjust: impl FnOnce(&mut Command),
    ) -> Daemon {
        let metrics_port = free_port();
        let log = data_dir.with_extension(format!("{metrics_port}.log"));
        let mut cmd = Command::new(bin("fuseboxd"));
        cmd.arg("--config")
            .arg(config)
            .args(["--nats-url", nats])
            .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
            .arg("--data-dir")
            .arg(data_dir)
            .env("RUST_LOG", "info,fusebox_nats=debug");
        adjust(&mut cmd);
        let mut daemon = Daemon {
            proc: Proc::spawn("fuseboxd", cmd, &log),
            metrics_port,
        };
        let client = client(nats).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if client.runs().await.is_ok() {
                return daemon;
            }
            if let Some(status) = daemon.proc.exit_status() {
                panic!(
                    "fuseboxd exited at start-up with {status}:\n{}",
                    daemon.logs()
                );
            }
            assert!(
                Instant::now() < deadline,
                "fuseboxd not ready:\n{}",
                daemon.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn logs(&self) -> String {
        self.proc.logs()
    }

    /// SIGTERM, then waits for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        self.proc.terminate(Duration::from_secs(30))
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        self.proc.kill();
    }
}

pub async fn client(nats: &str) -> FuseboxClient {
    FuseboxClient::connect(
        nats,
        ClientOptions {
            timeout: Duration::from_secs(5),
            ..ClientOptions::default()
        },
    )
    .await
    .expect("connect to nats")
}

/// A whole test setup: server, config, data dir, daemon.
pub struct Setup {
    pub nats: NatsServer,
    pub dir: TempDir,
    pub config: PathBuf,
    pub daemon: Daemon,
}

impl Setup {
    pub async fn start() -> Setup {
        let nats = NatsServer::start();
        let dir = tempfile::tempdir().unwrap();
        let config = write_config(dir.path());
        let daemon = Daemon::start(&nats.url(), &config, &dir.path().join("data")).await;
        Setup {
            nats,
            dir,
            config,
            daemon,
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub async fn restart_daemon(&mut self) {
        let status = self.daemon.terminate();
        assert!(
            status.success(),
            "fuseboxd exit {status}:\n{}",
            self.daemon.logs()
        );
        self.daemon = Daemon::start(&self.nats.url(), &self.config, &self.data_dir()).await;
    }
}
