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
use crate::netns::{Netns, Veth};
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
    /// Node a's namespace and links, when it runs apart ([`NatsCluster::start_split`]).
    /// Declared after `nodes`: the servers are gone before their links.
    pub split: Option<Split>,
    _dir: NatsConfigDir,
}

/// Node a of a [`NatsCluster::start_split`] cluster: in a network namespace of the
/// test's own, its routes to nodes b and c over one link and its clients from the root
/// namespace over another, so the cluster can be split (node a alone, b and c with the
/// quorum) while clients on either side still reach their own side.
pub struct Split {
    /// Nodes b and c dial node a's route port over this link; `cut()` splits the cluster.
    pub route_link: Veth,
    /// The root namespace's clients reach node a's client port over this link.
    pub client_link: Veth,
    pub ns: Netns,
}

impl NatsCluster {
    /// Starts the three nodes and waits until the cluster's JetStream answers (a
    /// meta leader is elected), which takes a few seconds after the processes listen.
    pub async fn start() -> NatsCluster {
        NatsCluster::launch(None).await
    }

    /// The cluster with node a in its own namespace ([`Split`]). Needs root.
    pub async fn start_split() -> NatsCluster {
        let ns = Netns::new();
        let route_link = Veth::new(&ns);
        let client_link = Veth::new(&ns);
        NatsCluster::launch(Some(Split {
            route_link,
            client_link,
            ns,
        }))
        .await
    }

