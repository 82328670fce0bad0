//! Operator commands over the daemon's control subjects (the `fusebox` CLI wires these
//! to `runs`, `run T/R`, `cancel T/R`, `resume T/R --evidence JSON`, `tail`). A cancel
//! reaches the cancelled run's subtree: the daemon stops every open run below it.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use async_nats::Subscriber;
use fusebox_core::Decision;
use fusebox_nats::subjects::{self, ControlVerb};
use fusebox_nats::wire::{
    CancelRequest, PartitionRuns, ResumeRequest, RunStatusReply, RunSummary, WatchdogReply,
    WatchdogRequest, WatchdogResume,
};
use futures_util::StreamExt;
use serde_json::Value;

use crate::client::FuseboxClient;

/// How long [`FuseboxClient::watchdog_resume`] waits for another daemon's watchdog after
/// an answer (they answer within milliseconds of each other).
pub const MORE_WATCHDOGS: std::time::Duration = std::time::Duration::from_millis(300);
use crate::error::ClientError;

/// `"tenant/run"` → `("tenant", "run")`.
pub fn parse_run_ref(reference: &str) -> Result<(String, String), ClientError> {
    let valid = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    match reference.split_once('/') {
        Some((tenant, run)) if valid(tenant) && valid(run) => {
            Ok((tenant.to_owned(), run.to_owned()))
        }
        _ => Err(ClientError::Usage(format!(
            "{reference:?} is not TENANT/RUN (letters, digits, _ and -)"
        ))),
    }
}

/// A fresh command id: one per operator action, reused by the retry inside it.
pub(crate) fn command_id(verb: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{verb}-{nanos:x}-{:x}", std::process::id())
}

/// Live notable decisions (`fusebox tail`).
pub struct DecisionTail {
    subscriber: Subscriber,
}

impl DecisionTail {
    /// The next decision; `None` when the connection closed. Undecodable messages are
    /// skipped with a warning (a tail must not die of one bad publisher).
    pub async fn next(&mut self) -> Option<Decision> {
        loop {
            let message = self.subscriber.next().await?;
            match serde_json::from_slice(&message.payload) {
                Ok(decision) => return Some(decision),
                Err(err) => tracing::warn!(subject = %message.subject, %err, "not a decision"),
            }
        }
    }
}

/// What a cancel of a node did: its own stop, and how many runs below it were open just
/// before — each of which the daemon stops with it, in the same batch, with a stop of its
/// own (`ancestor_stopped`, naming the ancestor) on its own kill switch.
#[derive(Debug, Clone, PartialEq)]
pub struct Cancelled {
    pub decision: Decision,
    /// `None` when the daemon did not say (an unknown run, a daemon before run trees).
    pub open_below: Option<u32>,
}

/// What `fusebox.control.runs` gathered: every run of the daemons that answered, and
/// in a cluster the partitions that did not answer in time (their runs are missing,
/// e.g. while a partition moves to another daemon).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunsListing {
    pub runs: Vec<RunSummary>,
    pub unanswered: Vec<u32>,
}

/// One answer to `fusebox.control.runs`: a single daemon's list, or a partition's.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum RunsAnswer {
    All(Vec<RunSummary>),
    Partition(PartitionRuns),
}

impl FuseboxClient {
    /// Publishes `body` on `subject` with a fresh inbox for the answers, for requests
    /// that several daemons (partitions, watchdogs) answer: the caller gathers them.
    pub(crate) async fn ask_every_answerer(
        &self,
        subject: &str,
        body: Vec<u8>,
    ) -> Result<Subscriber, ClientError> {
        let failed = |detail: String| ClientError::Request {
            subject: subject.to_owned(),
            detail,
        };
        let inbox = self.nats().new_inbox();
        let answers = self
            .nats()
            .subscribe(inbox.clone())
            .await
            .map_err(|e| failed(e.to_string()))?;
        self.nats()
            .publish_with_reply(subject.to_owned(), inbox, body.into())
            .await
            .map_err(|e| failed(e.to_string()))?;
        Ok(answers)
    }

    /// Every run the daemons know (`fusebox runs`); see [`FuseboxClient::runs_listing`].
    pub async fn runs(&self) -> Result<Vec<RunSummary>, ClientError> {
        Ok(self.runs_listing().await?.runs)
    }

