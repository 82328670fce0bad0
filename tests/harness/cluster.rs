//! Cluster harness: the 3-node nats-server cluster of deploy/nats/ (per-tenant accounts,
//! run partitioning switched on) on free loopback ports with temp stores, and `fuseboxd`
//! processes in cluster mode whose partition ownership is read from their logs.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fusebox_client::{ClientOptions, FuseboxClient};

use crate::daemon::write_config;
use crate::deploy_nats::{
    fnv1a32, has_port, placeholder_password, remap_addresses, replace_required, NatsConfigDir,
};
use crate::nats::NatsServer;
use crate::paths::{bin, read};
use crate::ports::free_ports;
use crate::proc::Proc;

/// N of deploy/nats/partitions.conf: `partition(8, tenant, run)`.
pub const PARTITIONS: u32 = 8;

/// The partition nats-server maps `fusebox.*.<tenant>.<run>` to: FNV-1a-32 over the
/// tenant and run tokens concatenated, mod N.
pub fn partition_of(tenant: &str, run: &str) -> u32 {
    fnv1a32(format!("{tenant}{run}").as_bytes()) % PARTITIONS
}

/// deploy/nats/cluster-{a,b,c}.conf with the partition mapping switched on.
pub struct NatsCluster {
    pub nodes: Vec<NatsServer>,
    _dir: NatsConfigDir,
}

