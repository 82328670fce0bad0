//! The way out: replies, acks and publishes, in the order the applier committed them.
//!
//! Everything here happens after the batch it belongs to is durable, which is the whole
//! point of routing it through one channel from the applier. A batch's outputs travel as
//! one [`Outbox`]: one wake-up of this task per commit rather than one per reply, and the
//! answers (what callers wait on) are written before the decision and dead-letter
//! publishes (what only observers wait on). Stop reports go through a second, sequential
//! task because they wait for JetStream's ack (and retry across a NATS outage) without
//! holding up replies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, AckKind};
use async_nats::{Client, Subject};
use bytes::Bytes;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::observer::Observer;
use crate::subjects;

pub(crate) enum Output {
    Reply {
        to: Subject,
        body: Bytes,
        /// When the gate request arrived (for the gate latency histogram).
        gate_received: Option<Instant>,
    },
    Ack(Box<jetstream::Message>),
    /// A stream message that can never be applied (it was dead-lettered).
    Terminate(Box<jetstream::Message>),
    /// A stream message this daemon will not apply after all (its batch failed): hand
    /// it back for redelivery now rather than after the ack wait.
    Nak(Box<jetstream::Message>),
    Publish {
        subject: String,
        body: Bytes,
    },
    /// The kill switch: kept in `FUSEBOX_STOPS` (last one per run).
    Stop {
        tenant: String,
        run: String,
        body: Bytes,
    },
    /// The run was resumed: its kept stop must not halt a late subscriber.
    ClearStop {
        tenant: String,
        run: String,
    },
}

/// Outputs handed to the dispatcher together. A body is serialised once and shared
/// (`Bytes`) between the reply and the publish of the same decision.
#[derive(Default)]
pub(crate) struct Outbox {
    /// Replies and acks: sent first.
    pub answers: Vec<Output>,
    /// Decisions, dead letters, stops: sent after this outbox's answers.
    pub publishes: Vec<Output>,
}

impl Outbox {
    /// Hands the outbox to the dispatcher (nothing is sent when it is empty). The
    /// dispatcher outlives every producer of outputs; a closed channel means the process
    /// is already going down and there is nobody left to tell.
    pub(crate) fn send(self, out: &UnboundedSender<Outbox>) {
        if self.answers.is_empty() && self.publishes.is_empty() {
            return;
        }
        if out.send(self).is_err() {
            tracing::warn!("dispatcher gone; outputs dropped during shutdown");
        }
    }
}

enum StopWork {
    Publish { subject: String, body: Bytes },
    Clear { subject: String },
}

/// A stop is retried this long across a NATS outage before it is given up on (it stays
/// in the log, and the next call of the run is refused with it anyway).
const STOP_PUBLISH_DEADLINE: Duration = Duration::from_secs(120);

pub(crate) async fn dispatch(
    client: Client,
    js: jetstream::Context,
    mut rx: UnboundedReceiver<Outbox>,
    observer: Arc<dyn Observer>,
) {
    let (stop_tx, stop_rx) = unbounded_channel();
    let stops = tokio::spawn(publish_stops(js, stop_rx));
    while let Some(outbox) = rx.recv().await {
        for output in outbox.answers.into_iter().chain(outbox.publishes) {
            send(&client, &*observer, &stop_tx, output).await;
        }
    }
    drop(stop_tx);
    if let Err(err) = stops.await {
        tracing::error!(%err, "stop publisher failed");
    }
    // A flush waits for the server's answer, and while NATS is unreachable that never
    // comes: a stopping service must not wait for the outage to end (the gate clients
    // time out and deny; unacked stream messages are redelivered to the next owner).
    match tokio::time::timeout(FINAL_FLUSH_WAIT, client.flush()).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::warn!(%err, "final flush failed"),
        Err(_) => tracing::warn!("final flush not answered in time; NATS unreachable"),
    }
}

/// How long a stopping service waits for its last replies and acks to reach NATS.
const FINAL_FLUSH_WAIT: Duration = Duration::from_secs(2);

/// One output, in the order of its outbox.
async fn send(
    client: &Client,
    observer: &dyn Observer,
    stop_tx: &UnboundedSender<StopWork>,
    output: Output,
) {
    match output {
        Output::Reply {
            to,
            body,
            gate_received,
        } => {
            if let Err(err) = client.publish(to, body).await {
                tracing::warn!(%err, "reply not sent");
            }
            if let Some(received) = gate_received {
                observer.gate_latency(received.elapsed());
            }
        }
        Output::Ack(message) => {
            if let Err(err) = message.ack().await {
                tracing::warn!(%err, "ack not sent; the message will be redelivered and deduplicated");
            }
        }
        Output::Terminate(message) => {
            if let Err(err) = message.ack_with(AckKind::Term).await {
                tracing::warn!(%err, "term not sent");
            }
        }
        Output::Nak(message) => {
            if let Err(err) = message.ack_with(AckKind::Nak(None)).await {
                tracing::warn!(%err, "nak not sent; the message comes back after its ack wait");
            }
        }
        Output::Publish { subject, body } => {
            if let Err(err) = client.publish(subject, body).await {
                tracing::warn!(%err, "publish failed");
            }
        }
        Output::Stop { tenant, run, body } => {
            let subject = subjects::stop(&tenant, &run);
            let _ = stop_tx.send(StopWork::Publish { subject, body });
        }
        Output::ClearStop { tenant, run } => {
            let subject = subjects::stop(&tenant, &run);
            let _ = stop_tx.send(StopWork::Clear { subject });
        }
    }
}

async fn publish_stops(js: jetstream::Context, mut rx: UnboundedReceiver<StopWork>) {
    while let Some(work) = rx.recv().await {
        let started = Instant::now();
        let mut delay = Duration::from_millis(50);
        loop {
            let done = match &work {
                StopWork::Publish { subject, body } => publish_stop(&js, subject, body).await,
                StopWork::Clear { subject } => clear_stop(&js, subject).await,
            };
            match done {
                Ok(()) => break,
                Err(err) if started.elapsed() < STOP_PUBLISH_DEADLINE => {
                    tracing::warn!(%err, "stop stream not updated yet; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                Err(err) => {
                    tracing::error!(%err, "stop stream update given up");
                    break;
                }
            }
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn publish_stop(
    js: &jetstream::Context,
    subject: &str,
    body: &Bytes,
) -> Result<(), BoxError> {
    js.publish(subject.to_owned(), body.clone()).await?.await?;
    Ok(())
}

async fn clear_stop(js: &jetstream::Context, subject: &str) -> Result<(), BoxError> {
    let stream = js.get_stream(subjects::STOPS_STREAM).await?;
    stream.purge().filter(subject).await?;
    Ok(())
}
