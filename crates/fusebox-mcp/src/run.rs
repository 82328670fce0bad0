//! One MCP session = one fusebox run: its identity, the events the gateway sends for it
//! (in the run's order: `order.rs`), and its latch (the stop that refuses every later
//! call, from a gate answer, a result's answer or the kill switch).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::StatusCode;
use fusebox_client::{FuseboxClient, Gate};
use fusebox_core::decision::Decision;
use fusebox_core::event::{Effect, EventBody, RunFinished, RunStarted, ToolResult};
use fusebox_core::Event;
use futures_util::StreamExt;
use rmcp::model::{CallToolResult, JsonObject};

use crate::mapping;
use crate::order::RunOrder;

/// Who the run is, as the operator will look it up (`fusebox run TENANT/RUN`).
#[derive(Debug, Clone)]
pub struct RunIdentity {
    pub tenant: String,
    pub run: String,
    /// The run id was made for this session (no `--run`): the session's end finishes it.
    pub fresh: bool,
    pub agent: Option<String>,
    /// The guarded run that started this session's agent, when it said so.
    pub parent: Option<String>,
    /// The root of the parent's tree, when the parent is itself a sub-agent.
    pub root: Option<String>,
}

impl RunIdentity {
    /// `run` from the flags or environment, else `mcp-<time>-<pid>-<n>`: unique per
    /// session of this process and across processes.
    pub fn for_session(tenant: &str, run: Option<&str>, agent: Option<&str>) -> Self {
        static SESSIONS: AtomicU64 = AtomicU64::new(0);
        let (run, fresh) = match run {
            Some(run) => (run.to_owned(), false),
            None => (
                format!(
                    "mcp-{:x}-{:x}-{}",
                    now_ms(),
                    std::process::id(),
                    SESSIONS.fetch_add(1, Ordering::Relaxed)
                ),
                true,
            ),
        };
        RunIdentity {
            tenant: tenant.to_owned(),
            run,
            fresh,
            agent: agent.map(str::to_owned),
            parent: None,
            root: None,
        }
    }

    /// The root of the session's tree: the token its subjects carry before the run, so
    /// that a cluster serves the session with its tree ([`FuseboxClient::gate_in_tree`]).
    pub fn tree_root(&self) -> &str {
        self.root
            .as_deref()
            .or(self.parent.as_deref())
            .unwrap_or(&self.run)
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The guard side of one session.
pub struct GuardedRun {
    pub id: RunIdentity,
    client: FuseboxClient,
    /// Event ids are `<session nonce>-<n>`: unique even when `--run` names a run an
    /// earlier session already used (a re-used id would get that session's decision).
    nonce: String,
    counter: AtomicU64,
    order: RunOrder,
    latch: Arc<Mutex<Option<CallToolResult>>>,
    watcher: tokio::task::JoinHandle<()>,
    finished: AtomicBool,
}

impl Drop for GuardedRun {
    /// A session that ends without [`GuardedRun::finish`] (an HTTP session dropped by
    /// the SDK) still closes the run it made.
    fn drop(&mut self) {
        self.watcher.abort();
        if self.id.fresh && !self.finished.load(Ordering::Relaxed) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let event = self.finish_event();
                let client = self.client.clone();
                let root = self.id.tree_root().to_owned();
                runtime.spawn(async move { client.gate_in_tree(&root, &event).await });
            }
        }
    }
}

impl GuardedRun {
    pub fn start(client: FuseboxClient, id: RunIdentity) -> Self {
        let latch = Arc::new(Mutex::new(None));
        let watcher = tokio::spawn(watch_kill_switch(
            client.clone(),
            id.tenant.clone(),
            id.run.clone(),
            latch.clone(),
        ));
        GuardedRun {
            nonce: format!("{:x}{:x}", now_ms(), std::process::id()),
            counter: AtomicU64::new(0),
            order: RunOrder::new(id.fresh),
            client,
            id,
            latch,
            watcher,
            finished: AtomicBool::new(false),
        }
    }

