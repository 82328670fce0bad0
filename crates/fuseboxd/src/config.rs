//! The daemon's view of `fusebox.toml`: the policy sections (built by `fusebox-core`) and
//! the daemon's own `[nats]`, `[storage]`, `[daemon]`, `[metrics]` sections, and the cloud
//! watchdog's `[watchdog]` (read by `fusebox-watchdog` itself). Every key has
//! a default, unknown keys are errors (a typo must not silently fall back to a default).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fusebox_core::PolicySet;
use fusebox_nats::ServiceOptions;
use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid TOML: {source}")]
    Toml {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("{path}: [{section}]: {message}")]
    Section {
        path: PathBuf,
        section: &'static str,
        message: String,
    },
    #[error("{path}: {source}")]
    Policy {
        path: PathBuf,
        source: fusebox_core::policy::PolicyError,
    },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    pub urls: Vec<String>,
    pub name: String,
    pub connect_timeout_ms: u64,
    pub user: Option<String>,
    pub password: Option<String>,
    pub token: Option<String>,
    pub nkey_seed_file: Option<PathBuf>,
    pub creds_file: Option<PathBuf>,
    pub tls_required: bool,
    pub tls_ca_file: Option<PathBuf>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub queue_group: String,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            urls: vec!["nats://127.0.0.1:4222".to_owned()],
            name: "fuseboxd".to_owned(),
            connect_timeout_ms: 5000,
            user: None,
            password: None,
            token: None,
            nkey_seed_file: None,
            creds_file: None,
            tls_required: false,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            queue_group: "fuseboxd".to_owned(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    pub data_dir: PathBuf,
    pub snapshot_every_records: u64,
    /// 0 keeps every run.
    pub retention_days: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            data_dir: PathBuf::from("/var/lib/fusebox"),
            snapshot_every_records: 100_000,
            retention_days: 7,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonSection {
    pub max_batch: usize,
    pub gap_timeout_ms: u64,
    pub timer_interval_ms: u64,
    pub max_ack_pending: i64,
    pub pull_batch: usize,
    pub recent_decisions: usize,
    pub stall_limit_ms: u64,
}

impl Default for DaemonSection {
    fn default() -> Self {
        let service = ServiceOptions::default();
        DaemonSection {
            max_batch: service.max_batch,
            gap_timeout_ms: service.gap_timeout.as_millis() as u64,
            timer_interval_ms: service.timer_interval.as_millis() as u64,
            max_ack_pending: service.max_ack_pending,
            pull_batch: service.pull_batch,
            recent_decisions: service.recent_decisions,
            stall_limit_ms: service.stall_limit.as_millis() as u64,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    pub listen: String,
    pub tenant_label: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: "127.0.0.1:9464".to_owned(),
            tenant_label: false,
        }
    }
}

/// `[otlp]`: the OTLP/HTTP receiver (docs/otel.md). Off unless `listen` is set.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OtlpSection {
    /// `host:port` to serve `POST /v1/traces` on; empty = no receiver.
    pub listen: String,
    /// The tenant of every request on a loopback listener without `credentials`.
    pub tenant: String,
    /// Bearer token → tenant. Required off loopback: whoever can reach the port could
    /// otherwise write any run of the fixed tenant.
    pub credentials: std::collections::HashMap<String, String>,
    /// The largest request body read; past it the exporter is answered 413.
    pub max_body_bytes: usize,
}

impl Default for OtlpSection {
    fn default() -> Self {
        OtlpSection {
            listen: String::new(),
            tenant: "default".to_owned(),
            credentials: Default::default(),
            max_body_bytes: 4 << 20,
        }
    }
}

/// Everything the daemon needs, validated.
/// `[cluster]`: several daemons sharing the runs of one NATS account by partition
/// (interfaces.md §2, deploy/nats/partitions.conf). Off when `partitions = 0`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// N of the servers' `partition(N, …)` mapping; 0 = no cluster mode.
    pub partitions: u32,
    /// This daemon's name in the partition leases; unique per daemon.
    pub node_id: String,
    /// A partition whose owner has not renewed it for this long is free.
    pub lease_ms: u64,
    /// JetStream replicas of every stream, consumer and bucket the daemon creates (also
    /// without partitions: one daemon on a 3-node cluster wants 3).
    pub replicas: usize,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            partitions: 0,
            node_id: String::new(),
            lease_ms: 3000,
            replicas: 1,
        }
    }
}

