//! A tree of runs in a cluster (guard contract §6), real processes on loopback only: the
//! 3-node nats-server cluster of deploy/nats/ with run partitioning on and three
//! `fuseboxd` in cluster mode. A run of a tree names its root on the wire
//! (`fusebox.gate.<tenant>.<root>.<run>`) and the servers' mapping hashes that root, so
//! the whole tree is one engine's, wherever its runs' own ids would hash. Checked:
//!
//! * a root fanning out 30 sub-agents of five calls each under a tree budget of 100
//!   steps executes exactly 100 calls, the children running concurrently, while the
//!   daemon serving the tree is SIGKILLed mid-fan-out (the tree moves whole);
//! * the operator reaches a child whose own id hashes to another partition (status,
//!   history), and a cancel of the root ends every open child there: their next call
//!   is refused with the stop that names the root.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fusebox_client::{ClientError, FuseboxClient, Gate};
use fusebox_core::{Action, Decision};
use fusebox_e2e::cluster::{add_daemon, partition_of, NatsCluster};
use fusebox_e2e::fleet::{GATE_TIMEOUT, RIDE_OUT};
use fusebox_e2e::{event, now_ms};
use fusebox_nats::wire::HistoryQuery;
use serde_json::{json, Value};

const TENANT: &str = "acme";
const ROOT: &str = "fan-root";
const CHILDREN: usize = 30;
const CALLS_EACH: usize = 5;
const TREE_BUDGET: usize = 100;

/// One run of the tree, asking on the tree's subjects and retrying the same event until
/// it is answered (how an agent rides out a takeover).
struct TreeRun {
    client: FuseboxClient,
    run: String,
    seq: u64,
}

impl TreeRun {
    fn new(client: &FuseboxClient, run: &str) -> TreeRun {
        TreeRun {
            client: client.clone(),
            run: run.to_owned(),
            seq: 0,
        }
    }

