//! Whether this daemon may act as the watchdog, and the provider that asks before
//! every termination.
//!
//! A single daemon always may ([`Authority::Always`]). In a cluster only the holder of
//! the watchdog role may (`cluster/watchdog_role.rs` keeps the lease): its keeper
//! publishes the instant until which this daemon may act — ⅔ of the lease after the
//! send time of its last successful renewal, the partitions' fence — or `None` when the
//! role is someone else's. The passes run only while the role is held, and a pass that
//! outlives the role (its calls are bounded by retries, not by the lease) cannot
//! terminate anything after the fence: [`Fenced`] refuses a TerminateInstances call past
//! it and abandons one still unanswered there. So a TerminateInstances this daemon
//! counts was answered before its fence, before another daemon could take the role and
//! list the instance: two daemons never both count one termination.

use std::time::{Duration, Instant};

use fusebox_watchdog::provider::{ErrorKind, Page, Terminated};
use fusebox_watchdog::{Ec2Provider, Op, Provider, ProviderError, Selector};
use tokio::sync::watch;

/// Until when this daemon may act as the watchdog.
#[derive(Clone)]
pub enum Authority {
    /// No cluster: this daemon is the only watchdog.
    Always,
    /// The role's fence while it is held here; `None` while another daemon holds it.
    Until(watch::Receiver<Option<Instant>>),
}

impl Authority {
    /// The time left to act; `None` when this daemon may not act now.
    pub fn left(&self) -> Option<Duration> {
        match self {
            Authority::Always => Some(Duration::MAX),
            Authority::Until(fence) => {
                let until = (*fence.borrow())?;
                until
                    .checked_duration_since(Instant::now())
                    .filter(|left| !left.is_zero())
            }
        }
    }

    /// Whether this daemon holds the role now.
    pub fn holds(&self) -> bool {
        self.left().is_some()
    }

    /// Waits until this daemon holds the role (at once for a single daemon).
    pub async fn taken(&mut self) {
        let Authority::Until(fence) = self else {
            return;
        };
        loop {
            if Authority::Until(fence.clone()).holds() {
                return;
            }
            if fence.changed().await.is_err() {
                // The keeper is gone (shutdown): the role never comes back.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Waits until this daemon no longer holds the role: lost, or its fence passed
    /// without a renewal. Never, for a single daemon.
    pub async fn lost(&mut self) {
        let Authority::Until(fence) = self else {
            return std::future::pending().await;
        };
        loop {
            let Some(until) = *fence.borrow_and_update() else {
                return;
            };
            if until <= Instant::now() {
                return;
            }
            tokio::select! {
                changed = fence.changed() => if changed.is_err() { return },
                () = tokio::time::sleep_until(until.into()) => {}
            }
        }
    }
}

/// The EC2 provider behind the role: listings and DryRun checks pass through (any
/// daemon may look), terminations only while [`Authority`] allows and within its fence.
pub struct Fenced {
    pub inner: Ec2Provider,
    pub authority: Authority,
}

/// The error a refused or abandoned termination reports: a client error, so it is not
/// retried (the next holder's pass does it) and the instance is re-armed for later.
fn not_the_holder(what: &str) -> ProviderError {
    ProviderError::new(
        ErrorKind::Client,
        "NotWatchdogRoleHolder",
        format!("{what}: this daemon no longer holds the cluster's watchdog role"),
    )
}

impl Provider for Fenced {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn describe_page(
        &self,
        region: &str,
        selector: &Selector,
        next_token: Option<String>,
    ) -> Result<Page, ProviderError> {
        self.inner.describe_page(region, selector, next_token).await
    }

    async fn terminate(&self, region: &str, ids: &[String]) -> Result<Terminated, ProviderError> {
        if let Authority::Always = self.authority {
            return self.inner.terminate(region, ids).await;
        }
        let Some(left) = self.authority.left() else {
            return Err(not_the_holder("termination refused"));
        };
        match tokio::time::timeout(left, self.inner.terminate(region, ids)).await {
            Ok(answered) => answered,
            // Unanswered at the fence: it may still land, after another daemon could
            // have taken the role; that daemon's listing decides, this one counts nothing.
            Err(_) => Err(not_the_holder("termination abandoned at the fence")),
        }
    }

    async fn dry_run(
        &self,
        region: &str,
        op: Op,
        instance_id: Option<&str>,
    ) -> Result<(), ProviderError> {
        self.inner.dry_run(region, op, instance_id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real time, short: the daemon's tokio has no paused clock.
    #[tokio::test]
    async fn the_role_is_held_until_its_fence_and_lost_when_taken_away() {
        let fence_after = Duration::from_millis(200);
        let (fence, watched) = watch::channel(None);
        let mut authority = Authority::Until(watched);
        assert!(!authority.holds());
        fence.send_replace(Some(Instant::now() + fence_after));
        authority.taken().await;
        assert!(authority.holds());
        // Not renewed: lost at its fence.
        let started = Instant::now();
        authority.lost().await;
        assert!(started.elapsed() >= fence_after - Duration::from_millis(20));
        assert!(!authority.holds());
        // Taken away before the fence: lost at once.
        fence.send_replace(Some(Instant::now() + Duration::from_secs(60)));
        let started = Instant::now();
        let waiting = tokio::spawn({
            let mut authority = authority.clone();
            async move { authority.lost().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        fence.send_replace(None);
        waiting.await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(Authority::Always.holds());
    }

    /// Not the holder, or past the fence: refused before anything is sent to EC2 (the
    /// endpoint is a closed port, so a call that went out would fail otherwise), as a
    /// client error, which the pass does not retry.
    #[tokio::test]
    async fn no_termination_without_the_role_or_past_its_fence() {
        let cfg = fusebox_watchdog::WatchdogConfig {
            regions: vec!["us-east-1".to_owned()],
            endpoint_url: Some("http://127.0.0.1:9".to_owned()),
            ..Default::default()
        };
        let (fence, watched) = watch::channel(None);
        let fenced = Fenced {
            inner: Ec2Provider::from_env(&cfg).await,
            authority: Authority::Until(watched),
        };
        let ids = ["i-0a".to_owned()];
        for until in [None, Some(Instant::now())] {
            fence.send_replace(until);
            let refused = fenced.terminate("us-east-1", &ids).await.unwrap_err();
            assert_eq!(refused.code, "NotWatchdogRoleHolder", "{refused}");
            assert_eq!(refused.kind, ErrorKind::Client);
        }
    }
}
