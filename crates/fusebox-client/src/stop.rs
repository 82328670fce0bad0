//! The kill switch, seen from a worker: the stop kept on `FUSEBOX_STOPS` for its run,
//! and the live stops on `fusebox.stop.<tenant>.<run>`.
//!
//! Only what a tenant user of `deploy/nats/accounts.conf` may do is used: a core
//! subscription to its own stop subject and a JetStream *direct get* of that subject's
//! last message (`$JS.API.DIRECT.GET.FUSEBOX_STOPS.fusebox.stop.<tenant>.<run>`), which
//! names the run in the subject, so the per-tenant allow-list keeps tenants apart. No
//! consumer, no stream creation (tenants have neither). The wire form is shared with the
//! Python client and the MCP gateway; ARCHITECTURE.md ("The kill switch") has it.

use async_nats::{StatusCode, Subscriber};
use fusebox_core::Decision;
use fusebox_nats::subjects;
use futures_util::StreamExt;

use crate::client::FuseboxClient;
use crate::error::ClientError;

/// Stop decisions (each carrying its `report`) of one run: the kept one first, then the
/// live ones. A stop published while the watch started may come twice (kept and live);
/// a run is stopped by the first.
pub struct StopWatch {
    kept: Option<Decision>,
    live: Subscriber,
}

impl StopWatch {
    /// The stop that was kept when the watch began, until [`StopWatch::next`] hands it out.
    pub fn kept(&self) -> Option<&Decision> {
        self.kept.as_ref()
    }

    /// The next stop; `None` when the watch ended (the connection closed).
    pub async fn next(&mut self) -> Option<Result<Decision, ClientError>> {
        if let Some(kept) = self.kept.take() {
            return Some(Ok(kept));
        }
        let message = self.live.next().await?;
        Some(decode(&message.subject, &message.payload))
    }
}

fn decode(subject: &str, payload: &[u8]) -> Result<Decision, ClientError> {
    serde_json::from_slice(payload).map_err(|err| ClientError::BadAnswer {
        subject: subject.to_owned(),
        detail: err.to_string(),
    })
}

impl FuseboxClient {
    /// The stop kept for the run, if any: `Ok(None)` when the run was never stopped or a
    /// `resume` cleared it. An error (timeout, no responders: `FUSEBOX_STOPS` missing or
    /// without `allow_direct`, i.e. no current fuseboxd has started yet) means *unknown*,
    /// never "not stopped": treat it like an unanswered gate.
    pub async fn kept_stop(
        &self,
        tenant: &str,
        run: &str,
    ) -> Result<Option<Decision>, ClientError> {
        let subject = subjects::stop_lookup(tenant, run);
        let reply = self.raw_request(&subject, Vec::new()).await?;
        match reply.status {
            None => decode(&subject, &reply.payload).map(Some),
            Some(StatusCode::NOT_FOUND) => Ok(None),
            Some(status) => Err(ClientError::BadAnswer {
                subject,
                detail: format!(
                    "status {status} {}",
                    reply.description.as_deref().unwrap_or("")
                ),
            }),
        }
    }

    /// Live stops only, for when the kept one cannot be looked up and the caller chose
    /// to go on regardless ([`crate::GateOnError::Allow`]).
    pub(crate) async fn watch_live_stops(
        &self,
        tenant: &str,
        run: &str,
    ) -> Result<StopWatch, ClientError> {
        let live = self.subscribe_stops(tenant, run).await?;
        Ok(StopWatch { kept: None, live })
    }

    /// Subscribes to the run's stop subject and waits until the server has the
    /// subscription (a stop published from then on reaches it).
    async fn subscribe_stops(&self, tenant: &str, run: &str) -> Result<Subscriber, ClientError> {
        let subject = subjects::stop(tenant, run);
        self.subscribe_confirmed(&subject).await
    }

    /// Watches the run's kill switch, starting with the stop kept from before the watch:
    /// subscribes live first and makes sure the server has the subscription (flush), then
    /// looks the kept stop up, so no stop falls between the two.
    pub async fn watch_stop(&self, tenant: &str, run: &str) -> Result<StopWatch, ClientError> {
        let live = self.subscribe_stops(tenant, run).await?;
        let kept = self.kept_stop(tenant, run).await?;
        Ok(StopWatch { kept, live })
    }
}
