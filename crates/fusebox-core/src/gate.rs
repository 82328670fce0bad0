//! The gate (guard contract §4): one `tool_call` in, one decision out. The five layers
//! are five steps, in contract order — [`latch`], [`budget_fuse`], [`error_contract`],
//! [`loop_detection`], [`side_effect_gate`] — each of which may settle the call; what
//! none settles runs, with the first warning any of them gave. Refusals escalate into
//! a stop ([`refuse`]).

use crate::close::{self, decision, Closing};
use crate::decision::{Action, Decision, Detector, Reason, TerminalState};
use crate::detect::{self, Call, Verdict};
use crate::event::{Effect, Event, ToolCall};
use crate::fingerprint::{
    call_fingerprint_in, tool_fingerprint, wording_in, ArgFilter, Fingerprint,
};
use crate::ledger::{Ledger, LedgerEntry};
use crate::message;
use crate::policy::{Policy, StaleInFlight};
use crate::run::{honoured, Below, Entry, Outcome, PendingCall, RunState, Waiting, INTERLUDE_MAX};
use crate::tree::{self, Lineage};

/// The effect of a call: the producer's word, else the tool's policy, else `write` for a
/// call with an `op_key` (it names a side effect), else `read`.
pub(crate) fn effect_of(
    run: &RunState,
    tool: &str,
    declared: Option<Effect>,
    has_op_key: bool,
) -> Effect {
    declared
        .or_else(|| run.policy.tool(tool).and_then(|t| t.effect))
        .unwrap_or(if has_op_key {
            Effect::Write
        } else {
            Effect::Read
        })
}

/// How one layer settles a call, when it does.
enum Settled {
    /// Do not run it; the run goes on (or stops, if refusals have piled up).
    Refuse(Verdict),
    /// Do not run it; the run is over.
    Close(Closing),
    /// Do not run it; here is the stored result of the same operation.
    Answer(serde_json::Value),
}

pub(crate) fn gate(
    run: &mut RunState,
    ledger: &mut Ledger,
    scratch: &mut Vec<u8>,
    event: &Event,
    call: &ToolCall,
    lineage: &Lineage,
) -> Decision {
    let call_id = Some(call.call_id.as_str());
    if let Some(decided) = latch(run, event, call_id) {
        return decided;
    }
    if let Some(closing) = lineage.stopped().or_else(|| budget_fuse(run, lineage)) {
        run.counters.calls_refused += 1;
        return close::close(run, event, call_id, closing);
    }
    let label = || message::call_label(&call.tool, &call.args);
    let view = view_of(run, scratch, event, call, &label);
    let mut warning = None;
    let settled = error_contract(run, &view, event.ts_ms, &mut warning)
        .or_else(|| loop_detection(run, &view, lineage, &mut warning))
        .or_else(|| side_effect_gate(run, ledger, event, call, &mut warning));
    match settled {
        Some(Settled::Close(closing)) => {
            run.counters.calls_refused += 1;
            close::close(run, event, call_id, closing)
        }
        Some(Settled::Refuse(verdict)) => {
            record(run, &view, Outcome::Refused);
            refuse(run, event, call, verdict)
        }
        Some(Settled::Answer(result)) => {
            run.detection.blocks_in_row = 0;
            record(run, &view, Outcome::Answered);
            answer_from_ledger(run, event, call, result)
        }
        None => {
            run.detection.blocks_in_row = 0;
            execute(run, ledger, event, call, view, warning)
        }
    }
}

/// 4.0 Latch: a closed run answers every call with its stop (and a run whose ancestor
/// was stopped is closed by the caller, `Lineage::stopped`).
fn latch(run: &mut RunState, event: &Event, call_id: Option<&str>) -> Option<Decision> {
    let decided = close::latched(run, event, call_id)?;
    run.counters.calls_refused += 1;
    Some(decided)
}

