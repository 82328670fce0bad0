//! One MCP session = one fusebox run: its identity, the events the gateway sends for it,
//! and its latch (the stop that refuses every later call, from a gate answer or from
//! the kill switch).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::StatusCode;
use fusebox_client::{FuseboxClient, Gate};
use fusebox_core::decision::Decision;
use fusebox_core::event::{Effect, EventBody, Output, RunFinished, RunStarted, ToolResult};
use fusebox_core::Event;
use futures_util::StreamExt;
use rmcp::model::{CallToolResult, JsonObject};

use crate::mapping;

/// Who the run is, as the operator will look it up (`fusebox run TENANT/RUN`).
#[derive(Debug, Clone)]
pub struct RunIdentity {
    pub tenant: String,
    pub run: String,
    /// The run id was made for this session (no `--run`): the session's end finishes it.
    pub fresh: bool,
    pub agent: Option<String>,
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
        }
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
                runtime.spawn(async move { client.gate(&event).await });
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
            client,
            id,
            latch,
            watcher,
            finished: AtomicBool::new(false),
        }
    }

    fn event(&self, body: EventBody) -> Event {
        let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
        Event {
            v: 1,
            id: format!("{}-{n}", self.nonce),
            tenant: self.id.tenant.clone(),
            run: self.id.run.clone(),
            seq: None,
            ts_ms: now_ms(),
            body,
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

    /// `run_started` for a run this session made (or when an agent name selects a policy).
    pub async fn announce(&self) {
        if !self.id.fresh && self.id.agent.is_none() {
            return;
        }
        let event = self.event(EventBody::RunStarted(RunStarted {
            agent: self.id.agent.clone(),
            ..RunStarted::default()
        }));
        if let Gate::Unanswered { error, .. } = self.client.gate(&event).await {
            tracing::warn!(%error, "run_started not delivered");
        }
    }

    /// `run_finished` when the session ends, for a run this session made.
    pub async fn finish(&self) {
        if !self.id.fresh || self.finished.swap(true, Ordering::Relaxed) {
            return;
        }
        let event = self.finish_event();
        if let Gate::Unanswered { error, .. } = self.client.gate(&event).await {
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
        let event = self.event(EventBody::ToolCall(mapping::tool_call(
            call_id, tool, arguments, op_key, effect,
        )));
        self.client.gate(&event).await
    }

    /// Reports the call's outcome inline (on the gate subject), so the daemon has
    /// applied it before the agent can make its next call. A stop in the answer latches
    /// the session and is returned.
    pub async fn report(&self, result: ToolResult) -> Option<Decision> {
        let event = self.event(EventBody::ToolResult(result.clone()));
        let mut answer = self.client.gate(&event).await;
        if let Gate::Refused(error) = &answer {
            if let (Some(Output::Json(value)), "too_large") =
                (&result.output, error.reason.as_str())
            {
                // Past this daemon's `max_event_bytes` (below `max_stored_result_bytes`):
                // the hash still completes or releases the op_key, which must not stay
                // in flight for want of the result's bytes.
                tracing::warn!(message = %error.message, "tool_result too large for fuseboxd; sending its hash");
                let hashed = ToolResult {
                    output: Some(Output::inline_up_to(value.clone(), 0)),
                    ..result
                };
                answer = self
                    .client
                    .gate(&self.event(EventBody::ToolResult(hashed)))
                    .await;
            }
        }
        match answer {
            Gate::Decided(decision) if decision.report.is_some() => {
                self.latch(mapping::stop_result(&decision));
                Some(decision)
            }
            Gate::Decided(_) => None,
            Gate::Refused(error) => {
                tracing::error!(reason = %error.reason, message = %error.message, "fuseboxd refused a tool_result");
                None
            }
            Gate::Unanswered { error, .. } => {
                tracing::error!(%error, "tool_result not delivered: the guard did not answer");
                None
            }
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
