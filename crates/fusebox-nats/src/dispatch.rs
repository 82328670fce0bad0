//! The way out: replies, acks and publishes, in the order the applier committed them.
//!
//! Everything here happens after the batch it belongs to is durable, which is the whole
//! point of routing it through one channel from the applier. Stop reports go through a
//! second, sequential task because they wait for JetStream's ack (and retry across a
//! NATS outage) without holding up replies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, AckKind};
use async_nats::{Client, Subject};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::observer::Observer;
use crate::subjects;

pub(crate) enum Output {
    Reply {
        to: Subject,
        body: Vec<u8>,
        /// When the gate request arrived (for the gate latency histogram).
        gate_received: Option<Instant>,
    },
    Ack(jetstream::Message),
    /// A stream message that can never be applied (it was dead-lettered).
    Terminate(jetstream::Message),
    Publish {
        subject: String,
        body: Vec<u8>,
    },
    /// The kill switch: kept in `FUSEBOX_STOPS` (last one per run).
    Stop {
        tenant: String,
        run: String,
        body: Vec<u8>,
    },
    /// The run was resumed: its kept stop must not halt a late subscriber.
    ClearStop {
        tenant: String,
        run: String,
    },
}

enum StopWork {
    Publish { subject: String, body: Vec<u8> },
    Clear { subject: String },
}

/// A stop is retried this long across a NATS outage before it is given up on (it stays
/// in the log, and the next call of the run is refused with it anyway).
const STOP_PUBLISH_DEADLINE: Duration = Duration::from_secs(120);

pub(crate) async fn dispatch(
    client: Client,
    js: jetstream::Context,
    mut rx: UnboundedReceiver<Output>,
    observer: Arc<dyn Observer>,
) {
    let (stop_tx, stop_rx) = unbounded_channel();
    let stops = tokio::spawn(publish_stops(js, stop_rx));
    while let Some(output) = rx.recv().await {
        match output {
            Output::Reply {
                to,
                body,
                gate_received,
            } => {
                if let Err(err) = client.publish(to, body.into()).await {
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
            Output::Publish { subject, body } => {
                if let Err(err) = client.publish(subject, body.into()).await {
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
    drop(stop_tx);
    if let Err(err) = stops.await {
        tracing::error!(%err, "stop publisher failed");
    }
    if let Err(err) = client.flush().await {
        tracing::warn!(%err, "final flush failed");
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

async fn publish_stop(js: &jetstream::Context, subject: &str, body: &[u8]) -> Result<(), BoxError> {
    js.publish(subject.to_owned(), body.to_vec().into())
        .await?
        .await?;
    Ok(())
}

async fn clear_stop(js: &jetstream::Context, subject: &str) -> Result<(), BoxError> {
    let stream = js.get_stream(subjects::STOPS_STREAM).await?;
    stream.purge().filter(subject).await?;
    Ok(())
}
