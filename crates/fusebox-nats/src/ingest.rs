//! Passive ingest: `FUSEBOX_EVENTS` through the daemon's durable pull consumer. A message
//! is acked only after its batch is committed (by the dispatcher), so a crash or a NATS
//! outage redelivers it and the sequencer drops what was already applied.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::watch;

use crate::applier::Input;
use crate::inbound::{parse_on, stopped, Inbound};
use crate::reject::Origin;
use crate::setup;

/// Consecutive pull errors (missed heartbeats, no responders while NATS is down) after
/// which the consumer is bound afresh.
const REBIND_AFTER_ERRORS: u32 = 3;

pub(crate) async fn run(
    js: async_nats::jetstream::Context,
    scope: crate::subjects::Scope,
    inbound: Inbound,
    pull_batch: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    while !*shutdown.borrow() {
        // Each JetStream request waits up to its timeout while NATS is unreachable; a
        // stopping service must not wait for them.
        let bound = tokio::select! {
            biased;
            _ = stopped(&mut shutdown) => break,
            bound = setup::events_consumer(&js, scope) => bound,
        };
        let messages = match bound {
            Ok(consumer) => tokio::select! {
                biased;
                _ = stopped(&mut shutdown) => break,
                messages = consumer
                    .stream()
                    .max_messages_per_batch(pull_batch)
                    .heartbeat(Duration::from_secs(5))
                    .expires(Duration::from_secs(30))
                    .messages() => messages,
            },
            Err(err) => {
                tracing::warn!(%err, "binding the events consumer failed; retrying");
                if tokio::time::timeout(Duration::from_secs(1), stopped(&mut shutdown))
                    .await
                    .is_ok()
                {
                    break;
                }
                continue;
            }
        };
        let mut messages = match messages {
            Ok(messages) => messages,
            Err(err) => {
                tracing::warn!(%err, "pulling from the events consumer failed; retrying");
                if tokio::time::timeout(Duration::from_secs(1), stopped(&mut shutdown))
                    .await
                    .is_ok()
                {
                    break;
                }
                continue;
            }
        };
        inbound.observer.consumer_bound(true);
        let mut errors = 0;
        loop {
            tokio::select! {
                biased;
                _ = stopped(&mut shutdown) => break,
                next = messages.next() => match next {
                    Some(Ok(message)) => {
                        errors = 0;
                        handle(&inbound, message).await;
                    }
                    Some(Err(err)) => {
                        errors += 1;
                        tracing::warn!(%err, "events consumer error");
                        if errors >= REBIND_AFTER_ERRORS {
                            break;
                        }
                    }
                    None => break,
                },
            }
        }
        inbound.observer.consumer_bound(false);
    }
}

async fn handle(inbound: &Inbound, message: async_nats::jetstream::Message) {
    let parsed = parse_on(
        message.subject.as_str(),
        "events",
        &message.payload,
        &inbound.accept,
    );
    let origin = Origin::Stream(Box::new(message));
    match parsed {
        Ok(event) => inbound.queue(Input::Event { event, origin }).await,
        Err(err) => inbound.reject(origin, &err),
    }
}