    fn next_id(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
        format!("{}-{n}", self.nonce)
    }

    fn event(&self, body: EventBody) -> Event {
        self.place().with(body)
    }

    /// The next event's place in the run: its id, `seq` and time.
    fn place(&self) -> Place {
        Place {
            id: self.next_id(),
            tenant: self.id.tenant.clone(),
            run: self.id.run.clone(),
            seq: self.order.next_seq(),
            ts_ms: now_ms(),
        }
    }

    /// A fresh call id for the guard (the MCP request id is the agent's, not unique
    /// across sessions of one run).
    pub fn call_id(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
        format!("{}-c{n}", self.nonce)
    }

    /// The stop this session is latched on, if any.
    pub fn latched(&self) -> Option<CallToolResult> {
        self.latch.lock().expect("latch lock").clone()
    }

    pub fn latch(&self, result: CallToolResult) {
        self.latch.lock().expect("latch lock").get_or_insert(result);
    }

    /// `run_started` for a run this session made (or when an agent name selects a policy,
    /// or a parent run is named: the session's run joins its tree).
    pub async fn announce(&self) {
        if !self.id.fresh && self.id.agent.is_none() && self.id.parent.is_none() {
            return;
        }
        let event = self.event(EventBody::RunStarted(RunStarted {
            agent: self.id.agent.clone(),
            parent: self.id.parent.clone(),
            ..RunStarted::default()
        }));
        if let Gate::Unanswered { error, .. } = self.send(&event).await {
            tracing::warn!(%error, "run_started not delivered");
        }
    }

    /// Gates `event`. A numbered event that gets no decision leaves the session
    /// unnumbered (see `order.rs`).
    async fn send(&self, event: &Event) -> Gate {
        let answer = self.client.gate_in_tree(self.id.tree_root(), event).await;
        if event.seq.is_some() && !matches!(answer, Gate::Decided(_)) {
            self.order.unnumber();
        }
        answer
    }

    /// When the session ends: the results still in flight are answered (the process may
    /// exit next), then `run_finished` goes, for a run this session made.
    pub async fn finish(&self) {
        self.order.release_all();
        self.order.settled().await;
        if !self.id.fresh || self.finished.swap(true, Ordering::Relaxed) {
            return;
        }
        let event = self.finish_event();
        if let Gate::Unanswered { error, .. } = self.send(&event).await {
            tracing::warn!(%error, "run_finished not delivered");
        }
    }

    fn finish_event(&self) -> Event {
        self.event(EventBody::RunFinished(RunFinished {
            status: Some("mcp_session_closed".to_owned()),
        }))
    }

    pub async fn gate_call(
        &self,
        call_id: &str,
        tool: &str,
        arguments: Option<&JsonObject>,
        op_key: Option<String>,
        effect: Option<Effect>,
    ) -> Gate {
        self.order.ready_for_call().await;
        let event = self.event(EventBody::ToolCall(mapping::tool_call(
            call_id, tool, arguments, op_key, effect,
        )));
        let mut call = std::pin::pin!(self.send(&event));
        // The first poll puts the call on the connection; the results numbered before it
        // follow it (see `order.rs`: held for them, the call commits with them).
        let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
        match first {
            Poll::Ready(answer) => answer,
            Poll::Pending => {
                if let Some(seq) = event.seq {
                    self.order.release(seq);
                }
                call.await
            }
        }
    }

    /// Reports the call's outcome on the gate subject without waiting for its commit.
    /// Its place in the run's order is taken now, before the agent sees the result, so
    /// the daemon applies it before the session's next call (`order.rs`); the outcome
    /// itself is made off the agent's path (for a large result, its copy into JSON, its
    /// size and hash are the gateway's largest cost). A stop in the answer latches the
    /// session; the daemon answers the next call with that stop too.
    pub fn report<F>(self: &Arc<Self>, outcome: F)
    where
        F: FnOnce() -> ToolResult + Send + 'static,
    {
        let in_flight = self.order.reporting();
        let place = self.place();
        let run = self.clone();
        tokio::spawn(async move {
            let event = place.with(EventBody::ToolResult(outcome()));
            run.order.until_released(event.seq).await;
            run.deliver_result(event).await;
            drop(in_flight);
        });
    }

