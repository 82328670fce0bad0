//! A cluster's halt, durable and shared: the KV key `halt` of the bucket
//! `FUSEBOX_WATCHDOG` (no expiry) holds the latest halt or resume, as the [`Fact`] the
//! journal keeps.
//!
//! The holder of the watchdog role that trips `on_blast_radius = "halt"` writes its
//! [`Fact::Halted`] there (besides its journal); an operator's resume, answered by the
//! holder, writes a [`Fact::Resumed`] checked against the revision of the halt it
//! clears. Every daemon follows the key and records each change in its watchdog and
//! journal (so every daemon's status and `fusebox_watchdog_halted` agree), and a daemon
//! taking the role reads it from the stream's leader before its first pass: a holder
//! that takes over from a halted one starts halted, whatever its own journal says.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv::{self, UpdateErrorKind};
use async_nats::jetstream::stream::{LastRawMessageErrorKind, StorageType};
use async_nats::jetstream::Context;
use fusebox_watchdog::{Fact, Watchdog};
use futures_util::StreamExt;
use tokio::sync::watch;

use super::journal::{Entry, Journal};
use super::role::Fenced;

pub const BUCKET: &str = "FUSEBOX_WATCHDOG";
const KEY: &str = "halt";
/// The KV header that says a message deletes or purges its key.
const KV_OPERATION: &str = "KV-Operation";

pub struct HaltKey {
    kv: kv::Store,
}

/// The key's latest fact with its revision; `None`: never written (or removed).
pub type Latest = Option<(Fact, u64)>;

impl HaltKey {
    /// Binds the bucket, creating it when absent.
    pub async fn open(js: &Context, replicas: usize) -> Result<HaltKey, String> {
        if let Ok(kv) = js.get_key_value(BUCKET).await {
            return Ok(HaltKey { kv });
        }
        let config = kv::Config {
            bucket: BUCKET.to_owned(),
            description: "fuseboxd watchdog: the cluster's halt".to_owned(),
            history: 16,
            storage: StorageType::File,
            num_replicas: replicas,
            ..Default::default()
        };
        match js.create_key_value(config).await {
            Ok(kv) => Ok(HaltKey { kv }),
            // Another daemon made it meanwhile.
            Err(err) => js
                .get_key_value(BUCKET)
                .await
                .map(|kv| HaltKey { kv })
                .map_err(|_| format!("creating KV bucket {BUCKET}: {err}")),
        }
    }

    /// The key as the bucket stream's leader has it. Not `kv.entry`: a direct get may
    /// be answered by a lagging replica, and a holder must not miss a halt.
    pub async fn read(&self) -> Result<Latest, String> {
        let subject = format!("{}{KEY}", self.kv.prefix);
        let message = match self
            .kv
            .stream
            .get_last_raw_message_by_subject(&subject)
            .await
        {
            Ok(message) => message,
            Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(err) => return Err(format!("reading {BUCKET}/{KEY}: {err}")),
        };
        let removed = message
            .headers
            .get(KV_OPERATION)
            .is_some_and(|op| op.as_str() != "PUT");
        if removed {
            return Ok(None);
        }
        let fact = serde_json::from_slice(&message.payload)
            .map_err(|err| format!("{BUCKET}/{KEY} does not decode: {err}"))?;
        Ok(Some((fact, message.sequence)))
    }

    /// Writes a halt, whatever was there: a halt is never lost to a race.
    pub async fn halt(&self, fact: &Fact) -> Result<(), String> {
        let body = serde_json::to_vec(fact).expect("facts serialise");
        self.kv
            .put(KEY, body.into())
            .await
            .map(|_| ())
            .map_err(|err| format!("writing {BUCKET}/{KEY}: {err}"))
    }

    /// Writes a resume over the halt at `revision`; `Ok(false)` when the key changed
    /// since (a newer halt is not cleared by a resume of an older one).
    pub async fn resume(&self, fact: &Fact, revision: u64) -> Result<bool, String> {
        let body = serde_json::to_vec(fact).expect("facts serialise");
        match self.kv.update(KEY, body.into(), revision).await {
            Ok(_) => Ok(true),
            Err(err) if err.kind() == UpdateErrorKind::WrongLastRevision => Ok(false),
            Err(err) => Err(format!("writing {BUCKET}/{KEY}: {err}")),
        }
    }
}

/// Records a halt or resume read from the key, journaled first, unless the watchdog is
/// in that state already (the holder hears its own write back).
pub fn apply(wd: &Watchdog<Fenced>, journal: &Journal, fact: Fact) {
    let news = match &fact {
        Fact::Halted(_) => wd.halted().is_none(),
        Fact::Resumed(_) => wd.halted().is_some(),
        Fact::InstanceLaunched(_) | Fact::RunEnded(_) => false,
    };
    if !news {
        return;
    }
    match &fact {
        Fact::Halted(h) => tracing::error!(since_ms = h.at_ms, why = %h.why,
            "the cluster's watchdog is HALTED (FUSEBOX_WATCHDOG/halt): no daemon terminates anything until `fusebox watchdog resume`"),
        _ => tracing::warn!(
            ?fact,
            "the cluster's watchdog was resumed (FUSEBOX_WATCHDOG/halt)"
        ),
    }
    let written = journal.append_then(&[Entry::Fact { fact: &fact }], || wd.record(fact.clone()));
    if let Err(err) = written {
        tracing::error!(%err, "cannot journal the cluster's halt or resume; recorded all the same");
    }
}

/// Follows the key until `stop`: its current value first, then every change. A watch
/// that ends (a NATS outage) is opened again.
pub async fn follow(
    halt: Arc<HaltKey>,
    wd: Watchdog<Fenced>,
    journal: Arc<Journal>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        match halt.kv.watch_with_history(KEY).await {
            Ok(mut changes) => loop {
                let change = tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    change = changes.next() => change,
                };
                match change {
                    Some(Ok(entry)) if entry.operation == kv::Operation::Put => {
                        match serde_json::from_slice::<Fact>(&entry.value) {
                            Ok(fact) => {
                                let (wd, journal) = (wd.clone(), journal.clone());
                                let _ =
                                    tokio::task::spawn_blocking(move || apply(&wd, &journal, fact))
                                        .await;
                            }
                            Err(err) => tracing::error!(%err, "{BUCKET}/{KEY} does not decode"),
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(err)) => {
                        tracing::warn!(%err, "following the cluster's halt failed; again shortly");
                        break;
                    }
                    None => break,
                }
            },
            Err(err) => tracing::warn!(%err, "cannot follow the cluster's halt; again shortly"),
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}
