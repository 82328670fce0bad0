//! [`RunHandle`]: one agent run behind the guard. It owns the envelope of guard contract
//! §2 — event ids, `seq`, `ts_ms`, `run_started` — so an agent only says what happened.
//!
//! Ids are `<run>-<seq>`: deterministic per event, so an event re-sent after a timeout
//! is answered from the daemon's dedup (the same decision), never applied twice. The one
//! exception is `run_started`, `<run>-1.<handle nonce>`, always inline: a second handle
//! for a run id the daemon already has (a restarted worker) is refused at start with
//! [`ClientError::RunExists`] instead of being answered the old process's decisions.
//!
//! Ordering: the daemon applies a run's events by `seq` and holds an event whose `seq`
//! is ahead of a missing one, so a lost event would stall the run. An event whose
//! delivery failed (timeout, no daemon, no JetStream ack) therefore stays queued and is
//! re-sent — same id, same bytes — before anything newer; one lock per run keeps sends
//! in order (parallel calls of one turn are gated one after the other). An event the
//! daemon *refused* was not applied: it leaves the queue and the events behind it move
//! down one `seq`.
//!
//! Kill switch: [`FuseboxClient::start_run`] watches the run's stop subject and learns a
//! stop kept from before (see `stop.rs`) before it sends anything; once the run is known
//! to be stopped (kill switch, gate or observe answer), a tool call is refused without
//! a round trip. This is the same handle as the Python client's `Run`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use fusebox_core::event::{
    Args, Compaction, InstanceLaunched, ModelCall, ModelTurn, ProgressUpdate, RunFinished,
    RunStarted, ToolCall, ToolResult,
};
use fusebox_core::{Action, Decision, Event, EventBody};
use fusebox_nats::subjects;
use serde_json::Value;
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;

use crate::client::{FuseboxClient, Gate, GateOnError};
use crate::error::ClientError;

/// How the run's events other than tool calls reach the daemon. Tool calls always go
/// inline: the agent needs the decision before the tool runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Delivery {
    /// On the gate subject, answered with the observe decision (`continue`,
    /// `retry_after`, `stop` …).
    #[default]
    Inline,
    /// To JetStream (`Nats-Msg-Id` = the event id), acked once stored; no decision.
    Passive,
}

/// What `run_started` says, and how the run talks to the daemon.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub agent: Option<String>,
    pub tools: Option<Vec<String>>,
    /// Per-run policy overrides (guard contract §3), merged over the agent's policy.
    pub policy: Option<Value>,
    /// The run that started this one (a sub-agent's parent, guard contract §6): the
    /// parent's budgets count this run's spending, and its stop reaches this run.
    pub parent: Option<String>,
    /// The root of the parent's tree, when the parent is itself a sub-agent (a handle's
    /// [`RunHandle::root`]); `None` takes the parent for the root. The run's subjects
    /// name it, so that in a cluster a whole tree is served by its root's partition and
    /// the tree's budgets stay exact (deploy/nats/partitions.conf).
    pub root: Option<String>,
    pub delivery: Delivery,
}

impl RunOptions {
    /// Options for a sub-agent of `parent`: its parent and its tree's root set.
    pub fn child_of(parent: &RunHandle) -> RunOptions {
        RunOptions {
            parent: Some(parent.run().to_owned()),
            root: Some(parent.root().to_owned()),
            ..RunOptions::default()
        }
    }
}

struct Queued {
    event: Event,
    inline: bool,
}

/// The run's `seq` counter and the events not yet delivered, oldest first.
#[derive(Default)]
struct Envelope {
    seq: u64,
    calls: u64,
    queue: VecDeque<Queued>,
    /// The daemon said the run id is another process's (`run_exists`): nothing more is
    /// sent, since a later id would be that process's, answered from the dedup.
    exists: Option<String>,
}

/// One run. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct RunHandle {
    client: FuseboxClient,
    tenant: String,
    run: String,
    /// The root of the run's tree (the run itself for a root): the token its subjects
    /// carry before the run.
    root: String,
    delivery: Delivery,
    envelope: Mutex<Envelope>,
    stop: Arc<watch::Sender<Option<Decision>>>,
    watcher: JoinHandle<()>,
    /// Makes this handle's `run_started` id its own (see the module docs).
    nonce: String,
}

