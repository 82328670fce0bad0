//! The watchdog: facts in, timers and sweeps, outcomes out through the sink.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use crate::clock::Clock;
use crate::config::{ConfigError, WatchdogConfig};
use crate::facts::Fact;
use crate::pass::{PassKind, PassReport};
use crate::provider::Provider;
use crate::sink::WatchdogSink;
use crate::state::State;
use crate::stats::{Counters, WatchdogStats};

/// The cloud cost watchdog for one provider. Cheap to clone; clones share everything.
pub struct Watchdog<P: Provider> {
    pub(crate) inner: Arc<Inner<P>>,
}

impl<P: Provider> Clone for Watchdog<P> {
    fn clone(&self) -> Self {
        Watchdog {
            inner: Arc::clone(&self.inner),
        }
    }
}

pub(crate) struct Inner<P> {
    pub cfg: WatchdogConfig,
    pub schedule: cron::Schedule,
    pub provider: P,
    pub clock: Arc<dyn Clock>,
    pub sink: Arc<dyn WatchdogSink>,
    pub state: Mutex<State>,
    pub counters: Mutex<Counters>,
    /// Wakes the run loop when a fact may have armed an earlier timer.
    pub wake: Notify,
    /// One pass at a time: two passes could otherwise terminate and report the same instance.
    pub pass_lock: tokio::sync::Mutex<()>,
}

impl<P> Inner<P> {
    // The guarded data stays consistent between statements, so a poisoned lock is usable.
    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn counters(&self) -> MutexGuard<'_, Counters> {
        self.counters.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<P: Provider> Watchdog<P> {
    /// Checks the config and builds an idle watchdog; nothing runs until `run` or `sweep`.
    pub fn new(
        cfg: WatchdogConfig,
        provider: P,
        clock: Arc<dyn Clock>,
        sink: Arc<dyn WatchdogSink>,
    ) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let schedule = cfg.schedule()?;
        Ok(Watchdog {
            inner: Arc::new(Inner {
                cfg,
                schedule,
                provider,
                clock,
                sink,
                state: Mutex::new(State::default()),
                counters: Mutex::new(Counters::default()),
                wake: Notify::new(),
                pass_lock: tokio::sync::Mutex::new(()),
            }),
        })
    }

    pub fn config(&self) -> &WatchdogConfig {
        &self.inner.cfg
    }

    /// Feeds one fact: a launch arms a deadline timer, a run end arms a verify-empty check
    /// `grace_s` later. Facts for another provider are ignored.
    pub fn record(&self, fact: impl Into<Fact>) {
        self.apply(fact.into());
        self.inner.wake.notify_one();
    }

    /// Feeds the facts of the whole log at start-up (before `run`, which then sweeps once).
    /// Feeding a fact twice is harmless.
    pub fn restore(&self, facts: impl IntoIterator<Item = Fact>) {
        for f in facts {
            self.apply(f);
        }
        self.inner.wake.notify_one();
    }

    fn apply(&self, fact: Fact) {
        let cfg = &self.inner.cfg;
        let mut state = self.inner.state();
        match fact {
            Fact::InstanceLaunched(f) if f.provider != self.inner.provider.name() => {
                tracing::debug!(provider = %f.provider, instance = %f.instance_id, "not our provider");
            }
            Fact::InstanceLaunched(f) => state.launched(f, cfg.default_max_lifetime_s),
            Fact::RunEnded(f) => state.run_ended(f, cfg.grace_s),
            Fact::Halted(f) => {
                // The first halt is the one to report; a later one changes nothing.
                state.halted.get_or_insert(f);
            }
            Fact::Resumed(f) => {
                if let Some(halted) = state.halted.take() {
                    tracing::warn!(by = %f.by, halted_since_ms = halted.at_ms, "watchdog resumed by an operator");
                }
            }
        }
    }

    /// Whether recording `fact` would change nothing: the same launch is tracked, or the
    /// run is known to have ended no later. A daemon of a cluster hears every fact of the
    /// cluster's shared stream, its own included; only the new ones are worth a journal
    /// line. A halt or a resume is never "known" here: it always goes through.
    pub fn knows(&self, fact: &Fact) -> bool {
        let state = self.inner.state();
        match fact {
            Fact::InstanceLaunched(f) if f.provider != self.inner.provider.name() => true,
            Fact::InstanceLaunched(f) => {
                let key = crate::state::InstanceKey {
                    region: f.region.clone(),
                    instance_id: f.instance_id.clone(),
                };
                state.launched.get(&key) == Some(f)
            }
            Fact::RunEnded(f) => {
                let key = crate::state::RunKey {
                    tenant: f.tenant.clone(),
                    run: f.run.clone(),
                };
                state
                    .runs_ended
                    .get(&key)
                    .is_some_and(|&end| end <= f.ts_ms)
            }
            Fact::Halted(_) | Fact::Resumed(_) => false,
        }
    }

