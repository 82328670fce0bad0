//! The coding-agent hook suites' stack and process: a nats-server + fuseboxd with a
//! fixture directory's `policy.toml` laid over the shipped config, and one
//! `fusebox-hook <agent>` process per hook event, as the agent runs it (the binary the
//! printed settings install; `fusebox hook <agent>` runs the same code).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::{bin, read, write_config, Daemon, NatsServer};

/// A running nats-server + fuseboxd with the fixtures' policy.
pub struct HookStack {
    pub nats_url: String,
    _nats: NatsServer,
    _dir: tempfile::TempDir,
    _daemon: Daemon,
}

impl HookStack {
    /// `policy` is a TOML file whose `[policy]` keys (and those of any other table it
    /// has, e.g. `[guard]`) override the shipped config's.
    pub async fn start(policy: &Path) -> HookStack {
        let overlay: toml::Table = toml::from_str(&read(policy)).expect("policy is TOML");
        assert!(overlay.contains_key("policy"), "the overlay has [policy]");
        HookStack::start_with(&overlay).await
    }

    /// [`HookStack::start`] with the overlay given as a table.
    pub async fn start_with(overlay: &toml::Table) -> HookStack {
        let nats = NatsServer::start();
        let dir = tempfile::tempdir().expect("temp dir");
        let config = write_config(dir.path());
        let mut doc: toml::Table = toml::from_str(&read(&config)).expect("config is TOML");
        for (name, pinned) in overlay {
            let table = doc
                .entry(name)
                .or_insert(toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .unwrap_or_else(|| panic!("[{name}] is a table"));
            let pinned = pinned
                .as_table()
                .unwrap_or_else(|| panic!("[{name}] overlays a table"));
            for (key, value) in pinned {
                table.insert(key.clone(), value.clone());
            }
        }
        std::fs::write(&config, toml::to_string(&doc).unwrap()).expect("config written");
        let daemon = Daemon::start(&nats.url(), &config, &dir.path().join("data")).await;
        HookStack {
            nats_url: nats.url(),
            _nats: nats,
            _dir: dir,
            _daemon: daemon,
        }
    }

    /// `fusebox run TENANT/RUN --json`'s summary.
    pub fn run_summary(&self, tenant: &str, run: &str) -> Value {
        let out = Command::new(bin("fusebox"))
            .arg("run")
            .arg(format!("{tenant}/{run}"))
            .arg("--json")
            .args(["--nats-url", &self.nats_url])
            .output()
            .expect("fusebox run");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let status: Value = serde_json::from_slice(&out.stdout).expect("status is JSON");
        status["summary"].clone()
    }
}

/// One hook invocation, as the agent makes it: `fusebox-hook <protocol> ARGS`, the
/// payload on stdin, the answer on stdout.
pub fn run_hook(protocol: &str, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(bin("fusebox-hook"))
        .arg(protocol)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fusebox-hook runs");
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(stdin)
        .expect("hook reads its payload");
    child.wait_with_output().expect("hook finishes")
}
