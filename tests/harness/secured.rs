//! A secured single-node deployment as deploy/ ships it: nats-server on
//! deploy/nats/single.conf (accounts, users, per-tenant permissions, partition mapping
//! on), and a real `fuseboxd` that connects as the `fuseboxd` user through its config's
//! `[nats]` section. Clients connect as any user of accounts.conf, with the connection
//! settings every fusebox client binary uses ([`NatsSettings`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use fusebox_client::{ClientOptions, FuseboxClient, NatsSettings};
use tempfile::TempDir;

use crate::daemon::{write_config, Daemon};
use crate::deploy_nats::{
    assert_mapping_on, placeholder_password, remap_addresses, replace_required, NatsConfigDir,
};
use crate::nats::NatsServer;
use crate::paths::{bin, read};
use crate::ports::{free_port, free_ports};
use crate::proc::Proc;

/// deploy/nats/single.conf in a temp dir: client and monitoring ports on free loopback
/// ports, the JetStream store in the temp dir; everything else as shipped.
pub fn start_single() -> (NatsConfigDir, NatsServer) {
    assert_mapping_on();
    let conf = NatsConfigDir::copy();
    let [client, http] = free_ports(2)[..] else {
        unreachable!("two ports")
    };
    let ports = HashMap::from([(4222, client), (8222, http)]);
    let store = conf.dir.path().join("jetstream");
    conf.edit("single.conf", |text| {
        for addr in ["0.0.0.0:4222", "0.0.0.0:8222"] {
            assert!(
                text.contains(addr),
                "single.conf no longer listens on {addr}"
            );
        }
        let text = remap_addresses(text, "0.0.0.0", &ports);
        replace_required(
            &text,
            "\"/var/lib/nats/jetstream\"",
            &format!("{:?}", store.display().to_string()),
            "single.conf store_dir",
        )
    });
    let server = NatsServer::with_config("single", &conf.path("single.conf"), client);
    (conf, server)
}

/// The connection settings of `user` of accounts.conf (its placeholder password); a
/// `tenant-<t>` user gets the inbox prefix `_INBOX.<t>` its permissions require.
pub fn settings_for(url: &str, user: &str) -> NatsSettings {
    NatsSettings {
        user: Some(user.to_owned()),
        password: Some(placeholder_password(user)),
        inbox_prefix: user
            .strip_prefix("tenant-")
            .map(|tenant| format!("_INBOX.{tenant}")),
        ..NatsSettings::url(url)
    }
}

pub struct SecuredStack {
    pub nats: NatsServer,
    pub dir: TempDir,
    /// The daemon's config: the test config with `[nats]` user `fuseboxd`.
    pub config: PathBuf,
    pub daemon: Option<Daemon>,
    _conf: NatsConfigDir,
}

impl SecuredStack {
    /// The server and the daemon, ready (it answered the operator).
    pub async fn start() -> SecuredStack {
        let mut stack = SecuredStack::server_only();
        stack.start_daemon().await;
        stack
    }

    /// The server alone; [`SecuredStack::start_daemon`] later.
    pub fn server_only() -> SecuredStack {
        let (conf, nats) = start_single();
        let dir = tempfile::tempdir().expect("temp dir");
        let config = write_config(dir.path());
        let mut doc: toml::Table = toml::from_str(&read(&config)).expect("test config");
        let section = doc
            .get_mut("nats")
            .and_then(|n| n.as_table_mut())
            .expect("[nats] in the shipped config");
        section.insert("user".into(), "fuseboxd".into());
        section.insert("password".into(), placeholder_password("fuseboxd").into());
        std::fs::write(&config, toml::to_string(&doc).expect("toml")).expect("write config");
        SecuredStack {
            nats,
            dir,
            config,
            daemon: None,
            _conf: conf,
        }
    }

    pub fn url(&self) -> String {
        self.nats.url()
    }

    pub fn settings(&self, user: &str) -> NatsSettings {
        settings_for(&self.url(), user)
    }

    /// A client connected as `user`, requests timing out after `timeout`.
    pub async fn client(&self, user: &str, timeout: Duration) -> FuseboxClient {
        FuseboxClient::connect_with(
            &self.settings(user),
            ClientOptions {
                timeout,
                ..ClientOptions::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("connecting as {user}: {e}"))
    }

    /// Starts `fuseboxd` (user `fuseboxd`) and waits until it answers the operator.
    pub async fn start_daemon(&mut self) {
        let metrics_port = free_port();
        let data_dir = self.dir.path().join("data");
        let mut cmd = Command::new(bin("fuseboxd"));
        cmd.arg("--config")
            .arg(&self.config)
            .args(["--nats-url", &self.url()])
            .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
            .arg("--data-dir")
            .arg(&data_dir)
            .env("RUST_LOG", "info,async_nats=warn")
            .env("NO_COLOR", "1");
        let log = self.dir.path().join(format!("fuseboxd-{metrics_port}.log"));
        let mut daemon = Daemon {
            proc: Proc::spawn("fuseboxd", cmd, &log),
            metrics_port,
        };
        let operator = self.client("operator", Duration::from_secs(2)).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while operator.runs().await.is_err() {
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
        self.daemon = Some(daemon);
    }
}
