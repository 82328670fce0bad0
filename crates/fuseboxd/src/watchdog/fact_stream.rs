//! A cluster's watchdog facts, shared: each daemon turns what its own partitions apply
//! into facts (`feed.rs`), and every daemon's watchdog needs all of them, since any
//! daemon may hold the watchdog role next. So each fact is also published to the
//! replicated stream `FUSEBOX_WATCHDOG_FACTS` (subject `fusebox.watchdog.facts`), and
//! every daemon follows the stream from where its journal reaches, journaling and
//! recording the facts its watchdog does not know yet (`Watchdog::knows`: its own come
//! back known). A standby therefore holds the facts of the whole cluster when it takes
//! the role over, without a catch-up.
//!
//! A fact is never only in memory: it is journaled (fsync) where it is applied before
//! it is queued here, and published with a retry until the stream acknowledges it. A
//! daemon killed between the two leaves it in its journal and in `FUSEBOX_APPLIED`:
//! another daemon taking the partition over re-applies the batch and publishes the fact
//! again, and on its own restart a daemon publishes its journal's facts again. The
//! message id is the fact's hash, so the stream drops repeats within its window, and a
//! repeat past it is known to every watchdog.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
use async_nats::jetstream::stream::{self, StorageType};
use async_nats::jetstream::Context;
use fusebox_watchdog::{Fact, Watchdog};
use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};

use super::journal::{Entry, Journal};
use super::role::Fenced;

pub const STREAM: &str = "FUSEBOX_WATCHDOG_FACTS";
pub const SUBJECT: &str = "fusebox.watchdog.facts";
/// Where this daemon's journal reaches into the stream (a lower bound, like the
/// partitions' `applied.seq`: written without fsync, and reading a fact twice is
/// harmless).
const POSITION_FILE: &str = "watchdog.facts.seq";
/// How often the position is written while facts arrive.
const POSITION_EVERY: Duration = Duration::from_secs(1);
/// Facts older than this leave the stream; a daemon whose journal is older still (or
/// empty) relies on the sweep, which finds every tagged instance by its tags.
const KEPT: Duration = Duration::from_secs(30 * 86_400);
const RETRY_PAUSE: Duration = Duration::from_millis(500);

pub fn stream_config(replicas: usize) -> stream::Config {
    stream::Config {
        name: STREAM.to_owned(),
        subjects: vec![SUBJECT.to_owned()],
        storage: StorageType::File,
        max_age: KEPT,
        num_replicas: replicas,
        ..Default::default()
    }
}

/// Only launches and run ends are shared this way; the halt has its key (`halt_key.rs`).
pub fn shared(fact: &Fact) -> bool {
    matches!(fact, Fact::InstanceLaunched(_) | Fact::RunEnded(_))
}

fn message_id(body: &[u8]) -> String {
    format!(
        "{:016x}{:016x}",
        fusebox_core::fixed_hash::fnv1a(body),
        fusebox_core::fixed_hash::fnv1a(&[body, b"\x00"].concat())
    )
}

/// Publishes queued facts until the queue closes or `stop`, each retried until the
/// stream acknowledges it; told to stop, what is queued gets one bounded attempt.
pub async fn publish(
    js: Context,
    mut queued: mpsc::UnboundedReceiver<Fact>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let fact = tokio::select! {
            biased;
            fact = queued.recv() => match fact {
                Some(fact) => fact,
                None => return,
            },
            _ = stop.wait_for(|s| *s) => break,
        };
        while let Err(err) = publish_one(&js, &fact).await {
            tracing::warn!(%err, "cannot publish a watchdog fact to {STREAM}; retrying");
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                () = tokio::time::sleep(RETRY_PAUSE) => {}
            }
        }
    }
    while let Ok(fact) = queued.try_recv() {
        let bounded = tokio::time::timeout(Duration::from_secs(2), publish_one(&js, &fact));
        if !matches!(bounded.await, Ok(Ok(()))) {
            tracing::warn!(?fact, "watchdog fact not published at shutdown; republished from the journal at the next start");
        }
    }
}

