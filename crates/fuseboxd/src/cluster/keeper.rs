//! One owned partition's lease, renewed by a task of its own.
//!
//! Each lease is kept apart from the ownership loop (heartbeat, fair share, claims) and
//! from the other partitions' leases: a claim or a heartbeat waiting out a JetStream
//! election, or another lease's slow renewal, never delays this one. That is what lets
//! a short lease (2 s) hold through the elections a network split causes.
//!
//! The fence counts from when a renewal was *sent*: the bucket's max age counts from
//! when the server wrote it, which is later, so however late the answer comes back the
//! fence stays a third of the lease inside the server's expiry. Counting from the
//! answer (as this loop once did) let a reply delayed past a third of the lease carry
//! the owner's fence beyond the moment another daemon could claim the partition.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::lease::{Lease, Leases};
use super::{fence, within};

/// How a keeper ended.
pub struct Kept {
    /// The last lease renewed (what a release must match).
    pub lease: Lease,
    /// Why the lease is lost, when it ended by itself; `None` when told to stop.
    pub lost: Option<&'static str>,
}

/// The task renewing one partition's lease.
pub struct Keeper {
    stop: watch::Sender<bool>,
    task: JoinHandle<Kept>,
}

impl Keeper {
    /// Starts renewing `lease`, taken by a claim sent at `claimed_at`. The returned
    /// receiver holds the send time of the last renewal that succeeded: the partition's
    /// [`super::Fence`] counts from it, and it closes when the keeper ends.
    pub fn start(
        leases: Arc<Leases>,
        partition: u32,
        lease: Lease,
        claimed_at: Instant,
        lease_time: Duration,
    ) -> (Keeper, watch::Receiver<Instant>) {
        let (renewed, renewals) = watch::channel(claimed_at);
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(keep(leases, partition, lease, renewed, stopped, lease_time));
        (Keeper { stop, task }, renewals)
    }

    /// Whether it ended by itself: the lease is lost or was not renewed in time.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops renewing (at once, a renewal in flight abandoned) and says how it ended.
    pub async fn stop(self) -> Kept {
        let _ = self.stop.send(true);
        self.task.await.expect("lease keeper task")
    }
}

async fn keep(
    leases: Arc<Leases>,
    partition: u32,
    mut lease: Lease,
    renewed: watch::Sender<Instant>,
    mut stop: watch::Receiver<bool>,
    lease_time: Duration,
) -> Kept {
    // A quarter lease apart, each renewal bounded by a quarter lease: about two more
    // attempts fit before the fence when one goes unanswered.
    let every = lease_time / 4;
    let mut next = *renewed.borrow() + every;
    loop {
        tokio::select! {
            biased;
            _ = stop.wait_for(|stop| *stop) => return Kept { lease, lost: None },
            _ = tokio::time::sleep_until(next.into()) => {}
        }
        let sent = Instant::now();
        next = sent + every;
        let renewal = tokio::select! {
            biased;
            _ = stop.wait_for(|stop| *stop) => return Kept { lease, lost: None },
            renewal = within(every, leases.renew(partition, lease)) => renewal,
        };
        match renewal {
            Ok(Some(renewed_lease)) => {
                lease = renewed_lease;
                renewed.send_replace(sent);
            }
            Ok(None) => match within(every, leases.holder(partition)).await {
                // An earlier renewal that went unanswered was written after all: the
                // key is still ours, at a later revision. Its send time is not known,
                // so the fence keeps counting from the last answered one.
                Ok(Some((holder, revision)))
                    if holder == leases.node() && revision > lease.revision =>
                {
                    tracing::info!(
                        partition,
                        "lease renewed by an unanswered request; going on from it"
                    );
                    lease = Lease { revision };
                }
                Ok(_) => {
                    return Kept {
                        lease,
                        lost: Some("lease lost"),
                    }
                }
                // Not known whose it is: renewals go on until the fence decides.
                Err(err) => {
                    tracing::warn!(partition, %err, "renewal refused and the lease unreadable");
                }
            },
            Err(err) => {
                tracing::warn!(partition, %err, "renewing the lease failed");
            }
        }
        if renewed.borrow().elapsed() > fence(lease_time) {
            return Kept {
                lease,
                lost: Some("lease not renewed in time"),
            };
        }
    }
}
