//! The cloud behind a small trait, so other clouds can be added next to EC2.

use std::collections::BTreeMap;
use std::future::Future;

use serde::Serialize;

/// An instance as the cloud lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub region: String,
    pub instance_id: String,
    pub state: InstanceState,
    /// The cloud's launch time, Unix ms.
    pub launch_ms: Option<u64>,
    pub tags: BTreeMap<String, String>,
}

/// Lifecycle state. Only `ShuttingDown` and `Terminated` are done: a stopped instance still
/// bills for its volumes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceState {
    Pending,
    Running,
    Stopping,
    Stopped,
    ShuttingDown,
    Terminated,
    /// A state this version does not know; treated as live (billing) to stay on the safe side.
    Other(String),
}

impl InstanceState {
    pub fn parse(name: &str) -> Self {
        match name {
            "pending" => Self::Pending,
            "running" => Self::Running,
            "stopping" => Self::Stopping,
            "stopped" => Self::Stopped,
            "shutting-down" => Self::ShuttingDown,
            "terminated" => Self::Terminated,
            other => Self::Other(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
            Self::ShuttingDown => "shutting-down",
            Self::Terminated => "terminated",
            Self::Other(s) => s,
        }
    }

    pub fn is_done(&self) -> bool {
        matches!(self, Self::ShuttingDown | Self::Terminated)
    }
}

/// Which managed instances to list. The provider always adds the `fusebox:managed=true`
/// filter: nothing else is ever returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    AllManaged,
    /// These instance ids (a filter, so unknown ids are simply absent, not an error).
    Ids(Vec<String>),
    /// Instances tagged with one of these `fusebox:run` values.
    Runs(Vec<String>),
}

/// One page of a listing.
#[derive(Debug, Clone, Default)]
pub struct Page {
    pub instances: Vec<Instance>,
    pub next_token: Option<String>,
}

/// The state each instance moved to after a successful TerminateInstances call.
pub type Terminated = Vec<(String, InstanceState)>;

/// An API operation, for permission checks and per-operation error counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Op {
    DescribeInstances,
    TerminateInstances,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::DescribeInstances => "DescribeInstances",
            Op::TerminateInstances => "TerminateInstances",
        }
    }

    /// The IAM action that allows it.
    pub fn permission(self) -> &'static str {
        match self {
            Op::DescribeInstances => "ec2:DescribeInstances",
            Op::TerminateInstances => "ec2:TerminateInstances",
        }
    }
}

/// How an API call failed, as far as retrying and reporting care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Throttling: retry with backoff.
    Throttled,
    /// 5xx: retry with backoff.
    Server,
    /// No answer (connection, timeout): retry with backoff.
    Transport,
    /// Some of the ids do not exist (`InvalidInstanceID.NotFound`); see `ProviderError::ids`.
    NotFound,
    /// Termination protection on some ids (`OperationNotPermitted`); see `ProviderError::ids`.
    NotPermitted,
    /// The credentials lack a permission (`UnauthorizedOperation`, `AuthFailure`).
    Unauthorized,
    /// Any other refusal: not retried.
    Client,
}

/// A failed API call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ProviderError {
    pub kind: ErrorKind,
    pub code: String,
    pub message: String,
    /// Instance ids the error names (for `NotFound` and `NotPermitted`).
    pub ids: Vec<String>,
}

impl ProviderError {
    pub fn new(kind: ErrorKind, code: impl Into<String>, message: impl Into<String>) -> Self {
        let message = message.into();
        let ids = instance_ids_in(&message);
        ProviderError {
            kind,
            code: code.into(),
            message,
            ids,
        }
    }

    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Throttled | ErrorKind::Server | ErrorKind::Transport
        )
    }
}

/// Instance ids quoted in an EC2 error message ("The instance IDs 'i-1, i-2' do not exist").
fn instance_ids_in(message: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for word in message.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')) {
        if let Some(hex) = word.strip_prefix("i-") {
            if !hex.is_empty()
                && hex.chars().all(|c| c.is_ascii_hexdigit())
                && !ids.iter().any(|i| i == word)
            {
                ids.push(word.to_owned());
            }
        }
    }
    ids
}

/// A cloud the watchdog can drive. One call is one API request: the engine does paging,
/// retries and batch splitting, so every provider gets them the same way.
pub trait Provider: Send + Sync + 'static {
    /// Short name, matched against `InstanceLaunched::provider` (e.g. `"ec2"`).
    fn name(&self) -> &str;

    /// One page of managed instances in `region`.
    fn describe_page(
        &self,
        region: &str,
        selector: &Selector,
        next_token: Option<String>,
    ) -> impl Future<Output = Result<Page, ProviderError>> + Send;

    /// One TerminateInstances call for `ids` (all in `region`).
    fn terminate(
        &self,
        region: &str,
        ids: &[String],
    ) -> impl Future<Output = Result<Terminated, ProviderError>> + Send;

    /// Asks the cloud whether `op` would be allowed, without doing it (EC2's DryRun).
    /// `Ok(())` means allowed; `instance_id` names a target for operations that need one.
    fn dry_run(
        &self,
        region: &str,
        op: Op,
        instance_id: Option<&str>,
    ) -> impl Future<Output = Result<(), ProviderError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_read_from_ec2_messages() {
        let e = ProviderError::new(
            ErrorKind::NotFound,
            "InvalidInstanceID.NotFound",
            "The instance IDs 'i-0abc, i-123def' do not exist",
        );
        assert_eq!(e.ids, vec!["i-0abc", "i-123def"]);
        let e = ProviderError::new(
            ErrorKind::NotPermitted,
            "OperationNotPermitted",
            "The instance 'i-0f00' may not be terminated. Modify its 'disableApiTermination' instance attribute and try again.",
        );
        assert_eq!(e.ids, vec!["i-0f00"]);
    }

    #[test]
    fn only_shutting_down_and_terminated_are_done() {
        for s in ["pending", "running", "stopping", "stopped", "rebooting"] {
            assert!(!InstanceState::parse(s).is_done(), "{s}");
        }
        assert!(InstanceState::parse("shutting-down").is_done());
        assert!(InstanceState::parse("terminated").is_done());
    }
}
