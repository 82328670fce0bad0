//! The serialised form of [`Engine`]: its runs with their policy as an index into a table
//! of the distinct policies, instead of each run carrying its whole policy. Runs started
//! under the same policy share one `Arc`, so the table holds each once: the log's
//! snapshot shrinks by a policy per run (about a quarter of a run's bytes), and a
//! decoded engine shares one policy again rather than holding a copy per run.
//!
//! `RunOut` and `RunIn` list `RunState`'s fields under the same names (the snapshot is
//! self-describing MessagePack); a field added to `RunState` must be added here too, or
//! the build fails in `RunIn::into_run` and `RunOut::new`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::de::Error as _;
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::engine::{Engine, Runs, Scratch};
use crate::fixed_hash::FixedHasher;
use crate::ledger::Ledger;
use crate::policy::{Policy, PolicySet};
use crate::run::{
    CompactionLog, Counters, Detection, Node, PendingCall, Reserved, RunState, RunStatus, Task,
};

#[derive(Serialize)]
struct EngineOut<'a> {
    policies: &'a PolicySet,
    /// The distinct policies of the runs, in the order first met.
    run_policies: Vec<&'a Policy>,
    runs: RunsOut<'a>,
    ledger: &'a Ledger,
}

#[derive(Deserialize)]
struct EngineIn {
    policies: PolicySet,
    run_policies: Vec<Arc<Policy>>,
    runs: HashMap<String, HashMap<String, RunIn, FixedHasher>, FixedHasher>,
    ledger: Ledger,
}

/// tenant → run → `RunOut`, with the policy indexes computed beforehand.
struct RunsOut<'a> {
    runs: &'a Runs,
    index: HashMap<*const Policy, u32>,
}

struct TenantOut<'a> {
    runs: &'a HashMap<String, Arc<RunState>, FixedHasher>,
    index: &'a HashMap<*const Policy, u32>,
}

impl Serialize for RunsOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.runs.len()))?;
        for (tenant, runs) in self.runs {
            let index = &self.index;
            map.serialize_entry(tenant, &TenantOut { runs, index })?;
        }
        map.end()
    }
}

impl Serialize for TenantOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.runs.len()))?;
        for (id, run) in self.runs {
            let policy = self.index[&Arc::as_ptr(&run.policy)];
            map.serialize_entry(id, &RunOut::new(run, policy))?;
        }
        map.end()
    }
}

#[derive(Serialize)]
struct RunOut<'a> {
    agent: &'a Option<String>,
    policy: u32,
    allowed_tools: &'a Option<Vec<String>>,
    status: &'a RunStatus,
    first_ts_ms: u64,
    last_ts_ms: u64,
    last_seq: Option<u64>,
    counters: &'a Counters,
    progress_version: Option<u64>,
    last_safe_checkpoint: &'a Option<String>,
    unmet_precondition: &'a Option<String>,
    detection: &'a Detection,
    pending: &'a BTreeMap<String, PendingCall>,
    completed_operations: &'a Vec<String>,
    fired_guards: &'a Vec<String>,
    compactions: &'a CompactionLog,
    resume_tokens: &'a Vec<String>,
    task: &'a Task,
    node: &'a Node,
    reserved: &'a Reserved,
}

impl<'a> RunOut<'a> {
    fn new(run: &'a RunState, policy: u32) -> Self {
        let RunState {
            agent,
            policy: _,
            allowed_tools,
            status,
            first_ts_ms,
            last_ts_ms,
            last_seq,
            counters,
            progress_version,
            last_safe_checkpoint,
            unmet_precondition,
            detection,
            pending,
            completed_operations,
            fired_guards,
            compactions,
            resume_tokens,
            task,
            node,
            reserved,
        } = run;
        RunOut {
            agent,
            policy,
            allowed_tools,
            status,
            first_ts_ms: *first_ts_ms,
            last_ts_ms: *last_ts_ms,
            last_seq: *last_seq,
            counters,
            progress_version: *progress_version,
            last_safe_checkpoint,
            unmet_precondition,
            detection,
            pending,
            completed_operations,
            fired_guards,
            compactions,
            resume_tokens,
            task,
            node,
            reserved,
        }
    }
}

