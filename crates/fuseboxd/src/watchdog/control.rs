//! `fusebox.control.watchdog`: the watchdog's status (halted or not, what it holds, its
//! recent terminations: `query.rs`), and an operator's resume of a watchdog halted by
//! `on_blast_radius = "halt"` (`fusebox watchdog resume`).
//!
//! A resume is a fact like a launch: journaled (fsync) and recorded under the journal's
//! lock before it is answered, so it holds across a restart. A plain subscription, not a
//! queue group: in a cluster every daemon's watchdog hears the operator, and only the
//! holder of the watchdog role answers (one answer, from the daemon that acts; between
//! a holder's death and the takeover, at most a lease, nobody does). Its resume is
//! written to the cluster's halt key first (`halt_key.rs`), checked against the halt it
//! clears, so every daemon resumes.

use std::sync::Arc;

use fusebox_nats::subjects::CONTROL_WATCHDOG;
use fusebox_nats::wire::{WatchdogReply, WatchdogRequest};
use fusebox_watchdog::{Fact, Resumed, Watchdog};
use futures_util::StreamExt;
use tokio::sync::watch;

use super::halt_key::HaltKey;
use super::journal::{Entry, Journal};
use super::query::{self, Recent};
use super::role::{Authority, Fenced};

/// The watchdog a daemon runs, as the control subject needs it.
pub struct Controlled {
    pub wd: Watchdog<Fenced>,
    pub journal: Arc<Journal>,
    pub recent: Recent,
    /// Whether this daemon answers: always alone, while it holds the role in a cluster.
    pub authority: Authority,
    /// The cluster's halt (`None` alone).
    pub halt: Option<Arc<HaltKey>>,
}

/// Answers `fusebox.control.watchdog` until `stop`; `None`: the watchdog is disabled
/// (`[watchdog] enabled = false`), and every answer says so.
pub async fn serve(
    client: async_nats::Client,
    watchdog: Option<Controlled>,
    stop: watch::Receiver<bool>,
) {
    let mut requests = match client.subscribe(CONTROL_WATCHDOG).await {
        Ok(sub) => sub,
        Err(err) => {
            tracing::error!(%err, subject = CONTROL_WATCHDOG, "cannot subscribe: the watchdog cannot be resumed over NATS");
            return;
        }
    };
    let stopped = until_told(stop);
    tokio::pin!(stopped);
    loop {
        let message = tokio::select! {
            () = &mut stopped => break,
            next = requests.next() => match next {
                Some(message) => message,
                None => break,
            },
        };
        let Some(reply) = message.reply.clone() else {
            continue;
        };
        if watchdog.as_ref().is_some_and(|w| !w.authority.holds()) {
            continue;
        }
        let answer = match &watchdog {
            Some(watchdog) => answer(watchdog, &message.payload).await,
            None => disabled(),
        };
        let body = serde_json::to_vec(&answer).expect("replies serialise");
        if let Err(err) = client.publish(reply, body.into()).await {
            tracing::warn!(%err, "cannot answer a watchdog control request");
        }
    }
}

