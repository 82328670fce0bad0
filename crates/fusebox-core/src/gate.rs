//! The gate (guard contract §4): one `tool_call` in, one decision out, the layers in
//! contract order — latch, budget fuse, error contract, loop detection, side-effect
//! gate — and the escalation of refusals into a stop.

use crate::close::{self, decision, latched, Closing};
use crate::decision::{Action, Decision, Detector, Reason, TerminalState};
use crate::detect::{self, Call, Verdict};
use crate::event::{Effect, Event, ToolCall};
use crate::fingerprint::{
    call_fingerprint_in, question_fingerprint_in, tool_fingerprint, Fingerprint,
};
use crate::ledger::{Ledger, LedgerEntry};
use crate::message;
use crate::policy::{Policy, StaleInFlight};
use crate::run::{Entry, Outcome, PendingCall, RunState};

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

pub(crate) fn gate(
    run: &mut RunState,
    ledger: &mut Ledger,
    scratch: &mut Vec<u8>,
    event: &Event,
    call: &ToolCall,
) -> Decision {
    let call_id = Some(call.call_id.as_str());
    // 4.0 Latch.
    if let Some(decided) = latched(run, event, call_id) {
        run.counters.calls_refused += 1;
        return decided;
    }
    // 4.1 Budget fuse.
    let policy = run.policy.clone();
    if run.time_budget_spent(event.ts_ms) {
        run.counters.calls_refused += 1;
        return close::close(run, event, call_id, Closing::guard(Reason::TimeBudget));
    }
    if run.counters.steps >= policy.max_steps {
        run.counters.calls_refused += 1;
        return close::close(run, event, call_id, Closing::guard(Reason::StepBudget));
    }

    let effect = effect_of(run, &call.tool, call.effect, call.op_key.is_some());
    let ignore_args = policy
        .tool(&call.tool)
        .map(|t| t.ignore_args.as_slice())
        .unwrap_or_default();
    let fp = call_fingerprint_in(scratch, &call.tool, &call.args, ignore_args);
    // Only a read's answer is judged by what it asked (rewording or sweep).
    let question = match effect {
        Effect::Read => question_fingerprint_in(scratch, &call.tool, &call.args, ignore_args),
        Effect::Write => None,
    };
    let tool_fp = tool_fingerprint(&call.tool);
    let label = || message::call_label(&call.tool, &call.args);
    let waiting_since = waited_as_told(run, fp, event.ts_ms);

    // 4.2 Error contract: a retry before its time, or with its precondition unchanged.
    let mut refusal: Option<Verdict> = None;
    if let Some(gate) = run.detection.retry_gates.iter().find(|g| g.call == fp) {
        if event.ts_ms < gate.not_before_ms {
            let wait_ms = gate.not_before_ms - event.ts_ms;
            refusal = Some(Verdict {
                action: Action::Block,
                reason: Reason::RetryTooSoon,
                detector: None,
                count: Some(gate.attempts),
                message: message::retry_too_soon(&label(), wait_ms),
            });
        }
    }
    if refusal.is_none() {
        if let Some(gate) = run
            .detection
            .precondition_gates
            .iter()
            .find(|g| g.call == fp)
        {
            refusal = Some(Verdict {
                action: Action::Block,
                reason: Reason::PreconditionUnchanged,
                detector: None,
                count: None,
                message: message::precondition_unchanged(&label(), gate.code.as_deref()),
            });
        }
    }

    // 4.2 A call that waits as the tool told it is bounded by time, not by a count.
    let mut wait_warning = None;
    if let (None, Some(since_ms)) = (&refusal, waiting_since) {
        let budget_s = policy
            .tool(&call.tool)
            .and_then(|t| t.poll)
            .and_then(|p| p.wait_budget_s)
            .unwrap_or(policy.wait_budget_s);
        let waited_ms = event.ts_ms.saturating_sub(since_ms);
        let budget_ms = budget_s.saturating_mul(1000);
        // Warned from three quarters of the budget: time to report, not to poll on.
        if waited_ms >= budget_ms / 4 * 3 {
            let blocked = waited_ms >= budget_ms;
            let verdict = Verdict {
                action: if blocked { Action::Block } else { Action::Warn },
                reason: Reason::WaitBudget,
                detector: None,
                count: None,
                message: message::wait_budget(&label(), waited_ms, budget_s, blocked),
            };
            if blocked {
                refusal = Some(verdict);
            } else {
                wait_warning = Some(verdict);
            }
        }
    }

    // 4.3 Loop detection.
    let mut warning = None;
    if refusal.is_none() {
        let view = Call {
            tool: &call.tool,
            tool_fp,
            fp,
            effect,
            patient: waiting_since.is_some(),
            label: &label,
        };
        if let Some(count) = detect::post_compaction(run, &view) {
            run.counters.calls_refused += 1;
            let closing = Closing::detector(
                Reason::CompactionLoopPersisted,
                Detector::PostCompaction,
                count,
            );
            return close::close(run, event, call_id, closing);
        }
        let (verdict, unknown_hit) = detect::detect(run, &view);
        if unknown_hit {
            run.detection.unknown_tool_hits += 1;
        }
        match verdict {
            Some(v) if v.action == Action::Block => refusal = Some(v),
            other => warning = other.or(wait_warning),
        }
    }

    // 4.4 Side-effect gate. A warning does not let a completed operation run again.
    // An operation in flight past its lease has an unknown outcome: the policy says
    // whether a human must look first or the call may run again.
    let mut answered = None;
    if refusal.is_none() {
        if let Some(op_key) = &call.op_key {
            match ledger.get(&event.tenant, op_key) {
                Some(LedgerEntry::Completed { result, .. }) => {
                    // Written by `stored_result` from a parsed value, so it parses back.
                    answered = Some(serde_json::from_str(result).unwrap_or(serde_json::Value::Null))
                }
                Some(LedgerEntry::InFlight {
                    run: holder,
                    call_id: holder_call,
                    since_ms,
                }) => {
                    if !lease_ran_out(&policy, *since_ms, event.ts_ms) {
                        refusal = Some(Verdict {
                            action: Action::Block,
                            reason: Reason::OperationInFlight,
                            detector: None,
                            count: None,
                            message: message::operation_in_flight(op_key),
                        })
                    } else if policy.stale_in_flight == StaleInFlight::NeedsHuman {
                        run.counters.calls_refused += 1;
                        let closing = outcome_unknown(op_key, holder, holder_call, *since_ms);
                        return close::close(run, event, call_id, closing);
                    } else {
                        warning = Some(Verdict {
                            action: Action::Warn,
                            reason: Reason::OperationOutcomeUnknown,
                            detector: None,
                            count: None,
                            message: message::outcome_unknown_retry(op_key, holder, *since_ms),
                        })
                    }
                }
                None => {}
            }
        }
    }

    let serial = run.detection.new_serial();
    let at = close::position(run, event);
    let entry = |outcome, result| Entry {
        serial,
        call: fp,
        tool: tool_fp,
        outcome,
        result,
    };

    if let Some(verdict) = refusal {
        // Refused calls stay in the history: a refusal must never hide the loop from
        // the next threshold.
        run.detection
            .push(entry(Outcome::Refused, None), policy.history_size);
        return refuse(run, event, call, verdict, at);
    }

    run.detection.blocks_in_row = 0;
    if let Some(result) = answered {
        let op_key = call.op_key.as_deref().unwrap_or_default();
        run.detection
            .push(entry(Outcome::Answered, None), policy.history_size);
        run.counters.calls_answered += 1;
        let mut decided = decision(event, Some(&call.call_id), Action::UseCompletedResult);
        decided.message = Some(match result.get(crate::ledger::RESULT_NOT_STORED) {
            Some(elsewhere) => message::completed_result_not_stored(op_key, elsewhere),
            None => message::completed_result(op_key),
        });
        decided.result = Some(result);
        return count_no_progress(run, event, call, decided);
    }

    run.detection
        .push(entry(Outcome::Executed, None), policy.history_size);
    run.counters.steps += 1;
    run.pending.insert(
        call.call_id.clone(),
        PendingCall {
            serial,
            call: fp,
            effect,
            op_key: call.op_key.clone(),
            watched: run.detection.compaction_watch.is_some()
                || run.detection.compaction_tail.is_some(),
            question,
            patient: waiting_since.is_some(),
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
    match warning {
        Some(v) => {
            let guard = v
                .detector
                .map(Detector::as_str)
                .unwrap_or(v.reason.as_str());
            run.note_fired(guard, "warn", at);
            let mut decided = decision(event, Some(&call.call_id), Action::Warn);
            decided.reason = Some(v.reason);
            decided.detector = v.detector;
            decided.count = v.count;
            decided.message = Some(v.message);
            decided
        }
        None => decision(event, Some(&call.call_id), Action::Execute),
    }
}

/// Since when this call has been told to wait, when this attempt waited as told: the
/// tool's own "wait" — a RETRYABLE answer with `retry_after_ms`, or a PENDING answer
/// (at least `poll_min_interval_ms`) — and the agent honouring it. A retry that the
/// guard's own backoff paced, or one after `retry_after_ms: 0`, was not told to wait.
fn waited_as_told(run: &RunState, fp: Fingerprint, ts_ms: u64) -> Option<u64> {
    let detection = &run.detection;
    if let Some(gate) = detection.retry_gates.iter().find(|g| g.call == fp) {
        return (gate.told && ts_ms >= gate.not_before_ms).then_some(gate.since_ms);
    }
    detection
        .poll_clocks
        .iter()
        .find(|c| c.call == fp && ts_ms >= c.patient_from_ms)
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
fn refuse(
    run: &mut RunState,
    event: &Event,
    call: &ToolCall,
    verdict: Verdict,
    at: u64,
) -> Decision {
    run.counters.calls_refused += 1;
    run.detection.blocks_in_row += 1;
    let guard = verdict
        .detector
        .map(Detector::as_str)
        .unwrap_or(verdict.reason.as_str());
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