impl FuseboxClient {
    /// Starts watching the run's kill switch (a stop kept from before included), then
    /// sends `run_started` — unless the run is already known to be stopped, in which
    /// case nothing is sent and every tool call is refused.
    ///
    /// When the kept stop cannot be looked up (timeout, no JetStream answer), the
    /// client's [`GateOnError`] decides, as for an unanswered gate: `Deny` returns the
    /// error (do not start the run), `Allow` goes on with the live kill switch only.
    pub async fn start_run(
        &self,
        tenant: &str,
        run: &str,
        options: RunOptions,
    ) -> Result<RunHandle, ClientError> {
        let watch = match self.watch_stop(tenant, run).await {
            Ok(watch) => watch,
            Err(err) if self.options.gate_on_error == GateOnError::Allow => {
                tracing::warn!(%err, tenant, run, "kept stop unknown; watching live stops only");
                self.watch_live_stops(tenant, run).await?
            }
            Err(err) => return Err(err),
        };
        let (stop, _) = watch::channel(None);
        let stop = Arc::new(stop);
        if let Some(kept) = watch.kept() {
            latch(&stop, kept.clone());
        }
        let watcher = tokio::spawn(follow(watch, stop.clone()));
        let root = options
            .root
            .or_else(|| options.parent.clone())
            .unwrap_or_else(|| run.to_owned());
        let handle = RunHandle {
            client: self.clone(),
            tenant: tenant.to_owned(),
            run: run.to_owned(),
            root,
            delivery: options.delivery,
            envelope: Mutex::new(Envelope::default()),
            stop,
            watcher,
            nonce: handle_nonce(),
        };
        if handle.stopped().is_none() {
            let started = EventBody::RunStarted(RunStarted {
                agent: options.agent,
                tools: options.tools,
                policy: options.policy,
                parent: options.parent,
            });
            // Inline whatever the delivery: a refusal must reach the caller.
            handle.send(started, true).await?;
        }
        Ok(handle)
    }
}

async fn follow(mut watch: crate::stop::StopWatch, stop: Arc<watch::Sender<Option<Decision>>>) {
    while let Some(next) = watch.next().await {
        match next {
            Ok(decision) => latch(&stop, decision),
            Err(err) => tracing::warn!(%err, "undecodable message on the kill switch"),
        }
    }
}

