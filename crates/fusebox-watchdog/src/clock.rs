//! The watchdog's only source of time, injectable so tests drive deadlines without waiting.
//!
//! Deadlines are absolute (a tag's UTC time, EC2's launch time + a lifetime), so the
//! watchdog needs wall-clock time to compare them with. But the host's wall clock can
//! step (a bad NTP server, an operator's `date -s`, a VM resumed from a snapshot): read
//! raw, a step forward by hours makes every instance look overdue in one pass, and a step
//! back postpones every deadline by as much. [`SteadyClock`], the daemon's clock, reads
//! the wall clock once and then advances with the monotonic clock, so only real elapsed
//! time moves the deadlines closer; a later step of the wall clock is reported, not
//! followed.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

/// Wall-clock time read once, then advanced by the monotonic clock (see the module docs).
#[derive(Debug)]
pub struct SteadyClock {
    wall_at_start_ms: u64,
    started: Instant,
    /// The wall clock's offset from this clock last reported, ms.
    reported_offset_ms: AtomicI64,
}

/// Differences between the wall clock and [`SteadyClock`] below this are drift, not a step.
const STEP_TOLERANCE_MS: i64 = 2_000;

impl SteadyClock {
    pub fn new() -> Self {
        SteadyClock::starting_at(SystemClock.now_ms())
    }

    /// A clock that reads `wall_ms` now.
    pub fn starting_at(wall_ms: u64) -> Self {
        SteadyClock {
            wall_at_start_ms: wall_ms,
            started: Instant::now(),
            reported_offset_ms: AtomicI64::new(0),
        }
    }

    /// How far the host's wall clock is ahead of this clock (negative: behind), ms.
    pub fn wall_offset_ms(&self) -> i64 {
        let wall = i128::from(SystemClock.now_ms());
        let steady = i128::from(self.now_ms());
        i64::try_from(wall - steady).unwrap_or(i64::MAX)
    }

    /// Logs a step of the host's wall clock once per step.
    fn report_step(&self) {
        let offset = self.wall_offset_ms();
        let reported = self.reported_offset_ms.load(Ordering::Relaxed);
        if (offset - reported).abs() < STEP_TOLERANCE_MS {
            return;
        }
        self.reported_offset_ms.store(offset, Ordering::Relaxed);
        tracing::warn!(
            wall_minus_watchdog_ms = offset,
            "the host's wall clock stepped; the watchdog keeps counting deadlines by elapsed \
             (monotonic) time from its start, so the step neither fires nor postpones any; \
             restart the daemon to adopt the host's clock if the step was a correction"
        );
    }
}

impl Default for SteadyClock {
    fn default() -> Self {
        SteadyClock::new()
    }
}

impl Clock for SteadyClock {
    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.wall_at_start_ms.saturating_add(elapsed)
    }

    fn sleep_until(&self, at_ms: u64) -> Sleep {
        self.report_step();
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
    async fn steady_clock_advances_with_elapsed_time_from_its_start() {
        let clock = SteadyClock::starting_at(5_000);
        let before = clock.now_ms();
        assert!((5_000..5_100).contains(&before), "{before}");
        clock.sleep_until(before + 50).await;
        let after = clock.now_ms();
        assert!(after >= before + 50, "{before} -> {after}");
        // Started five seconds after the epoch, it is decades behind the host's wall
        // clock, and stays so: it does not follow the wall clock.
        assert!(clock.wall_offset_ms() > 1_600_000_000_000);
    }

    #[tokio::test]
    async fn system_clock_past_deadline_is_immediate() {
        SystemClock.sleep_until(0).await;
        assert!(SystemClock.now_ms() > 1_600_000_000_000);
    }
}
