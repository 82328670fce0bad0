//! Cluster mode end to end (issue 7), real processes on loopback only: the 3-node
//! nats-server cluster of deploy/nats/ with run partitioning on, three `fuseboxd` in
//! cluster mode, and a fleet of agent tasks over two tenants. Mid-load one daemon is
//! SIGKILLed, later one NATS node; the guarantees are checked afterwards:
//!
//! * every runaway run is stopped, with the stop kept on its kill switch;
//! * no legit run is blocked or stopped, and every run that has no side effects gets
//!   exactly the decisions the offline engine computes for its events;
//! * per (tenant, op_key) at most one call executes across the whole test, whatever
//!   partition, daemon or phase asks; later ones get the executor's stored result;
//! * every event acknowledged (a gate answer or a JetStream ack) is in its run's state,
//!   and every gate answer is repeated identically for the same event id.
//!
//! Times (takeover, failover) are printed, never asserted; only liveness has (generous)
//! timeouts. `gate_throughput_with_1_2_3_daemons` (ignored) is the scale-out benchmark:
//! `cargo test --release -p fuseboxd --test cluster -- --ignored --nocapture`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use fusebox_client::{ClientError, FuseboxClient, Gate};
use fusebox_core::{Action, Decision, Event, EventBody};
use fusebox_e2e::cluster::{add_daemon, partition_of, wait_owners, NatsCluster, PARTITIONS};
use fusebox_e2e::{event, now_ms, offline_engine};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

const TENANTS: [&str; 2] = ["acme", "globex"];
/// One gate attempt; a real agent retries the same event after this.
const GATE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long an agent keeps retrying one gate request or report before giving up.
const RIDE_OUT: Duration = Duration::from_secs(30);
/// Pause between an agent's steps, so runs are still going when something is killed.
const PACE: Duration = Duration::from_millis(30);
const PAGES: u64 = 10;

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// The same search again and again through the gate: must end in a stop.
    Runaway,
    /// Pages that each make progress, then `run_finished`: never refused.
    Legit,
    /// A side effect with `op_key`, retried within the run; the key may be shared.
    Op(String),
    /// Everything through JetStream only (monitor mode): a loop the kill switch ends.
    PassiveRunaway,
    /// Everything through JetStream only: pages, then `run_finished`.
    PassiveLegit,
}

impl Kind {
    /// Runs whose decisions depend on nothing but their own events.
    fn is_isolated(&self) -> bool {
        !matches!(self, Kind::Op(_))
    }
}

/// One gate request as the agent saw it.
struct Gated {
    /// Index into the run's `events`.
    event: usize,
    decision: Decision,
    /// When the last attempt (the answered one) was sent, and when it was answered.
    last_sent: Instant,
    answered: Instant,
    attempts: u32,
}

/// Everything one agent sent and got.
struct RunLog {
    tenant: String,
    run: String,
    kind: Kind,
    /// Acknowledged events in `seq` order (gate answered, or stored by JetStream).
    events: Vec<Event>,
    gates: Vec<Gated>,
    /// The outputs this run reported for side effects it executed, by op_key.
    executed: Vec<(String, Value)>,
}

