//! The op_key ledger shared by every daemon: JetStream KV bucket `FUSEBOX_LEDGER`, one
//! key per (tenant, op_key), never deleted (a free key holds `null`), so every claim is
//! an atomic create or a revision-checked update and two daemons can never both let
//! one operation run.
//!
//! The engine still decides; this module only tells it what other daemons did:
//! 1. before a batch (`look_up`), every call with an op_key that the local ledger has
//!    not seen complete is looked up, and what another run holds is *adopted* into the
//!    engine as a logged record, so the call is judged on it (`use_completed_result`,
//!    or a refusal while it is in flight elsewhere);
//! 2. before the batch is written (`claim`), every call the engine let run is claimed;
//!    a claim that loses a race fails the batch, which is then decided again on the
//!    new knowledge;
//! 3. after the commit (`settle`), completions and releases are written back.

use std::collections::BTreeMap;

use async_nats::jetstream::kv::{self, CreateErrorKind, UpdateErrorKind};
use async_nats::jetstream::{self, stream::StorageType};
use fusebox_core::{Engine, Event, EventBody, LedgerEntry};
use fusebox_log::AdoptedOp;
use sha2::{Digest, Sha256};
use tokio::runtime::Handle;

use super::{bind_bucket, ClusterError, ATTEMPTS, RETRY_PAUSE};

pub const BUCKET: &str = "FUSEBOX_LEDGER";

#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("op_key {op_key:?} of tenant {tenant} was claimed by another daemon first")]
    Lost { tenant: String, op_key: String },
    #[error("the shared ledger is unavailable: {0}")]
    Unavailable(String),
}

