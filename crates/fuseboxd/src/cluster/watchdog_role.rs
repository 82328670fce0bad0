//! The cloud watchdog's role: one daemon of a cluster at a time runs its sweeps, timers
//! and terminations (issue 49 §2). Every daemon runs its watchdog's bookkeeping (facts,
//! halts); only the role's holder acts.
//!
//! The role is a lease like a partition's, in the same bucket (`FUSEBOX_PARTITIONS`, whose
//! keys expire after `lease_ms`): the key `role.watchdog` holds the holder's node id, is
//! taken with a create-if-absent and renewed every quarter lease with a revision-checked
//! update, so two daemons can never both hold it, and a dead holder's key ages out after
//! which any daemon's next attempt takes it — within `lease_ms` plus a quarter lease of
//! the holder's death. The holder may act until ⅔ of the lease after the send time of
//! its last renewal (the partitions' fence, [`super::fence`]); past it, not renewed, it
//! stops acting, a third of a lease before the server lets another daemon take the key.
//! The instant is published on a watch channel (`None` while the role is not held here),
//! which `watchdog::role::Authority` reads.

use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{self, CreateErrorKind, UpdateErrorKind};
use async_nats::jetstream::{self, Context};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::lease::BUCKET;
use super::{fence, refused_by_revision_check, within, ClusterError, RELEASE_WAIT};

/// The role's key in the lease bucket (beside `partition.<p>` and `node.<id>`).
pub const KEY: &str = "role.watchdog";

/// The task that takes, renews and gives back the watchdog role.
pub struct RoleKeeper {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl RoleKeeper {
    /// Starts trying to take the role for `node`. The receiver holds the instant until
    /// which this daemon may act as the watchdog, `None` while it does not hold the role.
    pub fn start(
        client: async_nats::Client,
        node: String,
        lease_time: Duration,
    ) -> (RoleKeeper, watch::Receiver<Option<Instant>>) {
        let (until, authority) = watch::channel(None);
        let (stop, stopped) = watch::channel(false);
        let js = jetstream::new(client);
        let task = tokio::spawn(keep(js, node, lease_time, until, stopped));
        (RoleKeeper { stop, task }, authority)
    }

    /// Stops renewing and gives the role back (if it is still ours), so another daemon
    /// takes over at once rather than after the lease. Called once the watchdog's last
    /// pass has finished.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        if let Err(err) = self.task.await {
            tracing::error!(%err, "watchdog role keeper failed");
        }
    }
}

/// The bucket is made by the ownership loop (`Leases::open`, which also checks its
/// expiry against `lease_ms`); the role waits for it rather than make it with settings
/// of its own.
async fn bucket(js: &Context, stop: &mut watch::Receiver<bool>) -> Option<kv::Store> {
    loop {
        match js.get_key_value(BUCKET).await {
            Ok(kv) => return Some(kv),
            Err(err) => {
                tracing::debug!(%err, "lease bucket not there yet; the watchdog role waits")
            }
        }
        tokio::select! {
            _ = stop.wait_for(|stop| *stop) => return None,
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
}

async fn keep(
    js: Context,
    node: String,
    lease_time: Duration,
    until: watch::Sender<Option<Instant>>,
    mut stop: watch::Receiver<bool>,
) {
    let Some(kv) = bucket(&js, &mut stop).await else {
        return;
    };
    let every = lease_time / 4;
    let mut held: Option<u64> = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.wait_for(|stop| *stop) => break,
            _ = tick.tick() => {}
        }
        let sent = Instant::now();
        let Some(revision) = held else {
            match within(every, claim(&kv, &node)).await {
                Ok(Some(revision)) => {
                    held = Some(revision);
                    until.send_replace(Some(sent + fence(lease_time)));
                    tracing::info!(node = %node, "watchdog role taken: this daemon runs the cluster's sweeps, timers and terminations");
                }
                Ok(None) => {}
                Err(err) => tracing::debug!(%err, "taking the watchdog role failed"),
            }
            continue;
        };
        match within(every, renew(&kv, &node, revision)).await {
            Ok(Some(revision)) => {
                held = Some(revision);
                until.send_replace(Some(sent + fence(lease_time)));
            }
            Ok(None) => match within(every, holder(&kv)).await {
                // An earlier, unanswered renewal was written after all: still ours. Its
                // send time is unknown, so the fence keeps its last answered one.
                Ok(Some((who, later))) if who == node && later > revision => held = Some(later),
                Ok(_) => {
                    held = None;
                    until.send_replace(None);
                    tracing::warn!("watchdog role lost to another daemon; no more passes here");
                    continue;
                }
                Err(err) => {
                    tracing::warn!(%err, "watchdog role renewal refused and the key unreadable")
                }
            },
            Err(err) => tracing::warn!(%err, "renewing the watchdog role failed"),
        }
        let fenced = until.borrow().is_none_or(|at| at <= Instant::now());
        if fenced {
            held = None;
            until.send_replace(None);
            tracing::warn!(
                "watchdog role not renewed in time; no more passes here until it is taken again"
            );
        }
    }
    until.send_replace(None);
    if let Some(revision) = held {
        match within(RELEASE_WAIT, release(&kv, revision)).await {
            Ok(()) => tracing::info!("watchdog role released"),
            Err(err) => tracing::warn!(%err, "releasing the watchdog role failed; it ages out"),
        }
    }
}

async fn claim(kv: &kv::Store, node: &str) -> Result<Option<u64>, ClusterError> {
    match kv.create(KEY, node.to_owned().into()).await {
        Ok(revision) => Ok(Some(revision)),
        Err(err)
            if err.kind() == CreateErrorKind::AlreadyExists || refused_by_revision_check(&err) =>
        {
            Ok(None)
        }
        Err(err) => Err(ClusterError::nats("taking the watchdog role", err)),
    }
}

async fn renew(kv: &kv::Store, node: &str, revision: u64) -> Result<Option<u64>, ClusterError> {
    match kv.update(KEY, node.to_owned().into(), revision).await {
        Ok(revision) => Ok(Some(revision)),
        Err(err)
            if err.kind() == UpdateErrorKind::WrongLastRevision
                || refused_by_revision_check(&err) =>
        {
            Ok(None)
        }
        Err(err) => Err(ClusterError::nats("renewing the watchdog role", err)),
    }
}

async fn holder(kv: &kv::Store) -> Result<Option<(String, u64)>, ClusterError> {
    let entry = kv
        .entry(KEY)
        .await
        .map_err(|e| ClusterError::nats("reading the watchdog role", e))?;
    Ok(entry
        .filter(|entry| entry.operation == kv::Operation::Put)
        .map(|entry| {
            (
                String::from_utf8_lossy(&entry.value).into_owned(),
                entry.revision,
            )
        }))
}

async fn release(kv: &kv::Store, revision: u64) -> Result<(), ClusterError> {
    kv.delete_expect_revision(KEY, Some(revision))
        .await
        .map_err(|e| ClusterError::nats("releasing the watchdog role", e))
}