    /// Every run the daemons know. A single daemon answers with all of them; in a
    /// cluster each owned partition answers with its own and says how many partitions
    /// there are, so the answers are gathered until every partition answered or the
    /// client's timeout passed.
    pub async fn runs_listing(&self) -> Result<RunsListing, ClientError> {
        let subject = subjects::CONTROL_RUNS.to_owned();
        let started = std::time::Instant::now();
        let mut answers = self.ask_every_answerer(&subject, Vec::new()).await?;
        let deadline = tokio::time::Instant::now() + self.options().timeout;
        let timed_out = || self.unanswered(&subject, started);
        let mut partitions: BTreeMap<u32, Vec<RunSummary>> = BTreeMap::new();
        let mut expected = None;
        loop {
            let Ok(Some(message)) = tokio::time::timeout_at(deadline, answers.next()).await else {
                break;
            };
            // 503: no daemon subscribes (the only status a plain reply inbox gets).
            if message.status.is_some_and(|s| s.is_server_error()) {
                return Err(ClientError::NoResponders { subject });
            }
            let answer: RunsAnswer =
                serde_json::from_slice(&message.payload).map_err(|e| ClientError::BadAnswer {
                    subject: subject.clone(),
                    detail: e.to_string(),
                })?;
            match answer {
                RunsAnswer::All(mut runs) => {
                    runs.sort_by(|a, b| (&a.tenant, &a.run).cmp(&(&b.tenant, &b.run)));
                    return Ok(RunsListing {
                        runs,
                        unanswered: Vec::new(),
                    });
                }
                // Two owners may both answer for a partition in the moment it moves:
                // the first answer counts.
                RunsAnswer::Partition(part) => {
                    expected = Some(part.partitions);
                    partitions.entry(part.partition).or_insert(part.runs);
                    if partitions.len() as u32 >= part.partitions {
                        break;
                    }
                }
            }
        }
        let Some(expected) = expected else {
            return Err(timed_out());
        };
        let unanswered = (0..expected)
            .filter(|p| !partitions.contains_key(p))
            .collect();
        let mut runs: Vec<RunSummary> = partitions.into_values().flatten().collect();
        runs.sort_by(|a, b| (&a.tenant, &a.run).cmp(&(&b.tenant, &b.run)));
        Ok(RunsListing { runs, unanswered })
    }

    /// The watchdog's answer: its state, its instances with their deadlines and its
    /// recent terminations (in a cluster only the daemon holding the watchdog role
    /// answers), for the operator's page, which takes the first answer.
    pub async fn watchdog_first(&self) -> Result<WatchdogReply, ClientError> {
        self.request(subjects::CONTROL_WATCHDOG.to_owned(), Vec::new())
            .await
    }

    /// One run's state, counters, stop report and latest decisions (`fusebox run T/R`).
    pub async fn run_status(&self, tenant: &str, run: &str) -> Result<RunStatusReply, ClientError> {
        self.ask_run(tenant, run, ControlVerb::Status, Vec::new())
            .await
    }

    /// Cancels a run (`fusebox cancel T/R`): its stop goes out on the kill switch.
    pub async fn cancel(
        &self,
        tenant: &str,
        run: &str,
        by: Option<&str>,
        reason: Option<&str>,
    ) -> Result<Decision, ClientError> {
        let subject = self
            .served(tenant, run)
            .await
            .subject(tenant, run, ControlVerb::Cancel);
        self.cancel_at(subject, by, reason).await
    }

    async fn cancel_at(
        &self,
        subject: String,
        by: Option<&str>,
        reason: Option<&str>,
    ) -> Result<Decision, ClientError> {
        let request = CancelRequest {
            id: Some(command_id("cancel")),
            by: by.map(str::to_owned),
            reason: reason.map(str::to_owned),
        };
        let body = serde_json::to_vec(&request).expect("requests serialise");
        self.command(subject, body).await
    }

    /// Cancels a run and, through the daemon, every open run below it (`fusebox cancel`,
    /// the page's cancel): see [`Cancelled`].
    pub async fn cancel_subtree(
        &self,
        tenant: &str,
        run: &str,
        by: Option<&str>,
        reason: Option<&str>,
    ) -> Result<Cancelled, ClientError> {
        // The status is read first, where the cancel will go: the daemon closes the runs
        // below in the cancel's own batch, so after it none is open.
        let mut served = self.served(tenant, run).await;
        let status = match served.status.take() {
            Some(status) => Some(status),
            None if served.root.is_some() => {
                let subject = served.subject(tenant, run, ControlVerb::Status);
                self.request::<RunStatusReply>(subject, Vec::new())
                    .await
                    .ok()
            }
            None => None,
        };
        let open_below = status.and_then(|s| s.tree).map(|tree| tree.open_below);
        let subject = served.subject(tenant, run, ControlVerb::Cancel);
        let decision = self.cancel_at(subject, by, reason).await?;
        Ok(Cancelled {
            decision,
            open_below,
        })
    }

