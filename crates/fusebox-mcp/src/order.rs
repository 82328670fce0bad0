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
//!
//! One commit per call: a numbered result is sent just after the next call (or after
//! [`LINGER`] without one). The daemon holds the call for it and then applies both in one
//! batch, one flush; a result sent first would be a commit of its own, which a call
//! arriving meanwhile would wait for.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// How long a numbered result waits for the session's next call to go with: an agent
/// loop without a model turn between calls (a script, a benchmark) calls again within
/// a millisecond or two; an agent that waits for a model does not, and its result goes
/// alone, this much later.
pub const LINGER: Duration = Duration::from_millis(10);

pub struct RunOrder {
    numbered: AtomicBool,
    last_seq: AtomicU64,
    /// Results reported and not answered yet.
    reporting: Arc<watch::Sender<usize>>,
    /// Results numbered below this may be sent (the call numbered after them is out).
    released: watch::Sender<u64>,
}

impl RunOrder {
    pub fn new(numbered: bool) -> Self {
        RunOrder {
            numbered: AtomicBool::new(numbered),
            last_seq: AtomicU64::new(0),
            reporting: Arc::new(watch::Sender::new(0)),
            released: watch::Sender::new(0),
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

    /// A numbered result (`seq`) waits here until the call after it is sent, or
    /// [`LINGER`]; an unnumbered one goes at once.
    pub async fn until_released(&self, seq: Option<u64>) {
        let Some(seq) = seq else { return };
        let mut released = self.released.subscribe();
        let _ = tokio::time::timeout(LINGER, released.wait_for(|below| *below > seq)).await;
    }

    /// The event numbered `seq` is sent: the results before it go now.
    pub fn release(&self, seq: u64) {
        self.released.send_if_modified(|below| {
            let moved = seq > *below;
            *below = (*below).max(seq);
            moved
        });
    }

    /// Every result goes now (the session ends).
    pub fn release_all(&self) {
        self.release(u64::MAX);
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
    async fn a_numbered_result_goes_once_the_call_after_it_is_sent() {
        let order = RunOrder::new(true);
        let (result, call) = (order.next_seq(), order.next_seq().unwrap());
        let waiting = tokio::time::timeout(Duration::from_millis(1), order.until_released(result));
        assert!(waiting.await.is_err(), "no call yet: the result waits");
        order.release(call);
        tokio::time::timeout(Duration::from_millis(1), order.until_released(result))
            .await
            .expect("the call after it is out: the result goes");
        tokio::time::timeout(LINGER * 10, order.until_released(order.next_seq()))
            .await
            .expect("without a call, the result goes after the linger");
        tokio::time::timeout(Duration::from_millis(1), order.until_released(None))
            .await
            .expect("an unnumbered result goes at once");
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
