//! An agent fleet for the cluster suites: agent tasks over tenants, each asking the gate
//! (retrying the same event until answered, as the client contract says) and reporting
//! through JetStream, with everything they sent and got recorded; and the checks every
//! cluster test ends on (at most one execution per op_key, every answer repeated
//! identically, every acknowledged event in its run's state, side-effect-free runs equal
//! to the offline engine).
//!
//! An agent may hold several connections ("sides", e.g. the two sides of a network
//! partition): an attempt left unanswered on one is asked again on the next, and each
//! answer records the side it came through.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use fusebox_client::{ClientError, FuseboxClient, Gate};
use fusebox_core::{Action, Decision, Event, EventBody, LedgerEntry};
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::engine::{event, now_ms, offline_engine};

pub const TENANTS: [&str; 2] = ["acme", "globex"];
/// One gate attempt; a real agent retries the same event after this.
pub const GATE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long an agent keeps retrying one gate request or report before giving up.
pub const RIDE_OUT: Duration = Duration::from_secs(60);
/// Pause between an agent's steps, so runs are still going when something is killed.
pub const PACE: Duration = Duration::from_millis(30);
pub const PAGES: u64 = 10;

#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
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
    pub fn is_isolated(&self) -> bool {
        !matches!(self, Kind::Op(_))
    }
}

/// One gate request as the agent saw it.
pub struct Gated {
    /// Index into the run's `events`.
    pub event: usize,
    pub decision: Decision,
    /// When the last attempt (the answered one) was sent, and when it was answered.
    pub last_sent: Instant,
    pub answered: Instant,
    pub attempts: u32,
    /// The side (index into the agent's connections) that answered.
    pub side: usize,
}

/// Everything one agent sent and got.
pub struct RunLog {
    pub tenant: String,
    pub run: String,
    pub kind: Kind,
    /// Acknowledged events in `seq` order (gate answered, or stored by JetStream).
    pub events: Vec<Event>,
    pub gates: Vec<Gated>,
    /// The outputs this run reported for side effects it executed, by op_key.
    pub executed: Vec<(String, Value)>,
}

/// A gate request as answered.
pub struct Asked {
    pub decision: Decision,
    pub attempts: u32,
    /// When the answered attempt was sent.
    pub sent: Instant,
    /// The side that answered.
    pub side: usize,
}

/// Asks the gate about `event` until it is answered, up to `RIDE_OUT`, starting on
/// side `side` and moving to the next side after each unanswered attempt.
pub async fn ask(sides: &[FuseboxClient], mut side: usize, event: &Event) -> Asked {
    let first = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let sent = Instant::now();
        match sides[side].gate(event).await {
            Gate::Decided(decision) => {
                return Asked {
                    decision,
                    attempts,
                    sent,
                    side,
                }
            }
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
                side = (side + 1) % sides.len();
            }
        }
    }
}

struct Agent {
    sides: Vec<FuseboxClient>,
    /// The side the agent asks first: the one that answered it last.
    side: usize,
    answered: Arc<AtomicUsize>,
    log: RunLog,
}