#[derive(Deserialize)]
struct RunIn {
    agent: Option<String>,
    policy: u32,
    allowed_tools: Option<Vec<String>>,
    status: RunStatus,
    first_ts_ms: u64,
    last_ts_ms: u64,
    last_seq: Option<u64>,
    counters: Counters,
    progress_version: Option<u64>,
    last_safe_checkpoint: Option<String>,
    unmet_precondition: Option<String>,
    detection: Detection,
    pending: BTreeMap<String, PendingCall>,
    completed_operations: Vec<String>,
    fired_guards: Vec<String>,
    compactions: CompactionLog,
    resume_tokens: Vec<String>,
    /// Snapshots written before tasks were budgeted apart read as one task.
    #[serde(default)]
    task: Task,
    /// Snapshots written before trees read as roots.
    #[serde(default)]
    node: Node,
    /// Snapshots written before reservations hold none.
    #[serde(default)]
    reserved: Reserved,
}

impl RunIn {
    fn into_run(self, policy: Arc<Policy>) -> RunState {
        RunState {
            agent: self.agent,
            policy,
            allowed_tools: self.allowed_tools,
            status: self.status,
            first_ts_ms: self.first_ts_ms,
            last_ts_ms: self.last_ts_ms,
            last_seq: self.last_seq,
            counters: self.counters,
            progress_version: self.progress_version,
            last_safe_checkpoint: self.last_safe_checkpoint,
            unmet_precondition: self.unmet_precondition,
            detection: self.detection,
            pending: self.pending,
            completed_operations: self.completed_operations,
            fired_guards: self.fired_guards,
            compactions: self.compactions,
            resume_tokens: self.resume_tokens,
            task: self.task,
            node: self.node,
            reserved: self.reserved,
        }
    }
}

impl Serialize for Engine {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut run_policies = Vec::new();
        let mut index = HashMap::new();
        for run in self.runs.values().flat_map(HashMap::values) {
            index.entry(Arc::as_ptr(&run.policy)).or_insert_with(|| {
                run_policies.push(&*run.policy);
                run_policies.len() as u32 - 1
            });
        }
        EngineOut {
            policies: &self.policies,
            run_policies,
            runs: RunsOut {
                runs: &self.runs,
                index,
            },
            ledger: &self.ledger,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Engine {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let form = EngineIn::deserialize(deserializer)?;
        let mut runs = Runs::default();
        for (tenant, tenant_runs) in form.runs {
            let mut decoded =
                HashMap::with_capacity_and_hasher(tenant_runs.len(), FixedHasher::default());
            for (id, run) in tenant_runs {
                let policy = form
                    .run_policies
                    .get(run.policy as usize)
                    .ok_or_else(|| D::Error::custom(format!("run {id}: no policy {}", run.policy)))?
                    .clone();
                decoded.insert(id, Arc::new(run.into_run(policy)));
            }
            runs.insert(tenant, decoded);
        }
        Ok(Engine {
            policies: form.policies,
            runs,
            ledger: form.ledger,
            scratch: Scratch::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_event;

    #[test]
    fn runs_share_their_policy_through_the_table_and_come_back_equal() {
        let mut engine = Engine::default();
        for (run, policy) in [("a", ""), ("b", ""), ("c", r#","policy":{"max_steps":3}"#)] {
            let line = format!(
                r#"{{"v":1,"id":"{run}","tenant":"t","run":"{run}","ts_ms":1,"type":"run_started"{policy}}}"#
            );
            engine.apply(&parse_event(line.as_bytes()).unwrap());
        }
        let json = serde_json::to_value(&engine).unwrap();
        assert_eq!(json["run_policies"].as_array().unwrap().len(), 2);

        let back: Engine = serde_json::from_value(json).unwrap();
        assert_eq!(back, engine);
        let policy = |run| &back.run("t", run).unwrap().policy;
        assert!(Arc::ptr_eq(policy("a"), policy("b")));
        assert_eq!(policy("c").max_steps, 3);
    }
}
