//! The op_key ledger for operators (`fusebox ledger list | show | resolve`): what the
//! daemons hold, and an operator's word on one key, sent as a command to the run that
//! holds it so it becomes a `ledger_resolve` event in that run's log (replayed, and
//! audited with `by`).

use std::collections::BTreeMap;

use fusebox_core::event::Resolution;
use fusebox_core::Decision;
use fusebox_nats::subjects::{self, ControlVerb};
use fusebox_nats::wire::{ErrorReply, LedgerItem, LedgerListing, LedgerQuery, ResolveRequest};
use futures_util::StreamExt;
use serde_json::Value;

use crate::client::FuseboxClient;
use crate::error::ClientError;
use crate::ops::command_id;

/// What `fusebox.control.ledger` gathered: the entries of the daemons that answered (in
/// a cluster, each partition's view, tagged with it) and the partitions that did not
/// answer in time.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LedgerView {
    /// (partition, entry); the partition is `None` for a single daemon.
    pub entries: Vec<(Option<u32>, LedgerItem)>,
    pub truncated: bool,
    pub unanswered: Vec<u32>,
}

/// What an operator says became of an operation.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolve {
    /// It happened; later calls with the key get `output`.
    Completed { output: Value },
    /// It did not happen (or must happen again): the next call with the key runs.
    Released,
}

impl FuseboxClient {
    /// The ledger entries matching `query`. A single daemon answers once; in a cluster
    /// every owned partition answers with its own view, gathered until all did or the
    /// client's timeout passed.
    pub async fn ledger(&self, query: &LedgerQuery) -> Result<LedgerView, ClientError> {
        let subject = subjects::CONTROL_LEDGER.to_owned();
        let body = serde_json::to_vec(query).expect("queries serialise");
        let mut answers = self.ask_every_answerer(&subject, body).await?;
        let deadline = tokio::time::Instant::now() + self.options().timeout;
        let mut parts: BTreeMap<u32, LedgerListing> = BTreeMap::new();
        let mut expected = None;
        loop {
            let Ok(Some(message)) = tokio::time::timeout_at(deadline, answers.next()).await else {
                break;
            };
            if message.status.is_some_and(|s| s.is_server_error()) {
                return Err(ClientError::NoResponders { subject });
            }
            if let Ok(refused) = serde_json::from_slice::<ErrorReply>(&message.payload) {
                return Err(ClientError::Refused(refused.error));
            }
            let listing: LedgerListing =
                serde_json::from_slice(&message.payload).map_err(|e| ClientError::BadAnswer {
                    subject: subject.clone(),
                    detail: e.to_string(),
                })?;
            let (Some(partition), Some(of)) = (listing.partition, listing.partitions) else {
                return Ok(LedgerView {
                    truncated: listing.truncated,
                    entries: listing.entries.into_iter().map(|e| (None, e)).collect(),
                    unanswered: Vec::new(),
                });
            };
            expected = Some(of);
            // Two owners may both answer in the moment a partition moves: the first counts.
            parts.entry(partition).or_insert(listing);
            if parts.len() as u32 >= of {
                break;
            }
        }
        let Some(expected) = expected else {
            return Err(ClientError::Timeout {
                subject,
                timeout_ms: self.options().timeout.as_millis() as u64,
            });
        };
        let unanswered = (0..expected).filter(|p| !parts.contains_key(p)).collect();
        let truncated = parts.values().any(|l| l.truncated);
        let entries = parts
            .into_iter()
            .flat_map(|(p, l)| l.entries.into_iter().map(move |e| (Some(p), e)))
            .collect();
        Ok(LedgerView {
            entries,
            truncated,
            unanswered,
        })
    }

    /// Resolves `op_key` of `tenant` (`fusebox ledger resolve`), as a command to `run`:
    /// the run that holds the key (see [`FuseboxClient::ledger`]), or for a key nobody
    /// holds, the run the operator names. The decision's message says what the key was.
    pub async fn resolve(
        &self,
        tenant: &str,
        run: &str,
        op_key: &str,
        resolve: Resolve,
        by: Option<&str>,
        reason: Option<&str>,
    ) -> Result<Decision, ClientError> {
        let (resolution, output) = match resolve {
            Resolve::Completed { output } => (Resolution::Completed, Some(output)),
            Resolve::Released => (Resolution::Released, None),
        };
        let request = ResolveRequest {
            id: Some(command_id("resolve")),
            by: by.map(str::to_owned),
            reason: reason.map(str::to_owned),
            op_key: op_key.to_owned(),
            resolution,
            output,
        };
        let body = serde_json::to_vec(&request).expect("requests serialise");
        let subject = self
            .served(tenant, run)
            .await
            .subject(tenant, run, ControlVerb::Resolve);
        self.command(subject, body).await
    }
}
