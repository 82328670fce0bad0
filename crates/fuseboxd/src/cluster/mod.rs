//! Cluster mode: several fuseboxd share one NATS account's runs by partition
//! (interfaces.md §2, deploy/nats/partitions.conf). Everything shared lives in
//! JetStream, nothing in a protocol of ours:
//!
//! - `lease.rs`: who owns which partition (KV keys that expire unless renewed with a
//!   revision check), and a fair share per live daemon;
//! - `keeper.rs`: the task that renews one owned partition's lease, apart from
//!   everything else;
//! - `applied.rs`: each partition's replicated batches (`FUSEBOX_APPLIED`), written
//!   before the local log and fenced, and the catch-up a new owner runs;
//! - `shared_ledger.rs`: the op_key ledger every daemon claims from (KV, create-if-absent);
//! - `store.rs`: the partition's `GuardStore` that puts those together around its own
//!   `fusebox-log` guard in `<data_dir>/partitions/<p>`;
//! - `mark.rs`: how far that log reaches into `FUSEBOX_APPLIED`, so a catch-up reads
//!   only what the log lacks;
//! - `watchdog_role.rs`: the cloud watchdog's role, one holder per cluster (started by
//!   the watchdog, `crate::watchdog`, not by this loop).
//!
//! Each owned partition is an ordinary [`Service`] scoped to its subjects, with its own
//! applier thread and durable consumer `fuseboxd-p<p>`. This file is the loop that
//! heartbeats, claims up to the fair share, gives up extras, and stops a partition
//! whose lease (its keeper says) or replication was lost.

