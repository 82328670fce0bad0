//! One pass: list, assess, plan, terminate, report. Sweeps list everything; timer passes list
//! only the instances and runs whose timers fired.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use serde::Serialize;
use tokio::task::JoinSet;

use crate::deadline::Reason;
use crate::engine::Inner;
use crate::facts::Halted;
use crate::plan::{self, Assessed, Plan};
use crate::provider::{Instance, Provider, Selector};
use crate::sink::{BlastRadiusAlert, ProtectedInstance, Termination};
use crate::state::{Due, InstanceKey, RunKey};

/// EC2 accepts up to 200 values in one filter.
const FILTER_VALUES: usize = 200;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PassKind {
    /// Every region, every managed instance.
    Sweep,
    /// Only what due deadline timers and verify checks name.
    Timers,
}

/// What one pass saw and did.
#[derive(Debug, Clone, Serialize)]
pub struct PassReport {
    pub kind: PassKind,
    pub started_ms: u64,
    pub finished_ms: u64,
    /// Managed instances listed (any state).
    pub listed: usize,
    /// Live managed instances the share limit counted.
    pub managed: usize,
    /// Overdue, unprotected instances found.
    pub overdue: usize,
    /// Outcomes reported to the sink in this pass.
    pub terminations: Vec<Termination>,
    /// Overdue instances kept alive by `fusebox:protect`.
    pub protected: usize,
    /// Overdue instances left running by the blast-radius limit.
    pub held: usize,
    pub alert: Option<BlastRadiusAlert>,
    /// Runs whose verify-empty check completed in this pass.
    pub verified_runs: usize,
    /// Regions that could not be listed, with the error; they are retried later.
    pub region_errors: BTreeMap<String, String>,
}

impl<P: Provider> Inner<P> {
    pub(crate) async fn pass(self: &Arc<Self>, kind: PassKind, due: Due) -> PassReport {
        let _one_at_a_time = self.pass_lock.lock().await;
        let started_ms = self.clock.now_ms();
        let (listed, region_errors) = self.list(self.jobs(kind, &due)).await;
        let now = self.clock.now_ms();
        let retry_at = now.saturating_add(self.cfg.recheck_after_s.saturating_mul(1000));

        let mut verifying: HashSet<RunKey> = HashSet::new();
        let mut verified_runs = 0;
        let (plan, assessed) = {
            let mut state = self.state();
            for run in due.runs {
                // A check that could not see every region is not a check: try again later.
                if region_errors.is_empty() {
                    verified_runs += 1;
                } else {
                    state.arm_verify(run.clone(), retry_at);
                }
                verifying.insert(run);
            }
            for key in &due.instances {
                if region_errors.contains_key(&key.region) {
                    state.arm_instance(key.clone(), retry_at);
                } else if !listed.contains_key(key) {
                    // Unlisted: gone, unless just launched and not yet visible (EC2 is
                    // eventually consistent), in which case look again soon.
                    let young = state
                        .launched
                        .get(key)
                        .is_some_and(|f| self.is_young(Some(f.ts_ms), now));
                    if young {
                        state.arm_instance(key.clone(), retry_at);
                    } else {
                        state.launched.remove(key);
                    }
                }
            }
            let assessed: Vec<Assessed> = listed
                .into_values()
                .map(|i| plan::assess(i, &state, &self.cfg))
                .collect();
            let floor = self.counters().managed;
            let halted = state.halted.is_some();
            let plan = plan::plan(&assessed, now, &verifying, floor, halted, &self.cfg);
            for key in &plan.done {
                state.disarm_instance(key);
                state.launched.remove(key);
            }
            for (key, at) in &plan.upcoming {
                state.arm_instance(key.clone(), *at);
            }
            for a in assessed.iter().filter(|a| !a.tags.problems.is_empty()) {
                if state.warned_tags.insert(a.key()) {
                    tracing::warn!(instance = %a.instance.instance_id, problems = ?a.tags.problems, "bad fusebox tags ignored");
                }
            }
            (plan, assessed)
        };

        self.report_protected(&plan);
        let alert = self.check_blast_radius(&plan, now);
        if plan.halted {
            self.latch_halt(&plan, now);
        }
        let terminations = self.execute(&plan).await;
        if kind == PassKind::Sweep && region_errors.is_empty() {
            self.update_fleet_counters(&assessed, &plan);
        }
        self.counters().passes_total += 1;
        PassReport {
            kind,
            started_ms,
            finished_ms: self.clock.now_ms(),
            listed: assessed.len(),
            managed: plan.managed,
            overdue: plan.terminate.len() + plan.held.len(),
            terminations,
            protected: plan.protected.len(),
            held: plan.held.len(),
            alert,
            verified_runs,
            region_errors,
        }
    }

    pub(crate) fn is_young(&self, launch_ms: Option<u64>, now_ms: u64) -> bool {
        launch_ms.is_some_and(|l| {
            now_ms.saturating_sub(l) < self.cfg.not_found_grace_s.saturating_mul(1000)
        })
    }

