//! A stuck log must not leave a daemon that looks alive: when the applier has been in
//! one batch for longer than the stall limit (a commit blocked in the storage layer —
//! a failing disk, a hung network volume, or sled waiting forever after a write error
//! on a full disk), the service fails with [`crate::ServiceError::Stalled`] so the
//! daemon exits, its supervisor restarts it, and a full disk is then reported plainly
//! at start-up. The log is crash-safe, so leaving the blocked thread behind loses
//! nothing that was acknowledged.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// When the applier started the batch in hand (ms after `epoch`, plus one so that zero
/// means idle).
#[derive(Debug)]
pub(crate) struct Busy {
    epoch: Instant,
    since: AtomicU64,
}

impl Default for Busy {
    fn default() -> Self {
        Busy {
            epoch: Instant::now(),
            since: AtomicU64::new(0),
        }
    }
}

impl Busy {
    pub(crate) fn start(&self) {
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        self.since.store(now, Ordering::Relaxed);
    }

    pub(crate) fn done(&self) {
        self.since.store(0, Ordering::Relaxed);
    }

    /// How long the batch in hand has taken so far; `None` while idle.
    fn busy_for(&self) -> Option<Duration> {
        match self.since.load(Ordering::Relaxed) {
            0 => None,
            since => {
                let now = self.epoch.elapsed().as_millis() as u64 + 1;
                Some(Duration::from_millis(now.saturating_sub(since)))
            }
        }
    }
}

/// Resolves once one batch has taken longer than `limit`, with how long it has taken.
pub(crate) async fn stalled(busy: &Busy, limit: Duration) -> Duration {
    let mut check = tokio::time::interval(
        (limit / 10).clamp(Duration::from_millis(10), Duration::from_secs(1)),
    );
    loop {
        check.tick().await;
        if let Some(taken) = busy.busy_for().filter(|taken| *taken >= limit) {
            return taken;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn only_a_batch_longer_than_the_limit_is_a_stall() {
        let busy = Busy::default();
        let limit = Duration::from_millis(100);
        // Idle for long: no stall.
        assert!(tokio::time::timeout(limit * 5, stalled(&busy, limit))
            .await
            .is_err());
        busy.start();
        busy.done();
        assert!(tokio::time::timeout(limit * 5, stalled(&busy, limit))
            .await
            .is_err());
        // The paused clock does not move `Instant`, so a real batch is simulated by
        // backdating its start.
        busy.since.store(1, Ordering::Relaxed);
        std::thread::sleep(limit + Duration::from_millis(20));
        let taken = tokio::time::timeout(limit * 5, stalled(&busy, limit))
            .await
            .expect("a stall");
        assert!(taken >= limit);
    }
}
