//! Start-up permission check with the cloud's own DryRun flag.

use serde::Serialize;

use crate::engine::Watchdog;
use crate::provider::{ErrorKind, Op, Provider, Selector};

/// An id that cannot exist, for a terminate dry run when no managed instance is at hand.
const PLACEHOLDER_ID: &str = "i-00000000000000000";

/// The verdict on one permission in one region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PermissionCheck {
    pub region: String,
    pub op: Op,
    /// The IAM action, e.g. `ec2:TerminateInstances`.
    pub permission: &'static str,
    pub status: PermissionStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "detail", rename_all = "snake_case")]
pub enum PermissionStatus {
    Granted,
    /// The cloud refused the dry run: the credentials lack the permission.
    Missing(String),
    /// The dry run could not conclude (network, no instance to test against, …).
    Unverified(String),
}

impl PermissionCheck {
    /// One line for logs and the CLI.
    pub fn describe(&self) -> String {
        match &self.status {
            PermissionStatus::Granted => format!("{}: {} granted", self.region, self.permission),
            PermissionStatus::Missing(m) => {
                format!(
                    "{}: MISSING {} (needed for {}): {m}",
                    self.region,
                    self.permission,
                    self.op.as_str()
                )
            }
            PermissionStatus::Unverified(m) => {
                format!("{}: could not verify {}: {m}", self.region, self.permission)
            }
        }
    }
}

impl<P: Provider> Watchdog<P> {
    /// Dry-runs DescribeInstances and TerminateInstances in every region. Terminate is tried
    /// against a managed instance when one exists, since AWS may check the id before the
    /// permission.
    pub async fn check_permissions(&self) -> Vec<PermissionCheck> {
        let mut out = Vec::new();
        for region in &self.inner.cfg.regions {
            let target = self
                .inner
                .provider
                .describe_page(region, &Selector::AllManaged, None)
                .await
                .ok()
                .and_then(|p| p.instances.into_iter().find(|i| !i.state.is_done()))
                .map(|i| i.instance_id);
            for (op, id) in [
                (Op::DescribeInstances, None),
                (
                    Op::TerminateInstances,
                    Some(target.as_deref().unwrap_or(PLACEHOLDER_ID)),
                ),
            ] {
                let status = match self.inner.provider.dry_run(region, op, id).await {
                    Ok(()) => PermissionStatus::Granted,
                    Err(e) if e.kind == ErrorKind::Unauthorized => {
                        PermissionStatus::Missing(e.to_string())
                    }
                    Err(e) => PermissionStatus::Unverified(e.to_string()),
                };
                let check = PermissionCheck {
                    region: region.clone(),
                    op,
                    permission: op.permission(),
                    status,
                };
                match check.status {
                    PermissionStatus::Granted => tracing::info!("{}", check.describe()),
                    _ => tracing::error!("{}", check.describe()),
                }
                out.push(check);
            }
        }
        out
    }
}