async fn publish_one(js: &Context, fact: &Fact) -> Result<(), String> {
    let body = serde_json::to_vec(fact).expect("facts serialise");
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", message_id(&body).as_str());
    let ack = js
        .publish_with_headers(SUBJECT, headers, body.into())
        .await
        .map_err(|e| e.to_string())?;
    ack.await.map(|_| ()).map_err(|e| e.to_string())
}

/// Follows the stream until `stop`, from just after the position this daemon's journal
/// reached, recording (journal first) every fact its watchdog does not know.
pub async fn follow(
    js: Context,
    wd: Watchdog<Fenced>,
    journal: Arc<Journal>,
    data_dir: PathBuf,
    mut stop: watch::Receiver<bool>,
) {
    let position = data_dir.join(POSITION_FILE);
    let mut last = read_position(&position);
    let mut written = (last, Instant::now());
    loop {
        let consumer = async {
            let stream = js.get_stream(STREAM).await.map_err(|e| e.to_string())?;
            let consumer = stream
                .create_consumer(OrderedConfig {
                    deliver_policy: DeliverPolicy::ByStartSequence {
                        start_sequence: last + 1,
                    },
                    ..Default::default()
                })
                .await
                .map_err(|e| e.to_string())?;
            consumer.messages().await.map_err(|e| e.to_string())
        };
        match consumer.await {
            Ok(mut messages) => loop {
                let next = tokio::select! {
                    _ = stop.wait_for(|s| *s) => {
                        write_position(&position, last);
                        return;
                    }
                    next = messages.next() => next,
                };
                let message = match next {
                    Some(Ok(message)) => message,
                    Some(Err(err)) => {
                        tracing::warn!(%err, "following {STREAM} failed; again shortly");
                        break;
                    }
                    None => break,
                };
                let sequence = message
                    .info()
                    .map(|i| i.stream_sequence)
                    .unwrap_or(last + 1);
                match serde_json::from_slice::<Fact>(&message.payload) {
                    Ok(fact) if shared(&fact) && !wd.knows(&fact) => {
                        let (wd, journal) = (wd.clone(), journal.clone());
                        let _ =
                            tokio::task::spawn_blocking(move || record(&wd, &journal, fact)).await;
                    }
                    Ok(_) => {}
                    Err(err) => {
                        tracing::error!(%err, sequence, "a {STREAM} message does not decode; skipped")
                    }
                }
                last = sequence;
                if written.0 != last && written.1.elapsed() >= POSITION_EVERY {
                    write_position(&position, last);
                    written = (last, Instant::now());
                }
            },
            Err(err) => tracing::warn!(%err, "cannot follow {STREAM}; again shortly"),
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => {
                write_position(&position, last);
                return;
            }
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

fn record(wd: &Watchdog<Fenced>, journal: &Journal, fact: Fact) {
    tracing::info!(?fact, "watchdog fact from another daemon");
    let written = journal.append_then(&[Entry::Fact { fact: &fact }], || wd.record(fact.clone()));
    if let Err(err) = written {
        // Recorded all the same; after a restart only its origin's republishing
        // brings it back to this daemon.
        tracing::error!(%err, "cannot journal a watchdog fact from the stream");
    }
}

fn read_position(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0)
}

/// Written beside and renamed over, so a kill leaves the old position or the new one.
fn write_position(path: &Path, sequence: u64) {
    let beside = path.with_extension("seq.new");
    let written =
        std::fs::write(&beside, sequence.to_string()).and_then(|()| std::fs::rename(&beside, path));
    if let Err(err) = written {
        tracing::warn!(%err, path = %path.display(), "cannot write the facts stream position; it is read again from further back");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_survives_and_a_missing_one_starts_at_the_beginning() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(POSITION_FILE);
        assert_eq!(read_position(&path), 0);
        write_position(&path, 42);
        assert_eq!(read_position(&path), 42);
    }

    #[test]
    fn the_same_fact_has_the_same_message_id() {
        assert_eq!(message_id(b"{\"a\":1}"), message_id(b"{\"a\":1}"));
        assert_ne!(message_id(b"{\"a\":1}"), message_id(b"{\"a\":2}"));
    }
}