/// Records the first stop; later ones (a duplicate, a second report) change nothing.
fn latch(stop: &watch::Sender<Option<Decision>>, decision: Decision) {
    if decision.action == Action::Stop {
        stop.send_if_modified(|known| {
            if known.is_some() {
                return false;
            }
            *known = Some(decision);
            true
        });
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl RunHandle {
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The root of the run's tree: the run itself, unless it was started with a parent.
    pub fn root(&self) -> &str {
        &self.root
    }

    pub fn run(&self) -> &str {
        &self.run
    }

    /// The stop decision (with its report) once the run is known to be stopped.
    pub fn stopped(&self) -> Option<Decision> {
        self.stop.borrow().clone()
    }

    /// Waits until the run is stopped (kill switch, or a stop answered to this handle).
    pub async fn wait_stopped(&self) -> Decision {
        let mut seen = self.stop.subscribe();
        let stop = seen
            .wait_for(Option::is_some)
            .await
            .expect("the handle holds the sender");
        stop.clone().expect("waited for Some")
    }

    /// A call id for producers whose framework has none: `<run>-call-<n>`.
    pub async fn next_call_id(&self) -> String {
        let mut envelope = self.envelope.lock().await;
        envelope.calls += 1;
        format!("{}-call-{}", self.run, envelope.calls)
    }

    /// Asks whether `tool` may run with `args`; returns the call id to report its result
    /// with, and the gate's answer ([`Gate::may_run`]).
    pub async fn call(&self, tool: &str, args: Value) -> (String, Gate) {
        let call_id = self.next_call_id().await;
        let gate = self
            .tool_call(ToolCall {
                call_id: call_id.clone(),
                tool: tool.to_owned(),
                args: Args::Json(args),
                op_key: None,
                effect: None,
            })
            .await;
        (call_id, gate)
    }

    /// Gates a tool call (with `op_key`, `effect`, `args` or `args_hash` as given). A run
    /// known to be stopped is refused without a round trip, with its stop.
    pub async fn tool_call(&self, call: ToolCall) -> Gate {
        if let Some(stop) = self.stopped() {
            return Gate::Decided(Decision {
                call_id: Some(call.call_id),
                ..stop
            });
        }
        match self.send(EventBody::ToolCall(call), true).await {
            Ok(Some(decision)) => Gate::Decided(decision),
            Ok(None) => unreachable!("an inline send answers with a decision"),
            Err(ClientError::Refused(error)) => Gate::Refused(error),
            // Never `gate_on_error`: the daemon answered, and the run is not this process's.
            Err(ClientError::RunExists { message, .. }) => {
                Gate::Refused(fusebox_nats::wire::WireError {
                    reason: "run_exists".to_owned(),
                    message,
                    event_id: None,
                })
            }
            Err(error) => Gate::Unanswered {
                error,
                allowed: self.client.options.gate_on_error == GateOnError::Allow,
            },
        }
    }

    /// Reports how a call ended (kind, code, retry_after_ms, output or output_hash,
    /// progress, terminal). Inline delivery returns the observe decision.
    pub async fn tool_result(&self, result: ToolResult) -> Result<Option<Decision>, ClientError> {
        self.observe(EventBody::ToolResult(result)).await
    }

    /// Asks, before the agent calls its model, whether a token, cost or model-turn
    /// budget (this run's, or a run's above it counting its tree) has room for the call;
    /// the guard holds what it reserves (the estimate, else this run's mean per model
    /// turn) until the next [`RunHandle::model_turn`]. Always inline: the answer must
    /// come before the model is called; a `stop` means the call must not be made.
    pub async fn model_call(
        &self,
        estimate_tokens: Option<u64>,
        estimate_usd: Option<f64>,
    ) -> Result<Option<Decision>, ClientError> {
        let call = ModelCall {
            estimate_tokens,
            estimate_usd,
        };
        self.send(EventBody::ModelCall(call), true).await
    }

    /// One model turn: why it ended, its usage (cache tokens included) and cost.
    pub async fn model_turn(&self, turn: ModelTurn) -> Result<Option<Decision>, ClientError> {
        self.observe(EventBody::ModelTurn(turn)).await
    }

    /// The agent's own progress counter moved to `version`.
    pub async fn progress(
        &self,
        version: u64,
        note: Option<String>,
    ) -> Result<Option<Decision>, ClientError> {
        self.observe(EventBody::Progress(ProgressUpdate { version, note }))
            .await
    }

    /// The agent compacted its context.
    pub async fn compaction(
        &self,
        reason: Option<String>,
    ) -> Result<Option<Decision>, ClientError> {
        self.observe(EventBody::Compaction(Compaction { reason }))
            .await
    }

    /// A cloud instance was launched for this run (the daemon's watchdog tears it down
    /// if the run ends and it is still up).
    pub async fn instance_launched(
        &self,
        launched: InstanceLaunched,
    ) -> Result<Option<Decision>, ClientError> {
        self.observe(EventBody::InstanceLaunched(launched)).await
    }

    /// `run_finished`: the agent closes the run.
    pub async fn finish(&self, status: Option<String>) -> Result<Option<Decision>, ClientError> {
        self.observe(EventBody::RunFinished(RunFinished { status }))
            .await
    }

    /// Any event body, enveloped like the rest, inline or passive as asked.
    pub async fn send(
        &self,
        body: EventBody,
        inline: bool,
    ) -> Result<Option<Decision>, ClientError> {
        let mut envelope = self.envelope.lock().await;
        if let Some(message) = &envelope.exists {
            return Err(self.run_exists(message.clone()));
        }
        envelope.seq += 1;
        let seq = envelope.seq;
        let id = match body {
            EventBody::RunStarted(_) => format!("{}-{seq}.{}", self.run, self.nonce),
            _ => format!("{}-{seq}", self.run),
        };
        envelope.queue.push_back(Queued {
            event: Event {
                v: 1,
                id,
                tenant: self.tenant.clone(),
                run: self.run.clone(),
                seq: Some(seq),
                ts_ms: now_ms(),
                body,
            },
            inline,
        });
        self.flush(&mut envelope).await
    }

    fn run_exists(&self, message: String) -> ClientError {
        ClientError::RunExists {
            tenant: self.tenant.clone(),
            run: self.run.clone(),
            message,
        }
    }

    async fn observe(&self, body: EventBody) -> Result<Option<Decision>, ClientError> {
        self.send(body, self.delivery == Delivery::Inline).await
    }

    /// Delivers the queue in order; the answer is the newest event's (the caller's).
    /// Stops at the first failure, leaving that event and everything after it queued.
    async fn flush(&self, envelope: &mut Envelope) -> Result<Option<Decision>, ClientError> {
        let mut answer = None;
        while let Some(head) = envelope.queue.front() {
            let last = envelope.queue.len() == 1;
            let delivered = if head.inline {
                let subject = subjects::tree_gate(&self.tenant, &self.root, &self.run);
                self.client
                    .request::<Decision>(subject, payload(&head.event))
                    .await
                    .map(Some)
            } else {
                let event = &head.event;
                let subject = subjects::tree_events(&self.tenant, &self.root, &self.run);
                self.client
                    .report_on(
                        subject,
                        &event.tenant,
                        &event.run,
                        &event.id,
                        payload(event),
                    )
                    .await
                    .map(|()| None)
            };
            match delivered {
                Ok(decision) => {
                    envelope.queue.pop_front();
                    if let Some(decision) = &decision {
                        latch(&self.stop, decision.clone());
                    }
                    answer = decision;
                }
                Err(ClientError::Refused(error)) if error.reason == "run_exists" => {
                    // A queued run_started (the daemon was unreachable at start) for a run
                    // id another process has: drop everything, send nothing more.
                    envelope.queue.clear();
                    envelope.exists = Some(error.message.clone());
                    return Err(self.run_exists(error.message));
                }
                Err(ClientError::Refused(error)) => {
                    let refused = envelope.queue.pop_front().expect("the head");
                    renumber(envelope, &self.run, refused.event.seq.expect("numbered"));
                    if last {
                        return Err(ClientError::Refused(error));
                    }
                    tracing::warn!(reason = %error.reason, "an earlier event was refused: {}", error.message);
                }
                Err(err) => return Err(err),
            }
        }
        Ok(answer)
    }
}

/// Tells this process's handles apart from another's for the same run id: the clock's
/// nanoseconds and the process id, in hex.
fn handle_nonce() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("{:x}", nanos ^ (u64::from(std::process::id()) << 48))
}

fn payload(event: &Event) -> Vec<u8> {
    serde_json::to_vec(event).expect("events serialise")
}

/// The events behind a refused one take its `seq` and the ones after, so the run has no
/// gap the daemon would wait for.
fn renumber(envelope: &mut Envelope, run: &str, free: u64) {
    let mut seq = free;
    for queued in &mut envelope.queue {
        queued.event.seq = Some(seq);
        queued.event.id = format!("{run}-{seq}");
        seq += 1;
    }
    envelope.seq = seq - 1;
}

impl Drop for RunHandle {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_core::event::Tick;

    fn queued(run: &str, seq: u64) -> Queued {
        Queued {
            event: Event {
                v: 1,
                id: format!("{run}-{seq}"),
                tenant: "t".into(),
                run: run.into(),
                seq: Some(seq),
                ts_ms: 1,
                body: EventBody::Tick(Tick {}),
            },
            inline: true,
        }
    }

    #[test]
    fn events_behind_a_refused_one_close_the_gap() {
        let mut envelope = Envelope {
            seq: 5,
            calls: 0,
            queue: [queued("r", 4), queued("r", 5)].into(),
            exists: None,
        };
        renumber(&mut envelope, "r", 3);
        let ids: Vec<_> = envelope.queue.iter().map(|q| q.event.id.as_str()).collect();
        assert_eq!(ids, ["r-3", "r-4"]);
        assert_eq!(envelope.seq, 4);
    }
}