/// Starts the agent of one run of `kind` on connections `sides`, asking on `side` first;
/// `answered` counts its gate answers.
pub fn spawn_agent(
    (tenant, run, kind): (String, String, Kind),
    sides: Vec<FuseboxClient>,
    side: usize,
    answered: &Arc<AtomicUsize>,
) -> JoinHandle<RunLog> {
    let agent = Agent {
        sides,
        side,
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
        let asked = ask(&self.sides, self.side, &event).await;
        self.side = asked.side;
        self.answered.fetch_add(1, Ordering::Relaxed);
        self.log.gates.push(Gated {
            event: self.log.events.len(),
            decision: asked.decision.clone(),
            last_sent: asked.sent,
            answered: Instant::now(),
            attempts: asked.attempts,
            side: asked.side,
        });
        self.log.events.push(event);
        asked.decision
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
        while let Err(error) = self.sides[self.side].report(&event).await {
            assert!(
                first.elapsed() < RIDE_OUT,
                "{}: report {} not acknowledged for {RIDE_OUT:?}: {error}",
                event.run,
                event.id
            );
            self.side = (self.side + 1) % self.sides.len();
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

pub fn op_key_of(event: &Event) -> Option<&str> {
    match &event.body {
        EventBody::ToolCall(call) => call.op_key.as_deref(),
        _ => None,
    }
}

/// The shared op_key of pair `j` of a tenant.
pub fn op_key(tenant: &str, j: usize) -> String {
    format!("{tenant}:INC-{j}:notify")
}

/// Waits until `answered` reaches `target` gate answers (the load is well under way).
pub async fn wait_answers(answered: &AtomicUsize, target: usize, fleet: &[JoinHandle<RunLog>]) {
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

pub async fn join(fleet: Vec<JoinHandle<RunLog>>) -> Vec<RunLog> {
    let mut logs = Vec::new();
    for agent in fleet {
        logs.push(agent.await.expect("an agent failed (see its panic above)"));
    }
    logs
}

/// The stop kept on a run's kill switch (FUSEBOX_STOPS, last message of its subject).
pub async fn kept_stop(
    stops: &jetstream::stream::Stream,
    tenant: &str,
    run: &str,
) -> Option<Decision> {
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
pub async fn retry<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
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

/// Per run: runaway runs are stopped (and the stop is kept on the kill switch), legit
/// runs are never refused and complete, and isolated runs get the offline engine's
/// decisions, kill-switch message included.
pub async fn check_runs(logs: &[RunLog], config: &Path, admin: &jetstream::Context) {
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
/// Returns the (tenant, op_key)s that executed.
pub fn check_exactly_once(logs: &[RunLog]) -> BTreeSet<(String, String)> {
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
                    .push(format!(
                        "{}/{} ({:?} {:?}, side {}, {} attempts)",
                        log.run,
                        gated.decision.event_id,
                        gated.decision.action,
                        gated.decision.reason,
                        gated.side,
                        gated.attempts
                    ));
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
    assert!(across_runs > 0, "no run got another run's stored result");
    eprintln!(
        "op_keys executed: {} (once each); {across_runs} calls answered with another run's result",
        executed.len()
    );
    outputs
        .keys()
        .map(|(tenant, key)| (tenant.to_string(), key.to_string()))
        .collect()
}

/// Every acknowledged event is in its run's state on whichever daemon owns it now
/// (JetStream events may still be on their way: polled for up to 120 s — after a split
/// heals on 2 cores, the owners' catch-up has taken over a minute), and the legit runs
/// completed. Lists every run that falls short, and says how long the wait took.
pub async fn check_acknowledged_events_applied(logs: &[RunLog], operator: &FuseboxClient) {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(120);
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
            eprintln!(
                "every acknowledged event applied after {} ms of polling",
                started.elapsed().as_millis()
            );
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

/// No op_key is left in flight in the cluster's shared ledger (`FUSEBOX_LEDGER`): every
/// run that executed one reported its result, and the partitions' owners wrote back the
/// outcomes they caught up (a minority owner cut off at its fence commits outcomes it can
/// no longer write), so after a heal no key needs an operator's `fusebox ledger resolve`.
pub async fn check_no_key_in_flight(admin: &jetstream::Context) {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(30);
    loop {
        let kv = retry("FUSEBOX_LEDGER", || admin.get_key_value("FUSEBOX_LEDGER")).await;
        let mut keys = retry("ledger keys", || kv.keys()).await;
        let (mut in_flight, mut settled) = (Vec::new(), 0);
        while let Some(key) = keys.next().await {
            let key = key.expect("a ledger key");
            let value = retry("a ledger entry", || kv.get(key.clone())).await;
            let entry: Option<LedgerEntry> = value
                .map(|bytes| serde_json::from_slice(bytes.as_ref()).expect("a ledger entry's JSON"))
                .unwrap_or_default();
            match entry {
                Some(entry @ LedgerEntry::InFlight { .. }) => {
                    in_flight.push(format!("{key}: {entry:?}"))
                }
                Some(LedgerEntry::Completed { .. }) => settled += 1,
                None => {}
            }
        }
        if in_flight.is_empty() {
            eprintln!(
                "shared ledger: {settled} op_keys completed, none in flight after {} ms",
                started.elapsed().as_millis()
            );
            assert!(settled > 0, "no op_key completed in the shared ledger");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} op_keys still in flight in the shared ledger: {in_flight:#?}",
            in_flight.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every gate request asked again after all that gets its original decision (an agent
/// whose answer was lost asks again: a different answer, e.g. `execute` where it was
/// `use_completed_result`, would run a side effect twice).
pub async fn check_answers_repeat(logs: &[RunLog], clients: &HashMap<String, FuseboxClient>) {
    let mut asked = 0;
    for log in logs {
        for gated in &log.gates {
            let event = &log.events[gated.event];
            let answer = ask(std::slice::from_ref(&clients[&log.tenant]), 0, event).await;
            assert_eq!(
                answer.decision, gated.decision,
                "{}: event {} re-asked",
                log.run, event.id
            );
            asked += 1;
        }
    }
    eprintln!("{asked} gate requests re-asked: identical answers");
}
