//! The cloud cost watchdog inside the daemon (`[watchdog]` in fusebox.toml).
//!
//! Wiring only; the engine is `fusebox-watchdog`:
//! * facts in: [`feed::FeedStore`] turns applied `instance_launched` events and run-closing
//!   decisions into facts, journals them (fsync) and records them with the watchdog;
//! * start: facts are read back from the journal and the timers rebuilt, permissions are
//!   checked with EC2's DryRun flag, then the watchdog sweeps once and serves its timers;
//! * outcomes out: through a channel to [`outcomes::publish`] (journal, NATS, metrics);
//! * gauges: copied into `fusebox-metrics` every second;
//! * `fusebox.control.watchdog`: status (halted or not, the instances with their
//!   deadlines, recent terminations), and an operator's resume of a halt ([`control`]);
//!   answered also when the watchdog is disabled, saying so.
//!
//! Missing AWS credentials are not fatal: the watchdog says so and retries every sweep,
//! and the guard runs regardless.
//!
//! In a cluster (issue 49 §2) every daemon keeps the whole cluster's facts and halt, and
//! only the holder of the watchdog role acts ([`role`], `cluster/watchdog_role.rs`):
//! * facts: journaled where applied, then shared through `FUSEBOX_WATCHDOG_FACTS`
//!   ([`fact_stream`]), which every daemon follows;
//! * the halt: the KV key `FUSEBOX_WATCHDOG/halt` ([`halt_key`]), written by the holder
//!   that halts and by the resume, followed by every daemon, read by a new holder
//!   before its first pass;
//! * passes run only while the role is held, terminations only within its fence;
//! * `fusebox.control.watchdog` is answered by the holder alone: one answer.