mod applied;
mod keeper;
mod lease;
mod mark;
mod observe;
mod shared_ledger;
mod store;
pub mod watchdog_role;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use fusebox_core::PolicySet;
use fusebox_log::{Guard, GuardOptions, LogError};
use fusebox_nats::subjects::Scope;
use fusebox_nats::{setup, Observer, Service, ServiceError, ServiceOptions};
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::ClusterConfig;
use crate::watchdog::{FactSink, FeedStore};
use fusebox_metrics::Metrics;
use keeper::Keeper;
use lease::{fair_share, Lease, Leases};
use shared_ledger::SharedLedger;
use store::PartitionStore;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cluster: {what} failed: {detail}")]
    Nats { what: &'static str, detail: String },
    #[error("cluster: {0}")]
    Config(String),
    #[error("cluster: FUSEBOX_APPLIED message {sequence} of partition {partition} does not decode ({detail}); the replicated log is damaged")]
    Corrupt {
        partition: u32,
        sequence: u64,
        detail: String,
    },
    #[error("cluster: {0}")]
    Setup(#[from] fusebox_nats::SetupError),
    #[error("cluster: partition log: {0}")]
    Log(#[from] LogError),
    #[error("cluster: partition service: {0}")]
    Service(#[from] ServiceError),
    #[error("cluster: catching up failed: {0}")]
    Replay(fusebox_nats::StoreError),
}

impl ClusterError {
    fn nats(what: &'static str, err: impl std::fmt::Display) -> Self {
        ClusterError::Nats {
            what,
            detail: err.to_string(),
        }
    }
}

/// Attempts of one replication or shared-ledger request from the applier thread:
/// JetStream answers "unavailable" while a cluster elects a new leader (seconds), which
/// must not cost the partition.
const ATTEMPTS: u32 = 20;
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Whether a KV write was refused by its revision check (another writer was first):
/// JetStream's 10071, which async-nats maps to `WrongLastRevision` / `AlreadyExists`,
/// or 10164 (`wrong last sequence: N`, the form nats-server 2.15 answers some header
/// checks with), which it leaves as `Other`. Taken for an outage, a lost race was
/// retried 20 times and then failed the batch, and a renewal whose earlier, unanswered
/// attempt had landed looked like a lease the network kept from being renewed.
fn refused_by_revision_check<K>(err: &async_nats::error::Error<K>) -> bool
where
    K: Clone + std::fmt::Debug + std::fmt::Display + PartialEq,
{
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        if let Some(answer) = cause.downcast_ref::<jetstream::Error>() {
            let code = answer.error_code();
            return code == jetstream::ErrorCode::STREAM_WRONG_LAST_SEQUENCE
                || code == jetstream::ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT;
        }
        source = cause.source();
    }
    false
}

/// JetStream's answer refusing a write with `code`, as the server sends it (tests).
#[cfg(test)]
fn jetstream_answer(code: u64) -> jetstream::Error {
    serde_json::from_value(serde_json::json!({
        "code": 400, "err_code": code, "description": "wrong last sequence: 7"
    }))
    .unwrap()
}

/// Binds a KV bucket, creating it from `config` when absent.
async fn bind_bucket(
    js: &jetstream::Context,
    config: async_nats::jetstream::kv::Config,
) -> Result<async_nats::jetstream::kv::Store, ClusterError> {
    match js.get_key_value(config.bucket.clone()).await {
        Ok(kv) => Ok(kv),
        Err(_) => js
            .create_key_value(config)
            .await
            .map_err(|e| ClusterError::nats("creating a KV bucket", e)),
    }
}

/// What a partition needs to run, shared by all of them.
#[derive(Clone)]
pub struct Shared {
    pub client: async_nats::Client,
    pub cluster: ClusterConfig,
    pub service: ServiceOptions,
    pub data_dir: std::path::PathBuf,
    pub guard_options: GuardOptions,
    pub policies: PolicySet,
    pub observer: Arc<dyn Observer>,
    pub metrics: Arc<Metrics>,
    pub facts: Option<Arc<dyn FactSink>>,
}

/// The state of the ownership loop.
struct Partitions {
    owned: BTreeMap<u32, Owned>,
    totals: Arc<observe::Totals>,
    /// A partition whose log got stuck (`ServiceError::Stalled`): the disk is this
    /// daemon's, so it stops altogether and the others take its partitions over.
    stuck: Option<ClusterError>,
    /// Partitions given up whose service is still draining (its kill-switch publishes
    /// may wait minutes for an unreachable NATS): waited for beside the loop, never in
    /// it, so the other partitions' leases are still renewed meanwhile; not claimed
    /// again until drained.
    draining: BTreeMap<u32, JoinHandle<Option<ClusterError>>>,
}

/// An owned partition: the task renewing its lease and the task serving it. The
/// service stops by itself once the lease's last renewal is older than the fence,
/// whatever the ownership loop is waiting on.
struct Owned {
    keeper: Keeper,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), ClusterError>>,
}

/// Serves the partitions this daemon owns until `shutdown` resolves, then drains
/// them and gives their leases up so the others take over at once.
pub async fn serve(
    shared: Shared,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ClusterError> {
    let js = jetstream::new(shared.client.clone());
    let replicas = shared.cluster.replicas;
    let applied_config = applied::stream_config(replicas, shared.guard_options.retention);
    while_starting("creating FUSEBOX_APPLIED", || async {
        Ok(setup::ensure_stream(&js, applied_config.clone()).await?)
    })
    .await?;
    let lease_time = Duration::from_millis(shared.cluster.lease_ms);
    let leases = Arc::new(
        while_starting("binding the lease bucket", || {
            Leases::open(
                &js,
                &shared.cluster.node_id,
                shared.cluster.partitions,
                lease_time,
                replicas,
            )
        })
        .await?,
    );
    let ledger = while_starting("binding the ledger bucket", || {
        SharedLedger::open(&js, replicas, tokio::runtime::Handle::current())
    })
    .await?;
    let ledger = Arc::new(ledger);
    tracing::info!(
        node = %shared.cluster.node_id,
        partitions = shared.cluster.partitions,
        lease_ms = shared.cluster.lease_ms,
        "cluster mode: claiming partitions"
    );
    shared
        .metrics
        .set_cluster_partitions(shared.cluster.partitions);
    let mut state = Partitions {
        owned: BTreeMap::new(),
        totals: Arc::new(observe::Totals::default()),
        stuck: None,
        draining: BTreeMap::new(),
    };
    let mut tick = tokio::time::interval(lease_time / 4);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tick.tick() => {
                round(&shared, &js, &leases, &ledger, &mut state, lease_time).await;
                shared.metrics.set_cluster_partitions_owned(state.owned.len());
                if state.stuck.is_some() {
                    break;
                }
            }
        }
    }
    for (partition, owned) in std::mem::take(&mut state.owned) {
        give_up(
            &shared,
            &mut state,
            &leases,
            partition,
            owned,
            Change::Released("shutdown"),
        )
        .await;
    }
    for (_, draining) in std::mem::take(&mut state.draining) {
        if let Some(stuck) = draining.await.unwrap_or_default() {
            state.stuck.get_or_insert(stuck);
        }
    }
    shared.metrics.set_cluster_partitions_owned(0);
    if let Err(err) = within(RELEASE_WAIT, leases.leave()).await {
        tracing::warn!(%err, "removing the heartbeat failed; it ages out");
    }
    match state.stuck {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

/// How long start-up waits for JetStream to answer: a cluster that has just started (or
/// lost a node) elects its stream leaders for a few seconds and answers "no responders"
/// meanwhile.
const STARTUP_PATIENCE: Duration = Duration::from_secs(30);

/// Runs a start-up step again while it fails on NATS (not on configuration), for up to
/// [`STARTUP_PATIENCE`].
async fn while_starting<T, F, Fut>(what: &str, mut step: F) -> Result<T, ClusterError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ClusterError>>,
{
    let deadline = Instant::now() + STARTUP_PATIENCE;
    loop {
        match step().await {
            Err(
                err @ (ClusterError::Nats { .. }
                | ClusterError::Setup(
                    fusebox_nats::SetupError::NoJetStream(_)
                    | fusebox_nats::SetupError::Request { .. },
                )),
            ) if Instant::now() < deadline => {
                tracing::warn!(%err, what, "JetStream not ready; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            other => return other,
        }
    }
}

/// One turn of the ownership loop.
async fn round(
    shared: &Shared,
    js: &jetstream::Context,
    leases: &Arc<Leases>,
    ledger: &Arc<SharedLedger>,
    state: &mut Partitions,
    lease_time: Duration,
) {
    let drained: Vec<u32> = state
        .draining
        .iter()
        .filter(|(_, task)| task.is_finished())
        .map(|(&p, _)| p)
        .collect();
    for partition in drained {
        let task = state.draining.remove(&partition).expect("listed");
        if let Some(stuck) = task.await.unwrap_or_default() {
            state.stuck.get_or_insert(stuck);
        }
    }
    // Every request is bounded by a quarter lease: a round stuck on an unreachable
    // JetStream must not hold up claims and releases for long. Leases are renewed by
    // their keepers meanwhile, whatever this round waits on.
    let bound = lease_time / 4;
    let live = match within(bound, leases.heartbeat(shared.cluster.partitions)).await {
        Ok(live) => Some(live),
        Err(err) => {
            tracing::warn!(%err, "cluster heartbeat failed");
            None
        }
    };
    // A lease lost (its keeper ended), or a service that stopped on its own (a fenced
    // or failed batch), is given up; the partition is claimed afresh (reopened, caught
    // up) by whoever gets it next, this daemon included.
    let ended: Vec<u32> = state
        .owned
        .iter()
        .filter(|(_, o)| o.keeper.is_finished() || o.task.is_finished())
        .map(|(&p, _)| p)
        .collect();
    for partition in ended {
        let entry = state.owned.remove(&partition).expect("listed");
        give_up(shared, state, leases, partition, entry, Change::Failed).await;
    }
    let Some(live) = live else { return };
    let share = fair_share(shared.cluster.partitions, live);
    while state.owned.len() > share {
        let (&partition, _) = state.owned.iter().next_back().expect("more than the share");
        let entry = state.owned.remove(&partition).expect("listed");
        let change = Change::Released("above the fair share");
        give_up(shared, state, leases, partition, entry, change).await;
    }
    if state.owned.len() >= share {
        return;
    }
    // Start the search at a node-dependent place so daemons do not all race for the
    // same free partitions first.
    let n = shared.cluster.partitions;
    let offset = fusebox_core::fixed_hash::fnv1a(shared.cluster.node_id.as_bytes()) as u32 % n;
    for i in 0..n {
        if state.owned.len() >= share {
            break;
        }
        let partition = (offset + i) % n;
        if state.owned.contains_key(&partition) || state.draining.contains_key(&partition) {
            continue;
        }
        let sent = Instant::now();
        match within(bound, leases.claim(partition)).await {
            Ok(Some(lease)) => {
                tracing::info!(partition, "partition lease taken; catching up");
                let (stop, stopped) = watch::channel(false);
                let (keeper, renewals) =
                    Keeper::start(leases.clone(), partition, lease, sent, lease_time);
                let task = tokio::spawn(serve_partition(
                    shared.clone(),
                    js.clone(),
                    ledger.clone(),
                    state.totals.clone(),
                    partition,
                    Stopping {
                        stop: stopped,
                        fence: Fence::new(renewals, fence(lease_time)),
                    },
                ));
                state.owned.insert(partition, Owned { keeper, stop, task });
            }
            Ok(None) => {}
            Err(err) => {
                tracing::warn!(partition, %err, "claiming a partition failed");
                break;
            }
        }
    }
}

/// Why a partition is no longer served.
enum Change {
    /// Given up on purpose (shutdown, above the fair share).
    Released(&'static str),
    /// The lease is (or may be) someone else's now: its keeper ended, for this reason.
    Lost(&'static str),
    /// Its service stopped on its own.
    Failed,
}

/// How long giving a lease (or the heartbeat) back may take: only a courtesy that lets
/// another daemon take over before the lease expires, so it must not hold up a
/// shutdown while NATS is unreachable.
const RELEASE_WAIT: Duration = Duration::from_secs(1);

/// A lease not renewed for this long is given up by its owner, well before it expires
/// and another daemon may take the partition.
fn fence(lease: Duration) -> Duration {
    lease * 2 / 3
}

/// How long this daemon may still act for a partition: until [`fence`] after its
/// lease's last renewal. The partition's service stops there, and so do its applier's
/// JetStream requests (replication, shared ledger): a batch in flight is abandoned, not
/// retried past it, so nothing is committed or answered for a partition after its owner
/// stopped serving it, however long the owner stays cut off.
#[derive(Clone)]
pub struct Fence {
    renewals: watch::Receiver<Instant>,
    after: Duration,
}

impl Fence {
    fn new(renewals: watch::Receiver<Instant>, after: Duration) -> Fence {
        Fence { renewals, after }
    }

    fn deadline(&self) -> Instant {
        *self.renewals.borrow() + self.after
    }

    /// The time left before the fence; `None` once it has passed.
    pub fn left(&self) -> Option<Duration> {
        Some(self.deadline().checked_duration_since(Instant::now())?).filter(|d| !d.is_zero())
    }

    /// Runs `request` on `runtime` (from a blocking thread) until it answers or the
    /// fence passes (`None`).
    pub fn block_on<T>(&self, runtime: &Handle, request: impl Future<Output = T>) -> Option<T> {
        let left = self.left()?;
        runtime.block_on(async { tokio::time::timeout(left, request).await.ok() })
    }
}

/// When a partition's service must stop: told to, or its lease not renewed in time.
struct Stopping {
    stop: watch::Receiver<bool>,
    fence: Fence,
}

impl Stopping {
    async fn until(&mut self, partition: u32) {
        loop {
            let deadline = self.fence.deadline();
            tokio::select! {
                _ = self.stop.wait_for(|stop| *stop) => return,
                changed = self.fence.renewals.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep_until(deadline.into()) => {
                    if self.fence.left().is_none() {
                        tracing::warn!(partition, "lease not renewed in time; stopped serving the partition");
                        return;
                    }
                }
            }
        }
    }
}

async fn within<T>(
    bound: Duration,
    request: impl std::future::Future<Output = Result<T, ClusterError>>,
) -> Result<T, ClusterError> {
    tokio::time::timeout(bound, request)
        .await
        .unwrap_or_else(|_| Err(ClusterError::nats("a lease request", "no answer in time")))
}

/// Stops serving a partition: tells its service to stop, and leaves the waiting for
/// it (and the lease's release) to [`drain`], beside the ownership loop.
async fn give_up(
    shared: &Shared,
    state: &mut Partitions,
    leases: &Arc<Leases>,
    partition: u32,
    owned: Owned,
    change: Change,
) {
    let _ = owned.stop.send(true);
    let kept = owned.keeper.stop().await;
    // A keeper that ended by itself says the lease is lost, whatever else happened.
    let change = match kept.lost {
        Some(why) => Change::Lost(why),
        None => change,
    };
    if let Change::Lost(why) = &change {
        // Logged now, not once drained: told to stop, the service takes no more input
        // (what it still answers was received before), while its drain may wait minutes
        // for kill-switch publishes to an unreachable NATS.
        tracing::warn!(partition, why, "partition lost; stopped serving it");
    }
    let drained = drain(
        shared.clone(),
        leases.clone(),
        state.totals.clone(),
        partition,
        owned.task,
        kept.lease,
        change,
    );
    state.draining.insert(partition, tokio::spawn(drained));
}

/// Waits for a given-up partition's service to drain what it received and, unless the
/// partition was lost, releases its lease so another daemon can take it at once.
/// Returns the error when its log got stuck.
async fn drain(
    shared: Shared,
    leases: Arc<Leases>,
    totals: Arc<observe::Totals>,
    partition: u32,
    task: JoinHandle<Result<(), ClusterError>>,
    lease: Lease,
    change: Change,
) -> Option<ClusterError> {
    let stuck = log_end(partition, task.await);
    totals.forget(&*shared.observer, partition);
    let (label, why) = match change {
        Change::Released(why) => ("released", why),
        Change::Lost(why) => ("lost", why),
        Change::Failed => ("failed", "its service stopped"),
    };
    shared.metrics.cluster_partition_change(label);
    if label == "lost" {
        return stuck;
    }
    match within(RELEASE_WAIT, leases.release(partition, lease)).await {
        Ok(()) => tracing::info!(partition, why, "partition released"),
        Err(err) => tracing::warn!(partition, why, %err, "releasing the lease failed; it ages out"),
    }
    stuck
}

/// Logs how a partition's task ended; returns the error when its log got stuck.
fn log_end(
    partition: u32,
    ended: Result<Result<(), ClusterError>, tokio::task::JoinError>,
) -> Option<ClusterError> {
    match ended {
        Ok(Ok(())) => None,
        Ok(Err(err @ ClusterError::Service(ServiceError::Stalled { .. }))) => {
            tracing::error!(partition, %err, "partition log stuck; stopping the daemon");
            Some(err)
        }
        Ok(Err(err)) => {
            tracing::error!(partition, %err, "partition service ended with an error");
            None
        }
        Err(err) => {
            tracing::error!(partition, %err, "partition task failed");
            None
        }
    }
}

/// Opens the partition's log, catches it up with the replicated stream, republishes
/// the kill switch of runs the catch-up closed, and serves until told to stop. Told to
/// stop (or past the fence) before it serves, it gives up where it is: a catch-up or a
/// start-up waiting on an unreachable JetStream must not hold up the loop that gives the
/// partition up.
async fn serve_partition(
    shared: Shared,
    js: jetstream::Context,
    ledger: Arc<SharedLedger>,
    totals: Arc<observe::Totals>,
    partition: u32,
    mut stopping: Stopping,
) -> Result<(), ClusterError> {
    let started = Instant::now();
    let fence = stopping.fence.clone();
    let opening = open_partition(&shared, &js, ledger, totals, partition, fence);
    let (service, caught) = tokio::select! {
        opened = opening => opened?,
        _ = stopping.until(partition) => {
            tracing::info!(partition, "partition given up before it was served");
            return Ok(());
        }
    };
    shared.metrics.cluster_partition_change("claimed");
    tracing::info!(
        partition,
        batches_read = caught.batches_read,
        batches_caught_up = caught.batches_applied,
        stops_republished = caught.stops.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "partition claimed"
    );
    service.run_until(stopping.until(partition)).await?;
    Ok(())
}

/// Everything before serving a partition: its log opened and caught up, its service
/// started with the stops the catch-up found to republish.
async fn open_partition(
    shared: &Shared,
    js: &jetstream::Context,
    ledger: Arc<SharedLedger>,
    totals: Arc<observe::Totals>,
    partition: u32,
    fence: Fence,
) -> Result<(Service, applied::CaughtUp), ClusterError> {
    let dir = shared
        .data_dir
        .join("partitions")
        .join(partition.to_string());
    let mark = mark::AppliedMark::new(&dir);
    let (policies, options) = (shared.policies.clone(), shared.guard_options.clone());
    let guard = tokio::task::spawn_blocking(move || Guard::open(&dir, policies, options))
        .await
        .expect("log open task")?;
    let replicator = applied::Replicator::new(js.clone(), partition, 0, Handle::current(), fence);
    let store = PartitionStore::catching_up(guard, replicator, ledger, mark);
    let (mut store, caught) =
        applied::catch_up(js, partition, FeedStore::new(store, shared.facts.clone())).await?;
    // The stops go to the service's stop publisher, which retries them across an
    // outage. Publishing them here, failing the claim when JetStream is electing a
    // leader, lost them: the retried claim's catch-up finds the batches in the log
    // already, so it closes no run and has no stop to publish.
    store.inner_mut().serve(caught.stops.clone());
    store.inner_mut().replicator.continue_after(caught.last);
    let options = ServiceOptions {
        scope: Scope::Partition {
            index: partition,
            of: shared.cluster.partitions,
        },
        ..shared.service.clone()
    };
    let service = Service::start(
        shared.client.clone(),
        store,
        options,
        Arc::new(observe::PartitionObserver {
            inner: shared.observer.clone(),
            totals,
            partition,
        }),
    )
    .await?;
    Ok((service, caught))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request JetStream never answers (a daemon cut off from the quorum) is abandoned
    /// at the fence, and none is started after it: a batch in flight cannot be
    /// committed, and so answered, after the partition's owner stopped serving it.
    #[test]
    fn requests_end_at_the_fence_and_a_renewal_moves_it() {
        // Multi-threaded, as the daemon's: a current-thread runtime's timers only run
        // under its own `block_on`, not a handle's (the applier thread's).
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        let (renewed, renewals) = watch::channel(Instant::now());
        let fence = Fence::new(renewals, Duration::from_millis(300));
        assert_eq!(fence.block_on(runtime.handle(), async { 7 }), Some(7));
        let started = Instant::now();
        let never = fence.block_on(runtime.handle(), std::future::pending::<()>());
        let waited = started.elapsed();
        assert_eq!(never, None);
        assert!(fence.left().is_none());
        assert!(waited < Duration::from_millis(1_000), "{waited:?}");
        assert_eq!(fence.block_on(runtime.handle(), async { 7 }), None);
        renewed.send_replace(Instant::now());
        assert!(fence
            .left()
            .is_some_and(|left| left <= Duration::from_millis(300)));
        assert_eq!(fence.block_on(runtime.handle(), async { 7 }), Some(7));
    }

    /// A KV write refused by another writer, in either of the server's forms and
    /// however deep async-nats wraps it, is a lost race, not an outage.
    #[test]
    fn both_forms_of_a_refused_revision_are_a_lost_race() {
        use async_nats::jetstream::context::{PublishError, PublishErrorKind};
        use async_nats::jetstream::kv::{UpdateError, UpdateErrorKind};
        let answer = jetstream_answer;
        let update = |code: u64| {
            let publish = PublishError::with_source(PublishErrorKind::Other, answer(code));
            UpdateError::with_source(UpdateErrorKind::Other, publish)
        };
        assert!(refused_by_revision_check(&update(10071)));
        assert!(refused_by_revision_check(&update(10164)));
        assert!(!refused_by_revision_check(&update(10008)), "unavailable");
        assert!(!refused_by_revision_check(&UpdateError::new(
            UpdateErrorKind::TimedOut
        )));
    }

    #[test]
    fn the_fence_is_well_inside_the_lease() {
        let lease = Duration::from_millis(2000);
        assert!(fence(lease) + lease / 4 < lease);
    }
}
