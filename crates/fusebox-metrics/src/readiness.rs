//! What `/readyz` reports: the daemon is ready only when it can take traffic end to end.

use std::sync::atomic::{AtomicBool, Ordering};

/// Readiness flags, set by the daemon as its parts come up (and cleared if they go down).
#[derive(Debug, Default)]
pub struct Readiness {
    log_open: AtomicBool,
    nats_connected: AtomicBool,
    consumer_bound: AtomicBool,
}

impl Readiness {
    pub fn new() -> Self {
        Self::default()
    }

    /// The sled log is open and state has been rebuilt from it.
    pub fn set_log_open(&self, ready: bool) {
        self.log_open.store(ready, Ordering::Release);
    }

    pub fn set_nats_connected(&self, ready: bool) {
        self.nats_connected.store(ready, Ordering::Release);
    }

    /// The JetStream durable consumer is bound and pulling.
    pub fn set_consumer_bound(&self, ready: bool) {
        self.consumer_bound.store(ready, Ordering::Release);
    }

    /// Names of the flags not yet set; empty means ready.
    pub fn missing(&self) -> Vec<&'static str> {
        [
            ("log_open", &self.log_open),
            ("nats_connected", &self.nats_connected),
            ("consumer_bound", &self.consumer_bound),
        ]
        .into_iter()
        .filter(|(_, flag)| !flag.load(Ordering::Acquire))
        .map(|(name, _)| name)
        .collect()
    }

    pub fn is_ready(&self) -> bool {
        self.missing().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_flag_is_set_and_flips_back() {
        let r = Readiness::new();
        assert_eq!(
            r.missing(),
            ["log_open", "nats_connected", "consumer_bound"]
        );
        r.set_log_open(true);
        r.set_nats_connected(true);
        assert_eq!(r.missing(), ["consumer_bound"]);
        assert!(!r.is_ready());
        r.set_consumer_bound(true);
        assert!(r.is_ready());
        r.set_nats_connected(false);
        assert_eq!(r.missing(), ["nats_connected"]);
    }
}