/// 4.1 Budget fuse, for what a call can be refused before it runs: the task's active
/// time, and the run's budgets counted over its subtree (its own spending and its
/// sub-agents'), then each ancestor's over its own subtree — so a call that would pass
/// a tree's step budget is refused whatever runs beside it, and once a model turn
/// anywhere in a tree crosses its token or cost budget every later call is.
fn budget_fuse(run: &RunState, lineage: &Lineage) -> Option<Closing> {
    if run.time_budget_spent() {
        return Some(Closing::guard(Reason::TimeBudget));
    }
    tree::budget_spent(&run.policy, tree::spent(run))
        .map(Closing::guard)
        .or_else(|| lineage.budget_spent(Below::default()))
}

/// The call as the layers see it.
struct View<'a> {
    call: Call<'a>,
    /// Since when this call has waited as told, when this attempt honoured the wait.
    waiting_since: Option<u64>,
    serial: u64,
}

fn view_of<'a>(
    run: &mut RunState,
    scratch: &mut Vec<u8>,
    event: &Event,
    call: &'a ToolCall,
    label: &'a dyn Fn() -> String,
) -> View<'a> {
    let effect = effect_of(run, &call.tool, call.effect, call.op_key.is_some());
    let tool_policy = run.policy.tool(&call.tool);
    let filter = ArgFilter {
        ignore: tool_policy.map_or(&[], |t| t.ignore_args.as_slice()),
        defaults: tool_policy.map_or(&crate::fingerprint::NO_DEFAULTS, |t| &t.defaults),
    };
    let fp = call_fingerprint_in(scratch, &call.tool, &call.args, filter);
    // Only a read's answer is judged by what it asked (rewording or sweep).
    let wording = match effect {
        Effect::Read => wording_in(scratch, &call.tool, &call.args, filter),
        Effect::Write => None,
    };
    let waiting_since = waited_as_told(run, fp, event.ts_ms);
    let interlude = interlude(run, fp);
    View {
        call: Call {
            tool: &call.tool,
            tool_fp: tool_fingerprint(&call.tool),
            fp,
            effect,
            patient: waiting_since.is_some(),
            interlude,
            wording,
            label,
        },
        waiting_since,
        serial: run.detection.new_serial(),
    }
}

/// Whether a call comes between two checks of a task the run waits on (its last check
/// said "still running"): up to [`INTERLUDE_MAX`] such calls are part of the wait — a
/// `sleep 30` between two looks at a background build — and the count starts again at
/// each check.
fn interlude(run: &mut RunState, fp: Fingerprint) -> bool {
    let Some(waiting) = run.detection.waiting.as_mut() else {
        return false;
    };
    if waiting.poll == fp {
        waiting.between = 0;
        return false;
    }
    waiting.between += 1;
    if waiting.between > INTERLUDE_MAX {
        run.detection.waiting = None;
        return false;
    }
    true
}

/// 4.2 Error contract: a retry before its time, or with its precondition unchanged, is
/// refused; a call that waits as the tool told it is bounded by the wait budget.
fn error_contract(
    run: &RunState,
    view: &View<'_>,
    ts_ms: u64,
    warning: &mut Option<Verdict>,
) -> Option<Settled> {
    let fp = view.call.fp;
    let label = view.call.label;
    if let Some(gate) = run.detection.retry_gates.iter().find(|g| g.call == fp) {
        if !honoured(ts_ms, gate.not_before_ms, gate.wait_ms) {
            let wait_ms = gate.not_before_ms.saturating_sub(ts_ms);
            return Some(Settled::Refuse(Verdict {
                action: Action::Block,
                reason: Reason::RetryTooSoon,
                detector: None,
                count: Some(gate.attempts),
                message: message::retry_too_soon(&label(), wait_ms),
            }));
        }
    }
    if let Some(gate) = run
        .detection
        .precondition_gates
        .iter()
        .find(|g| g.call == fp)
    {
        return Some(Settled::Refuse(Verdict {
            action: Action::Block,
            reason: Reason::PreconditionUnchanged,
            detector: None,
            count: None,
            message: message::precondition_unchanged(&label(), gate.code.as_deref()),
        }));
    }
    let since_ms = view.waiting_since?;
    let policy = &run.policy;
    let budget_s = policy
        .tool(view.call.tool)
        .and_then(|t| t.poll)
        .and_then(|p| p.wait_budget_s)
        .unwrap_or(policy.wait_budget_s);
    let waited_ms = ts_ms.saturating_sub(since_ms);
    let budget_ms = budget_s.saturating_mul(1000);
    // Warned from three quarters of the budget: time to report, not to poll on.
    if waited_ms < budget_ms / 4 * 3 {
        return None;
    }
    let blocked = waited_ms >= budget_ms;
    let verdict = Verdict {
        action: if blocked { Action::Block } else { Action::Warn },
        reason: Reason::WaitBudget,
        detector: None,
        count: None,
        message: message::wait_budget(&label(), waited_ms, budget_s, blocked),
    };
    if blocked {
        return Some(Settled::Refuse(verdict));
    }
    *warning = Some(verdict);
    None
}