    /// Why the watchdog is halted, if it is (`on_blast_radius = "halt"`): it terminates
    /// nothing until [`Fact::Resumed`] is recorded.
    pub fn halted(&self) -> Option<crate::facts::Halted> {
        self.inner.state().halted.clone()
    }

    /// The watchdog's clock, for stamping an operator's resume.
    pub fn now_ms(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    /// The facts that rebuild the watchdog's timers as they are now (for compacting a
    /// journal of facts): tracked instances, and the run ends that can still matter —
    /// those of the last `default_max_lifetime_s` (at least `grace_s`), those with a
    /// pending verify-empty check, and those of runs with a tracked instance.
    pub fn live_facts(&self) -> Vec<Fact> {
        let cfg = &self.inner.cfg;
        let window_s = cfg.default_max_lifetime_s.max(cfg.grace_s);
        let since = self
            .inner
            .clock
            .now_ms()
            .saturating_sub(window_s.saturating_mul(1000));
        self.inner.state().live_facts(since)
    }

    /// One full sweep of every region now.
    pub async fn sweep(&self) -> PassReport {
        let due = self.inner.state().take_due(self.inner.clock.now_ms());
        self.inner.pass(PassKind::Sweep, due).await
    }

    /// Runs the timers that are due now, if any (the run loop does this by itself).
    pub async fn fire_due_timers(&self) -> Option<PassReport> {
        let due = self.inner.state().take_due(self.inner.clock.now_ms());
        if due.is_empty() {
            return None;
        }
        Some(self.inner.pass(PassKind::Timers, due).await)
    }

    /// Sweeps once, then serves cron sweeps, deadline timers and verify checks until
    /// `shutdown` completes. A pass in progress is finished first (its API calls are bounded
    /// by the retry settings), so no termination is left half-reported.
    pub async fn run(&self, shutdown: impl Future<Output = ()> + Send) {
        tokio::pin!(shutdown);
        let clock = &self.inner.clock;
        self.log_pass(&self.sweep().await);
        let mut next_sweep = self.next_sweep_after(clock.now_ms());
        loop {
            // Registered before reading the timers, so a fact recorded meanwhile still wakes us.
            let woken = self.inner.wake.notified();
            let next_timer = self.inner.state().next_wake();
            let wake_at = [next_sweep, next_timer].into_iter().flatten().min();
            let sleep = match wake_at {
                Some(at) => clock.sleep_until(at),
                None => Box::pin(std::future::pending()),
            };
            tokio::select! {
                () = &mut shutdown => break,
                () = woken => continue,
                () = sleep => {}
            }
            let now = clock.now_ms();
            if next_sweep.is_some_and(|at| at <= now) {
                self.log_pass(&self.sweep().await);
                next_sweep = self.next_sweep_after(clock.now_ms());
            } else if let Some(report) = self.fire_due_timers().await {
                self.log_pass(&report);
            }
        }
        tracing::info!("watchdog stopped");
    }

    /// The next cron moment strictly after `now_ms`; missed moments are skipped, not
    /// caught up, so a suspended host does not wake to a burst of sweeps.
    fn next_sweep_after(&self, now_ms: u64) -> Option<u64> {
        let now = DateTime::<Utc>::from_timestamp_millis(i64::try_from(now_ms).ok()?)?;
        let next = self.inner.schedule.after(&now).next()?;
        u64::try_from(next.timestamp_millis()).ok()
    }

    fn log_pass(&self, r: &PassReport) {
        tracing::info!(
            kind = ?r.kind,
            listed = r.listed,
            managed = r.managed,
            overdue = r.overdue,
            terminations = r.terminations.len(),
            held = r.held,
            region_errors = r.region_errors.len(),
            took_ms = r.finished_ms.saturating_sub(r.started_ms),
            "watchdog pass"
        );
    }

    /// Current gauges and counters for the metrics crate.
    pub fn stats(&self) -> WatchdogStats {
        let (next, halted) = {
            let mut state = self.inner.state();
            (state.next_wake(), state.halted.is_some())
        };
        let mut stats = self
            .inner
            .counters()
            .snapshot(self.inner.clock.now_ms(), next);
        stats.halted = halted;
        stats
    }
}
