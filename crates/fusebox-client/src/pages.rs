//! The reads of the operator's page (`fusebox ui`): one page of runs, gathered from every
//! partition in a cluster, and one run's history.

use std::collections::BTreeMap;

use fusebox_nats::subjects::{self, ControlVerb};
use fusebox_nats::wire::{ErrorReply, HistoryQuery, RunHistory, RunsPage, RunsQuery};
use futures_util::StreamExt;

use crate::client::FuseboxClient;
use crate::error::ClientError;

/// One page of runs from every daemon that answered, and in a cluster the partitions
/// that did not answer in time (their runs are missing from the page and the counts).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunsPageView {
    pub page: RunsPage,
    pub unanswered: Vec<u32>,
}

/// Merges partitions' pages: each holds its own first `limit` rows after the cursor,
/// so the first `limit` of their union is the merged page's.
fn merge(parts: Vec<RunsPage>, limit: usize) -> RunsPage {
    let mut merged = RunsPage::default();
    for part in parts {
        merged.matched += part.matched;
        for (state, count) in part.states {
            *merged.states.entry(state).or_insert(0) += count;
        }
        merged.runs.extend(part.runs);
    }
    merged.runs.sort_by(|a, b| {
        (
            std::cmp::Reverse(a.summary.last_ts_ms),
            &a.summary.tenant,
            &a.summary.run,
        )
            .cmp(&(
                std::cmp::Reverse(b.summary.last_ts_ms),
                &b.summary.tenant,
                &b.summary.run,
            ))
    });
    merged.runs.truncate(limit);
    merged
}

impl FuseboxClient {
    /// One page of runs matching `query`, newest activity first. A single daemon
    /// answers once; in a cluster every owned partition answers with its own page,
    /// gathered until all did or the client's timeout passed.
    pub async fn runs_page(&self, query: &RunsQuery) -> Result<RunsPageView, ClientError> {
        let subject = subjects::CONTROL_RUNS.to_owned();
        let limit = query
            .limit
            .unwrap_or(fusebox_nats::wire::RUNS_PAGE_LIMIT)
            .min(fusebox_nats::wire::RUNS_PAGE_LIMIT);
        let body = serde_json::to_vec(query).expect("queries serialise");
        let mut answers = self.ask_every_answerer(&subject, body).await?;
        let deadline = tokio::time::Instant::now() + self.options().timeout;
        let mut parts: BTreeMap<u32, RunsPage> = BTreeMap::new();
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
            let page: RunsPage =
                serde_json::from_slice(&message.payload).map_err(|e| ClientError::BadAnswer {
                    subject: subject.clone(),
                    detail: e.to_string(),
                })?;
            let (Some(partition), Some(partitions)) = (page.partition, page.partitions) else {
                return Ok(RunsPageView {
                    page,
                    unanswered: Vec::new(),
                });
            };
            expected = Some(partitions);
            // Two owners may both answer for a partition while it moves: the first counts.
            parts.entry(partition).or_insert(page);
            if parts.len() as u32 >= partitions {
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
        Ok(RunsPageView {
            page: merge(parts.into_values().collect(), limit),
            unanswered,
        })
    }

    /// A run's applied events with their decisions, from the log of the daemon that
    /// serves it (`query.after`: continue after the last position of a previous page).
    pub async fn history(
        &self,
        tenant: &str,
        run: &str,
        query: &HistoryQuery,
    ) -> Result<RunHistory, ClientError> {
        let body = serde_json::to_vec(query).expect("queries serialise");
        self.request(subjects::control(tenant, run, ControlVerb::History), body)
            .await
    }
}

#[cfg(test)]
mod tests {
    use fusebox_nats::wire::{RunRow, RunSummary};

    use super::*;

    fn row(run: &str, last_ts_ms: u64) -> RunRow {
        RunRow {
            summary: RunSummary {
                tenant: "t".to_owned(),
                run: run.to_owned(),
                agent: None,
                open: true,
                terminal_state: None,
                reason: None,
                events: 1,
                steps: 0,
                last_seq: None,
                last_ts_ms,
            },
            first_ts_ms: 0,
            calls_refused: 0,
            tokens: 0,
            cost_usd: 0.0,
            parent: None,
            depth: 0,
            stopped_by: None,
        }
    }

    fn page(rows: Vec<RunRow>, open: u64) -> RunsPage {
        RunsPage {
            matched: rows.len() as u64,
            states: [("OPEN".to_owned(), open)].into(),
            runs: rows,
            ..RunsPage::default()
        }
    }

    #[test]
    fn partitions_merge_newest_first_and_sum_their_counts() {
        let a = page(vec![row("a1", 50), row("a2", 10)], 2);
        let b = page(vec![row("b1", 40), row("b2", 30)], 5);
        let merged = merge(vec![a, b], 3);
        let runs: Vec<&str> = merged.runs.iter().map(|r| r.summary.run.as_str()).collect();
        assert_eq!(runs, ["a1", "b1", "b2"]);
        assert_eq!(merged.matched, 4);
        assert_eq!(merged.states["OPEN"], 7);
    }
}