/// 4.3 Loop detection: a loop that survived a compaction stops the run before the call
/// runs; the detectors may block the call or warn. A detector's warning comes before
/// the wait budget's.
fn loop_detection(
    run: &mut RunState,
    view: &View<'_>,
    lineage: &Lineage,
    warning: &mut Option<Verdict>,
) -> Option<Settled> {
    // A sub-agent's first call names its sub-task: one its parent's earlier sub-agents
    // ran to the same end again and again is a loop of the parent's.
    if !lineage.is_empty() && run.node.subtask.is_none() {
        let subtask = tree::subtask(run.agent.as_deref(), view.call.fp);
        run.node.subtask = Some(subtask);
        if let Some(closing) = lineage.subtask_repeated(subtask, run.policy.read_same_call_limit) {
            return Some(Settled::Close(closing));
        }
    }
    if let Some(count) = detect::post_compaction(run, &view.call) {
        return Some(Settled::Close(Closing::detector(
            Reason::CompactionLoopPersisted,
            Detector::PostCompaction,
            count,
        )));
    }
    let (verdict, unknown_hit) = detect::detect(run, &view.call);
    if unknown_hit {
        run.detection.unknown_tool_hits += 1;
    }
    match verdict {
        Some(v) if v.action == Action::Block => Some(Settled::Refuse(v)),
        Some(v) => {
            *warning = Some(v);
            None
        }
        None => None,
    }
}

/// 4.4 Side-effect gate: a completed operation is answered from the ledger (a warning
/// does not let it run again); one in flight is refused; one in flight past its lease
/// has an unknown outcome, and the policy says whether a human must look first.
fn side_effect_gate(
    run: &RunState,
    ledger: &Ledger,
    event: &Event,
    call: &ToolCall,
    warning: &mut Option<Verdict>,
) -> Option<Settled> {
    let op_key = call.op_key.as_ref()?;
    match ledger.get(&event.tenant, op_key)? {
        // Written by `stored_result` from a parsed value, so it parses back.
        LedgerEntry::Completed { result, .. } => Some(Settled::Answer(
            serde_json::from_str(result).unwrap_or(serde_json::Value::Null),
        )),
        LedgerEntry::InFlight {
            run: holder,
            call_id: holder_call,
            since_ms,
        } => {
            let policy = &run.policy;
            if !lease_ran_out(policy, *since_ms, event.ts_ms) {
                return Some(Settled::Refuse(Verdict {
                    action: Action::Block,
                    reason: Reason::OperationInFlight,
                    detector: None,
                    count: None,
                    message: message::operation_in_flight(op_key),
                }));
            }
            if policy.stale_in_flight == StaleInFlight::NeedsHuman {
                return Some(Settled::Close(outcome_unknown(
                    op_key,
                    holder,
                    holder_call,
                    *since_ms,
                )));
            }
            *warning = Some(Verdict {
                action: Action::Warn,
                reason: Reason::OperationOutcomeUnknown,
                detector: None,
                count: None,
                message: message::outcome_unknown_retry(op_key, holder, *since_ms),
            });
            None
        }
    }
}