#[derive(Debug)]
pub struct DaemonConfig {
    pub policies: PolicySet,
    pub nats: NatsConfig,
    pub storage: StorageConfig,
    pub service: ServiceOptions,
    pub metrics_listen: SocketAddr,
    pub metrics_tenant_label: bool,
    pub watchdog: fusebox_watchdog::WatchdogConfig,
    pub cluster: ClusterConfig,
    /// `Some` when `[otlp] listen` is set.
    pub otlp: Option<fusebox_otlp::OtlpOptions>,
}

/// Command-line values that win over the file.
pub struct Overrides {
    pub nats_url: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub metrics_listen: Option<String>,
    pub node_id: Option<String>,
}

fn section<T: Default + for<'de> Deserialize<'de>>(
    doc: &toml::Table,
    path: &Path,
    name: &'static str,
) -> Result<T, ConfigError> {
    match doc.get(name) {
        None => Ok(T::default()),
        Some(value) => {
            value
                .clone()
                .try_into()
                .map_err(|err: toml::de::Error| ConfigError::Section {
                    path: path.to_owned(),
                    section: name,
                    message: err.message().to_owned(),
                })
        }
    }
}

pub fn load(path: &Path, overrides: Overrides) -> Result<DaemonConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let doc: toml::Table = toml::from_str(&text).map_err(|source| ConfigError::Toml {
        path: path.to_owned(),
        source: Box::new(source),
    })?;
    let json = serde_json::to_value(&doc).map_err(|err| ConfigError::Section {
        path: path.to_owned(),
        section: "policy",
        message: err.to_string(),
    })?;
    let (policies, warnings) =
        PolicySet::from_config_document(&json, None).map_err(|source| ConfigError::Policy {
            path: path.to_owned(),
            source,
        })?;
    for warning in warnings {
        tracing::warn!(%warning, "policy setting raised");
    }
    let mut nats: NatsConfig = section(&doc, path, "nats")?;
    let mut storage: StorageConfig = section(&doc, path, "storage")?;
    let daemon: DaemonSection = section(&doc, path, "daemon")?;
    let mut metrics: MetricsConfig = section(&doc, path, "metrics")?;
    let watchdog: fusebox_watchdog::WatchdogConfig = section(&doc, path, "watchdog")?;
    let mut cluster: ClusterConfig = section(&doc, path, "cluster")?;
    let otlp_section: OtlpSection = section(&doc, path, "otlp")?;
    if let Some(node_id) = overrides.node_id {
        cluster.node_id = node_id;
    }
    watchdog.validate().map_err(|err| ConfigError::Section {
        path: path.to_owned(),
        section: "watchdog",
        message: err.to_string(),
    })?;
    if let Some(urls) = overrides.nats_url {
        nats.urls = urls.split(',').map(|u| u.trim().to_owned()).collect();
    }
    if let Some(dir) = overrides.data_dir {
        storage.data_dir = dir;
    }
    if let Some(listen) = overrides.metrics_listen {
        metrics.listen = listen;
    }
    let invalid = |section, message: String| ConfigError::Section {
        path: path.to_owned(),
        section,
        message,
    };
    if nats.urls.iter().all(|u| u.is_empty()) {
        return Err(invalid(
            "nats",
            "urls must name at least one server".to_owned(),
        ));
    }
    let credentials = [
        nats.user.is_some() || nats.password.is_some(),
        nats.token.is_some(),
        nats.nkey_seed_file.is_some(),
        nats.creds_file.is_some(),
    ];
    if credentials.iter().filter(|set| **set).count() > 1 {
        return Err(invalid(
            "nats",
            "set at most one of user/password, token, nkey_seed_file, creds_file".to_owned(),
        ));
    }
    if nats.user.is_some() != nats.password.is_some() {
        return Err(invalid("nats", "user and password go together".to_owned()));
    }
    if nats.tls_cert_file.is_some() != nats.tls_key_file.is_some() {
        return Err(invalid(
            "nats",
            "tls_cert_file and tls_key_file go together".to_owned(),
        ));
    }
    if cluster.partitions > 0 {
        if cluster.node_id.is_empty() {
            return Err(invalid(
                "cluster",
                "node_id must name this daemon (unique in the cluster; or --node-id)".to_owned(),
            ));
        }
        let key_safe = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
        if !cluster.node_id.bytes().all(key_safe) {
            return Err(invalid(
                "cluster",
                format!(
                    "node_id {:?} may hold only A-Z a-z 0-9 - _",
                    cluster.node_id
                ),
            ));
        }
        if cluster.lease_ms < 500 {
            return Err(invalid(
                "cluster",
                "lease_ms must be at least 500".to_owned(),
            ));
        }
    }
    if !(1..=5).contains(&cluster.replicas) {
        return Err(invalid("cluster", "replicas must be 1 to 5".to_owned()));
    }
    if daemon.max_batch == 0
        || daemon.pull_batch == 0
        || daemon.timer_interval_ms == 0
        || daemon.stall_limit_ms == 0
    {
        return Err(invalid(
            "daemon",
            "max_batch, pull_batch, timer_interval_ms and stall_limit_ms must be above 0"
                .to_owned(),
        ));
    }
    let metrics_listen = metrics.listen.parse().map_err(|err| {
        invalid(
            "metrics",
            format!("listen {:?} is not host:port: {err}", metrics.listen),
        )
    })?;
    let max_event_bytes = match doc
        .get("guard")
        .and_then(|guard| guard.get("max_event_bytes"))
    {
        None => fusebox_core::parse::DEFAULT_MAX_EVENT_BYTES,
        Some(value) => value
            .as_integer()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                invalid(
                    "guard",
                    "max_event_bytes must be a positive integer".to_owned(),
                )
            })?,
    };
    let service = ServiceOptions {
        queue_group: nats.queue_group.clone(),
        max_event_bytes,
        max_batch: daemon.max_batch,
        gap_timeout: Duration::from_millis(daemon.gap_timeout_ms),
        timer_interval: Duration::from_millis(daemon.timer_interval_ms),
        pull_batch: daemon.pull_batch,
        max_ack_pending: daemon.max_ack_pending,
        recent_decisions: daemon.recent_decisions,
        stall_limit: Duration::from_millis(daemon.stall_limit_ms),
        replicas: cluster.replicas,
        ..ServiceOptions::default()
    };
    let otlp = otlp_options(otlp_section, max_event_bytes).map_err(|m| invalid("otlp", m))?;
    Ok(DaemonConfig {
        otlp,
        policies,
        nats,
        storage,
        service,
        metrics_listen,
        metrics_tenant_label: metrics.tenant_label,
        watchdog,
        cluster,
    })
}

