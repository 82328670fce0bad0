//! The floor of JetStream ingest: what taking events off a stream costs before any guard
//! or disk. The same events go into a stream of their own with a durable pull consumer
//! set up as the daemon's is (explicit acks, the same pull batch and ack window), read on
//! a connection and a thread of their own (the daemon is a process of its own) and acked
//! one by one as they arrive. Publishing into a stream nobody consumes — the raw figure
//! beside it — leaves out the server's delivery and ack work, which on a small machine is
//! most of what separates ingest from that figure.

use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{pull, AckPolicy};
use futures_util::StreamExt;
use tokio::sync::oneshot;

use super::{fresh_stream, js_error, publish_all, Figure};
use crate::client::{ClientOptions, FuseboxClient};
use crate::error::ClientError;
use crate::settings::NatsSettings;

const STREAM: &str = "FUSEBOX_BENCH_CONSUMED";
const SUBJECT_PREFIX: &str = "fusebox.bench.consumed";
const CONSUMER: &str = "bench";

/// fuseboxd's defaults (`[daemon] pull_batch`, `max_ack_pending` in config/fusebox.toml).
const PULL_BATCH: usize = 512;
const MAX_ACK_PENDING: i64 = 20_000;

/// Publishes `total` events (`message(i)` gives the subject's tail below this stream's
/// prefix, the message id and the body) and returns once the consumer has acked every
/// one and its acks have reached the server.
pub(super) async fn measure(
    client: &FuseboxClient,
    settings: &NatsSettings,
    options: &ClientOptions,
    total: usize,
    message: impl Fn(usize) -> (String, String, Vec<u8>),
) -> Result<Figure, ClientError> {
    fresh_stream(client, STREAM, SUBJECT_PREFIX).await?;
    let (ready_tx, ready_rx) = oneshot::channel();
    let (stop, stop_rx) = oneshot::channel();
    let (settings, options) = (settings.clone(), options.clone());
    let thread = std::thread::Builder::new()
        .name("bench-acked-consumer".to_owned())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|err| usage(format!("the acked consumer: {err}")))?;
            runtime.block_on(async {
                tokio::select! {
                    consumed = consume(settings, options, total, ready_tx) => consumed,
                    _ = stop_rx => Ok(()),
                }
            })
        })
        .map_err(|err| usage(format!("starting the acked consumer: {err}")))?;
    let published = async {
        ready_rx
            .await
            .map_err(|_| usage("the acked consumer stopped before it was ready".to_owned()))?;
        let started = Instant::now();
        publish_all(client, total, |i| {
            let (tail, id, body) = message(i);
            (format!("{SUBJECT_PREFIX}.{tail}"), id, body)
        })
        .await?;
        Ok::<_, ClientError>(started)
    }
    .await;
    if published.is_err() {
        // The consumer would wait for events that never come.
        let _ = stop.send(());
    }
    let consumed = tokio::task::spawn_blocking(move || thread.join())
        .await
        .expect("joining the acked consumer's thread does not panic")
        .map_err(|_| usage("the acked consumer panicked".to_owned()))?;
    let _ = client.js.delete_stream(STREAM).await;
    // The consumer's own error first: it explains a consumer that was never ready.
    consumed?;
    let started = published?;
    Ok(Figure::whole(total, started.elapsed()))
}

fn usage(message: String) -> ClientError {
    ClientError::Usage(message)
}

/// Pulls and acks `total` messages, then waits for the server to have the acks.
async fn consume(
    settings: NatsSettings,
    options: ClientOptions,
    total: usize,
    ready: oneshot::Sender<()>,
) -> Result<(), ClientError> {
    let client = FuseboxClient::connect_with(&settings, options).await?;
    let consumer = client
        .js
        .create_consumer_on_stream(
            pull::Config {
                durable_name: Some(CONSUMER.to_owned()),
                ack_policy: AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                max_ack_pending: MAX_ACK_PENDING,
                ..Default::default()
            },
            STREAM,
        )
        .await
        .map_err(|e| js_error("consumed bench consumer")(e.into()))?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(PULL_BATCH)
        .heartbeat(Duration::from_secs(5))
        .expires(Duration::from_secs(30))
        .messages()
        .await
        .map_err(|e| js_error("consumed bench pull")(e.into()))?;
    let _ = ready.send(());
    let mut acked = 0;
    while acked < total {
        let message = match messages.next().await {
            Some(Ok(message)) => message,
            Some(Err(err)) => return Err(js_error("consumed bench pull")(err.into())),
            None => {
                return Err(usage(format!(
                    "the consumed bench stream ended after {acked} of {total} messages"
                )))
            }
        };
        message
            .ack()
            .await
            .map_err(|e| js_error("consumed bench ack")(e))?;
        acked += 1;
    }
    client
        .nats
        .flush()
        .await
        .map_err(|e| js_error("consumed bench flush")(e.into()))
}
