//! Cluster harness: the 3-node nats-server cluster of deploy/nats/ (per-tenant accounts,
//! run partitioning switched on) on free loopback ports with temp stores, and `fuseboxd`
//! processes in cluster mode whose partition ownership is read from their logs.
//! Copied in spirit from crates/fusebox-deploy-tests/tests/common (not depended on).

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fusebox_client::{ClientOptions, FuseboxClient};
use tempfile::TempDir;

use crate::common::{free_ports, write_config};

/// N of deploy/nats/partitions.conf: `partition(8, tenant, run)`.
pub const PARTITIONS: u32 = 8;

/// The partition nats-server maps `fusebox.*.<tenant>.<run>` to: FNV-1a-32 over the
/// tenant and run tokens concatenated, mod N.
pub fn partition_of(tenant: &str, run: &str) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in tenant.bytes().chain(run.bytes()) {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash % PARTITIONS
}

fn deploy_nats() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/nats")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// `text` with `from` replaced by `to`; a deploy file that changed shape fails loudly
/// instead of silently keeping a production value.
fn replace_required(text: &str, from: &str, to: &str, what: &str) -> String {
    assert!(
        text.contains(from),
        "{what}: expected {from:?} to rewrite; the file changed shape"
    );
    text.replace(from, to)
}

/// Every `127.0.0.1:<port>` of `text` whose port is a key of `ports` moved to the new
/// port; whole port numbers are compared, so nothing is rewritten twice.
fn remap_ports(text: &str, ports: &HashMap<u16, u16>) -> String {
    const HOST: &str = "127.0.0.1:";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(HOST) {
        let after = &rest[at + HOST.len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        out.push_str(&rest[..at + HOST.len()]);
        match after[..digits]
            .parse()
            .ok()
            .and_then(|p: u16| ports.get(&p))
        {
            Some(new) => out.push_str(&new.to_string()),
            None => out.push_str(&after[..digits]),
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

/// Whether `text` has `127.0.0.1:<port>` with exactly that port (a free port may start
/// with the same digits, e.g. 42221).
fn has_port(text: &str, port: u16) -> bool {
    let needle = format!("127.0.0.1:{port}");
    text.match_indices(&needle).any(|(at, _)| {
        !text[at + needle.len()..]
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_digit())
    })
}

/// The placeholder password accounts.conf gives `user` (checked against the file).
pub fn password(user: &str) -> String {
    let password = format!("PLACEHOLDER-{user}-change-me");
    assert!(
        read(&deploy_nats().join("accounts.conf")).contains(&format!("\"{password}\"")),
        "accounts.conf: no placeholder password for {user}"
    );
    password
}

/// One nats-server of the cluster; SIGKILLed on drop.
pub struct NatsNode {
    pub name: String,
    pub port: u16,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl NatsNode {
    fn spawn(&mut self) {
        let out = File::create(&self.log).expect("server log");
        let child = Command::new("nats-server")
            .arg("-c")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log handle"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run nats-server ({e}); run scripts/setup.sh"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!("{} exited ({status}):\n{}", self.name, read(&self.log));
            }
            assert!(Instant::now() < deadline, "{} not listening", self.name);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// SIGKILL: no goodbye to the cluster.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for NatsNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// deploy/nats/cluster-{a,b,c}.conf with the partition mapping switched on.
pub struct NatsCluster {
    pub nodes: Vec<NatsNode>,
    _dir: TempDir,
}

impl NatsCluster {
    /// Starts the three nodes and waits until the cluster's JetStream answers (a
    /// meta leader is elected), which takes a few seconds after the processes listen.
    pub async fn start() -> NatsCluster {
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(deploy_nats()).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "conf") {
                std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
            }
        }
        // The partition mapping, switched on as accounts.conf tells an operator to
        // (remove the "# "), unless the shipped file has it on already.
        let accounts = dir.path().join("accounts.conf");
        let on = "    mappings { include \"partitions.conf\" }";
        let text = read(&accounts).replace("    # mappings {", "    mappings {");
        assert!(
            text.lines().any(|line| line == on),
            "accounts.conf: no partition mapping line {on:?}"
        );
        std::fs::write(&accounts, text).unwrap();
        // Client 422x, route 622x and monitoring 822x ports of the three nodes.
        let ports: HashMap<u16, u16> = [4222u16, 6222, 8222]
            .iter()
            .flat_map(|base| (0..3).map(move |i| base + i))
            .zip(free_ports(9))
            .collect();
        let mut nodes = Vec::new();
        for (i, node) in ["a", "b", "c"].into_iter().enumerate() {
            let config = dir.path().join(format!("cluster-{node}.conf"));
            let text = remap_ports(&read(&config), &ports);
            assert!(
                ports.keys().all(|port| !has_port(&text, *port)),
                "cluster-{node}.conf: an address was not rewritten:\n{text}"
            );
            let store = dir.path().join(format!("store-{node}"));
            let text = replace_required(
                &text,
                &format!("\"/tmp/fusebox-nats-cluster/{node}\""),
                &format!("{:?}", store.display().to_string()),
                "cluster conf",
            );
            std::fs::write(&config, text).unwrap();
            let mut server = NatsNode {
                name: format!("fusebox-nats-{node}"),
                port: ports[&(4222 + i as u16)],
                log: config.with_extension("log"),
                config,
                child: None,
            };
            server.spawn();
            nodes.push(server);
        }
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
        self.nodes.iter().map(NatsNode::url).collect()
    }

    /// Connects as `user` to every node's URL; tenants get their own inbox prefix, as
    /// accounts.conf requires.
    pub async fn connect(&self, user: &str, inbox_prefix: Option<&str>) -> async_nats::Client {
        let mut options = async_nats::ConnectOptions::new()
            .user_and_password(user.to_owned(), password(user))
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
    pub log: PathBuf,
    child: Option<Child>,
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
    nats.insert("password".into(), password("fuseboxd").into());
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
        let log = dir.join(format!("{node_id}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_fuseboxd"))
            .arg("--config")
            .arg(&config)
            .arg("--nats-url")
            .arg(urls.join(","))
            .args(["--metrics-listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.join(node_id))
            .env("RUST_LOG", "info,async_nats=warn")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .expect("spawn fuseboxd");
        ClusterDaemon {
            node_id: node_id.to_owned(),
            config,
            log,
            child: Some(child),
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How the process ended, once it has.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().unwrap())
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
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ClusterDaemon {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let logs = self.logs();
            let lines: Vec<&str> = logs.lines().collect();
            let tail = lines[lines.len().saturating_sub(80)..].join("\n");
            eprintln!("--- fuseboxd {} (log tail) ---\n{tail}", self.node_id);
        }
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