    /// Asks to resume a stopped run with `evidence` (`fusebox resume T/R --evidence JSON`),
    /// e.g. `{"progress_version": 7}` or `{"approval_id": "CHG-1234"}`. The decision says
    /// whether it was accepted (`continue`) or refused (`stop`, `precondition_unchanged`).
    pub async fn resume(
        &self,
        tenant: &str,
        run: &str,
        by: Option<&str>,
        evidence: Value,
    ) -> Result<Decision, ClientError> {
        let request = ResumeRequest {
            id: Some(command_id("resume")),
            by: by.map(str::to_owned),
            evidence,
        };
        let body = serde_json::to_vec(&request).expect("requests serialise");
        let subject = self
            .served(tenant, run)
            .await
            .subject(tenant, run, ControlVerb::Resume);
        self.command(subject, body).await
    }

    /// The cloud watchdog's state (`fusebox watchdog status`): halted or running, one
    /// answer per answering watchdog (see [`FuseboxClient::watchdog_resume`]).
    pub async fn watchdog_status(&self) -> Result<Vec<WatchdogReply>, ClientError> {
        self.watchdogs(Vec::new()).await
    }

    /// Resumes the watchdog halted by `on_blast_radius = "halt"` (`fusebox watchdog
    /// resume`); `by` is journaled with the resume. A single daemon answers for itself;
    /// in a cluster only the role's holder answers (the halt is one for all), but a
    /// deployment may run watchdogs outside a cluster too, so the answers are gathered:
    /// until the client's timeout for the first, then [`MORE_WATCHDOGS`] after the last.
    pub async fn watchdog_resume(&self, by: &str) -> Result<Vec<WatchdogReply>, ClientError> {
        let request = WatchdogRequest {
            resume: Some(WatchdogResume { by: by.to_owned() }),
        };
        self.watchdogs(serde_json::to_vec(&request).expect("requests serialise"))
            .await
    }

    async fn watchdogs(&self, body: Vec<u8>) -> Result<Vec<WatchdogReply>, ClientError> {
        let subject = subjects::CONTROL_WATCHDOG.to_owned();
        let started = std::time::Instant::now();
        let mut answers = self.ask_every_answerer(&subject, body).await?;
        let mut deadline = tokio::time::Instant::now() + self.options().timeout;
        let mut replies = Vec::new();
        while let Ok(Some(message)) = tokio::time::timeout_at(deadline, answers.next()).await {
            // 503: no daemon with a watchdog subscribes.
            if message.status.is_some_and(|s| s.is_server_error()) {
                return Err(ClientError::NoResponders { subject });
            }
            replies.push(serde_json::from_slice(&message.payload).map_err(|e| {
                ClientError::BadAnswer {
                    subject: subject.clone(),
                    detail: e.to_string(),
                }
            })?);
            deadline = deadline.min(tokio::time::Instant::now() + MORE_WATCHDOGS);
        }
        if replies.is_empty() {
            return Err(self.unanswered(&subject, started));
        }
        Ok(replies)
    }

    /// Live decisions (`fusebox tail`), of one run, one tenant (`run` = `None`) or all
    /// (`tenant` = `None`).
    pub async fn tail(
        &self,
        tenant: Option<&str>,
        run: Option<&str>,
    ) -> Result<DecisionTail, ClientError> {
        let subject = match (tenant, run) {
            (Some(tenant), Some(run)) => subjects::decisions(tenant, run),
            (Some(tenant), None) => format!("fusebox.decisions.{tenant}.*"),
            (None, _) => subjects::DECISIONS_FILTER.to_owned(),
        };
        let subscriber = self.subscribe_confirmed(&subject).await?;
        Ok(DecisionTail { subscriber })
    }

    /// A state-changing command: retried once on timeout with the same id, which the
    /// daemon applies once.
    pub(crate) async fn command(
        &self,
        subject: String,
        body: Vec<u8>,
    ) -> Result<Decision, ClientError> {
        match self.request(subject.clone(), body.clone()).await {
            Err(ClientError::Timeout { .. }) => self.request(subject, body).await,
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_refs_parse() {
        assert_eq!(
            parse_run_ref("acme/r-1").unwrap(),
            ("acme".to_owned(), "r-1".to_owned())
        );
        assert!(parse_run_ref("acme").is_err());
        assert!(parse_run_ref("acme/r.1").is_err());
        assert!(parse_run_ref("/r").is_err());
    }
}
