//! Where a session's events go in their run's order, so a call's result can be reported
//! without waiting for its commit while the daemon still applies it before it decides the
//! session's next call.
//!
//! A run the session made has no other producer: its events are numbered (`seq`), and
//! the daemon's sequencer applies them in that order whatever order they arrive in,
//! holding a call until the result numbered before it is applied. A run named by `--run`
//! may have other producers (an earlier session, the other sessions of an HTTP gateway),
//! so its events go unnumbered and are applied as they arrive: there the next call waits
//! for the answers of the results still in flight. A numbered event that went unanswered
//! or was refused may have left a hole the daemon would hold later events for (up to its
//! gap timeout), so the session goes on unnumbered from then on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

pub struct RunOrder {
    numbered: AtomicBool,
    last_seq: AtomicU64,
    /// Results reported and not answered yet.
    reporting: Arc<watch::Sender<usize>>,
}

impl RunOrder {
    pub fn new(numbered: bool) -> Self {
        RunOrder {
            numbered: AtomicBool::new(numbered),
            last_seq: AtomicU64::new(0),
            reporting: Arc::new(watch::Sender::new(0)),
        }
    }

    /// The `seq` of the session's next event (in the order they are made), or `None`
    /// when its events go unnumbered.
    pub fn next_seq(&self) -> Option<u64> {
        self.numbered
            .load(Ordering::Acquire)
            .then(|| self.last_seq.fetch_add(1, Ordering::AcqRel) + 1)
    }

    /// A numbered event got no decision: nothing later is numbered.
    pub fn unnumber(&self) {
        self.numbered.store(false, Ordering::Release);
    }

    /// Counts a result as in flight until the returned guard is dropped.
    pub fn reporting(&self) -> Reporting {
        self.reporting.send_modify(|n| *n += 1);
        Reporting(self.reporting.clone())
    }

    /// Before the session's next call is made: unnumbered, the results in flight must be
    /// applied first, so this waits for their answers; numbered, the daemon orders them.
    pub async fn ready_for_call(&self) {
        if !self.numbered.load(Ordering::Acquire) {
            self.settled().await;
        }
    }

    /// Waits until every result reported so far is answered (or given up on).
    pub async fn settled(&self) {
        let mut watch = self.reporting.subscribe();
        // The sender lives in `self`: the wait ends only by the count reaching zero.
        let _ = watch.wait_for(|n| *n == 0).await;
    }
}

/// A result in flight (see [`RunOrder::reporting`]).
pub struct Reporting(Arc<watch::Sender<usize>>);

impl Drop for Reporting {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_numbered_session_numbers_its_events_in_the_order_they_are_made() {
        let order = RunOrder::new(true);
        let seqs: Vec<_> = (0..4).map(|_| order.next_seq()).collect();
        assert_eq!(seqs, [Some(1), Some(2), Some(3), Some(4)]);
        order.unnumber();
        assert_eq!(order.next_seq(), None, "after a hole, nothing is numbered");
        assert_eq!(RunOrder::new(false).next_seq(), None);
    }

    #[tokio::test]
    async fn a_numbered_call_does_not_wait_for_the_result_before_it() {
        let order = RunOrder::new(true);
        let _in_flight = order.reporting();
        tokio::time::timeout(Duration::from_secs(1), order.ready_for_call())
            .await
            .expect("the daemon orders numbered events: no wait");
    }

    #[tokio::test]
    async fn an_unnumbered_call_waits_until_the_results_before_it_are_answered() {
        let order = RunOrder::new(false);
        let first = order.reporting();
        let second = order.reporting();
        let waiting = tokio::time::timeout(Duration::from_millis(50), order.ready_for_call());
        assert!(
            waiting.await.is_err(),
            "two results in flight: the call waits"
        );
        drop(first);
        let waiting = tokio::time::timeout(Duration::from_millis(50), order.ready_for_call());
        assert!(
            waiting.await.is_err(),
            "one result in flight: the call waits"
        );
        drop(second);
        tokio::time::timeout(Duration::from_secs(1), order.ready_for_call())
            .await
            .expect("every result answered: the call goes");
    }
}
