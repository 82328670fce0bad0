//! Batched, idempotent termination of the planned candidates, region by region.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::task::JoinSet;

use crate::engine::Inner;
use crate::plan::{Candidate, Plan};
use crate::provider::{ErrorKind, Op, Provider, ProviderError};
use crate::sink::{Outcome, Termination};

/// The fate of one candidate after its region's calls.
enum Fate {
    Final(Outcome, Option<String>),
    /// Not found but just launched: look again soon instead of calling it gone.
    Recheck,
}

impl<P: Provider> Inner<P> {
    /// Terminates (or in dry-run, reports) every candidate the plan allows, and reports each
    /// outcome to the sink unless it was already reported.
    pub(crate) async fn execute(self: &Arc<Self>, plan: &Plan) -> Vec<Termination> {
        let fates: Vec<(Candidate, Fate)> = if self.cfg.dry_run {
            plan.terminate
                .iter()
                .map(|c| (c.clone(), Fate::Final(Outcome::WouldTerminate, None)))
                .collect()
        } else {
            self.terminate_all(&plan.terminate).await
        };
        let now = self.clock.now_ms();
        let retry_at = now.saturating_add(self.cfg.recheck_after_s.saturating_mul(1000));
        let mut out = Vec::new();
        for (c, fate) in fates {
            let (outcome, error) = match fate {
                Fate::Recheck => {
                    self.state().arm_instance(c.key.clone(), retry_at);
                    continue;
                }
                Fate::Final(o, e) => (o, e),
            };
            if outcome == Outcome::Failed {
                self.state().arm_instance(c.key.clone(), retry_at);
            } else if self.state().reported.insert(c.key.clone(), outcome) == Some(outcome) {
                // Same outcome as last time (e.g. EC2 still lists it while it shuts down).
                continue;
            }
            let t = Termination {
                tenant: c.tenant,
                run: c.run,
                provider: self.provider.name().to_owned(),
                region: c.key.region,
                instance_id: c.key.instance_id,
                reason: c.reason,
                deadline_ms: c.deadline_ms,
                at_ms: now,
                dry_run: self.cfg.dry_run,
                outcome,
                error,
            };
            tracing::info!(region = %t.region, instance = %t.instance_id, reason = %t.reason,
                outcome = ?t.outcome, late_ms = now.saturating_sub(t.deadline_ms), "watchdog termination");
            self.sink.termination(&t);
            out.push(t);
        }
        out
    }

    async fn terminate_all(self: &Arc<Self>, candidates: &[Candidate]) -> Vec<(Candidate, Fate)> {
        let mut by_region: BTreeMap<String, Vec<Candidate>> = BTreeMap::new();
        for c in candidates {
            by_region
                .entry(c.key.region.clone())
                .or_default()
                .push(c.clone());
        }
        let mut set = JoinSet::new();
        for (region, cands) in by_region {
            let me = Arc::clone(self);
            set.spawn(async move { me.terminate_region(&region, cands).await });
        }
        let mut out = Vec::new();
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok(fates) => out.extend(fates),
                Err(e) => tracing::error!(error = %e, "termination task failed"),
            }
        }
        out
    }

    /// Works through batches; an error that names ids settles those ids and retries the rest
    /// of the batch, so one bad id never blocks its neighbours.
    async fn terminate_region(
        &self,
        region: &str,
        cands: Vec<Candidate>,
    ) -> Vec<(Candidate, Fate)> {
        let mut queue: Vec<Vec<Candidate>> = cands
            .chunks(self.cfg.terminate_batch_size)
            .map(<[Candidate]>::to_vec)
            .collect();
        let mut out = Vec::new();
        while let Some(batch) = queue.pop() {
            let ids: Vec<String> = batch.iter().map(|c| c.key.instance_id.clone()).collect();
            let result = self
                .with_retry(Op::TerminateInstances, region, || {
                    self.provider.terminate(region, &ids)
                })
                .await;
            let err = match result {
                Ok(_) => {
                    out.extend(
                        batch
                            .into_iter()
                            .map(|c| (c, Fate::Final(Outcome::Terminated, None))),
                    );
                    continue;
                }
                Err(e) => e,
            };
            match settle(&err, batch) {
                Settled::Named(named, rest) => {
                    let now = self.clock.now_ms();
                    for c in named {
                        let fate = match err.kind {
                            ErrorKind::NotFound if self.is_young(c.launch_ms, now) => Fate::Recheck,
                            ErrorKind::NotFound => Fate::Final(Outcome::AlreadyGone, None),
                            _ => {
                                tracing::warn!(%region, instance = %c.key.instance_id,
                                    "termination protection is on; reporting, not forcing");
                                Fate::Final(
                                    Outcome::TerminationProtected,
                                    Some(err.message.clone()),
                                )
                            }
                        };
                        out.push((c, fate));
                    }
                    if !rest.is_empty() {
                        queue.push(rest);
                    }
                }
                Settled::Split(singles) => queue.extend(singles.into_iter().map(|c| vec![c])),
                Settled::Failed(batch) => {
                    tracing::error!(%region, error = %err, n = batch.len(), "termination failed");
                    let msg = err.to_string();
                    out.extend(
                        batch
                            .into_iter()
                            .map(|c| (c, Fate::Final(Outcome::Failed, Some(msg.clone())))),
                    );
                }
            }
        }
        out
    }
}