/// Puts the call in the detection window. Refused calls stay in the history too: a
/// refusal must never hide the loop from the next threshold.
fn record(run: &mut RunState, view: &View<'_>, outcome: Outcome) {
    let entry = Entry {
        serial: view.serial,
        call: view.call.fp,
        tool: view.call.tool_fp,
        outcome,
        result: None,
        interlude: view.call.interlude,
    };
    let history_size = run.policy.history_size;
    run.detection.push(entry, history_size);
}

fn answer_from_ledger(
    run: &mut RunState,
    event: &Event,
    call: &ToolCall,
    result: serde_json::Value,
) -> Decision {
    let op_key = call.op_key.as_deref().unwrap_or_default();
    run.counters.calls_answered += 1;
    let mut decided = decision(event, Some(&call.call_id), Action::UseCompletedResult);
    decided.message = Some(match result.get(crate::ledger::RESULT_NOT_STORED) {
        Some(elsewhere) => message::completed_result_not_stored(op_key, elsewhere),
        None => message::completed_result(op_key),
    });
    decided.result = Some(result);
    count_no_progress(run, event, call, decided)
}

/// The call runs: it is a step of the task, in flight until its result.
fn execute(
    run: &mut RunState,
    ledger: &mut Ledger,
    event: &Event,
    call: &ToolCall,
    view: View<'_>,
    warning: Option<Verdict>,
) -> Decision {
    record(run, &view, Outcome::Executed);
    run.counters.steps += 1;
    run.task.steps += 1;
    let watched =
        run.detection.compaction_watch.is_some() || run.detection.compaction_tail.is_some();
    let View {
        call: seen,
        waiting_since,
        serial,
    } = view;
    run.pending.insert(
        call.call_id.clone(),
        PendingCall {
            serial,
            call: seen.fp,
            effect: seen.effect,
            op_key: call.op_key.clone(),
            watched,
            patient: waiting_since.is_some(),
            interlude: seen.interlude,
            wording: seen.wording,
        },
    );
    if let Some(op_key) = &call.op_key {
        ledger.start(
            &event.tenant,
            op_key,
            &event.run,
            &call.call_id,
            event.ts_ms,
        );
    }
    // The model learns that a sub-agent of its run was stopped (or never started).
    let warning = warning.or_else(|| {
        let stopped = std::mem::take(&mut run.node.stopped_children);
        (!stopped.is_empty()).then(|| Verdict {
            action: Action::Warn,
            reason: Reason::ChildStopped,
            detector: None,
            count: Some(stopped.len() as u32),
            message: message::child_stopped(&stopped),
        })
    });
    let Some(v) = warning else {
        return decision(event, Some(&call.call_id), Action::Execute);
    };
    let guard = v
        .detector
        .map(Detector::as_str)
        .unwrap_or(v.reason.as_str());
    let at = close::position(run, event);
    run.note_fired(guard, "warn", at);
    let mut decided = decision(event, Some(&call.call_id), Action::Warn);
    decided.reason = Some(v.reason);
    decided.detector = v.detector;
    decided.count = v.count;
    decided.message = Some(v.message);
    decided
}

/// Since when this call has been told to wait, when this attempt waited as told: the
/// tool's own "wait" — a RETRYABLE answer with `retry_after_ms`, or a PENDING answer
/// (at least `poll_min_interval_ms`) — and the agent honouring it, within a tenth of
/// the wait. A retry that the guard's own backoff paced, or one after
/// `retry_after_ms: 0`, was not told to wait.
fn waited_as_told(run: &RunState, fp: Fingerprint, ts_ms: u64) -> Option<u64> {
    let detection = &run.detection;
    if let Some(gate) = detection.retry_gates.iter().find(|g| g.call == fp) {
        return (gate.told && honoured(ts_ms, gate.not_before_ms, gate.wait_ms))
            .then_some(gate.since_ms);
    }
    detection
        .poll_clocks
        .iter()
        .find(|c| c.call == fp && honoured(ts_ms, c.patient_from_ms, c.wait_ms))
        .map(|c| c.since_ms)
}