    async fn gate(&mut self, body: Value) -> Decision {
        self.seq += 1;
        let mut json = json!({"v":1,"id":format!("{}-{}", self.run, self.seq),
            "tenant":TENANT,"run":self.run,"seq":self.seq,"ts_ms":now_ms()});
        json.as_object_mut()
            .unwrap()
            .extend(body.as_object().unwrap().clone());
        let event = event(json);
        let first = Instant::now();
        loop {
            match self.client.gate_in_tree(ROOT, &event).await {
                Gate::Decided(decision) => return decision,
                Gate::Refused(error) => {
                    panic!("{}: event {} refused: {error:?}", self.run, event.id)
                }
                Gate::Unanswered { error, .. } => {
                    assert!(
                        first.elapsed() < RIDE_OUT,
                        "{}: {} unanswered for {RIDE_OUT:?}: {error}",
                        self.run,
                        event.id
                    );
                    if !matches!(error, ClientError::Timeout { .. }) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }
    }

    /// A call that reads a page of its own: executed (and answered) or refused.
    async fn fetch(&mut self, step: usize) -> Decision {
        let call_id = format!("c{step}");
        let url = format!("https://docs.example.test/{}/{step}", self.run);
        let decision = self
            .gate(json!({"type":"tool_call","call_id":call_id,"tool":"fetch","args":{"url":url}}))
            .await;
        if decision.action == Action::Execute {
            self.gate(
                json!({"type":"tool_result","call_id":call_id,"tool":"fetch",
                "kind":"SUCCESS","output":{"page":url}}),
            )
            .await;
        }
        decision
    }
}

fn child_id(i: usize) -> String {
    format!("{ROOT}-researcher-{i}")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tree_is_served_whole_by_its_roots_partition_through_a_daemon_crash() {
    let nats = NatsCluster::start().await;
    let urls = nats.urls();
    let dir = tempfile::tempdir().unwrap();
    let mut daemons = Vec::new();
    let mut owners = Vec::new();
    for _ in 0..3 {
        owners = add_daemon(&mut daemons, dir.path(), &urls).await;
    }
    let client = nats.tenant_client(TENANT, GATE_TIMEOUT).await;
    let operator = nats.operator_client().await;

    // The children's own ids hash all over: without the root on the wire most of them
    // would be roots of their own in other engines, outside the tree's budget.
    let root_partition = partition_of(TENANT, ROOT);
    let own_partitions: BTreeSet<u32> = (0..CHILDREN)
        .map(|i| partition_of(TENANT, &child_id(i)))
        .collect();
    let elsewhere = (0..CHILDREN)
        .filter(|i| partition_of(TENANT, &child_id(*i)) != root_partition)
        .count();
    assert!(
        elsewhere >= CHILDREN / 2 && own_partitions.len() >= 4,
        "the children's ids should hash away from the root's partition {root_partition}: {own_partitions:?}"
    );

    let mut root = TreeRun::new(&client, ROOT);
    let started = root
        .gate(json!({"type":"run_started","agent":"lead","policy":{
            "max_steps":TREE_BUDGET,"max_children":CHILDREN,"max_open_children":CHILDREN}}))
        .await;
    assert_eq!(started.action, Action::Continue, "{started:?}");

    // Thirty children at once, five calls each: 150 asked, the tree's budget is 100.
    let executed = Arc::new(AtomicUsize::new(0));
    let mut fan_out = Vec::new();
    for i in 0..CHILDREN {
        let mut child = TreeRun::new(&client, &child_id(i));
        let executed = executed.clone();
        fan_out.push(tokio::spawn(async move {
            let start = child
                .gate(json!({"type":"run_started","agent":"researcher","parent":ROOT}))
                .await;
            assert_eq!(start.action, Action::Continue, "{}: {start:?}", child.run);
            let mut refused = None;
            for step in 0..CALLS_EACH {
                let decision = child.fetch(step).await;
                if decision.action == Action::Execute {
                    assert!(
                        refused.is_none(),
                        "{}: call {step} executed after a refusal",
                        child.run
                    );
                    executed.fetch_add(1, Ordering::Relaxed);
                } else {
                    refused.get_or_insert(decision);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            refused
        }));
    }

    // Mid-fan-out the daemon serving the tree's partition is SIGKILLed.
    let deadline = Instant::now() + Duration::from_secs(60);
    while executed.load(Ordering::Relaxed) < 40 {
        assert!(Instant::now() < deadline, "the fan-out made no progress");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let serving = &owners[root_partition as usize];
    let at_kill = executed.load(Ordering::Relaxed);
    let victim = daemons
        .iter_mut()
        .find(|d| &d.node_id == serving)
        .expect("the tree's daemon");
    victim.kill();
    eprintln!("daemon {serving} (partition {root_partition}) SIGKILLed after {at_kill} executions");

    let mut refusals = Vec::new();
    for task in fan_out {
        refusals.extend(task.await.expect("child task"));
    }
    let executed = executed.load(Ordering::Relaxed);
    assert_eq!(
        executed, TREE_BUDGET,
        "the tree's budget is {TREE_BUDGET} steps: exactly that many calls run, across the crash"
    );
    assert!(
        refusals
            .iter()
            .all(|d| matches!(d.action, Action::Stop | Action::Block)),
        "{refusals:?}"
    );
    assert!(
        refusals
            .iter()
            .any(|d| d.reason.is_some_and(|r| r.as_str() == "tree_budget")),
        "a refusal names the tree's budget: {refusals:?}"
    );

    // The operator reaches a child wherever its own id hashes: its status and history
    // come from the tree's daemon.
    let far = (0..CHILDREN)
        .map(child_id)
        .find(|c| partition_of(TENANT, c) != root_partition)
        .unwrap();
    let status = operator
        .run_status(TENANT, &far)
        .await
        .expect("child status");
    let tree = status.tree.expect("the child's place in its tree");
    assert_eq!(
        (tree.parent.as_deref(), tree.root.as_str()),
        (Some(ROOT), ROOT)
    );
    let history = operator
        .history(TENANT, &far, &HistoryQuery::default())
        .await
        .expect("child history");
    assert!(!history.entries.is_empty());
    let root_status = operator
        .run_status(TENANT, ROOT)
        .await
        .expect("root status");
    let root_tree = root_status.tree.expect("root tree");
    assert_eq!(root_tree.below.steps, TREE_BUDGET as u64, "{root_tree:?}");
}

/// A cancel of the root reaches the children that hash elsewhere: each open child is
/// stopped with it and its next call refused, the stop naming the root.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_of_the_root_reaches_children_whose_ids_hash_elsewhere() {
    let nats = NatsCluster::start().await;
    let urls = nats.urls();
    let dir = tempfile::tempdir().unwrap();
    let mut daemons = Vec::new();
    for _ in 0..2 {
        add_daemon(&mut daemons, dir.path(), &urls).await;
    }
    let client = nats.tenant_client(TENANT, GATE_TIMEOUT).await;
    let operator = nats.operator_client().await;

    let mut root = TreeRun::new(&client, ROOT);
    root.gate(json!({"type":"run_started","agent":"lead"}))
        .await;
    let mut children: Vec<TreeRun> = (0..6)
        .map(|i| TreeRun::new(&client, &child_id(i)))
        .collect();
    for child in &mut children {
        child
            .gate(json!({"type":"run_started","agent":"researcher","parent":ROOT}))
            .await;
        assert_eq!(child.fetch(0).await.action, Action::Execute);
    }
    // Cancelled by id alone, as `fusebox cancel acme/fan-root` does.
    let cancelled = operator
        .cancel_subtree(TENANT, ROOT, Some("oncall"), Some("runaway tree"))
        .await
        .expect("cancel");
    assert_eq!(cancelled.open_below, Some(children.len() as u32));
    for child in &mut children {
        let next = child.fetch(1).await;
        assert_eq!(next.action, Action::Stop, "{}: {next:?}", child.run);
        assert_eq!(
            next.reason.map(|r| r.as_str()),
            Some("ancestor_stopped"),
            "{next:?}"
        );
        let message = next.message.unwrap_or_default();
        assert!(message.contains(ROOT), "{message}");
    }
    // A child started under the cancelled root, its own id hashing elsewhere, is
    // refused at its start: the root's stop is known where the tree is served.
    let far = (6..CHILDREN)
        .map(child_id)
        .find(|c| partition_of(TENANT, c) != partition_of(TENANT, ROOT))
        .unwrap();
    let mut late = TreeRun::new(&client, &far);
    let start = late
        .gate(json!({"type":"run_started","agent":"researcher","parent":ROOT}))
        .await;
    assert_eq!(
        start.action,
        Action::Stop,
        "a child of a cancelled root: {start:?}"
    );
}
