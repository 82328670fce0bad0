//! Where an operator's request about one run goes. A run of a tree is published with its
//! tree's root before it (`fusebox.<kind>.<tenant>.<root>.<run>`), so in a cluster it is
//! served in its root's partition, not in the one its own id hashes to; its own plain
//! control subject reaches a daemon that does not know it. The client asks the plain
//! subject first (every root, and every run on a single daemon, is found there) and, on
//! `unknown_run`, looks the run's root up among every daemon's runs and asks again there.

use fusebox_nats::subjects::{self, ControlVerb};
use fusebox_nats::wire::{RunStatusReply, RunsQuery, RUNS_PAGE_LIMIT};
use serde::de::DeserializeOwned;

use crate::client::FuseboxClient;
use crate::error::ClientError;

const UNKNOWN_RUN: &str = "unknown_run";

impl FuseboxClient {
    /// A query about a run (`status`, `history`), asked where the run is served.
    pub(crate) async fn ask_run<T: DeserializeOwned>(
        &self,
        tenant: &str,
        run: &str,
        verb: ControlVerb,
        body: Vec<u8>,
    ) -> Result<T, ClientError> {
        match self
            .request(subjects::control(tenant, run, verb), body.clone())
            .await
        {
            Err(ClientError::Refused(refused)) if refused.reason == UNKNOWN_RUN => {
                match self.root_of(tenant, run).await {
                    Some(root) => {
                        self.request(subjects::tree_control(tenant, &root, run, verb), body)
                            .await
                    }
                    None => Err(ClientError::Refused(refused)),
                }
            }
            answered => answered,
        }
    }

    /// Where a command on a run (`cancel`, `resume`, `resolve`) goes. A command changes
    /// what it reaches (a cancel of a run nobody knows latches that id against a later
    /// start), so where the run is served is asked first, never tried: its status on the
    /// plain subject, else its root among every daemon's runs.
    pub(crate) async fn served(&self, tenant: &str, run: &str) -> Served {
        let plain = subjects::control(tenant, run, ControlVerb::Status);
        match self.request::<RunStatusReply>(plain, Vec::new()).await {
            Ok(status) => Served {
                root: None,
                status: Some(status),
            },
            Err(ClientError::Refused(refused)) if refused.reason == UNKNOWN_RUN => Served {
                root: self.root_of(tenant, run).await,
                status: None,
            },
            Err(_) => Served {
                root: None,
                status: None,
            },
        }
    }

    /// The root of a run of a tree, as the daemons that serve it say; `None` for a root,
    /// a run nobody knows, or when no daemon answered.
    async fn root_of(&self, tenant: &str, run: &str) -> Option<String> {
        let query = RunsQuery {
            tenant: Some(tenant.to_owned()),
            run_contains: Some(run.to_owned()),
            limit: Some(RUNS_PAGE_LIMIT),
            ..RunsQuery::default()
        };
        let view = self.runs_page(&query).await.ok()?;
        view.page
            .runs
            .into_iter()
            .find(|row| row.summary.tenant == tenant && row.summary.run == run)?
            .root
    }
}

/// Where a run is served, as [`FuseboxClient::served`] found it.
pub(crate) struct Served {
    /// The run's tree root, when it is a run of a tree served in its root's partition.
    pub(crate) root: Option<String>,
    /// The run's status, when the plain subject answered it (a root, or any run on a
    /// single daemon).
    pub(crate) status: Option<RunStatusReply>,
}

impl Served {
    /// The subject of `verb` on the run: its tree's when it has a root, else the plain
    /// one (also when nobody knew it: the daemon then answers for itself).
    pub(crate) fn subject(&self, tenant: &str, run: &str, verb: ControlVerb) -> String {
        match &self.root {
            Some(root) => subjects::tree_control(tenant, root, run, verb),
            None => subjects::control(tenant, run, verb),
        }
    }
}