/// Has an operation in flight since `since_ms` gone without a word for longer than the
/// policy's lease, at event time `now_ms`?
pub(crate) fn lease_ran_out(policy: &Policy, since_ms: u64, now_ms: u64) -> bool {
    now_ms >= lease_end_ms(policy, since_ms)
}

pub(crate) fn lease_end_ms(policy: &Policy, since_ms: u64) -> u64 {
    since_ms.saturating_add(policy.in_flight_lease_minutes.saturating_mul(60_000))
}

/// The stop for an operation whose outcome is unknown: a human must find out whether it
/// happened and say so (`fusebox ledger resolve`) before anything repeats it.
pub(crate) fn outcome_unknown(op_key: &str, run: &str, call_id: &str, since_ms: u64) -> Closing {
    let mut closing = Closing::new(
        TerminalState::NeedsHuman,
        Reason::OperationOutcomeUnknown,
        Some(message::outcome_unknown_detail(
            op_key, run, call_id, since_ms,
        )),
    );
    closing.unmet_precondition = Some(format!("outcome of operation {op_key}"));
    closing
}

/// A refused call is a no-progress outcome and a block in a row; enough of either turns
/// the block into a stop.
fn refuse(run: &mut RunState, event: &Event, call: &ToolCall, verdict: Verdict) -> Decision {
    run.counters.calls_refused += 1;
    run.detection.blocks_in_row += 1;
    let guard = verdict
        .detector
        .map(Detector::as_str)
        .unwrap_or(verdict.reason.as_str());
    let at = close::position(run, event);
    run.note_fired(guard, "block", at);
    let mut decided = decision(event, Some(&call.call_id), Action::Block);
    decided.reason = Some(verdict.reason);
    decided.detector = verdict.detector;
    decided.count = verdict.count;
    decided.message = Some(verdict.message);
    if run.detection.blocks_in_row >= run.policy.consecutive_block_limit {
        let count = run.detection.blocks_in_row;
        return close::close(
            run,
            event,
            Some(&call.call_id),
            Closing::detector(
                Reason::ConsecutiveBlocks,
                Detector::ConsecutiveBlocks,
                count,
            ),
        );
    }
    count_no_progress(run, event, call, decided)
}

/// Counts a call that produced nothing new (refused, or answered from the ledger)
/// towards `no_progress` and the breaker; stops the run when either is reached.
fn count_no_progress(
    run: &mut RunState,
    event: &Event,
    call: &ToolCall,
    decided: Decision,
) -> Decision {
    run.detection.no_progress_streak += 1;
    run.detection.no_progress_outcomes += 1;
    match no_progress_stop(run) {
        Some(closing) => close::close(run, event, Some(&call.call_id), closing),
        None => decided,
    }
}

/// The two no-progress stops, checked after every no-progress outcome.
pub(crate) fn no_progress_stop(run: &RunState) -> Option<Closing> {
    let policy = &run.policy;
    let detection = &run.detection;
    if policy.detectors.no_progress && detection.no_progress_streak >= policy.no_progress_limit {
        return Some(Closing::detector(
            Reason::NoProgress,
            Detector::NoProgress,
            detection.no_progress_streak,
        ));
    }
    if detection.no_progress_outcomes >= policy.global_circuit_breaker_threshold {
        return Some(Closing::detector(
            Reason::GlobalCircuitBreaker,
            Detector::GlobalCircuitBreaker,
            detection.no_progress_outcomes,
        ));
    }
    None
}

/// Starts (or goes on) waiting on a task whose check answered "still running".
pub(crate) fn wait_on(run: &mut RunState, poll: Fingerprint) {
    match run.detection.waiting.as_mut() {
        Some(waiting) if waiting.poll == poll => waiting.between = 0,
        _ => run.detection.waiting = Some(Waiting { poll, between: 0 }),
    }
}
