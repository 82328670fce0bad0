//! The op_key ledger shared by every daemon: JetStream KV bucket `FUSEBOX_LEDGER`, one
//! key per (tenant, op_key), never deleted (a free key holds `null`), so every claim is
//! an atomic create or a revision-checked update and two daemons can never both let
//! one operation run.
//!
//! The engine still decides; this module only tells it what other daemons did:
//! 1. before a batch (`look_up`), every call with an op_key that the local ledger has
//!    not seen complete is looked up, and what another run holds is *adopted* into the
//!    engine as a logged record, so the call is judged on it (`use_completed_result`,
//!    or a refusal while it is in flight elsewhere); a key free everywhere is claimed
//!    for the call at once, so a race between two daemons is decided before either
//!    engine decides;
//! 2. before the batch is written (`claim`), every call the engine let run is claimed,
//!    and every operator's `ledger_resolve` written; a claim that loses a race fails the
//!    batch, which is then decided again on the new knowledge. A key another run holds
//!    is taken over only when the bucket still holds what the engine decided on (the
//!    revision read in step 1): the engine let the call run over it (a lease that ran
//!    out under `stale_in_flight = "retry"`) — the same rules as on one daemon;
//! 3. after the commit (`settle`), completions, releases and renewed leases (a PENDING
//!    answer) are written back.

use std::collections::BTreeMap;

use async_nats::jetstream::kv::{self, CreateErrorKind, UpdateErrorKind};
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::{self, stream::StorageType};
use fusebox_core::{Engine, Event, EventBody, LedgerEntry};
use fusebox_log::AdoptedOp;
use sha2::{Digest, Sha256};
use tokio::runtime::Handle;

use super::{bind_bucket, refused_by_revision_check, ClusterError, Fence, ATTEMPTS, RETRY_PAUSE};

pub const BUCKET: &str = "FUSEBOX_LEDGER";

/// The header a KV delete or purge carries (`DEL`, `PURGE`); a put has none.
const KV_OPERATION: &str = "KV-Operation";

#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("op_key {op_key:?} of tenant {tenant} was claimed by another daemon first")]
    Lost { tenant: String, op_key: String },
    #[error("the shared ledger is unavailable: {0}")]
    Unavailable(String),
    #[error("the shared ledger did not answer before the lease's fence; the partition is no longer served")]
    PastFence,
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

/// The revision of each key as step 1 read it, by (tenant, op_key): what the engine
/// decided on. Kept up to date by the batch's own writes in step 2.
pub type Seen = BTreeMap<(String, String), u64>;

