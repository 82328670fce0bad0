//! Who owns which partition, decided by NATS: a JetStream KV bucket whose keys expire
//! after the lease. `partition.<p>` holds its owner's node id; an owner renews it with
//! a revision-checked update, so two daemons can never both hold it (the loser's update
//! fails), and a dead owner's key ages out, after which any daemon may `create` it.
//! `node.<id>` is each daemon's heartbeat, so every daemon can count the live ones and
//! take a fair share.

use std::time::Duration;

use async_nats::jetstream::kv::{self, CreateErrorKind, UpdateErrorKind};
use async_nats::jetstream::{self, stream::StorageType};
use futures_util::TryStreamExt;

use super::{bind_bucket, refused_by_revision_check, ClusterError};

pub const BUCKET: &str = "FUSEBOX_PARTITIONS";
/// The partition count the live daemons agree on.
const PARTITIONS_KEY: &str = "config.partitions";

pub struct Leases {
    kv: kv::Store,
    node: String,
}

/// An owned partition's lease: the revision the next renewal must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub revision: u64,
}

fn partition_key(partition: u32) -> String {
    format!("partition.{partition}")
}

fn node_key(node: &str) -> String {
    format!("node.{node}")
}

/// How many partitions each of `live` daemons should own: all of them are owned, and
/// no daemon owns more than one above another.
pub fn fair_share(partitions: u32, live: usize) -> usize {
    (partitions as usize).div_ceil(live.max(1))
}

impl Leases {
    /// Binds the bucket, creating it when absent. Keys live for `lease` after their
    /// last write (the bucket's max age).
    pub async fn open(
        js: &jetstream::Context,
        node: &str,
        partitions: u32,
        lease: Duration,
        replicas: usize,
    ) -> Result<Leases, ClusterError> {
        let kv = bind_bucket(
            js,
            kv::Config {
                bucket: BUCKET.to_owned(),
                description: "fuseboxd partition leases".to_owned(),
                history: 1,
                max_age: lease,
                storage: StorageType::File,
                num_replicas: replicas,
                ..Default::default()
            },
        )
        .await?;
        let status = kv
            .status()
            .await
            .map_err(|e| ClusterError::nats("reading the lease bucket", e))?;
        if status.max_age() != lease {
            return Err(ClusterError::Config(format!(
                "bucket {BUCKET} expires leases after {:?}, this daemon's lease_ms is {}; \
                 every daemon must use the same lease_ms (or remove the bucket)",
                status.max_age(),
                lease.as_millis()
            )));
        }
        let leases = Leases {
            kv,
            node: node.to_owned(),
        };
        leases.agree_on_partitions(partitions).await?;
        Ok(leases)
    }

    /// Every daemon must split runs into the same N partitions (the servers' mapping's
    /// N): the first daemon writes its N, later ones must match it. The key is written
    /// again with each heartbeat round's renewals so it does not age out while the
    /// cluster lives.
    async fn agree_on_partitions(&self, partitions: u32) -> Result<(), ClusterError> {
        let mine = partitions.to_string();
        match self.kv.create(PARTITIONS_KEY, mine.clone().into()).await {
            Ok(_) => return Ok(()),
            Err(err) if err.kind() == CreateErrorKind::AlreadyExists => {}
            Err(err) => return Err(ClusterError::nats("recording the partition count", err)),
        }
        let theirs = self
            .kv
            .get(PARTITIONS_KEY)
            .await
            .map_err(|e| ClusterError::nats("reading the partition count", e))?
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_default();
        if theirs != mine {
            return Err(ClusterError::Config(format!(
                "the running daemons split runs into {theirs} partitions, this one into \
                 {mine}; [cluster] partitions must equal the N of the servers' mapping \
                 (deploy/nats/partitions.conf) on every daemon"
            )));
        }
        Ok(())
    }