/// How an error divides a batch.
enum Settled {
    /// These candidates are settled by the error; the rest go again.
    Named(Vec<Candidate>, Vec<Candidate>),
    /// The error concerns some ids but does not say which: try them one by one.
    Split(Vec<Candidate>),
    /// The whole batch failed.
    Failed(Vec<Candidate>),
}

fn settle(err: &ProviderError, batch: Vec<Candidate>) -> Settled {
    if !matches!(err.kind, ErrorKind::NotFound | ErrorKind::NotPermitted) {
        return Settled::Failed(batch);
    }
    let named = |c: &Candidate| err.ids.contains(&c.key.instance_id);
    if batch.len() == 1 || batch.iter().any(named) {
        let single = batch.len() == 1;
        let (hit, rest): (Vec<_>, Vec<_>) = batch.into_iter().partition(|c| single || named(c));
        return Settled::Named(hit, rest);
    }
    Settled::Split(batch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deadline::Reason;
    use crate::state::InstanceKey;

    fn cand(id: &str) -> Candidate {
        Candidate {
            key: InstanceKey {
                region: "r".into(),
                instance_id: id.into(),
            },
            tenant: None,
            run: None,
            launch_ms: None,
            deadline_ms: 0,
            reason: Reason::Deadline,
        }
    }

    fn err(kind: ErrorKind, msg: &str) -> ProviderError {
        ProviderError::new(kind, "X", msg)
    }

    #[test]
    fn named_ids_are_settled_rest_retried() {
        let e = err(ErrorKind::NotFound, "The instance ID 'i-2' does not exist");
        let Settled::Named(hit, rest) = settle(&e, vec![cand("i-1"), cand("i-2"), cand("i-3")])
        else {
            panic!("expected Named");
        };
        assert_eq!(hit, vec![cand("i-2")]);
        assert_eq!(rest, vec![cand("i-1"), cand("i-3")]);
    }

    #[test]
    fn unnamed_error_splits_and_single_is_settled() {
        let e = err(ErrorKind::NotPermitted, "no ids here");
        assert!(
            matches!(settle(&e, vec![cand("i-1"), cand("i-2")]), Settled::Split(v) if v.len() == 2)
        );
        assert!(
            matches!(settle(&e, vec![cand("i-1")]), Settled::Named(h, r) if h.len() == 1 && r.is_empty())
        );
    }

    #[test]
    fn other_errors_fail_the_batch() {
        let e = err(ErrorKind::Throttled, "slow down");
        assert!(matches!(settle(&e, vec![cand("i-1")]), Settled::Failed(v) if v.len() == 1));
    }
}