/// A key's KV name: the tenant, then a hash of the op_key (op_keys may hold characters
/// KV keys may not).
fn kv_key(tenant: &str, op_key: &str) -> String {
    let digest = Sha256::digest(op_key.as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{tenant}.{hex}")
}

/// What the bucket holds for a key: an entry, or `None` when free.
type Shared = Option<LedgerEntry>;

pub struct SharedLedger {
    kv: kv::Store,
    runtime: Handle,
}

impl SharedLedger {
    pub async fn open(
        js: &jetstream::Context,
        replicas: usize,
        runtime: Handle,
    ) -> Result<SharedLedger, ClusterError> {
        let kv = bind_bucket(
            js,
            kv::Config {
                bucket: BUCKET.to_owned(),
                description: "fusebox op_key ledger shared by every fuseboxd".to_owned(),
                history: 1,
                storage: StorageType::File,
                num_replicas: replicas,
                ..Default::default()
            },
        )
        .await?;
        Ok(SharedLedger { kv, runtime })
    }

    /// Reads a key with its revision (0 = never written).
    fn read(&self, key: &str) -> Result<(Shared, u64), ClaimError> {
        self.retrying(|| async {
            match self.kv.entry(key).await {
                Ok(Some(entry)) if entry.operation == kv::Operation::Put => {
                    let shared = serde_json::from_slice(&entry.value).unwrap_or_else(|err| {
                        tracing::error!(%key, %err, "unreadable shared ledger entry; treating it as in flight elsewhere");
                        Some(LedgerEntry::InFlight {
                            run: "?".to_owned(),
                            call_id: "?".to_owned(),
                        })
                    });
                    Ok((shared, entry.revision))
                }
                Ok(Some(entry)) => Ok((None, entry.revision)),
                Ok(None) => Ok((None, 0)),
                Err(err) => Err(err.to_string()),
            }
        })
    }

    /// Writes `value` if the key is still at `revision` (0: absent). `Ok(false)`: lost.
    fn write(&self, key: &str, value: &Shared, revision: u64) -> Result<bool, ClaimError> {
        let body: bytes::Bytes = serde_json::to_vec(value).expect("entries serialise").into();
        self.retrying(|| async {
            let written = if revision == 0 {
                match self.kv.create(key, body.clone()).await {
                    Err(err) if err.kind() == CreateErrorKind::AlreadyExists => return Ok(false),
                    other => other.map(drop).map_err(|e| e.to_string()),
                }
            } else {
                match self.kv.update(key, body.clone(), revision).await {
                    Err(err) if err.kind() == UpdateErrorKind::WrongLastRevision => {
                        return Ok(false)
                    }
                    other => other.map(drop).map_err(|e| e.to_string()),
                }
            };
            written.map(|()| true)
        })
    }

    fn retrying<T, F, Fut>(&self, mut op: F) -> Result<T, ClaimError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.runtime.block_on(op()) {
                Ok(value) => return Ok(value),
                Err(err) if attempt < ATTEMPTS => {
                    tracing::warn!(%err, attempt, "shared ledger request failed; retrying");
                    std::thread::sleep(RETRY_PAUSE);
                }
                Err(err) => return Err(ClaimError::Unavailable(err)),
            }
        }
    }

    /// Step 1: what other runs hold for the op_keys this batch's calls carry, as
    /// entries to adopt before deciding. Keys the local ledger already has completed
    /// are skipped (a completion is final), and so are claims of the very same call.
    pub fn look_up(&self, engine: &Engine, events: &[Event]) -> Result<Vec<AdoptedOp>, ClaimError> {
        let mut adopted: BTreeMap<(String, String), Shared> = BTreeMap::new();
        for event in events {
            let EventBody::ToolCall(call) = &event.body else {
                continue;
            };
            let Some(op_key) = &call.op_key else { continue };
            let local = engine.ledger().get(&event.tenant, op_key);
            let id = (event.tenant.clone(), op_key.clone());
            if matches!(local, Some(LedgerEntry::Completed { .. })) || adopted.contains_key(&id) {
                continue;
            }
            let (shared, _) = self.read(&kv_key(&event.tenant, op_key))?;
            let ours = |run: &str, call_id: &str| {
                (run == event.run && call_id == call.call_id)
                    || matches!(local, Some(LedgerEntry::InFlight { run: r, call_id: c }) if r == run && c == call_id)
            };
            let differs = match &shared {
                Some(LedgerEntry::Completed { .. }) => true,
                Some(LedgerEntry::InFlight { run, call_id }) => !ours(run, call_id),
                None => local.is_some(),
            };
            if differs {
                adopted.insert(id, shared);
            }
        }
        Ok(adopted
            .into_iter()
            .map(|((tenant, op_key), entry)| AdoptedOp {
                tenant,
                op_key,
                entry,
            })
            .collect())
    }

    /// Step 2, before the write: every call of `applied` that the engine let run (its
    /// key is now in flight for exactly that call) is claimed in the bucket.
    pub fn claim(&self, engine: &Engine, applied: &[Event]) -> Result<(), ClaimError> {
        for event in applied {
            let EventBody::ToolCall(call) = &event.body else {
                continue;
            };
            let Some(op_key) = &call.op_key else { continue };
            let runs_now = matches!(
                engine.ledger().get(&event.tenant, op_key),
                Some(LedgerEntry::InFlight { run, call_id }) if *run == event.run && *call_id == call.call_id
            );
            if !runs_now {
                continue;
            }
            let key = kv_key(&event.tenant, op_key);
            let mine = Some(LedgerEntry::InFlight {
                run: event.run.clone(),
                call_id: call.call_id.clone(),
            });
            let (shared, revision) = self.read(&key)?;
            if shared == mine {
                continue;
            }
            // Only a free key can be claimed; anyone else's entry means we lost a race.
            if shared.is_some() || !self.write(&key, &mine, revision)? {
                return Err(ClaimError::Lost {
                    tenant: event.tenant.clone(),
                    op_key: op_key.clone(),
                });
            }
        }
        Ok(())
    }

    /// Step 3, after the commit: for each call of this batch with a key, write the
    /// local outcome back — a completion for good, or the key freed after a failure or
    /// when the call did not run. A failure here leaves the key in flight, which
    /// refuses rather than repeats.
    pub fn settle(&self, engine: &Engine, touched: &[Touch]) {
        for (tenant, op_key, run, call_id) in touched {
            let key = kv_key(tenant, op_key);
            let local = engine.ledger().get(tenant, op_key);
            let settled = (|| {
                let (shared, revision) = self.read(&key)?;
                let was_ours = matches!(&shared, Some(LedgerEntry::InFlight { run: r, call_id: c }) if r == run && c == call_id);
                match local {
                    Some(
                        done @ LedgerEntry::Completed {
                            run: r, call_id: c, ..
                        },
                    ) if r == run && c == call_id && (was_ours || shared.is_none()) => {
                        self.write(&key, &Some(done.clone()), revision).map(drop)
                    }
                    None if was_ours => self.write(&key, &None, revision).map(drop),
                    _ => Ok(()),
                }
            })();
            if let Err(err) = settled {
                tracing::error!(%tenant, %op_key, %err, "cannot write an outcome to the shared ledger; other runs see the key in flight");
            }
        }
    }
}

/// (tenant, op_key, run, call_id): one call's use of a key.
pub type Touch = (String, String, String, String);

#[cfg(test)]
mod tests {
    use super::kv_key;

    #[test]
    fn kv_keys_are_per_tenant_and_safe_for_any_op_key() {
        let key = kv_key("acme", "email: ops@example.com / #42");
        assert!(key.starts_with("acme."));
        assert!(key[5..].bytes().all(|b| b.is_ascii_hexdigit()), "{key}");
        assert_ne!(key, kv_key("globex", "email: ops@example.com / #42"));
    }
}