impl NatsCluster {
    /// Starts the three nodes and waits until the cluster's JetStream answers (a
    /// meta leader is elected), which takes a few seconds after the processes listen.
    pub async fn start() -> NatsCluster {
        let dir = NatsConfigDir::copy();
        // The partition mapping, switched on as accounts.conf tells an operator to
        // (remove the "# "), unless the shipped file has it on already.
        let on = "    mappings { include \"partitions.conf\" }";
        dir.edit("accounts.conf", |text| {
            let text = text.replace("    # mappings {", "    mappings {");
            assert!(
                text.lines().any(|line| line == on),
                "accounts.conf: no partition mapping line {on:?}"
            );
            text
        });
        // Client 422x, route 622x and monitoring 822x ports of the three nodes.
        let ports: HashMap<u16, u16> = [4222u16, 6222, 8222]
            .iter()
            .flat_map(|base| (0..3).map(move |i| base + i))
            .zip(free_ports(9))
            .collect();
        let mut configs = Vec::new();
        for node in ["a", "b", "c"] {
            let name = format!("cluster-{node}.conf");
            let store = dir.path(&format!("store-{node}"));
            dir.edit(&name, |text| {
                let text = remap_addresses(text, "127.0.0.1", &ports);
                assert!(
                    ports.keys().all(|port| !has_port(&text, *port)),
                    "{name}: an address was not rewritten:\n{text}"
                );
                replace_required(
                    &text,
                    &format!("\"/tmp/fusebox-nats-cluster/{node}\""),
                    &format!("{:?}", store.display().to_string()),
                    "cluster conf",
                )
            });
            configs.push(dir.path(&name));
        }
        let nodes = ["a", "b", "c"]
            .into_iter()
            .zip(configs)
            .enumerate()
            .map(|(i, (node, config))| {
                NatsServer::with_config(
                    &format!("fusebox-nats-{node}"),
                    &config,
                    ports[&(4222 + i as u16)],
                )
            })
            .collect();
        let cluster = NatsCluster { nodes, _dir: dir };
        let js = async_nats::jetstream::new(cluster.connect("fuseboxd", None).await);
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Err(err) = js.query_account().await {
            assert!(
                Instant::now() < deadline,
                "JetStream not ready in 60 s: {err}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(NatsServer::url).collect()
    }

    /// Connects as `user` to every node's URL; tenants get their own inbox prefix, as
    /// accounts.conf requires.
    pub async fn connect(&self, user: &str, inbox_prefix: Option<&str>) -> async_nats::Client {
        let mut options = async_nats::ConnectOptions::new()
            .user_and_password(user.to_owned(), placeholder_password(user))
            .connection_timeout(Duration::from_secs(5));
        if let Some(prefix) = inbox_prefix {
            options = options.custom_inbox_prefix(prefix);
        }
        let addrs: Vec<async_nats::ServerAddr> =
            self.urls().iter().map(|u| u.parse().unwrap()).collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match options.clone().connect(addrs.clone()).await {
                Ok(client) => return client,
                Err(err) if Instant::now() > deadline => panic!("connecting as {user}: {err}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// A fusebox client of `tenant` (user `tenant-<tenant>`, inbox `_INBOX.<tenant>`).
    pub async fn tenant_client(&self, tenant: &str, timeout: Duration) -> FuseboxClient {
        let nats = self
            .connect(
                &format!("tenant-{tenant}"),
                Some(&format!("_INBOX.{tenant}")),
            )
            .await;
        FuseboxClient::new(
            nats,
            ClientOptions {
                timeout,
                ..ClientOptions::default()
            },
        )
    }

    /// The operator's client (`fusebox run T/R` and friends).
    pub async fn operator_client(&self) -> FuseboxClient {
        let nats = self.connect("operator", None).await;
        FuseboxClient::new(
            nats,
            ClientOptions {
                timeout: Duration::from_secs(5),
                ..ClientOptions::default()
            },
        )
    }
}

/// A `fuseboxd` in cluster mode; SIGKILLed on drop (its log tail printed if panicking).
pub struct ClusterDaemon {
    pub node_id: String,
    pub config: PathBuf,
    pub proc: Proc,
}

/// Cluster settings of the daemons under test.
pub const LEASE_MS: i64 = 2000;

/// The test config (write_config) as a cluster member: the daemon's NATS user, the
/// `[cluster]` section, and the shipped 5 s gap timeout instead of the test's 1 s (a
/// run's reported event and its next gate request may be served by two different
/// daemons around a takeover; the hold is what keeps them in order).
pub fn write_cluster_config(dir: &Path, node_id: &str) -> PathBuf {
    let path = write_config(dir);
    let mut doc: toml::Table = toml::from_str(&read(&path)).unwrap();
    let nats = doc.get_mut("nats").unwrap().as_table_mut().unwrap();
    nats.insert("user".into(), "fuseboxd".into());
    nats.insert("password".into(), placeholder_password("fuseboxd").into());
    let daemon = doc.get_mut("daemon").unwrap().as_table_mut().unwrap();
    daemon.insert("gap_timeout_ms".into(), toml::Value::Integer(5000));
    let mut cluster = toml::Table::new();
    cluster.insert("partitions".into(), toml::Value::Integer(PARTITIONS.into()));
    cluster.insert("node_id".into(), node_id.into());
    cluster.insert("lease_ms".into(), toml::Value::Integer(LEASE_MS));
    cluster.insert("replicas".into(), toml::Value::Integer(3));
    doc.insert("cluster".into(), toml::Value::Table(cluster));
    let path = dir.join(format!("fusebox-{node_id}.toml"));
    std::fs::write(&path, toml::to_string(&doc).unwrap()).unwrap();
    path
}

impl ClusterDaemon {
    /// Starts `fuseboxd` with data in `dir/<node_id>`; readiness is the caller's
    /// business ([`wait_owners`]).
    pub fn start(dir: &Path, node_id: &str, urls: &[String]) -> ClusterDaemon {
        let config = write_cluster_config(dir, node_id);
        let mut cmd = Command::new(bin("fuseboxd"));
        cmd.arg("--config")
            .arg(&config)
            .arg("--nats-url")
            .arg(urls.join(","))
            .args(["--metrics-listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.join(node_id))
            .env("RUST_LOG", "info,async_nats=warn")
            .env("NO_COLOR", "1");
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

    pub fn logs(&self) -> String {
        self.proc.logs()
    }

    /// How the process ended, once it has.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.proc.exit_status()
    }

    /// The partitions this daemon holds according to its log: `partition claimed`
    /// adds `partition=K`, `partition released` / `partition lost` removes it.
    pub fn owned(&self) -> BTreeSet<u32> {
        let mut owned = BTreeSet::new();
        for line in self.logs().lines() {
            let Some(k) = field(line, "partition") else {
                continue;
            };
            if line.contains("partition claimed") {
                owned.insert(k);
            } else if line.contains("partition released") || line.contains("partition lost") {
                owned.remove(&k);
            }
        }
        owned
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        self.proc.kill();
    }
}

/// The number in ` name=K` of a log line.
fn field(line: &str, name: &str) -> Option<u32> {
    let at = line.find(&format!(" {name}="))? + name.len() + 2;
    let digits: String = line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Waits until the live `daemons` together own every partition, each exactly once, and
/// each of them at least one; returns the owners by partition.
pub async fn wait_owners(daemons: &mut [&mut ClusterDaemon], within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    loop {
        let mut owner: Vec<Vec<String>> = vec![Vec::new(); PARTITIONS as usize];
        for daemon in daemons.iter_mut() {
            if let Some(status) = daemon.exit_status() {
                panic!(
                    "fuseboxd {} exited ({status}):\n{}",
                    daemon.node_id,
                    daemon.logs()
                );
            }
            for p in daemon.owned() {
                owner[p as usize].push(daemon.node_id.clone());
            }
        }
        let each_once = owner.iter().all(|o| o.len() == 1);
        let all_serve = daemons
            .iter()
            .all(|d| owner.iter().any(|o| o.contains(&d.node_id)));
        if each_once && all_serve {
            return owner.into_iter().map(|mut o| o.remove(0)).collect();
        }
        assert!(
            Instant::now() < deadline,
            "partitions not owned once each by {:?} within {within:?}: {owner:?}",
            daemons.iter().map(|d| &d.node_id).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Starts daemon `d<n+1>` beside the `n` running ones and waits until the partitions
/// are spread over all of them; returns the owners by partition.
pub async fn add_daemon(
    daemons: &mut Vec<ClusterDaemon>,
    dir: &Path,
    urls: &[String],
) -> Vec<String> {
    let node_id = format!("d{}", daemons.len() + 1);
    daemons.push(ClusterDaemon::start(dir, &node_id, urls));
    wait_owners(
        &mut daemons.iter_mut().collect::<Vec<_>>(),
        Duration::from_secs(60),
    )
    .await
}