/// Asks the gate about `event` until it is answered, up to `RIDE_OUT`; returns the
/// decision, the attempts, and when the answered attempt was sent.
async fn ask(client: &FuseboxClient, event: &Event) -> (Decision, u32, Instant) {
    let first = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let sent = Instant::now();
        match client.gate(event).await {
            Gate::Decided(decision) => return (decision, attempts, sent),
            Gate::Refused(error) => panic!("{}: event {} refused: {error:?}", event.run, event.id),
            Gate::Unanswered { error, .. } => {
                assert!(
                    first.elapsed() < RIDE_OUT,
                    "{}: gate request {} unanswered for {RIDE_OUT:?}: {error}",
                    event.run,
                    event.id
                );
                if !matches!(error, ClientError::Timeout { .. }) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

struct Agent {
    client: FuseboxClient,
    answered: Arc<AtomicUsize>,
    log: RunLog,
}

impl Agent {
    fn next(&mut self, body: Value) -> Event {
        let seq = self.log.events.len() + 1;
        let mut json = json!({"v":1,"id":format!("{}-{seq}", self.log.run),
            "tenant":self.log.tenant,"run":self.log.run,"seq":seq,"ts_ms":now_ms()});
        json.as_object_mut()
            .unwrap()
            .extend(body.as_object().unwrap().clone());
        event(json)
    }

    /// Asks the gate, retrying the SAME event until it is answered (how an agent rides
    /// out a takeover); never runs anything on a missing answer.
    async fn gate(&mut self, body: Value) -> Decision {
        let event = self.next(body);
        let (decision, attempts, last_sent) = ask(&self.client, &event).await;
        self.answered.fetch_add(1, Ordering::Relaxed);
        self.log.gates.push(Gated {
            event: self.log.events.len(),
            decision: decision.clone(),
            last_sent,
            answered: Instant::now(),
            attempts,
        });
        self.log.events.push(event);
        decision
    }

    /// A tool call through the gate; returns its call id and decision.
    async fn call(&mut self, tool: &str, args: Value, op_key: Option<&str>) -> (String, Decision) {
        let call_id = format!("c{}", self.log.events.len() + 1);
        let mut body = json!({"type":"tool_call","call_id":call_id,"tool":tool,"args":args});
        if let Some(op_key) = op_key {
            body["op_key"] = op_key.into();
        }
        (call_id, self.gate(body).await)
    }

    /// Publishes to FUSEBOX_EVENTS until JetStream acknowledges it (same id each time,
    /// so a publish that was stored but whose ack was lost is stored once).
    async fn report(&mut self, body: Value) {
        let event = self.next(body);
        let first = Instant::now();
        while let Err(error) = self.client.report(&event).await {
            assert!(
                first.elapsed() < RIDE_OUT,
                "{}: report {} not acknowledged for {RIDE_OUT:?}: {error}",
                event.run,
                event.id
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.log.events.push(event);
    }

    async fn result(&mut self, call_id: &str, tool: &str, output: Value, progress: Option<u64>) {
        let mut body = json!({"type":"tool_result","call_id":call_id,"tool":tool,
            "kind":"SUCCESS","output":output});
        if let Some(progress) = progress {
            body["progress"] = progress.into();
        }
        self.report(body).await;
    }

    async fn run(mut self) -> RunLog {
        match self.log.kind.clone() {
            Kind::Runaway => self.runaway().await,
            Kind::Legit => self.legit().await,
            Kind::Op(key) => self.op(&key).await,
            Kind::PassiveRunaway => self.passive_runaway().await,
            Kind::PassiveLegit => self.passive_legit().await,
        }
        self.log
    }

    async fn runaway(&mut self) {
        self.gate(json!({"type":"run_started","agent":"researcher"}))
            .await;
        for _ in 0..40 {
            let query = json!({"query":"weather tokyo"});
            let (call_id, decision) = self.call("search", query, None).await;
            if decision.action == Action::Stop {
                return;
            }
            if decision.action.lets_tool_run() {
                self.result(&call_id, "search", json!({"hits":["jma.go.jp"]}), None)
                    .await;
            }
            tokio::time::sleep(PACE).await;
        }
    }

    async fn legit(&mut self) {
        self.report(json!({"type":"run_started","agent":"triager"}))
            .await;
        for page in 1..=PAGES {
            let (call_id, decision) = self.call("list_issues", json!({"page":page}), None).await;
            if decision.action.lets_tool_run() {
                let output = json!({"issues":[format!("ISSUE-{page}0"), format!("ISSUE-{page}1")],
                    "next": page < PAGES});
                self.result(&call_id, "list_issues", output, Some(page))
                    .await;
            }
            tokio::time::sleep(PACE).await;
        }
        self.gate(json!({"type":"run_finished","status":"all pages read"}))
            .await;
    }

    async fn op(&mut self, key: &str) {
        self.gate(json!({"type":"run_started","agent":"notifier"}))
            .await;
        let (call_id, _) = self.call("get_incident", json!({"id":key}), None).await;
        self.result(
            &call_id,
            "get_incident",
            json!({"id":key,"state":"resolved"}),
            None,
        )
        .await;
        // The notification, asked again after it ran (a retry of the same business
        // operation within the run) or while another run has it in flight.
        for _ in 0..3 {
            let args = json!({"to":"oncall@example.com","subject":format!("{key} resolved")});
            let (call_id, decision) = self.call("send_email", args, Some(key)).await;
            match decision.action {
                Action::Execute | Action::Warn => {
                    let output = json!({"sent":true,"by":self.log.run});
                    self.log.executed.push((key.to_owned(), output.clone()));
                    self.result(&call_id, "send_email", output, None).await;
                }
                Action::Block => tokio::time::sleep(Duration::from_millis(400)).await,
                Action::UseCompletedResult | Action::Stop => break,
                other => panic!("{}: a gate answered {other:?}", self.log.run),
            }
            tokio::time::sleep(PACE).await;
        }
        self.gate(json!({"type":"run_finished","status":"notified"}))
            .await;
    }

    async fn passive_runaway(&mut self) {
        self.report(json!({"type":"run_started","agent":"researcher"}))
            .await;
        for i in 0..15 {
            let call_id = format!("p{i}");
            self.report(json!({"type":"tool_call","call_id":call_id,"tool":"search",
                "args":{"query":"weather osaka"}}))
                .await;
            self.result(&call_id, "search", json!({"hits":["jma.go.jp"]}), None)
                .await;
            tokio::time::sleep(PACE).await;
        }
    }

    async fn passive_legit(&mut self) {
        self.report(json!({"type":"run_started","agent":"triager"}))
            .await;
        for page in 1..=PAGES {
            let call_id = format!("p{page}");
            self.report(
                json!({"type":"tool_call","call_id":call_id,"tool":"list_issues",
                "args":{"page":page}}),
            )
            .await;
            self.result(
                &call_id,
                "list_issues",
                json!({"issues":[page]}),
                Some(page),
            )
            .await;
            tokio::time::sleep(PACE).await;
        }
        self.report(json!({"type":"run_finished","status":"all pages read"}))
            .await;
    }
}

fn op_key_of(event: &Event) -> Option<&str> {
    match &event.body {
        EventBody::ToolCall(call) => call.op_key.as_deref(),
        _ => None,
    }
}

/// The shared op_key of pair `j` of a tenant.
fn op_key(tenant: &str, j: usize) -> String {
    format!("{tenant}:INC-{j}:notify")
}

/// Phase 1 per tenant: 5 runaway, 6 legit, 3 op_key pairs (the two runs of a pair share
/// the key and sit in different partitions), 2 passive runaway, 1 passive legit.
/// Phase 2 per tenant: 3 runaway, 3 legit, 3 op runs re-asking phase 1's keys, 1
/// passive runaway.
fn plan(phase: u32) -> Vec<(String, String, Kind)> {
    let mut runs = Vec::new();
    for tenant in TENANTS {
        let mut add = |run: String, kind: Kind| runs.push((tenant.to_owned(), run, kind));
        let (runaway, legit, passive) = if phase == 1 { (5, 6, 2) } else { (3, 3, 1) };
        for i in 0..runaway {
            add(format!("loop{phase}-{i}"), Kind::Runaway);
        }
        for i in 0..legit {
            add(format!("page{phase}-{i}"), Kind::Legit);
        }
        for i in 0..passive {
            add(format!("ploop{phase}-{i}"), Kind::PassiveRunaway);
        }
        for j in 0..3 {
            let first = format!("op{phase}-{j}a");
            if phase == 1 {
                let second = (0..)
                    .map(|s| format!("op{phase}-{j}b{s}"))
                    .find(|b| partition_of(tenant, b) != partition_of(tenant, &first))
                    .unwrap();
                add(second, Kind::Op(op_key(tenant, j)));
            }
            add(first, Kind::Op(op_key(tenant, j)));
        }
        if phase == 1 {
            add(format!("ppage{phase}-0"), Kind::PassiveLegit);
        }
    }
    runs
}

fn spawn_fleet(
    phase: u32,
    clients: &HashMap<String, FuseboxClient>,
    answered: &Arc<AtomicUsize>,
) -> Vec<JoinHandle<RunLog>> {
    plan(phase)
        .into_iter()
        .map(|(tenant, run, kind)| {
            let agent = Agent {
                client: clients[&tenant].clone(),
                answered: answered.clone(),
                log: RunLog {
                    tenant,
                    run,
                    kind,
                    events: Vec::new(),
                    gates: Vec::new(),
                    executed: Vec::new(),
                },
            };
            tokio::spawn(agent.run())
        })
        .collect()
}

/// Waits until `answered` reaches `target` gate answers (the load is well under way).
async fn wait_answers(answered: &AtomicUsize, target: usize, fleet: &[JoinHandle<RunLog>]) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while answered.load(Ordering::Relaxed) < target {
        assert!(
            !fleet.iter().all(JoinHandle::is_finished),
            "the load ended before {target} gate answers: nothing to kill it under"
        );
        assert!(
            Instant::now() < deadline,
            "load too slow: {answered:?} answers"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn join(fleet: Vec<JoinHandle<RunLog>>) -> Vec<RunLog> {
    let mut logs = Vec::new();
    for agent in fleet {
        logs.push(agent.await.expect("an agent failed (see its panic above)"));
    }
    logs
}

/// How the fleet rode out a kill at `at`: the first gate answered by a new owner for a
/// run in `partitions` (its last attempt sent after the kill), and the latest answer of
/// a request that had to be retried across the kill.
struct RideOut {
    first_answer: Option<Duration>,
    all_unblocked: Option<Duration>,
    retried: usize,
}

fn ride_out(logs: &[RunLog], at: Instant, partitions: &[u32]) -> RideOut {
    let mut figures = RideOut {
        first_answer: None,
        all_unblocked: None,
        retried: 0,
    };
    for log in logs {
        let moved = partitions.contains(&partition_of(&log.tenant, &log.run));
        for gated in log.gates.iter().filter(|g| g.last_sent >= at) {
            let after = gated.answered - at;
            if moved {
                figures.first_answer = Some(figures.first_answer.map_or(after, |f| f.min(after)));
            }
            if gated.attempts > 1 {
                figures.retried += 1;
                figures.all_unblocked = Some(figures.all_unblocked.map_or(after, |f| f.max(after)));
            }
        }
    }
    figures
}

/// The stop kept on a run's kill switch (FUSEBOX_STOPS, last message of its subject).
async fn kept_stop(stops: &jetstream::stream::Stream, tenant: &str, run: &str) -> Option<Decision> {
    let subject = fusebox_nats::subjects::stop(tenant, run);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match stops.get_last_raw_message_by_subject(&subject).await {
            Ok(message) => return Some(serde_json::from_slice(&message.payload).unwrap()),
            Err(err)
                if err.kind() == jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
            {
                return None
            }
            Err(err) => {
                assert!(Instant::now() < deadline, "reading {subject}: {err}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Retries `f` for up to 30 s: JetStream API calls fail while the cluster elects
/// leaders (after a node loss), which is not what is tested.
async fn retry<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    what: &str,
    mut f: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match f().await {
            Ok(value) => return value,
            Err(err) => assert!(Instant::now() < deadline, "{what}: {err}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The node leading FUSEBOX_EVENTS (the hardest one to lose).
async fn events_leader(js: &jetstream::Context) -> String {
    retry("FUSEBOX_EVENTS leader", || async {
        let mut stream = js
            .get_stream(fusebox_nats::subjects::EVENTS_STREAM)
            .await
            .map_err(|e| e.to_string())?;
        let info = stream.info().await.map_err(|e| e.to_string())?;
        let cluster = info.cluster.clone().ok_or("not clustered")?;
        cluster.leader.ok_or_else(|| "no leader".to_owned())
    })
    .await
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("-".to_owned(), |d| format!("{} ms", d.as_millis()))
}

#[tokio::test(flavor = "multi_thread")]
async fn partitions_move_on_a_daemon_crash_and_nothing_is_lost_or_done_twice() {
    let mut nats = NatsCluster::start().await;
    let urls = nats.urls();
    let dir = tempfile::tempdir().unwrap();
    // One after the other, each joining a cluster that serves every partition already
    // (the first ones give partitions up to the newcomer's fair share).
    let mut daemons = Vec::new();
    let mut owners = Vec::new();
    for _ in 0..3 {
        owners = add_daemon(&mut daemons, dir.path(), &urls).await;
    }
    eprintln!("partition owners at start: {owners:?}");

    let mut clients = HashMap::new();
    for tenant in TENANTS {
        clients.insert(
            tenant.to_owned(),
            nats.tenant_client(tenant, GATE_TIMEOUT).await,
        );
    }
    let admin = jetstream::new(nats.connect("fuseboxd", None).await);
    let answered = Arc::new(AtomicUsize::new(0));

    // Phase 1: the fleet runs; d2 is SIGKILLed once 120 gate requests were answered.
    let fleet = spawn_fleet(1, &clients, &answered);
    wait_answers(&answered, 120, &fleet).await;
    let mut victim = daemons.remove(1);
    let moved: Vec<u32> = (0..PARTITIONS)
        .filter(|p| owners[*p as usize] == victim.node_id)
        .collect();
    victim.kill();
    let killed = Instant::now();
    let owners_after = wait_owners(
        &mut daemons.iter_mut().collect::<Vec<_>>(),
        Duration::from_secs(30),
    )
    .await;
    let reowned = killed.elapsed();
    let mut logs = join(fleet).await;
    let takeover = ride_out(&logs, killed, &moved);
    assert!(
        takeover.first_answer.is_some(),
        "no run of {}'s partitions {moved:?} asked anything after the kill: the takeover was not exercised",
        victim.node_id
    );
    eprintln!(
        "daemon {} SIGKILLed (partitions {moved:?}): owners {owners_after:?} after {} ms (logs); \
         first answer in a moved partition after {}; every agent unblocked after {} \
         ({} gate requests had to be retried)",
        victim.node_id,
        reowned.as_millis(),
        ms(takeover.first_answer),
        ms(takeover.all_unblocked),
        takeover.retried
    );

    // Phase 2: more load; the node leading FUSEBOX_EVENTS is SIGKILLed under it.
    let before = answered.load(Ordering::Relaxed);
    let fleet = spawn_fleet(2, &clients, &answered);
    let leader = events_leader(&admin).await;
    wait_answers(&answered, before + 60, &fleet).await;
    let node = nats.nodes.iter_mut().find(|n| n.name == leader).unwrap();
    node.kill();
    let nats_killed = Instant::now();
    let phase2 = join(fleet).await;
    let failover = ride_out(&phase2, nats_killed, &[]);
    eprintln!(
        "NATS node {leader} (FUSEBOX_EVENTS leader) SIGKILLed: {} gate requests retried, \
         the last answered {} after the kill",
        failover.retried,
        ms(failover.all_unblocked)
    );
    // Both daemons are still there and again own every partition once between them.
    wait_owners(
        &mut daemons.iter_mut().collect::<Vec<_>>(),
        Duration::from_secs(60),
    )
    .await;
    eprintln!(
        "every partition owned once again {} ms after the NATS node loss (checked after the load)",
        nats_killed.elapsed().as_millis()
    );
    logs.extend(phase2);

    check_exactly_once(&logs);
    check_answers_repeat(&logs, &clients).await;
    check_acknowledged_events_applied(&logs, &nats.operator_client().await).await;
    check_runs(&logs, &daemons[0].config, &admin).await;

    let mut actions = BTreeMap::new();
    for gated in logs.iter().flat_map(|l| &l.gates) {
        *actions.entry(gated.decision.action.as_str()).or_insert(0) += 1;
    }
    let events: usize = logs.iter().map(|l| l.events.len()).sum();
    eprintln!(
        "{} runs, {events} events acknowledged, gate decisions {actions:?}",
        logs.len()
    );
}

/// Per run: runaway runs are stopped (and the stop is kept on the kill switch), legit
/// runs are never refused and complete, and isolated runs get the offline engine's
/// decisions, kill-switch message included.
async fn check_runs(logs: &[RunLog], config: &Path, admin: &jetstream::Context) {
    let stops = retry("FUSEBOX_STOPS", || {
        admin.get_stream(fusebox_nats::subjects::STOPS_STREAM)
    })
    .await;
    for log in logs {
        let name = format!("{}/{} ({:?})", log.tenant, log.run, log.kind);
        let kept = kept_stop(&stops, &log.tenant, &log.run).await;
        let calls: Vec<&Decision> = log
            .gates
            .iter()
            .filter(|g| matches!(log.events[g.event].body, EventBody::ToolCall(_)))
            .map(|g| &g.decision)
            .collect();
        match log.kind {
            Kind::Runaway => assert_eq!(
                calls.last().map(|d| d.action),
                Some(Action::Stop),
                "{name} was never stopped"
            ),
            Kind::Legit => assert!(
                calls.len() == PAGES as usize && calls.iter().all(|d| d.action == Action::Execute),
                "{name}: a legit call was refused: {calls:?}"
            ),
            Kind::PassiveRunaway => assert!(
                kept.as_ref().is_some_and(|k| k.action == Action::Stop),
                "{name}: no stop on the kill switch: {kept:?}"
            ),
            Kind::Op(_) | Kind::PassiveLegit => {}
        }
        // A stop a gate answer carried is the one kept for late workers.
        if let Some(stop) = log.gates.iter().find(|g| g.decision.action == Action::Stop) {
            let kept = kept
                .as_ref()
                .unwrap_or_else(|| panic!("{name}: stop not kept"));
            assert_eq!(kept.report, stop.decision.report, "{name}");
        }
        if log.kind.is_isolated() {
            let mut engine = offline_engine(config);
            let want: Vec<Decision> = log.events.iter().map(|e| engine.apply(e)).collect();
            for gated in &log.gates {
                assert_eq!(
                    gated.decision,
                    want[gated.event],
                    "{name}: event {}",
                    gated.event + 1
                );
            }
            // Only a closing `stop` goes on the kill switch (not a completion).
            let closing = want.iter().find(|d| d.report.is_some());
            let closing = closing.filter(|d| d.action == Action::Stop);
            assert_eq!(kept.as_ref(), closing, "{name}: kill switch");
        }
    }
}

/// Per (tenant, op_key): at most one call executed in the whole test, and every later
/// call got the executor's stored result; the shared ledger was really crossed.
fn check_exactly_once(logs: &[RunLog]) {
    let mut executed: HashMap<(&str, &str), Vec<String>> = HashMap::new();
    let mut outputs = HashMap::new();
    for log in logs {
        for (key, output) in &log.executed {
            outputs.insert(
                (log.tenant.as_str(), key.as_str()),
                (log.run.as_str(), output),
            );
        }
        for gated in &log.gates {
            let Some(key) = op_key_of(&log.events[gated.event]) else {
                continue;
            };
            if gated.decision.action.lets_tool_run() {
                executed
                    .entry((&log.tenant, key))
                    .or_default()
                    .push(format!("{}/{}", log.run, gated.decision.event_id));
            }
        }
    }
    for (key, runs) in &executed {
        assert_eq!(
            runs.len(),
            1,
            "op_key {key:?} executed more than once: {runs:?}"
        );
    }
    let mut across_runs = 0;
    for log in logs {
        for gated in &log.gates {
            let event = &log.events[gated.event];
            let Some(key) = op_key_of(event) else {
                continue;
            };
            if gated.decision.action != Action::UseCompletedResult {
                continue;
            }
            let (executor, output) =
                outputs.get(&(log.tenant.as_str(), key)).unwrap_or_else(|| {
                    panic!("{}: {key} answered from a ledger nobody wrote", log.run)
                });
            assert_eq!(
                gated.decision.result.as_ref(),
                Some(*output),
                "{}: {key}",
                log.run
            );
            if *executor != log.run {
                across_runs += 1;
            }
        }
    }
    // Phase 2 re-asks every key that ran in phase 1: all answered from the ledger.
    for log in logs.iter().filter(|l| l.run.starts_with("op2-")) {
        let Kind::Op(key) = &log.kind else {
            unreachable!()
        };
        if outputs.contains_key(&(log.tenant.as_str(), key.as_str())) {
            let first = log
                .gates
                .iter()
                .find(|g| op_key_of(&log.events[g.event]).is_some());
            assert_eq!(
                first.map(|g| g.decision.action),
                Some(Action::UseCompletedResult),
                "{}: {key} completed in phase 1",
                log.run
            );
        }
    }
    assert!(across_runs > 0, "no run got another run's stored result");
    eprintln!(
        "op_keys executed: {} (once each); {across_runs} calls answered with another run's result",
        executed.len()
    );
}

/// Every acknowledged event is in its run's state on whichever daemon owns it now
/// (JetStream events may still be on their way: polled for up to 30 s), and the legit
/// runs completed. Lists every run that falls short.
async fn check_acknowledged_events_applied(logs: &[RunLog], operator: &FuseboxClient) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut pending: Vec<&RunLog> = logs.iter().collect();
    loop {
        let mut short = Vec::new();
        for log in pending {
            let status = operator.run_status(&log.tenant, &log.run).await;
            let seen = status
                .as_ref()
                .map(|s| (s.counters.events, s.summary.last_seq))
                .map_err(ToString::to_string);
            let want = (log.events.len() as u64, Some(log.events.len() as u64));
            if seen != Ok(want) {
                short.push((log, format!("{seen:?} of {want:?}")));
                continue;
            }
            if matches!(log.kind, Kind::Legit | Kind::PassiveLegit) {
                let state = status.unwrap().summary.terminal_state;
                assert_eq!(
                    state.as_deref(),
                    Some("COMPLETED"),
                    "{}/{}",
                    log.tenant,
                    log.run
                );
            }
        }
        if short.is_empty() {
            return;
        }
        let list: Vec<String> = short
            .iter()
            .map(|(log, seen)| format!("{}/{} {seen}", log.tenant, log.run))
            .collect();
        assert!(
            Instant::now() < deadline,
            "{} runs lack acknowledged events, as (applied events, last seq) of \
             (acknowledged, last seq): {list:#?}",
            list.len()
        );
        pending = short.into_iter().map(|(log, _)| log).collect();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every gate request asked again after all that gets its original decision (an agent
/// whose answer was lost asks again: a different answer, e.g. `execute` where it was
/// `use_completed_result`, would run a side effect twice).
async fn check_answers_repeat(logs: &[RunLog], clients: &HashMap<String, FuseboxClient>) {
    let mut asked = 0;
    for log in logs {
        for gated in &log.gates {
            let event = &log.events[gated.event];
            let (decision, _, _) = ask(&clients[&log.tenant], event).await;
            assert_eq!(
                decision, gated.decision,
                "{}: event {} re-asked",
                log.run, event.id
            );
            asked += 1;
        }
    }
    eprintln!("{asked} gate requests re-asked: identical answers");
}

/// Gate requests of the throughput measurement, after a warm-up of `WARM_UP`.
const BENCH_GATES: usize = 40_000;
const WARM_UP: usize = 4_000;
const IN_FLIGHT: usize = 128;
/// Calls per run: many runs spread over all partitions, none near its step budget.
const CALLS_PER_RUN: usize = 100;

/// One throughput measurement.
struct Throughput {
    per_second: f64,
    p50: Duration,
    p99: Duration,
    /// Requests that had to be asked again (a partition changing hands under load).
    retried: usize,
}

/// `total` distinct tool calls of tenant acme (runs `<prefix>-<n>`), `IN_FLIGHT` at a
/// time over the given connections, each asked until answered. Every call must be
/// answered `execute`, or the figure would be measuring refusals.
async fn gate_load(clients: &[FuseboxClient], prefix: &str, total: usize) -> Throughput {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..IN_FLIGHT)
        .map(|w| {
            let (client, next, prefix) = (
                clients[w % clients.len()].clone(),
                next.clone(),
                prefix.to_owned(),
            );
            tokio::spawn(async move {
                let (mut latencies, mut retried) = (Vec::new(), 0);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return (latencies, retried);
                    }
                    let call = event(json!({"v":1,"id":format!("{prefix}-{i}"),"tenant":"acme",
                        "run":format!("{prefix}-{}", i / CALLS_PER_RUN),"ts_ms":now_ms(),
                        "type":"tool_call","call_id":format!("c{i}"),"tool":"search",
                        "args":{"q":format!("query {i}")}}));
                    let asked = Instant::now();
                    let (decision, attempts, _) = ask(&client, &call).await;
                    assert_eq!(
                        decision.action,
                        Action::Execute,
                        "bench call {i}: {decision:?}"
                    );
                    latencies.push(asked.elapsed());
                    retried += usize::from(attempts > 1);
                }
            })
        })
        .collect();
    let (mut latencies, mut retried) = (Vec::with_capacity(total), 0);
    for worker in workers {
        let (mine, again) = worker.await.expect("bench worker");
        latencies.extend(mine);
        retried += again;
    }
    let per_second = total as f64 / started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    Throughput {
        per_second,
        p50: latencies[total / 2],
        p99: latencies[total * 99 / 100],
        retried,
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: cargo test --release -p fuseboxd --test cluster -- --ignored --nocapture"]
async fn gate_throughput_with_1_2_3_daemons() {
    let nats = NatsCluster::start().await;
    let urls = nats.urls();
    let dir = tempfile::tempdir().unwrap();
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(nats.tenant_client("acme", Duration::from_secs(10)).await);
    }
    let mut daemons = Vec::new();
    let mut rates = Vec::new();
    for k in 1..=3 {
        let owners = add_daemon(&mut daemons, dir.path(), &urls).await;
        gate_load(&clients, &format!("warm{k}"), WARM_UP).await;
        let figure = gate_load(&clients, &format!("bench{k}"), BENCH_GATES).await;
        eprintln!(
            "{k} daemon(s) {owners:?}: {:.0} gates/s, p50 {} µs, p99 {} µs \
             ({BENCH_GATES} calls, {IN_FLIGHT} in flight, {} asked again)",
            figure.per_second,
            figure.p50.as_micros(),
            figure.p99.as_micros(),
            figure.retried
        );
        rates.push(figure.per_second);
    }
    eprintln!(
        "scaling: k=2/k=1 = {:.2}, k=3/k=1 = {:.2} (on {} cores, NATS and clients included)",
        rates[1] / rates[0],
        rates[2] / rates[0],
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
}