/// Resolves when `stop` says so. A sender gone without saying it is no stop: a daemon
/// whose watchdog is disabled keeps no sender, and must still answer that it is
/// disabled (`enabled: false`) rather than leave the asker to time out; this loop then
/// ends with the connection, when its subscription does.
async fn until_told(mut stop: watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn disabled() -> WatchdogReply {
    WatchdogReply {
        halted: false,
        halted_since_ms: None,
        why: None,
        resumed: false,
        message: "the cloud watchdog is disabled ([watchdog] enabled = false)".to_owned(),
        enabled: false,
        instances: Vec::new(),
        region_errors: Default::default(),
        terminations: Vec::new(),
    }
}

async fn answer(watchdog: &Controlled, payload: &[u8]) -> WatchdogReply {
    let mut reply = decide(watchdog, payload).await;
    query::fill(&mut reply, watchdog.wd.inventory().await, &watchdog.recent);
    reply
}

/// The request's effect, and the watchdog's state after it.
async fn decide(watchdog: &Controlled, payload: &[u8]) -> WatchdogReply {
    let (wd, journal) = (&watchdog.wd, &watchdog.journal);
    let request: WatchdogRequest = if payload.iter().all(u8::is_ascii_whitespace) {
        WatchdogRequest::default()
    } else {
        match serde_json::from_slice(payload) {
            Ok(request) => request,
            Err(err) => {
                return status(
                    wd,
                    format!(
                        "bad request ({err}); expected {{}} or {{\"resume\":{{\"by\":\"<who>\"}}}}"
                    ),
                )
            }
        }
    };
    let Some(resume) = request.resume else {
        return status(wd, String::new());
    };
    let Some(halted) = wd.halted() else {
        return status(
            wd,
            "the watchdog is not halted; nothing to resume".to_owned(),
        );
    };
    let fact = Fact::Resumed(Resumed {
        at_ms: wd.now_ms(),
        by: resume.by.clone(),
    });
    if let Some(halt) = &watchdog.halt {
        if let Err(refused) = resume_cluster(halt, &fact).await {
            return status(wd, refused);
        }
    }
    let (journal, recorder) = (journal.clone(), wd.clone());
    let written = tokio::task::spawn_blocking(move || {
        journal.append_then(&[Entry::Fact { fact: &fact }], || {
            recorder.record(fact.clone())
        })
    })
    .await
    .expect("journal append task");
    match written {
        Ok(()) => {
            tracing::warn!(by = %resume.by, halted_since_ms = halted.at_ms, "watchdog resumed by an operator (journaled)");
            let mut reply = status(
                wd,
                format!("watchdog resumed by {}; it was halted since {} ms: {}", resume.by, halted.at_ms, halted.why),
            );
            reply.resumed = true;
            reply
        }
        // Recorded but not durable: a restart would come back halted. Say so.
        Err(err) => status(
            wd,
            format!("resumed, but the resume could not be journaled ({err}): a restart comes back halted"),
        ),
    }
}

/// Writes the resume to the cluster's halt key over the halt it clears; the reason in
/// words when it cannot (then nothing is resumed anywhere).
async fn resume_cluster(halt: &HaltKey, fact: &Fact) -> Result<(), String> {
    let unreadable = |err| format!("not resumed: the cluster's halt cannot be read ({err})");
    let revision = match halt.read().await.map_err(unreadable)? {
        Some((Fact::Halted(_), revision)) => revision,
        // The bucket holds no halt to clear: this daemon's own never reached it (its
        // write was cut short), so the resume here is all there is.
        _ => return Ok(()),
    };
    match halt.resume(fact, revision).await {
        Ok(true) => Ok(()),
        Ok(false) => Err("not resumed: the cluster's halt changed meanwhile; ask again".to_owned()),
        Err(err) => Err(format!("not resumed: {err}")),
    }
}

fn status(wd: &Watchdog<Fenced>, message: String) -> WatchdogReply {
    let halted = wd.halted();
    let message = if message.is_empty() {
        match &halted {
            Some(h) => format!("halted since {} ms: {}", h.at_ms, h.why),
            None => "running".to_owned(),
        }
    } else {
        message
    };
    WatchdogReply {
        halted: halted.is_some(),
        halted_since_ms: halted.as_ref().map(|h| h.at_ms),
        why: halted.map(|h| h.why),
        resumed: false,
        message,
        enabled: true,
        instances: Vec::new(),
        region_errors: Default::default(),
        terminations: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A disabled watchdog's answering loop is given a receiver whose sender is already
    /// gone: that must not end the loop (it did, and `fusebox watchdog status` timed out).
    #[test]
    fn only_a_stop_said_ends_the_answering_loop() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            let orphan = watch::channel(false).1;
            let waited = tokio::time::timeout(Duration::from_millis(50), until_told(orphan));
            assert!(waited.await.is_err(), "a dropped sender is no stop");
            let (tell, told) = watch::channel(false);
            tell.send(true).unwrap();
            let waited = tokio::time::timeout(Duration::from_millis(50), until_told(told));
            assert!(waited.await.is_ok(), "a stop said ends it");
        });
    }
}