/// `[otlp]` validated: a listen address, and a credential for every tenant off loopback.
fn otlp_options(
    section: OtlpSection,
    max_event_bytes: usize,
) -> Result<Option<fusebox_otlp::OtlpOptions>, String> {
    if section.listen.is_empty() {
        return Ok(None);
    }
    let listen: SocketAddr = section
        .listen
        .parse()
        .map_err(|err| format!("listen {:?} is not host:port: {err}", section.listen))?;
    let token_safe = |t: &str| {
        !t.is_empty()
            && t.len() <= fusebox_core::parse::MAX_TENANT_LEN
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    for tenant in section.credentials.values().chain([&section.tenant]) {
        if !token_safe(tenant) {
            return Err(format!(
                "tenant {tenant:?} may hold only A-Z a-z 0-9 - _ (1-64)"
            ));
        }
    }
    let credentials = if section.credentials.is_empty() {
        if !listen.ip().is_loopback() {
            return Err(format!(
                "listen {listen} is off loopback: map a bearer token to a tenant in [otlp.credentials]"
            ));
        }
        fusebox_otlp::Credentials::Fixed(section.tenant)
    } else {
        fusebox_otlp::Credentials::Tokens(section.credentials)
    };
    if section.max_body_bytes == 0 {
        return Err("max_body_bytes must be above 0".to_owned());
    }
    Ok(Some(fusebox_otlp::OtlpOptions {
        listen,
        credentials,
        max_body_bytes: section.max_body_bytes,
        max_event_bytes,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
        file
    }

    fn none() -> Overrides {
        Overrides {
            nats_url: None,
            data_dir: None,
            metrics_listen: None,
            node_id: None,
        }
    }

    #[test]
    fn the_shipped_config_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/fusebox.toml");
        let config = load(&path, none()).unwrap();
        assert_eq!(config.service.max_event_bytes, 1 << 20);
        assert!(!config.nats.urls.is_empty());
    }

    #[test]
    fn overrides_win_and_typos_are_errors() {
        let file = write("[nats]\nurls = [\"nats://a:1\"]\n");
        let config = load(
            file.path(),
            Overrides {
                nats_url: Some("nats://b:2, nats://c:3".to_owned()),
                ..none()
            },
        )
        .unwrap();
        assert_eq!(config.nats.urls, ["nats://b:2", "nats://c:3"]);
        let typo = write("[nats]\nurl = \"nats://a:1\"\n");
        let err = load(typo.path(), none()).unwrap_err().to_string();
        assert!(err.contains("[nats]") && err.contains("url"), "{err}");
    }

    #[test]
    fn conflicting_credentials_are_refused() {
        let file = write("[nats]\ntoken = \"t\"\nuser = \"u\"\npassword = \"p\"\n");
        let err = load(file.path(), none()).unwrap_err().to_string();
        assert!(err.contains("at most one"), "{err}");
    }

    #[test]
    fn cluster_mode_needs_a_key_safe_node_id() {
        let file = write("[cluster]\npartitions = 8\n");
        let err = load(file.path(), none()).unwrap_err().to_string();
        assert!(
            err.contains("[cluster]") && err.contains("node_id"),
            "{err}"
        );
        let config = load(
            file.path(),
            Overrides {
                node_id: Some("d-1".to_owned()),
                ..none()
            },
        )
        .unwrap();
        assert_eq!(
            (config.cluster.partitions, config.cluster.node_id.as_str()),
            (8, "d-1")
        );
        let dotted = write("[cluster]\npartitions = 8\nnode_id = \"a.b\"\n");
        let err = load(dotted.path(), none()).unwrap_err().to_string();
        assert!(err.contains("may hold only"), "{err}");
    }

    #[test]
    fn otlp_off_loopback_needs_a_credential() {
        let cases = [
            ("", Ok(None)),
            (
                "[otlp]\nlisten = \"127.0.0.1:4318\"\n",
                Ok(Some("fixed:default")),
            ),
            (
                "[otlp]\nlisten = \"[::1]:4318\"\ntenant = \"acme\"\n",
                Ok(Some("fixed:acme")),
            ),
            ("[otlp]\nlisten = \"0.0.0.0:4318\"\n", Err("off loopback")),
            (
                "[otlp]\nlisten = \"0.0.0.0:4318\"\n[otlp.credentials]\ns3cret = \"acme\"\n",
                Ok(Some("tokens:1")),
            ),
            (
                "[otlp]\nlisten = \"127.0.0.1:4318\"\ntenant = \"a.b\"\n",
                Err("may hold only"),
            ),
            ("[otlp]\nlisten = \"localhost\"\n", Err("not host:port")),
            ("[otlp]\nlisen = \"127.0.0.1:4318\"\n", Err("lisen")),
        ];
        for (text, want) in cases {
            let file = write(text);
            let got = load(file.path(), none()).map(|c| {
                c.otlp.map(|o| match o.credentials {
                    fusebox_otlp::Credentials::Fixed(t) => format!("fixed:{t}"),
                    fusebox_otlp::Credentials::Tokens(t) => format!("tokens:{}", t.len()),
                })
            });
            match (got, want) {
                (Ok(got), Ok(want)) => assert_eq!(got.as_deref(), want, "{text}"),
                (Err(err), Err(needle)) => {
                    let err = err.to_string();
                    assert!(
                        err.contains("[otlp]") && err.contains(needle),
                        "{text}: {err}"
                    );
                }
                (got, want) => panic!("{text}: got {got:?}, want {want:?}"),
            }
        }
    }
}
