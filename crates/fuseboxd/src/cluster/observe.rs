//! Each partition's service reports gauges for its own runs and consumer; the daemon's
//! metrics are the sum over the partitions it serves (one service's figure would
//! overwrite another's). Everything else passes straight through.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fusebox_core::Decision;
use fusebox_nats::Observer;

/// Per-partition gauges of one daemon.
#[derive(Default)]
pub struct Totals {
    partitions: Mutex<BTreeMap<u32, Gauges>>,
}

#[derive(Default, Clone)]
struct Gauges {
    runs_active: u64,
    subagents_active: BTreeMap<u32, u64>,
    consumer_lag: u64,
    consumer_bound: bool,
}

/// The observer one partition's service gets.
pub struct PartitionObserver {
    pub inner: Arc<dyn Observer>,
    pub totals: Arc<Totals>,
    pub partition: u32,
}

impl PartitionObserver {
    fn update(&self, change: impl FnOnce(&mut Gauges)) {
        let mut partitions = self.totals.partitions.lock().expect("totals lock");
        change(partitions.entry(self.partition).or_default());
        report(&*self.inner, &partitions);
    }
}

fn report(inner: &dyn Observer, partitions: &BTreeMap<u32, Gauges>) {
    inner.runs_active(partitions.values().map(|g| g.runs_active).sum());
    let mut subagents = BTreeMap::new();
    for (depth, n) in partitions.values().flat_map(|g| &g.subagents_active) {
        *subagents.entry(*depth).or_insert(0) += n;
    }
    inner.subagents_active(&subagents);
    inner.consumer_lag(partitions.values().map(|g| g.consumer_lag).sum());
    inner.consumer_bound(!partitions.is_empty() && partitions.values().all(|g| g.consumer_bound));
}

impl Totals {
    /// A partition no longer served stops counting.
    pub fn forget(&self, inner: &dyn Observer, partition: u32) {
        let mut partitions = self.partitions.lock().expect("totals lock");
        partitions.remove(&partition);
        report(inner, &partitions);
    }
}

impl Observer for PartitionObserver {
    fn event(&self, tenant: &str, event_type: &str) {
        self.inner.event(tenant, event_type)
    }
    fn rejected(&self, reason: &str) {
        self.inner.rejected(reason)
    }
    fn dead_letter(&self) {
        self.inner.dead_letter()
    }
    fn decision(&self, decision: &Decision) {
        self.inner.decision(decision)
    }
    fn run_stopped(&self, tenant: &str, terminal_state: &str, reason: &str) {
        self.inner.run_stopped(tenant, terminal_state, reason)
    }
    fn gate_latency(&self, elapsed: Duration) {
        self.inner.gate_latency(elapsed)
    }
    fn log_commit(&self, elapsed: Duration) {
        self.inner.log_commit(elapsed)
    }
    fn nats_connected(&self, connected: bool) {
        self.inner.nats_connected(connected)
    }
    fn runs_active(&self, runs: u64) {
        self.update(|g| g.runs_active = runs)
    }
    fn subagents_active(&self, by_depth: &BTreeMap<u32, u64>) {
        self.update(|g| g.subagents_active.clone_from(by_depth))
    }
    fn consumer_lag(&self, messages: u64) {
        self.update(|g| g.consumer_lag = messages)
    }
    fn consumer_bound(&self, bound: bool) {
        self.update(|g| g.consumer_bound = bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Last(Mutex<(u64, bool)>, Mutex<BTreeMap<u32, u64>>);

    impl Observer for Last {
        fn runs_active(&self, runs: u64) {
            self.0.lock().unwrap().0 = runs;
        }
        fn subagents_active(&self, by_depth: &BTreeMap<u32, u64>) {
            self.1.lock().unwrap().clone_from(by_depth);
        }
        fn consumer_bound(&self, bound: bool) {
            self.0.lock().unwrap().1 = bound;
        }
    }

    #[test]
    fn gauges_are_summed_over_served_partitions() {
        let last = Arc::new(Last::default());
        let inner: Arc<dyn Observer> = last.clone();
        let totals = Arc::new(Totals::default());
        let observer = |partition| PartitionObserver {
            inner: inner.clone(),
            totals: totals.clone(),
            partition,
        };
        let (p0, p1) = (observer(0), observer(1));
        p0.runs_active(3);
        p1.runs_active(4);
        p0.subagents_active(&[(1, 2)].into());
        p1.subagents_active(&[(1, 1), (2, 1)].into());
        p0.consumer_bound(true);
        assert_eq!(*last.0.lock().unwrap(), (7, false), "p1 is not bound yet");
        assert_eq!(*last.1.lock().unwrap(), [(1, 3), (2, 1)].into());
        p1.consumer_bound(true);
        assert_eq!(*last.0.lock().unwrap(), (7, true));
        totals.forget(&*inner, 1);
        assert_eq!(*last.0.lock().unwrap(), (3, true));
        assert_eq!(*last.1.lock().unwrap(), [(1, 2)].into());
    }
}