    /// What to list: every region for a sweep; for timers, the due ids in their regions and
    /// the due runs in every region (a run's instances may be anywhere).
    fn jobs(&self, kind: PassKind, due: &Due) -> Vec<(String, Selector)> {
        let regions = || self.cfg.regions.iter().cloned();
        if kind == PassKind::Sweep {
            return regions().map(|r| (r, Selector::AllManaged)).collect();
        }
        let mut ids: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for k in &due.instances {
            ids.entry(k.region.clone())
                .or_default()
                .push(k.instance_id.clone());
        }
        let runs: Vec<String> = due
            .runs
            .iter()
            .map(|r| r.run.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut jobs = Vec::new();
        for (region, ids) in ids {
            for chunk in ids.chunks(FILTER_VALUES) {
                jobs.push((region.clone(), Selector::Ids(chunk.to_vec())));
            }
        }
        for chunk in runs.chunks(FILTER_VALUES) {
            jobs.extend(regions().map(|r| (r, Selector::Runs(chunk.to_vec()))));
        }
        jobs
    }

    /// Runs the listings concurrently; one region's failure leaves the others untouched.
    async fn list(
        self: &Arc<Self>,
        jobs: Vec<(String, Selector)>,
    ) -> (HashMap<InstanceKey, Instance>, BTreeMap<String, String>) {
        let mut set = JoinSet::new();
        for (region, selector) in jobs {
            let me = Arc::clone(self);
            set.spawn(async move {
                let result = me.describe_all(&region, &selector).await;
                (region, result)
            });
        }
        let mut listed = HashMap::new();
        let mut errors = BTreeMap::new();
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok((region, Ok(instances))) => {
                    if self.state().listing_succeeded(&region) {
                        tracing::info!(%region, "listing instances works again");
                    }
                    for i in instances {
                        let key = InstanceKey {
                            region: i.region.clone(),
                            instance_id: i.instance_id.clone(),
                        };
                        listed.insert(key, i);
                    }
                }
                Ok((region, Err(e))) => {
                    // Every failure is counted (fusebox_watchdog_api_errors_total, which
                    // an alert watches); the log says it hourly, not every minute.
                    let now = self.clock.now_ms();
                    if self.state().listing_failed(&region, &e, now) {
                        tracing::error!(%region, error = %e,
                            "cannot list instances (logged again hourly while it lasts, or when the error changes)");
                    } else {
                        tracing::debug!(%region, error = %e, "still cannot list instances");
                    }
                    errors.insert(region, e.to_string());
                }
                Err(e) => tracing::error!(error = %e, "listing task failed"),
            }
        }
        (listed, errors)
    }

    fn report_protected(&self, plan: &Plan) {
        for c in &plan.protected {
            if !self.state().reported_protected.insert(c.key.clone()) {
                continue;
            }
            self.counters().protected_overdue_total += 1;
            tracing::warn!(region = %c.key.region, instance = %c.key.instance_id, reason = %c.reason,
                "overdue instance is tagged fusebox:protect; not terminating");
            self.sink.protected(&ProtectedInstance {
                tenant: c.tenant.clone(),
                run: c.run.clone(),
                region: c.key.region.clone(),
                instance_id: c.key.instance_id.clone(),
                deadline_ms: c.deadline_ms,
                reason: c.reason,
            });
        }
    }

    fn check_blast_radius(&self, plan: &Plan, now: u64) -> Option<BlastRadiusAlert> {
        let overdue = plan.terminate.len() + plan.held.len();
        let mut counters = self.counters();
        if plan.held.is_empty() {
            if overdue > 0 {
                counters.blast_radius_alert = false;
                counters.held_last_pass = 0;
            }
            return None;
        }
        counters.blast_radius_alert = true;
        counters.blast_radius_trips_total += 1;
        counters.held_last_pass = plan.held.len() as u64;
        let mut held: BTreeMap<Reason, usize> = BTreeMap::new();
        for c in &plan.held {
            *held.entry(c.reason).or_default() += 1;
            *counters.held_total.entry(c.reason).or_default() += 1;
        }
        drop(counters);
        let alert = BlastRadiusAlert {
            at_ms: now,
            overdue,
            allowed: plan.allowed,
            held,
            managed: plan.managed,
            why: plan::why_held(plan, &self.cfg),
        };
        tracing::error!(why = %alert.why, "blast-radius limit reached");
        self.sink.blast_radius(&alert);
        Some(alert)
    }

    /// The pass that trips `on_blast_radius = "halt"` halts the watchdog until an operator
    /// resumes it; the sink journals the halt, so it also holds across a restart.
    fn latch_halt(&self, plan: &Plan, now: u64) {
        let halted = {
            let mut state = self.state();
            if state.halted.is_some() {
                return;
            }
            let halted = Halted {
                at_ms: now,
                why: plan::why_held(plan, &self.cfg),
            };
            state.halted = Some(halted.clone());
            halted
        };
        tracing::error!(why = %halted.why, "watchdog halted until an operator resumes it (fusebox watchdog resume)");
        self.sink.halted(&halted);
    }

    fn update_fleet_counters(&self, assessed: &[Assessed], plan: &Plan) {
        let mut by_state: BTreeMap<String, u64> = BTreeMap::new();
        for a in assessed.iter().filter(|a| a.tags.managed) {
            *by_state
                .entry(a.instance.state.as_str().to_owned())
                .or_default() += 1;
        }
        let live = || assessed.iter().filter(|a| a.is_live_managed());
        let mut c = self.counters();
        c.instances_by_state = by_state;
        c.protected_instances = live().filter(|a| a.tags.protect).count() as u64;
        c.protected_overdue = plan.protected.len() as u64;
        c.oldest_launch_ms = live().filter_map(|a| a.launch_ms).min();
        c.managed = live().count();
        c.last_sweep_ms = Some(self.clock.now_ms());
        // A sweep that found nothing overdue clears the alert as well.
        if plan.terminate.is_empty() && plan.held.is_empty() {
            c.blast_radius_alert = false;
            c.held_last_pass = 0;
        }
    }
}
