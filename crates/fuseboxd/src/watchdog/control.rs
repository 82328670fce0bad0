//! `fusebox.control.watchdog`: the watchdog's status, and an operator's resume of a
//! watchdog halted by `on_blast_radius = "halt"` (`fusebox watchdog resume`).
//!
//! A resume is a fact like a launch: journaled (fsync) and recorded under the journal's
//! lock before it is answered, so it holds across a restart. A plain subscription, not a
//! queue group: in a cluster every daemon's watchdog hears the operator, and the asker
//! takes the first answer.

use std::sync::Arc;

use fusebox_nats::subjects::CONTROL_WATCHDOG;
use fusebox_nats::wire::{WatchdogReply, WatchdogRequest};
use fusebox_watchdog::{Ec2Provider, Fact, Resumed, Watchdog};
use futures_util::StreamExt;
use tokio::sync::watch;

use super::journal::{Entry, Journal};

pub async fn serve(
    client: async_nats::Client,
    wd: Watchdog<Ec2Provider>,
    journal: Arc<Journal>,
    stop: watch::Receiver<bool>,
) {
    let mut requests = match client.subscribe(CONTROL_WATCHDOG).await {
        Ok(sub) => sub,
        Err(err) => {
            tracing::error!(%err, subject = CONTROL_WATCHDOG, "cannot subscribe: the watchdog cannot be resumed over NATS");
            return;
        }
    };
    let stopped = super::stopped(stop);
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
        let answer = answer(&wd, &journal, &message.payload).await;
        let body = serde_json::to_vec(&answer).expect("replies serialise");
        if let Err(err) = client.publish(reply, body.into()).await {
            tracing::warn!(%err, "cannot answer a watchdog control request");
        }
    }
}

async fn answer(
    wd: &Watchdog<Ec2Provider>,
    journal: &Arc<Journal>,
    payload: &[u8],
) -> WatchdogReply {
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

fn status(wd: &Watchdog<Ec2Provider>, message: String) -> WatchdogReply {
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
    }
}
