//! Whether the events stream may still hold a missing `seq`.
//!
//! A run's events come by two paths; when a later `seq` arrives and an earlier one has
//! not, the applier waits (`gap_timeout`) and then applies without it. An event that
//! JetStream has acknowledged but not yet delivered — a NATS node restarting, a
//! partition changing hands — must not be given up on that way: it would then be
//! refused as late, an acknowledged event lost. So a gap is released only while the
//! consumer has delivered everything the stream holds and every delivery it still
//! waits an ack for is one this service holds (a delivery to a connection that died
//! with a NATS node comes back only after the ack wait).
//!
//! A task asks JetStream every timer interval and leaves the answer in a flag, so the
//! applier thread never waits on NATS for it. The same answer is the consumer-lag gauge.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use tokio::sync::watch;

use crate::inbound::stopped;
use crate::observer::Observer;
use crate::subjects::{self, Scope};

/// The consumer's latest counts: messages not yet delivered, and delivered but not yet
/// acked. `UNKNOWN` until JetStream answers (and whenever it does not).
#[derive(Clone)]
pub(crate) struct Backlog(Arc<[AtomicU64; 2]>);

const UNKNOWN: u64 = u64::MAX;

impl Default for Backlog {
    fn default() -> Self {
        Backlog(Arc::new([AtomicU64::new(UNKNOWN), AtomicU64::new(UNKNOWN)]))
    }
}

impl Backlog {
    /// Nothing undelivered, and no unacked delivery beyond the `held` stream messages
    /// this service holds for gaps.
    pub(crate) fn drained(&self, held: usize) -> bool {
        let pending = self.0[0].load(Ordering::Acquire);
        let unacked = self.0[1].load(Ordering::Acquire);
        pending == 0 && unacked != UNKNOWN && unacked <= held as u64
    }

    fn set(&self, counts: Option<(u64, u64)>) {
        let (pending, unacked) = counts.unwrap_or((UNKNOWN, UNKNOWN));
        self.0[0].store(pending, Ordering::Release);
        self.0[1].store(unacked, Ordering::Release);
    }
}

/// Keeps `backlog` and the consumer-lag gauge up to date until shutdown; no answer
/// counts as "not drained".
pub(crate) async fn watch_backlog(
    js: jetstream::Context,
    scope: Scope,
    backlog: Backlog,
    observer: Arc<dyn Observer>,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let name = scope.events_consumer();
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Bound once and asked for its info each tick; bound again after a failed answer
    // (the consumer may have been recreated at its ack floor meanwhile).
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
        backlog.set(asked);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drained_only_with_nothing_undelivered_and_no_stranger_unacked() {
        let backlog = Backlog::default();
        assert!(!backlog.drained(0), "unknown until JetStream answers");
        backlog.set(Some((0, 2)));
        assert!(backlog.drained(2), "both unacked deliveries are held here");
        assert!(!backlog.drained(1), "one delivery went somewhere else");
        backlog.set(Some((3, 0)));
        assert!(!backlog.drained(0), "undelivered messages");
        backlog.set(None);
        assert!(!backlog.drained(100));
    }
}