mod control;
mod fact_stream;
mod feed;
mod halt_key;
mod journal;
mod outcomes;
mod query;
mod role;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use fusebox_metrics::Metrics;
use fusebox_watchdog::{
    Clock, Ec2Provider, Fact, PermissionStatus, Provider, SteadyClock, Watchdog, WatchdogConfig,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::cluster::watchdog_role::RoleKeeper;
use crate::config::ClusterConfig;
pub use feed::{FactSink, FeedStore};
use halt_key::HaltKey;
use journal::{Entry, Journal};
use role::{Authority, Fenced};

/// How often the watchdog's gauges are copied into the metrics registry.
const STATS_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum WatchdogError {
    #[error("cannot open the watchdog journal in {dir}: {source}")]
    Journal { dir: String, source: std::io::Error },
    #[error("[watchdog]: {0}")]
    Config(#[from] fusebox_watchdog::ConfigError),
    #[error("watchdog in cluster mode: {0}")]
    Cluster(String),
}

/// How long start-up waits for JetStream (a cluster electing its leaders) before the
/// watchdog's shared bucket and stream are given up on.
const STARTUP_PATIENCE: Duration = Duration::from_secs(30);

/// What the watchdog shares in a cluster.
struct Cluster {
    role: RoleKeeper,
    halt: Arc<HaltKey>,
    js: jetstream::Context,
}

/// A running watchdog; [`Running::shutdown`] stops it cleanly.
pub struct Running {
    /// The provider (cloud) the watchdog has a driver for: `instance_launched` events
    /// naming any other are refused at the door.
    pub provider: String,
    stop: watch::Sender<bool>,
    engine: JoinHandle<()>,
    stats: JoinHandle<()>,
    control: JoinHandle<()>,
    stop_publisher: oneshot::Sender<()>,
    publisher: JoinHandle<()>,
    /// The role's keeper, given back once the last pass has finished.
    role: Option<RoleKeeper>,
    /// The followers of the shared halt and facts, and the facts' publisher: stopped
    /// last, after the partitions (which feed facts) and the watchdog.
    stop_sharing: watch::Sender<bool>,
    sharing: Vec<JoinHandle<()>>,
}

/// Starts the watchdog unless `[watchdog] enabled = false`; returns it with the sink the
/// guard store feeds facts into. `cluster`: this daemon is one of a cluster's, and acts
/// as the watchdog only while it holds the role.
pub async fn start(
    cfg: WatchdogConfig,
    data_dir: &Path,
    metrics: Arc<Metrics>,
    client: async_nats::Client,
    cluster: Option<&ClusterConfig>,
) -> Result<Option<(Running, Arc<dyn FactSink>)>, WatchdogError> {
    if !cfg.enabled {
        tracing::info!("cloud watchdog disabled ([watchdog] enabled = false)");
        // Ends when the connection is drained at shutdown.
        tokio::spawn(control::serve(client, None, watch::channel(false).1));
        return Ok(None);
    }
    let opened = Journal::open(data_dir).map_err(|source| WatchdogError::Journal {
        dir: data_dir.display().to_string(),
        source,
    })?;
    let journal = Arc::new(opened.journal);
    let recent = query::Recent::from_journal(opened.termination_records);
    let regions: Vec<&str> = cfg.regions.iter().map(String::as_str).collect();
    metrics.init_watchdog_regions(&regions);
    metrics.init_watchdog_api_ops(&["DescribeInstances", "TerminateInstances"]);
    tracing::info!(
        regions = %cfg.regions.join(","),
        endpoint = cfg.endpoint_url.as_deref().unwrap_or("AWS default"),
        dry_run = cfg.dry_run,
        grace_s = cfg.grace_s,
        sweep = %cfg.sweep_cron,
        "cloud watchdog starting (credentials: standard AWS chain)"
    );
    let shared = match cluster {
        Some(cluster) => Some(share(&client, cluster).await?),
        None => None,
    };
    let authority = match &shared {
        Some((_, authority)) => authority.clone(),
        None => Authority::Always,
    };
    let shared = shared.map(|(cluster, _)| cluster);
    let provider = Fenced {
        inner: Ec2Provider::from_env(&cfg).await,
        authority: authority.clone(),
    };
    let provider_name = provider.name().to_owned();
    let (records, received) = mpsc::unbounded_channel();
    // Deadlines move closer by elapsed time only: a step of the host's clock neither
    // fires every timer at once nor postpones them all (fusebox_watchdog::clock).
    let clock = Arc::new(SteadyClock::new());
    let wd = Watchdog::new(
        cfg,
        provider,
        clock.clone(),
        Arc::new(outcomes::ChannelSink(records)),
    )?;
    let restored = opened.facts.len();
    // Published again on every start: a fact journaled here whose publish was cut short
    // by a kill reaches the others now (repeats are dropped or known).
    let republish: Vec<Fact> = match &shared {
        Some(_) => opened
            .facts
            .iter()
            .filter(|f| fact_stream::shared(f))
            .cloned()
            .collect(),
        None => Vec::new(),
    };
    wd.restore(opened.facts);
    tracing::info!(
        journal = %journal.path().display(),
        facts = restored,
        terminations = opened.terminations,
        "watchdog timers rebuilt from its journal"
    );
    compact_if_due(&journal, &wd);

    let (stop_publisher, publisher_stopped) = oneshot::channel();
    let publisher = tokio::spawn(outcomes::publish(
        received,
        publisher_stopped,
        journal.clone(),
        client.clone(),
        metrics.clone(),
        recent.clone(),
        shared.as_ref().map(|c| c.halt.clone()),
    ));
    let (stop_sharing, sharing_stopped) = watch::channel(false);
    let mut sharing = Vec::new();
    let mut to_share = None;
    if let Some(cluster) = &shared {
        sharing.push(tokio::spawn(halt_key::follow(
            cluster.halt.clone(),
            wd.clone(),
            journal.clone(),
            sharing_stopped.clone(),
        )));
        sharing.push(tokio::spawn(fact_stream::follow(
            cluster.js.clone(),
            wd.clone(),
            journal.clone(),
            data_dir.to_owned(),
            sharing_stopped.clone(),
        )));
        let (queue, queued) = mpsc::unbounded_channel();
        for fact in republish {
            let _ = queue.send(fact);
        }
        sharing.push(tokio::spawn(fact_stream::publish(
            cluster.js.clone(),
            queued,
            sharing_stopped,
        )));
        to_share = Some(queue);
    }
    let (stop, stopped) = watch::channel(false);
    if let Some(halted) = wd.halted() {
        tracing::error!(since_ms = halted.at_ms, why = %halted.why,
            "the watchdog starts HALTED (journaled): it terminates nothing until `fusebox watchdog resume`");
    }
    let controlled = control::Controlled {
        wd: wd.clone(),
        journal: journal.clone(),
        recent,
        authority: authority.clone(),
        halt: shared.as_ref().map(|c| c.halt.clone()),
    };
    let control = tokio::spawn(control::serve(client, Some(controlled), stopped.clone()));
    let engine = tokio::spawn(serve(
        wd.clone(),
        authority,
        shared.as_ref().map(|c| c.halt.clone()),
        journal.clone(),
        stopped.clone(),
    ));
    let stats = tokio::spawn(copy_stats(
        wd.clone(),
        clock,
        journal.clone(),
        metrics,
        stopped,
    ));
    let running = Running {
        provider: provider_name,
        stop,
        engine,
        stats,
        control,
        stop_publisher,
        publisher,
        role: shared.map(|c| c.role),
        stop_sharing,
        sharing,
    };
    let facts = Facts {
        journal,
        wd,
        to_share,
    };
    Ok(Some((running, Arc::new(facts))))
}

/// The role's keeper, the shared halt and the facts stream of a cluster's watchdog.
async fn share(
    client: &async_nats::Client,
    cluster: &ClusterConfig,
) -> Result<(Cluster, Authority), WatchdogError> {
    let js = jetstream::new(client.clone());
    let started = std::time::Instant::now();
    let halt = loop {
        let ready = async {
            let halt = HaltKey::open(&js, cluster.replicas).await?;
            fusebox_nats::setup::ensure_stream(&js, fact_stream::stream_config(cluster.replicas))
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(halt)
        };
        match ready.await {
            Ok(ready) => break ready,
            Err(err) if started.elapsed() < STARTUP_PATIENCE => {
                tracing::warn!(%err, "watchdog: JetStream not ready; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(err) => return Err(WatchdogError::Cluster(err)),
        }
    };
    let lease = Duration::from_millis(cluster.lease_ms);
    let (role, until) = RoleKeeper::start(client.clone(), cluster.node_id.clone(), lease);
    let shared = Cluster {
        role,
        halt: Arc::new(halt),
        js,
    };
    Ok((shared, Authority::Until(until)))
}

impl Running {
    /// Finishes the pass in progress, gives the role back, then publishes what the
    /// pass produced and stops sharing.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Err(err) = self.engine.await {
            tracing::error!(%err, "watchdog task failed");
        }
        if let Some(role) = self.role {
            role.stop().await;
        }
        let _ = self.stats.await;
        let _ = self.control.await;
        let _ = self.stop_publisher.send(());
        if let Err(err) = self.publisher.await {
            tracing::error!(%err, "watchdog publisher failed");
        }
        let _ = self.stop_sharing.send(true);
        for task in self.sharing {
            let _ = task.await;
        }
        tracing::info!("cloud watchdog stopped");
    }
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Permission check, then the watchdog's own loop (which sweeps once first) whenever
/// this daemon holds the role (always, alone), until it loses it.
async fn serve(
    wd: Watchdog<Fenced>,
    mut authority: Authority,
    halt: Option<Arc<HaltKey>>,
    journal: Arc<Journal>,
    stop: watch::Receiver<bool>,
) {
    tokio::select! {
        () = check_permissions(&wd) => {}
        () = stopped(stop.clone()) => return,
    }
    loop {
        tokio::select! {
            () = authority.taken() => {}
            () = stopped(stop.clone()) => return,
        }
        if let Some(halt) = &halt {
            if let Err(err) = adopt_halt(&wd, &journal, halt).await {
                tracing::warn!(%err, "the cluster's halt is unreadable: no pass until it is read");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(500)) => continue,
                    () = stopped(stop.clone()) => return,
                }
            }
            tracing::info!("watchdog active: this daemon holds the cluster's watchdog role");
        }
        let mut lost = authority.clone();
        let told = stopped(stop.clone());
        wd.run(async move {
            tokio::select! {
                () = lost.lost() => {}
                () = told => {}
            }
        })
        .await;
        if *stop.borrow() {
            return;
        }
        tracing::warn!("watchdog inactive: the role is no longer held here");
    }
}

/// Before a new holder's first pass: the bucket's halt or resume, which a holder that
/// halted or an operator wrote; or, the bucket never told of one, this daemon's own
/// journaled halt, written there (a halt whose write was cut short stays a halt).
async fn adopt_halt(
    wd: &Watchdog<Fenced>,
    journal: &Arc<Journal>,
    halt: &HaltKey,
) -> Result<(), String> {
    match halt.read().await? {
        Some((fact, _)) => {
            let (wd, journal) = (wd.clone(), journal.clone());
            tokio::task::spawn_blocking(move || halt_key::apply(&wd, &journal, fact))
                .await
                .map_err(|e| e.to_string())
        }
        None => match wd.halted() {
            Some(halted) => halt.halt(&Fact::Halted(halted)).await,
            None => Ok(()),
        },
    }
}

async fn check_permissions(wd: &Watchdog<Fenced>) {
    let checks = wd.check_permissions().await;
    let granted = checks
        .iter()
        .filter(|c| c.status == PermissionStatus::Granted)
        .count();
    let missing = checks
        .iter()
        .filter(|c| matches!(c.status, PermissionStatus::Missing(_)))
        .count();
    if granted == checks.len() {
        tracing::info!(
            checks = checks.len(),
            "watchdog permissions verified with EC2 DryRun"
        );
    } else if missing > 0 {
        tracing::error!(
            missing,
            "watchdog lacks EC2 permissions (see the MISSING lines above); it cannot \
             terminate overdue instances until they are granted; the guard keeps running"
        );
    } else {
        tracing::warn!(
            unverified = checks.len() - granted,
            "watchdog could not verify its EC2 permissions (no AWS credentials, or EC2 \
             unreachable: see above); it retries on every sweep; the guard keeps running"
        );
    }
}

/// Compacts the journal when it has grown enough; a failure leaves the old journal in place.
fn compact_if_due(journal: &Journal, wd: &Watchdog<Fenced>) {
    if !journal.compaction_due() {
        return;
    }
    match journal.compact(|| wd.live_facts()) {
        Ok(c) => tracing::info!(
            journal = %journal.path().display(),
            bytes_before = c.bytes_before,
            bytes_after = c.bytes_after,
            lines_before = c.lines_before,
            lines_after = c.lines_after,
            facts_kept = c.facts_kept,
            outcomes_kept = c.outcomes_kept,
            "watchdog journal compacted"
        ),
        Err(err) => tracing::error!(
            journal = %journal.path().display(), %err,
            "cannot compact the watchdog journal; it stays as it was and keeps growing"
        ),
    }
}

/// Copies the watchdog's gauges and counters into the registry, and compacts the journal
/// when due (off the async threads: it reads, writes and fsyncs a file).
async fn copy_stats(
    wd: Watchdog<Fenced>,
    clock: Arc<SteadyClock>,
    journal: Arc<Journal>,
    metrics: Arc<Metrics>,
    stop: watch::Receiver<bool>,
) {
    let mut errors_seen: BTreeMap<String, u64> = BTreeMap::new();
    let mut held_seen: BTreeMap<String, u64> = BTreeMap::new();
    let mut tick = tokio::time::interval(STATS_EVERY);
    let stop = stopped(stop);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = &mut stop => break,
        }
        let s = wd.stats();
        let by_state: Vec<(&str, u64)> = s
            .instances_by_state
            .iter()
            .map(|(state, n)| (state.as_str(), *n))
            .collect();
        metrics.set_watchdog_instances(&by_state);
        metrics.set_watchdog_oldest_instance_age(s.oldest_instance_age_s.map(Duration::from_secs));
        // The watchdog's own clock: the gauge is the time its timer will really wait.
        let now_ms = i128::from(clock.now_ms());
        metrics.set_watchdog_next_deadline(
            s.next_deadline_ms
                .map(|at| (i128::from(at) - now_ms) as f64 / 1000.0),
        );
        metrics.set_watchdog_protected_instances(s.protected_overdue);
        // The registry's counter only goes up; the watchdog reports running totals.
        for (op, total) in &s.api_errors_by_op {
            let seen = errors_seen.entry(op.clone()).or_default();
            for _ in *seen..*total {
                metrics.watchdog_api_error(op);
            }
            *seen = (*seen).max(*total);
        }
        metrics.set_watchdog_terminations_held(s.held_last_pass);
        metrics.set_watchdog_halted(s.halted);
        for (reason, total) in &s.held_total_by_reason {
            let seen = held_seen.entry(reason.clone()).or_default();
            if *total > *seen {
                metrics.watchdog_terminations_held(reason, *total - *seen);
                *seen = *total;
            }
        }
        if journal.compaction_due() {
            let (journal, wd) = (journal.clone(), wd.clone());
            let _ = tokio::task::spawn_blocking(move || compact_if_due(&journal, &wd)).await;
        }
    }
}

/// The guard store's fact sink: durable first, then the watchdog's timers, then (in a
/// cluster) the other daemons.
struct Facts {
    journal: Arc<Journal>,
    wd: Watchdog<Fenced>,
    to_share: Option<mpsc::UnboundedSender<Fact>>,
}

impl FactSink for Facts {
    fn facts(&self, facts: Vec<Fact>) {
        let entries: Vec<Entry<'_>> = facts.iter().map(|fact| Entry::Fact { fact }).collect();
        // Recorded under the journal's lock, so a compaction sees them in the watchdog.
        let written = self.journal.append_then(&entries, || {
            for fact in &facts {
                tracing::info!(?fact, "watchdog fact");
                self.wd.record(fact.clone());
            }
        });
        if let Err(err) = written {
            // The live timers still get the facts; only a restart before the next sweep
            // would miss them (the sweep finds tagged instances on its own).
            tracing::error!(%err, "cannot journal watchdog facts");
        }
        if let Some(queue) = &self.to_share {
            for fact in facts {
                // Fails only once the publisher has stopped, at the very end of a
                // shutdown: the journal has the fact, republished at the next start.
                let _ = queue.send(fact);
            }
        }
    }
}
