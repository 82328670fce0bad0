//! Test harness: a real `nats-server -js` on a free loopback port with a temporary store,
//! and real `fuseboxd` processes, both killed on drop.

#![allow(dead_code)] // each test file uses a different part of the harness

use std::fs::File;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use fusebox_client::{ClientOptions, FuseboxClient};
use fusebox_core::{parse_event, Decision, Engine, Event, PolicySet};
use tempfile::TempDir;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `n` distinct free ports: all bound at once, so no two of them can be the same.
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

fn wait_for_port(port: u16, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

pub struct NatsServer {
    pub port: u16,
    store: TempDir,
    child: Option<Child>,
}

impl NatsServer {
    pub fn start() -> NatsServer {
        let mut server = NatsServer {
            port: free_port(),
            store: tempfile::tempdir().unwrap(),
            child: None,
        };
        server.spawn();
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let child = Command::new("nats-server")
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(self.store.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| {
                panic!("cannot run nats-server ({err}); install it with `bash scripts/setup.sh`")
            });
        self.child = Some(child);
        assert!(
            wait_for_port(self.port, Duration::from_secs(10)),
            "nats-server did not listen on {}",
            self.port
        );
    }

    /// Kills the server and starts it again on the same port with the same store.
    pub fn restart(&mut self, down_for: Duration) {
        self.kill();
        std::thread::sleep(down_for);
        self.spawn();
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The shipped config with the test's daemon settings (short gap timeout, small max
/// event size so `too_large` can be sent through NATS) and the cloud watchdog off: these
/// tests have no EC2 to talk to and must stay on loopback (no instance-metadata lookups);
/// `monitoring.rs` turns it on against moto_server.
pub fn write_config(dir: &Path) -> PathBuf {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/fusebox.toml");
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

/// The policies the daemon runs with, for computing expected decisions offline.
pub fn offline_engine(config: &Path) -> Engine {
    let doc: toml::Table = toml::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
    let json = serde_json::to_value(doc).unwrap();
    let (policies, _) = PolicySet::from_config_document(&json, None).unwrap();
    Engine::new(policies)
}

pub struct Daemon {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `fuseboxd` and waits until it answers on `fusebox.control.runs`.
    pub async fn start(nats: &str, config: &Path, data_dir: &Path) -> Daemon {
        let log = data_dir.with_extension(format!("{}.log", free_port()));
        let child = Command::new(env!("CARGO_BIN_EXE_fuseboxd"))
            .arg("--config")
            .arg(config)
            .args([
                "--nats-url",
                nats,
                "--metrics-listen",
                "127.0.0.1:0",
                "--data-dir",
            ])
            .arg(data_dir)
            .env("RUST_LOG", "info,fusebox_nats=debug")
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .expect("spawn fuseboxd");
        let mut daemon = Daemon {
            child: Some(child),
            log,
        };
        let client = client(nats).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if client.runs().await.is_ok() {
                return daemon;
            }
            if let Some(status) = daemon.child.as_mut().unwrap().try_wait().unwrap() {
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
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then waits for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "fuseboxd did not stop:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- fuseboxd log ---\n{}", self.logs());
        }
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

pub fn fixture(name: &str) -> Vec<Event> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fusebox-core/tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("{}: {err}", path.display()))
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| parse_event(line.as_bytes()).unwrap())
        .collect()
}

pub const FIXTURES: [&str; 6] = [
    "exact-repeat.jsonl",
    "ping-pong.jsonl",
    "no-progress.jsonl",
    "duplicate-side-effect.jsonl",
    "permission-denied.jsonl",
    "pagination-ok.jsonl",
];

/// What the engine decides for `events`, in this order, with the daemon's policies.
pub fn expected(config: &Path, events: &[Event]) -> Vec<Decision> {
    let mut engine = offline_engine(config);
    events.iter().map(|e| engine.apply(e)).collect()
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Parses a JSON literal into an event.
pub fn event(json: serde_json::Value) -> Event {
    parse_event(json.to_string().as_bytes()).unwrap()
}
