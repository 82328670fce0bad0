//! The consumer-lag gauge: what the daemon still owes the events stream (messages not
//! yet delivered plus delivered but not yet acked), asked of JetStream every timer
//! interval by a task, so the applier thread never waits on NATS for it.
//!
//! Only a gauge: whether a run's missing `seq` may still come is asked of the stream
//! itself (`gap_probe.rs`), never of these counts — a consumer can be wrong about them.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use tokio::sync::watch;

use crate::inbound::stopped;
use crate::observer::Observer;
use crate::subjects::{self, Scope};

/// Keeps the consumer-lag gauge up to date until shutdown.
pub(crate) async fn watch_backlog(
    js: jetstream::Context,
    scope: Scope,
    observer: Arc<dyn Observer>,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let name = scope.events_consumer();
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Bound once and asked for its info each tick; bound again after a failed answer
    // (the consumer may have been recreated meanwhile).
    let mut bound: Option<jetstream::consumer::Consumer<pull::Config>> = None;
    loop {
        tokio::select! {
            _ = stopped(&mut shutdown) => return,
            _ = interval.tick() => {}
        }
        let ask = tokio::time::timeout(every.max(Duration::from_secs(1)), async {
            let consumer = match &mut bound {
                Some(consumer) => consumer,
                None => {
                    let stream = js.get_stream(subjects::EVENTS_STREAM).await?;
                    bound.insert(stream.get_consumer(&name).await?)
                }
            };
            let info = consumer.info().await?;
            Ok::<_, async_nats::Error>((info.num_pending, info.num_ack_pending as u64))
        });
        // While NATS is unreachable the question waits out its timeout; a stopping
        // service does not.
        let asked = tokio::select! {
            biased;
            _ = stopped(&mut shutdown) => return,
            asked = ask => asked.ok().and_then(Result::ok),
        };
        match asked {
            // Not yet delivered plus delivered but not yet acked: what the daemon still
            // owes the stream.
            Some((pending, unacked)) => observer.consumer_lag(pending.saturating_add(unacked)),
            None => bound = None,
        }
    }
}
