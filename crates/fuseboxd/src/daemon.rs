//! Start-up order and shutdown order.
//!
//! Start: open the log (rebuild state) → bind the metrics endpoint → connect to NATS →
//! start the cloud watchdog (timers from its journal) → the OTLP receiver, when
//! `[otlp]` is on → check/create streams and subscribe → serve. Any failure before serving is a clear error and a non-zero exit.
//! Stop (SIGTERM/SIGINT): stop taking input, commit and answer what was received, ack
//! it, snapshot the log, finish the watchdog's pass and publish its outcomes, let the
//! OTLP receiver answer what it holds, close NATS, stop metrics.

use std::sync::Arc;
use std::time::Instant;

use fusebox_log::{Guard, GuardOptions, LogError};
use fusebox_metrics::{Metrics, MetricsOptions, MetricsServer, Readiness, ServeError};
use fusebox_nats::{Observer, Service, ServiceError};

use crate::cluster::{self, ClusterError};
use crate::config::DaemonConfig;
use crate::connect::{connect, ConnectError};
use crate::observer::MetricsObserver;
use crate::signals;
use crate::store::DurableStore;
use crate::watchdog::{self, FeedStore, WatchdogError};

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot open the log: {0}")]
    Log(#[from] LogError),
    #[error("metrics: {0}")]
    Metrics(String),
    #[error("metrics endpoint: {0}")]
    Serve(#[from] ServeError),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    Service(#[from] ServiceError),
    #[error(transparent)]
    Watchdog(#[from] WatchdogError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Otlp(#[from] fusebox_otlp::BindError),
}

/// The OTLP receiver counts into the daemon's registry.
struct OtlpMetrics(Arc<Metrics>);

impl fusebox_otlp::OtlpCounter for OtlpMetrics {
    fn span(&self, outcome: &str) {
        self.0.otlp_span(outcome);
    }
    fn log_record(&self, outcome: &str) {
        self.0.otlp_log_record(outcome);
    }
    fn dead_letter(&self) {
        self.0.dlq_message();
    }
}

pub async fn run(mut config: DaemonConfig) -> Result<(), DaemonError> {
    let metrics = Arc::new(
        Metrics::new(
            env!("CARGO_PKG_VERSION"),
            MetricsOptions {
                tenant_label: config.metrics_tenant_label,
                ..MetricsOptions::default()
            },
        )
        .map_err(|err| DaemonError::Metrics(err.to_string()))?,
    );
    let readiness = Arc::new(Readiness::new());

    let guard_options = GuardOptions {
        snapshot_every_records: config.storage.snapshot_every_records,
        retention: (config.storage.retention_days > 0)
            .then(|| std::time::Duration::from_secs(config.storage.retention_days * 86_400)),
        ..GuardOptions::default()
    };
    // One log for all runs; in cluster mode one per owned partition, opened on claim.
    let guard = if config.cluster.partitions == 0 {
        let opened = Instant::now();
        let data_dir = config.storage.data_dir.clone();
        let (policies, options) = (config.policies.clone(), guard_options.clone());
        let guard = tokio::task::spawn_blocking(move || Guard::open(&data_dir, policies, options))
            .await
            .expect("log open task")?;
        metrics.set_replay_duration(opened.elapsed());
        tracing::info!(
            dir = %config.storage.data_dir.display(),
            runs = guard.engine().run_count(),
            position = guard.position(),
            "log open, state rebuilt"
        );
        Some(guard)
    } else {
        None
    };
    readiness.set_log_open(true);

    let server =
        MetricsServer::bind(config.metrics_listen, metrics.clone(), readiness.clone()).await?;
    let metrics_addr = server.local_addr()?;
    let (stop_metrics, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    let metrics_task = tokio::spawn(server.run(async {
        let _ = metrics_stopped.await;
    }));

    let observer: Arc<dyn Observer> = Arc::new(MetricsObserver {
        metrics: metrics.clone(),
        readiness: readiness.clone(),
    });
    let client = connect(&config.nats, observer.clone()).await?;
    observer.nats_connected(true);
    // The watchdog hears of launches and run ends through the store, as they are applied.
    let (watchdog, facts) = match watchdog::start(
        config.watchdog.clone(),
        &config.storage.data_dir,
        metrics.clone(),
        client.clone(),
        (config.cluster.partitions > 0).then_some(&config.cluster),
    )
    .await?
    {
        Some((running, facts)) => (Some(running), Some(facts)),
        None => (None, None),
    };
    // The OTLP receiver only publishes to FUSEBOX_EVENTS; the service created below (or
    // found) is what applies what it publishes, so it may start first.
    let (stop_otlp, otlp_task) = match config.otlp.clone() {
        Some(options) => {
            let listener = fusebox_otlp::OtlpListener::bind(
                options,
                client.clone(),
                Arc::new(OtlpMetrics(metrics.clone())),
            )
            .await?;
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, "OTLP receiver listening");
            }
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(listener.run(async {
                let _ = stopped.await;
            }));
            (Some(stop), Some(task))
        }
        None => (None, None),
    };
    // Launches are accepted only for a cloud the watchdog watches (part of every
    // service's options, the partitions' too).
    config.service.instance_providers = watchdog.iter().map(|w| w.provider.clone()).collect();
    let served = match guard {
        Some(guard) => {
            let service = Service::start(
                client.clone(),
                FeedStore::new(DurableStore(guard), facts),
                config.service.clone(),
                observer,
            )
            .await?;
            tracing::info!(
                nats = %config.nats.urls.join(","),
                metrics = %metrics_addr,
                "fuseboxd ready"
            );
            service
                .run_until(signals::terminated())
                .await
                .map_err(DaemonError::from)
        }
        None => {
            let shared = cluster::Shared {
                client: client.clone(),
                cluster: config.cluster.clone(),
                service: config.service.clone(),
                data_dir: config.storage.data_dir.clone(),
                guard_options,
                policies: config.policies.clone(),
                observer,
                metrics: metrics.clone(),
                facts,
            };
            tracing::info!(
                nats = %config.nats.urls.join(","),
                metrics = %metrics_addr,
                "fuseboxd ready (cluster mode)"
            );
            cluster::serve(shared, signals::terminated())
                .await
                .map_err(DaemonError::from)
        }
    };
    if let Some(watchdog) = watchdog {
        watchdog.shutdown().await;
    }
    if let Some(stop) = stop_otlp {
        let _ = stop.send(());
    }
    if let Some(Ok(Err(err))) = match otlp_task {
        Some(task) => Some(task.await),
        None => None,
    } {
        tracing::warn!(%err, "OTLP receiver stopped with an error");
    }
    if let Err(err) = client.drain().await {
        tracing::warn!(%err, "draining the NATS connection failed");
    }
    let _ = stop_metrics.send(());
    if let Ok(Err(err)) = metrics_task.await {
        tracing::warn!(%err, "metrics endpoint stopped with an error");
    }
    served?;
    tracing::info!("fuseboxd stopped cleanly");
    Ok(())
}
