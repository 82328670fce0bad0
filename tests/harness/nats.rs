//! A real `nats-server`: a plain JetStream server on a free port with a temp store, or
//! one started from a config file (the deploy configs, a mapping under test).

use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::netns::Netns;
use crate::paths::require_tool;
use crate::ports::free_port;
use crate::proc::Proc;

/// `nats-server` from $NATS_SERVER, the PATH or the repo's venv; a missing binary is a
/// clear failure, not a skipped test.
pub fn nats_server_bin() -> PathBuf {
    match std::env::var_os("NATS_SERVER") {
        Some(path) => PathBuf::from(path),
        None => require_tool("nats-server"),
    }
}

pub struct NatsServer {
    pub name: String,
    pub port: u16,
    args: Vec<OsString>,
    log: PathBuf,
    /// The temp dir of a plain server (store and log); a configured one keeps its own.
    _dir: Option<TempDir>,
    /// The network namespace it runs in (`None`: the test's own) and where it is ready.
    netns: Option<String>,
    ready_at: SocketAddr,
    proc: Option<Proc>,
}

impl NatsServer {
    /// `nats-server -js` on a free loopback port with a temporary store.
    pub fn start() -> NatsServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let args = ["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"]
            .into_iter()
            .map(OsString::from)
            .chain([dir.path().join("store").into_os_string()])
            .collect();
        let log = dir.path().join("nats.log");
        let mut server = NatsServer {
            name: "nats-server".to_owned(),
            port,
            args,
            log,
            _dir: Some(dir),
            netns: None,
            ready_at: SocketAddr::from(([127, 0, 0, 1], port)),
            proc: None,
        };
        server.spawn();
        server
    }

    /// `nats-server -c config` listening for clients on `port`, its output in
    /// `<config>.log`.
    pub fn with_config(name: &str, config: &Path, port: u16) -> NatsServer {
        let mut server = NatsServer {
            name: name.to_owned(),
            port,
            args: vec!["-c".into(), config.as_os_str().to_owned()],
            log: config.with_extension("log"),
            _dir: None,
            netns: None,
            ready_at: SocketAddr::from(([127, 0, 0, 1], port)),
            proc: None,
        };
        server.spawn();
        server
    }

    /// [`NatsServer::with_config`] inside the test's network namespace `ns`; ready once
    /// `reachable` (an address of `ns` as the test sees it) answers on `port`.
    pub fn with_config_in_netns(
        name: &str,
        config: &Path,
        port: u16,
        ns: &Netns,
        reachable: IpAddr,
    ) -> NatsServer {
        let mut server = NatsServer {
            name: name.to_owned(),
            port,
            args: vec!["-c".into(), config.as_os_str().to_owned()],
            log: config.with_extension("log"),
            _dir: None,
            netns: Some(ns.name().to_owned()),
            ready_at: SocketAddr::new(reachable, port),
            proc: None,
        };
        server.spawn();
        server
    }

    /// `nats-server -js` inside the test's network namespace `ns`, on `port` of every
    /// address there; ready once `reachable` (an address of `ns` as the test sees it)
    /// answers. Clients reach it through the namespace's links, so cutting a link is a
    /// partition between it and whoever uses that link ([`crate::netns`]).
    pub fn start_in_netns(ns: &Netns, port: u16, reachable: IpAddr) -> NatsServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let args = ["-js", "-a", "0.0.0.0", "-p", &port.to_string(), "-sd"]
            .into_iter()
            .map(OsString::from)
            .chain([dir.path().join("store").into_os_string()])
            .collect();
        let log = dir.path().join("nats.log");
        let mut server = NatsServer {
            name: format!("nats-server in {}", ns.name()),
            port,
            args,
            log,
            _dir: Some(dir),
            netns: Some(ns.name().to_owned()),
            ready_at: SocketAddr::new(reachable, port),
            proc: None,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let mut cmd = match &self.netns {
            None => Command::new(nats_server_bin()),
            Some(ns) => {
                // `ip netns exec` execs the server: the pid is the server's.
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", ns]).arg(nats_server_bin());
                cmd
            }
        };
        cmd.args(&self.args);
        let mut proc = Proc::spawn(&self.name, cmd, &self.log);
        proc.wait_reachable(self.ready_at, Duration::from_secs(15));
        self.proc = Some(proc);
    }

    /// Its client URL as the test sees it (a server in a namespace: through its link).
    pub fn url(&self) -> String {
        format!("nats://{}", self.ready_at)
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.proc.as_ref().expect("running").pid()
    }

    /// Kills the server and starts it again on the same port with the same store.
    pub fn restart(&mut self, down_for: Duration) {
        self.kill();
        std::thread::sleep(down_for);
        self.spawn();
    }

    /// SIGKILL: the crash case, no graceful shutdown, no goodbye to a cluster.
    pub fn kill(&mut self) {
        if let Some(mut proc) = self.proc.take() {
            proc.kill();
        }
    }
}

/// Returns once nats-server has processed everything `client` sent before the call, so
/// a subscription made just before already gets what another connection publishes
/// next. `Client::flush()` is not that: it only writes async-nats's buffer to the
/// socket, and the server reads each connection on its own, so a SUB merely written can
/// lose the race with another connection's PUB (deploy_nats_single saw it in ~1 of 6
/// runs). A server handles one connection's commands in order: our own message coming
/// back on a fresh inbox means the earlier SUBs are registered.
pub async fn server_has_processed(client: &async_nats::Client) {
    use futures_util::StreamExt;
    let probe = client.new_inbox();
    let mut echo = client
        .subscribe(probe.clone())
        .await
        .expect("subscribe to a probe inbox");
    client
        .publish(probe, Default::default())
        .await
        .expect("publish to the probe inbox");
    tokio::time::timeout(Duration::from_secs(10), echo.next())
        .await
        .expect("nats-server echoed the probe within 10 s")
        .expect("probe subscription open");
}
