//! Every API call goes through here: bounded retries with backoff, paging, and counting.

use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use crate::engine::Inner;
use crate::provider::{ErrorKind, Instance, Op, Provider, ProviderError, Selector};

/// A listing longer than this many pages is cut off rather than followed forever (a
/// provider that keeps returning a token would otherwise hang the pass).
const MAX_PAGES: usize = 10_000;

impl<P: Provider> Inner<P> {
    /// Runs `call` until it succeeds, fails for good, or the attempts are used up.
    pub(crate) async fn with_retry<T, F, Fut>(
        &self,
        op: Op,
        region: &str,
        mut call: F,
    ) -> Result<T, ProviderError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ProviderError>>,
    {
        let retry = &self.cfg.retry;
        let mut attempt = 1;
        loop {
            self.count(op, false);
            let err = match call().await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if !matches!(err.kind, ErrorKind::NotFound | ErrorKind::NotPermitted) {
                self.count(op, true);
            }
            if !err.is_retryable() || attempt >= retry.max_attempts {
                return Err(err);
            }
            let wait = jitter(retry.backoff(attempt));
            // Debug only: the caller reports the call's outcome and the API error metric
            // counts every failed attempt; at warn, a region that cannot be reached
            // repeated four lines on every sweep.
            tracing::debug!(op = op.as_str(), region, attempt, error = %err, ?wait, "retrying");
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    /// Every page of a listing.
    pub(crate) async fn describe_all(
        &self,
        region: &str,
        selector: &Selector,
    ) -> Result<Vec<Instance>, ProviderError> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let page = self
                .with_retry(Op::DescribeInstances, region, || {
                    self.provider.describe_page(region, selector, token.clone())
                })
                .await?;
            out.extend(page.instances);
            match page.next_token.filter(|t| !t.is_empty()) {
                Some(t) if Some(&t) != token.as_ref() => token = Some(t),
                _ => return Ok(out),
            }
        }
        tracing::error!(region, "listing cut off after {MAX_PAGES} pages");
        Ok(out)
    }

    fn count(&self, op: Op, error: bool) {
        let mut c = self.counters();
        let map = if error {
            &mut c.api_errors
        } else {
            &mut c.api_calls
        };
        *map.entry(op).or_default() += 1;
    }
}

/// Full jitter between half and all of `d`, so many watchdogs throttled together do not
/// retry in lockstep. `RandomState` is seeded per process: randomness without a crate.
fn jitter(d: Duration) -> Duration {
    let r = RandomState::new().hash_one(std::time::Instant::now()) % 1000;
    d / 2 + d / 2 * u32::try_from(r).unwrap_or(0) / 1000
}
