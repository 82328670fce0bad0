//! Whether the events stream may still hold a missing `seq`.
//!
//! A run's events come by two paths; when a later `seq` arrives and an earlier one has
//! not, the applier waits (`gap_timeout`) and then applies without it. An event that
//! JetStream has acknowledged but not yet delivered — a NATS node restarting, a
//! partition changing hands — must not be given up on that way: it would then be
//! refused as late, an acknowledged event lost. So a gap is released only while the
//! consumer has delivered everything the stream holds for it.
//!
//! A task asks JetStream every timer interval and leaves the answer in a flag, so the
//! applier thread never waits on NATS for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use tokio::sync::watch;

use crate::inbound::stopped;
use crate::subjects::{self, Scope};

/// The latest answer: true when the consumer had nothing undelivered.
#[derive(Clone, Default)]
pub(crate) struct Backlog(Arc<AtomicBool>);

impl Backlog {
    pub(crate) fn drained(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Keeps `backlog` up to date until shutdown; no answer counts as "not drained".
pub(crate) async fn watch_backlog(
    js: jetstream::Context,
    scope: Scope,
    backlog: Backlog,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let name = scope.events_consumer();
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stopped(&mut shutdown) => return,
            _ = interval.tick() => {}
        }
        let asked = tokio::time::timeout(every.max(Duration::from_secs(1)), async {
            let stream = js.get_stream(subjects::EVENTS_STREAM).await?;
            let mut consumer: jetstream::consumer::Consumer<pull::Config> =
                stream.get_consumer(&name).await?;
            let info = consumer.info().await?;
            Ok::<_, async_nats::Error>(info.num_pending == 0)
        })
        .await;
        let drained = matches!(asked, Ok(Ok(true)));
        backlog.0.store(drained, Ordering::Release);
    }
}