    async fn launch(split: Option<Split>) -> NatsCluster {
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
                let text = replace_required(
                    &text,
                    &format!("\"/tmp/fusebox-nats-cluster/{node}\""),
                    &format!("{:?}", store.display().to_string()),
                    "cluster conf",
                );
                // Clients are not told the other nodes' addresses: in a split cluster
                // they are not all reachable from every side.
                let text = replace_required(
                    &text,
                    "cluster {\n",
                    "cluster {\n  no_advertise: true\n",
                    "cluster conf",
                );
                match &split {
                    Some(split) => split_config(&text, node, split, &ports),
                    None => text,
                }
            });
            configs.push(dir.path(&name));
        }
        let nodes = ["a", "b", "c"]
            .into_iter()
            .zip(configs)
            .enumerate()
            .map(|(i, (node, config))| {
                let (name, port) = (format!("fusebox-nats-{node}"), ports[&(4222 + i as u16)]);
                match &split {
                    Some(split) if i == 0 => NatsServer::with_config_in_netns(
                        &name,
                        &config,
                        port,
                        &split.ns,
                        split.client_link.ns_ip.into(),
                    ),
                    _ => NatsServer::with_config(&name, &config, port),
                }
            })
            .collect();
        let cluster = NatsCluster {
            nodes,
            split,
            _dir: dir,
        };
        // Every node answers JetStream requests: all three are in the cluster, which
        // has a meta leader.
        for url in cluster.urls() {
            let client = connect_at("fuseboxd", None, std::slice::from_ref(&url)).await;
            let js = async_nats::jetstream::new(client);
            let deadline = Instant::now() + Duration::from_secs(60);
            while let Err(err) = js.query_account().await {
                assert!(
                    Instant::now() < deadline,
                    "JetStream not ready at {url} in 60 s: {err}"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        cluster
    }

    /// Every node's client URL as the test sees it.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(NatsServer::url).collect()
    }

    /// Node a's client URL inside its namespace (for a daemon started there).
    pub fn inner_url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[0].port)
    }

    /// Connects as `user` to every node's URL; tenants get their own inbox prefix, as
    /// accounts.conf requires.
    pub async fn connect(&self, user: &str, inbox_prefix: Option<&str>) -> async_nats::Client {
        connect_at(user, inbox_prefix, &self.urls()).await
    }

    /// A fusebox client of `tenant` (user `tenant-<tenant>`, inbox `_INBOX.<tenant>`).
    pub async fn tenant_client(&self, tenant: &str, timeout: Duration) -> FuseboxClient {
        tenant_client_at(tenant, timeout, &self.urls()).await
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

/// Node `node`'s config of a split cluster: node a takes clients on every address of
/// its namespace and routes only on the route link's; b and c dial it there.
fn split_config(text: &str, node: &str, split: &Split, ports: &HashMap<u16, u16>) -> String {
    let route = |port: u16| format!("\"nats-route://127.0.0.1:{}\"", ports[&port]);
    let route_a = format!(
        "\"nats-route://{}:{}\"",
        split.route_link.ns_ip, ports[&6222]
    );
    let text = replace_required(text, &route(6222), &route_a, "cluster conf");
    if node != "a" {
        return text;
    }
    let listen = |port: u16| format!("listen: 127.0.0.1:{}\n", ports[&port]);
    let text = replace_required(
        &text,
        &listen(4222),
        &format!("listen: 0.0.0.0:{}\n", ports[&4222]),
        "cluster conf",
    );
    let text = replace_required(
        &text,
        &listen(6222),
        &format!("listen: {}:{}\n", split.route_link.ns_ip, ports[&6222]),
        "cluster conf",
    );
    // b and c dial a; from inside the namespace their loopback ports are not there.
    let text = replace_required(&text, &route(6223), "", "cluster conf");
    replace_required(&text, &route(6224), "", "cluster conf")
}

/// Connects as `user` to `urls`; tenants get their own inbox prefix, as accounts.conf
/// requires.
pub async fn connect_at(
    user: &str,
    inbox_prefix: Option<&str>,
    urls: &[String],
) -> async_nats::Client {
    let mut options = async_nats::ConnectOptions::new()
        .user_and_password(user.to_owned(), placeholder_password(user))
        .connection_timeout(Duration::from_secs(5));
    if let Some(prefix) = inbox_prefix {
        options = options.custom_inbox_prefix(prefix);
    }
    let addrs: Vec<async_nats::ServerAddr> = urls.iter().map(|u| u.parse().unwrap()).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match options.clone().connect(addrs.clone()).await {
            Ok(client) => return client,
            Err(err) if Instant::now() > deadline => panic!("connecting as {user}: {err}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// A fusebox client of `tenant` (user `tenant-<tenant>`, inbox `_INBOX.<tenant>`) on
/// `urls`.
pub async fn tenant_client_at(tenant: &str, timeout: Duration, urls: &[String]) -> FuseboxClient {
    let inbox = format!("_INBOX.{tenant}");
    let nats = connect_at(&format!("tenant-{tenant}"), Some(&inbox), urls).await;
    FuseboxClient::new(
        nats,
        ClientOptions {
            timeout,
            ..ClientOptions::default()
        },
    )
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
    write_cluster_config_with(dir, node_id, LEASE_MS)
}

/// [`write_cluster_config`] with a lease of `lease_ms`.
pub fn write_cluster_config_with(dir: &Path, node_id: &str, lease_ms: i64) -> PathBuf {
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
    cluster.insert("lease_ms".into(), toml::Value::Integer(lease_ms));
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
        ClusterDaemon::start_in(None, dir, node_id, urls, LEASE_MS)
    }

    /// [`ClusterDaemon::start`] inside the network namespace `ns` (`None`: the test's),
    /// with a lease of `lease_ms`.
    pub fn start_in(
        ns: Option<&Netns>,
        dir: &Path,
        node_id: &str,
        urls: &[String],
        lease_ms: i64,
    ) -> ClusterDaemon {
        let config = write_cluster_config_with(dir, node_id, lease_ms);
        let mut cmd = match ns {
            Some(ns) => ns.command(bin("fuseboxd")),
            None => Command::new(bin("fuseboxd")),
        };
        cmd.arg("--config")
            .arg(&config)
            .arg("--nats-url")
            .arg(urls.join(","))
            .args(["--metrics-listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.join(node_id))
            .env("RUST_LOG", cluster_log_filter())
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
    /// adds `partition=K`, `partition released` / `partition lost` / `releasing the
    /// lease failed` (given up, its lease left to age out) removes it.
    pub fn owned(&self) -> BTreeSet<u32> {
        let mut owned = BTreeSet::new();
        for line in self.logs().lines() {
            let Some(k) = field(line, "partition") else {
                continue;
            };
            if line.contains("partition claimed") {
                owned.insert(k);
            } else if line.contains("partition released")
                || line.contains("partition lost")
                || line.contains("releasing the lease failed")
            {
                owned.remove(&k);
            }
        }
        owned
    }

    /// The partitions named (` partition=K`) by a log line containing `message`.
    pub fn logged(&self, message: &str) -> BTreeSet<u32> {
        self.logs()
            .lines()
            .filter(|line| line.contains(message))
            .filter_map(|line| field(line, "partition"))
            .collect()
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

/// The cluster daemons' log filter; `FUSEBOX_TEST_RUST_LOG` replaces it (the soak
/// script turns the shared ledger's debug lines on).
fn cluster_log_filter() -> String {
    std::env::var("FUSEBOX_TEST_RUST_LOG").unwrap_or_else(|_| "info,async_nats=warn".to_owned())
}