    async fn deliver_result(&self, mut event: Event) {
        let mut answer = self.client.gate_in_tree(self.id.tree_root(), &event).await;
        if let (Gate::Refused(error), EventBody::ToolResult(result)) = (&answer, &mut event.body) {
            // Past this daemon's `max_event_bytes` (below `max_stored_result_bytes`). The
            // refused event was never admitted: its `seq` is the hash's.
            if error.reason == "too_large" && result.hash_output() {
                tracing::warn!(message = %error.message, "tool_result too large for fuseboxd; sending its hash");
                event.id = self.next_id();
                answer = self.client.gate_in_tree(self.id.tree_root(), &event).await;
            }
        }
        if event.seq.is_some() && !matches!(answer, Gate::Decided(_)) {
            self.order.unnumber();
        }
        match answer {
            Gate::Decided(decision) if decision.report.is_some() => {
                self.latch(mapping::stop_result(&decision));
            }
            Gate::Decided(_) => {}
            Gate::Refused(error) => {
                tracing::error!(reason = %error.reason, message = %error.message, "fuseboxd refused a tool_result");
            }
            Gate::Unanswered { error, .. } => {
                tracing::error!(%error, "tool_result not delivered: the guard did not answer");
            }
        }
    }
}

/// Where an event goes in its run, taken before its body is made.
struct Place {
    id: String,
    tenant: String,
    run: String,
    seq: Option<u64>,
    ts_ms: u64,
}

impl Place {
    fn with(self, body: EventBody) -> Event {
        Event {
            v: 1,
            id: self.id,
            tenant: self.tenant,
            run: self.run,
            seq: self.seq,
            ts_ms: self.ts_ms,
            body,
        }
    }
}

/// Watches the run's kill switch for the session's life, as the tenant-permitted wire
/// form says: subscribe to the live stop subject, flush, then look up the kept stop
/// with a JetStream direct get (404: none). An unreachable NATS is retried every
/// second; gate requests meanwhile fail on their own timeout.
async fn watch_kill_switch(
    client: FuseboxClient,
    tenant: String,
    run: String,
    latch: Arc<Mutex<Option<CallToolResult>>>,
) {
    let subject = format!("fusebox.stop.{tenant}.{run}");
    let nats = client.nats().clone();
    let apply = |payload: &[u8]| match serde_json::from_slice::<Decision>(payload) {
        Ok(decision) => {
            tracing::warn!(tenant = %tenant, run = %run, "kill switch: the run was stopped");
            latch
                .lock()
                .expect("latch lock")
                .get_or_insert(mapping::stop_result(&decision));
        }
        Err(err) => tracing::warn!(%err, "undecodable message on the kill switch"),
    };
    loop {
        let mut live = match nats.subscribe(subject.clone()).await {
            Ok(live) => live,
            Err(err) => {
                tracing::debug!(%err, "kill switch: cannot subscribe yet");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if nats.flush().await.is_err() {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        let kept = format!("$JS.API.DIRECT.GET.FUSEBOX_STOPS.{subject}");
        let lookup = async_nats::Request::new()
            .payload(Vec::new().into())
            .timeout(Some(client.options().timeout));
        match nats.send_request(kept, lookup).await {
            Ok(message) if message.status.is_none() => apply(&message.payload),
            Ok(message) if message.status == Some(StatusCode::NOT_FOUND) => {}
            Ok(message) => {
                tracing::debug!(status = ?message.status, "kill switch: no kept stop lookup")
            }
            Err(err) => tracing::debug!(%err, "kill switch: kept stop lookup failed"),
        }
        while let Some(message) = live.next().await {
            apply(&message.payload);
        }
        // The subscription ended (connection closed): start over.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