fn op_key_of(event: &Event) -> Option<&str> {
    match &event.body {
        EventBody::ToolCall(call) => call.op_key.as_deref(),
        EventBody::LedgerResolve(resolve) => Some(&resolve.op_key),
        _ => None,
    }
}

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

    /// Reads a key with its revision (0 = never written), from the bucket stream's
    /// leader. Not `kv.entry`: that is a direct get, which any replica answers, and a
    /// replica that lags (seen around a network split's heal) answers with what the key
    /// was — a claim or a completion not there yet. Every decision here (adopt, claim,
    /// write back) is only as good as the read it rests on.
    fn read(&self, fence: &Fence, key: &str) -> Result<(Shared, u64), ClaimError> {
        let subject = format!("{}{key}", self.kv.prefix);
        self.retrying(fence, || async {
            let message = match self.kv.stream.get_last_raw_message_by_subject(&subject).await {
                Ok(message) => message,
                Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => {
                    return Ok((None, 0))
                }
                Err(err) => return Err(err.to_string()),
            };
            let removed = message
                .headers
                .get(KV_OPERATION)
                .is_some_and(|op| op.as_str() != "PUT");
            if removed {
                return Ok((None, message.sequence));
            }
            let shared = serde_json::from_slice(&message.payload).unwrap_or_else(|err| {
                tracing::error!(%key, %err, "unreadable shared ledger entry; treating it as in flight elsewhere");
                // Never stale: refused until an operator resolves the key.
                Some(LedgerEntry::InFlight {
                    run: "?".to_owned(),
                    call_id: "?".to_owned(),
                    since_ms: u64::MAX,
                })
            });
            Ok((shared, message.sequence))
        })
    }

    /// Writes `value` if the key is still at `revision` (0: absent): the new revision,
    /// or `Ok(None)` when another writer was first.
    fn write(
        &self,
        fence: &Fence,
        key: &str,
        value: &Shared,
        revision: u64,
    ) -> Result<Option<u64>, ClaimError> {
        let body: bytes::Bytes = serde_json::to_vec(value).expect("entries serialise").into();
        self.retrying(fence, || async {
            if revision == 0 {
                match self.kv.create(key, body.clone()).await {
                    Err(err)
                        if err.kind() == CreateErrorKind::AlreadyExists
                            || refused_by_revision_check(&err) =>
                    {
                        Ok(None)
                    }
                    other => other.map(Some).map_err(|e| e.to_string()),
                }
            } else {
                match self.kv.update(key, body.clone(), revision).await {
                    Err(err)
                        if err.kind() == UpdateErrorKind::WrongLastRevision
                            || refused_by_revision_check(&err) =>
                    {
                        Ok(None)
                    }
                    other => other.map(Some).map_err(|e| e.to_string()),
                }
            }
        })
    }

    /// Runs `op` until it succeeds, for up to `ATTEMPTS` attempts, none of them past
    /// the partition's fence.
    fn retrying<T, F, Fut>(&self, fence: &Fence, mut op: F) -> Result<T, ClaimError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let Some(done) = fence.block_on(&self.runtime, op()) else {
                return Err(ClaimError::PastFence);
            };
            match done {
                Ok(value) => return Ok(value),
                Err(err) if attempt < ATTEMPTS => {
                    tracing::warn!(%err, attempt, "shared ledger request failed; retrying");
                    std::thread::sleep(RETRY_PAUSE);
                }
                Err(err) => return Err(ClaimError::Unavailable(err)),
            }
        }
    }

    /// Step 1: what other runs hold for the op_keys this batch's calls carry (and its
    /// operators' resolves name), as entries to adopt before deciding, with the
    /// revisions read. Keys the local ledger already has completed are skipped for
    /// calls (a completion is final; a resolve still looks), and so are claims of the
    /// very same call. Also returns the keys claimed here for a call: settled after
    /// the batch like every key it touched, so a claim for a call the batch did not
    /// apply (held for an earlier `seq`, refused) is freed again.
    pub fn look_up(
        &self,
        fence: &Fence,
        engine: &Engine,
        events: &[Event],
    ) -> Result<(Vec<AdoptedOp>, Seen, Vec<Touch>), ClaimError> {
        let mut adopted: BTreeMap<(String, String), Shared> = BTreeMap::new();
        let mut seen = Seen::new();
        let mut claimed = Vec::new();
        for event in events {
            let Some(op_key) = op_key_of(event) else {
                continue;
            };
            let call_id = match &event.body {
                EventBody::ToolCall(call) => Some(call.call_id.as_str()),
                _ => None,
            };
            let local = engine.ledger().get(&event.tenant, op_key);
            let id = (event.tenant.clone(), op_key.to_owned());
            let final_locally =
                call_id.is_some() && matches!(local, Some(LedgerEntry::Completed { .. }));
            if final_locally || seen.contains_key(&id) {
                continue;
            }
            let key = kv_key(&event.tenant, op_key);
            let (mut shared, mut revision) = self.read(fence, &key)?;
            // A free key is claimed for this call before the engine decides (freed again
            // at the settle when the engine does not let the call run): two daemons
            // deciding calls of one key at the same moment then race here, where the
            // loser still decides on what the winner holds, instead of in `claim`, where
            // losing fails the batch after the engine decided and restarts the
            // partition's service.
            if let (None, None, Some(call_id)) = (&shared, local, call_id) {
                let claim = Some(LedgerEntry::InFlight {
                    run: event.run.clone(),
                    call_id: call_id.to_owned(),
                    since_ms: event.ts_ms,
                });
                match self.write(fence, &key, &claim, revision)? {
                    Some(written) => {
                        claimed.push((
                            event.tenant.clone(),
                            op_key.to_owned(),
                            event.run.clone(),
                            call_id.to_owned(),
                        ));
                        (shared, revision) = (claim, written);
                    }
                    None => (shared, revision) = self.read(fence, &key)?,
                }
            }
            seen.insert(id.clone(), revision);
            let ours = |run: &str, c: &str| {
                (run == event.run && Some(c) == call_id)
                    || matches!(local, Some(LedgerEntry::InFlight { run: r, call_id: lc, .. }) if r == run && lc == c)
            };
            let differs = match &shared {
                Some(LedgerEntry::Completed { .. }) => true,
                Some(LedgerEntry::InFlight { run, call_id, .. }) => !ours(run, call_id),
                None => local.is_some(),
            };
            if differs {
                adopted.insert(id, shared);
            }
        }
        let adopted = adopted
            .into_iter()
            .map(|((tenant, op_key), entry)| AdoptedOp {
                tenant,
                op_key,
                entry,
            })
            .collect();
        Ok((adopted, seen, claimed))
    }

    /// Step 2, before the write: every call of `applied` that the engine let run (its
    /// key is now in flight for exactly that call) is claimed in the bucket, and every
    /// `ledger_resolve` writes the key as the engine now has it.
    pub fn claim(
        &self,
        fence: &Fence,
        engine: &Engine,
        applied: &[Event],
        seen: &mut Seen,
    ) -> Result<(), ClaimError> {
        for event in applied {
            let Some(op_key) = op_key_of(event) else {
                continue;
            };
            let local = engine.ledger().get(&event.tenant, op_key);
            if let EventBody::ToolCall(call) = &event.body {
                let runs_now = matches!(
                    local,
                    Some(LedgerEntry::InFlight { run, call_id, .. }) if *run == event.run && *call_id == call.call_id
                );
                if !runs_now {
                    continue;
                }
            }
            let key = kv_key(&event.tenant, op_key);
            let mine: Shared = local.cloned();
            let (shared, revision) = self.read(fence, &key)?;
            if shared == mine {
                continue;
            }
            let id = (event.tenant.clone(), op_key.to_owned());
            // A free key may be claimed; anyone else's entry only when it is still what
            // the engine decided on. Otherwise we lost a race.
            let decided_on = seen.get(&id) == Some(&revision);
            let lost = || ClaimError::Lost {
                tenant: event.tenant.clone(),
                op_key: op_key.to_owned(),
            };
            if shared.is_some() && !decided_on {
                return Err(lost());
            }
            tracing::debug!(tenant = %event.tenant, %op_key, ?shared, ?mine, "claiming");
            match self.write(fence, &key, &mine, revision)? {
                Some(written) => {
                    seen.insert(id, written);
                }
                None => return Err(lost()),
            }
        }
        Ok(())
    }

    /// Step 3, after the commit: for each call of this batch with a key, write the
    /// local outcome back — a completion for good, or the key freed after a failure or
    /// when the call did not run. A failure here leaves the key in flight, which
    /// refuses rather than repeats, until the write is made again (the owner retries
    /// it; a next owner's catch-up writes it back).
    /// Returns the touches whose outcome is not written yet.
    #[must_use]
    pub fn settle(&self, fence: &Fence, engine: &Engine, touched: &[Touch]) -> Vec<Touch> {
        let mut unwritten = Vec::new();
        for touch in touched {
            let (tenant, op_key, run, call_id) = touch;
            let key = kv_key(tenant, op_key);
            let local = engine.ledger().get(tenant, op_key);
            // A write that finds the key moved since its read (another writer, or its
            // own retried write) reads again and decides again, rather than leave
            // the key as it was: a lost write-back is a key in flight for good.
            let settle_once = || -> Result<bool, ClaimError> {
                let (shared, revision) = self.read(fence, &key)?;
                let was_ours = matches!(&shared, Some(LedgerEntry::InFlight { run: r, call_id: c, .. }) if r == run && c == call_id);
                let value = match local {
                    Some(
                        done @ LedgerEntry::Completed {
                            run: r, call_id: c, ..
                        },
                    ) if r == run && c == call_id && (was_ours || shared.is_none()) => {
                        Some(done.clone())
                    }
                    // A PENDING answer renewed the lease: other daemons judge it by this.
                    Some(
                        renewed @ LedgerEntry::InFlight {
                            run: r, call_id: c, ..
                        },
                    ) if r == run && c == call_id && was_ours && shared.as_ref() != local => {
                        Some(renewed.clone())
                    }
                    None if was_ours => None,
                    _ => {
                        tracing::debug!(%tenant, %op_key, %run, %call_id, ?local, ?shared, "outcome needs no write");
                        return Ok(true);
                    }
                };
                let written = self.write(fence, &key, &value, revision)?;
                tracing::debug!(%tenant, %op_key, %run, %call_id, ?value, ?written, "outcome written back");
                Ok(written.is_some())
            };
            let mut settled = settle_once();
            for _ in 1..SETTLE_READS {
                if !matches!(settled, Ok(false)) {
                    break;
                }
                settled = settle_once();
            }
            let settled = match settled {
                Ok(true) => Ok(()),
                Ok(false) => Err(ClaimError::Unavailable(format!(
                    "the key kept changing under {SETTLE_READS} writes"
                ))),
                Err(err) => Err(err),
            };
            if let Err(err) = settled {
                unwritten.push(touch.clone());
                tracing::warn!(%tenant, %op_key, %err, "cannot write an outcome to the shared ledger yet; retrying it later");
            }
        }
        unwritten
    }
}

/// Reads (and writes) one write-back may take while the key changes under it.
const SETTLE_READS: u32 = 3;

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