    /// Writes this daemon's heartbeat (and refreshes the agreed partition count) and
    /// returns how many daemons are alive (itself included): those whose heartbeat has
    /// not aged out.
    pub async fn heartbeat(&self, partitions: u32) -> Result<usize, ClusterError> {
        self.kv
            .put(node_key(&self.node), self.node.clone().into())
            .await
            .map_err(|e| ClusterError::nats("writing the heartbeat", e))?;
        self.kv
            .put(PARTITIONS_KEY, partitions.to_string().into())
            .await
            .map_err(|e| ClusterError::nats("writing the heartbeat", e))?;
        let keys: Vec<String> = self
            .kv
            .keys()
            .await
            .map_err(|e| ClusterError::nats("listing heartbeats", e))?
            .try_collect()
            .await
            .map_err(|e| ClusterError::nats("listing heartbeats", e))?;
        Ok(keys
            .iter()
            .filter(|k| k.starts_with("node."))
            .count()
            .max(1))
    }

    /// Takes a free partition; `None` when another daemon holds it.
    pub async fn claim(&self, partition: u32) -> Result<Option<Lease>, ClusterError> {
        match self
            .kv
            .create(partition_key(partition), self.node.clone().into())
            .await
        {
            Ok(revision) => Ok(Some(Lease { revision })),
            Err(err)
                if err.kind() == CreateErrorKind::AlreadyExists
                    || refused_by_revision_check(&err) =>
            {
                Ok(None)
            }
            Err(err) => Err(ClusterError::nats("claiming a partition", err)),
        }
    }

    /// Renews an owned partition; `None` when the lease was lost (it aged out and
    /// another daemon took it, or someone else wrote it).
    pub async fn renew(&self, partition: u32, lease: Lease) -> Result<Option<Lease>, ClusterError> {
        match self
            .kv
            .update(
                partition_key(partition),
                self.node.clone().into(),
                lease.revision,
            )
            .await
        {
            Ok(revision) => Ok(Some(Lease { revision })),
            Err(err)
                if err.kind() == UpdateErrorKind::WrongLastRevision
                    || refused_by_revision_check(&err) =>
            {
                Ok(None)
            }
            Err(err) => Err(ClusterError::nats("renewing a lease", err)),
        }
    }

    /// Who holds a partition's key, with its revision; `None` when free.
    pub async fn holder(&self, partition: u32) -> Result<Option<(String, u64)>, ClusterError> {
        let entry = self
            .kv
            .entry(partition_key(partition))
            .await
            .map_err(|e| ClusterError::nats("reading a lease", e))?;
        Ok(entry
            .filter(|entry| entry.operation == kv::Operation::Put)
            .map(|entry| {
                (
                    String::from_utf8_lossy(&entry.value).into_owned(),
                    entry.revision,
                )
            }))
    }

    /// This daemon's node id, the value of the keys it holds.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Gives a partition up (only if the lease is still ours), so another daemon can
    /// take it at once instead of after the lease.
    pub async fn release(&self, partition: u32, lease: Lease) -> Result<(), ClusterError> {
        self.kv
            .delete_expect_revision(partition_key(partition), Some(lease.revision))
            .await
            .map_err(|e| ClusterError::nats("releasing a partition", e))
    }

    /// Removes this daemon's heartbeat on a clean shutdown.
    pub async fn leave(&self) -> Result<(), ClusterError> {
        self.kv
            .delete(node_key(&self.node))
            .await
            .map_err(|e| ClusterError::nats("removing the heartbeat", e))
    }
}

#[cfg(test)]
mod tests {
    use super::fair_share;

    #[test]
    fn fair_shares_cover_every_partition_and_differ_by_at_most_one() {
        assert_eq!(fair_share(8, 1), 8);
        assert_eq!(fair_share(8, 2), 4);
        assert_eq!(fair_share(8, 3), 3);
        assert_eq!(fair_share(8, 0), 8);
        assert_eq!(fair_share(8, 9), 1);
    }
}
