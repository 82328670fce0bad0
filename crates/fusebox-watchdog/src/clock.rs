//! The watchdog's only source of time, injectable so tests drive deadlines without waiting.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

/// A boxed future that owns everything it needs.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Wall-clock time in Unix milliseconds, and a way to wait for a moment of it.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
    /// Completes once `now_ms() >= at_ms` (immediately when that is already so).
    fn sleep_until(&self, at_ms: u64) -> Sleep;
}

/// The system clock, used in production.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }

    fn sleep_until(&self, at_ms: u64) -> Sleep {
        let wait = at_ms.saturating_sub(self.now_ms());
        Box::pin(tokio::time::sleep(Duration::from_millis(wait)))
    }
}

/// A clock that moves only when told to: for tests and simulations.
#[derive(Debug)]
pub struct ManualClock {
    now: watch::Sender<u64>,
}

impl ManualClock {
    pub fn new(start_ms: u64) -> Self {
        ManualClock {
            now: watch::Sender::new(start_ms),
        }
    }

    /// Moves the clock to `ms` (never backwards) and wakes every sleeper that is due.
    pub fn set(&self, ms: u64) {
        self.now.send_modify(|now| *now = (*now).max(ms));
    }

    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.now.send_modify(|now| *now = now.saturating_add(by));
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        *self.now.borrow()
    }

    fn sleep_until(&self, at_ms: u64) -> Sleep {
        let mut rx = self.now.subscribe();
        Box::pin(async move {
            // The sender lives as long as the clock; if it is dropped nobody can wake us.
            if rx.wait_for(|now| *now >= at_ms).await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn manual_clock_wakes_sleepers_when_advanced() {
        let clock = std::sync::Arc::new(ManualClock::new(1_000));
        let sleeper = tokio::spawn(clock.sleep_until(1_500));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.advance(Duration::from_millis(499));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.advance(Duration::from_millis(1));
        sleeper.await.unwrap();
        assert_eq!(clock.now_ms(), 1_500);
    }

    #[test]
    fn manual_clock_never_goes_back() {
        let clock = ManualClock::new(10);
        clock.set(5);
        assert_eq!(clock.now_ms(), 10);
    }

    #[tokio::test]
    async fn system_clock_past_deadline_is_immediate() {
        SystemClock.sleep_until(0).await;
        assert!(SystemClock.now_ms() > 1_600_000_000_000);
    }
}
