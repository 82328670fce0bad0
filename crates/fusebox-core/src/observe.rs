//! Observe decisions (guard contract §3, §4.1, §4.2, §4.6): what every event other than
//! a `tool_call` does to its run, and what the guard answers.

use crate::close::{self, decision, latched, stored_result, Closing};
use crate::decision::{Action, Decision, Detector, Reason, ResumeCondition, TerminalState};
use crate::event::*;
use crate::fingerprint::{
    call_fingerprint_in, result_fingerprint_in, same_question, tool_fingerprint, ArgFilter,
    Fingerprint,
};
use crate::gate::{effect_of, no_progress_stop, wait_on};
use crate::ledger::Ledger;
use crate::message;
use crate::policy::{is_default_volatile, Policy};
use crate::run::{
    short, short_pair, AnswerStreak, Below, CompactionTail, CompactionWatch, Outcome, PendingCall,
    PollClock, PreconditionGate, RetryGate, RunState, RunStatus, Task, Worded, PAIR_MEMORY,
    WORDING_MEMORY,
};
use crate::tree::{self, Lineage};
use crate::volatile::{
    is_epoch_number, is_time_key, is_usage_counter_key, masks_epochs, same_key, MaskSet, TextMask,
};

/// Retry backoff without `retry_after_ms`: 1 s, doubling, at most a minute.
const BACKOFF_BASE_MS: u64 = 1000;
const BACKOFF_MAX_MS: u64 = 60_000;
/// Calls with a pending retry wait or precondition remembered per run (newest kept).
const GATES_MAX: usize = 32;
/// What the new answer of a never-seen call is worth inside a repeating pattern: it pays
/// back this many no-progress outcomes, and is progress of the run only once the run's
/// no-progress count since its last progress is no larger. A batch (every call new) and
/// read-act-read (at most one repeat between new answers) stay progress; a loop with a
/// one-off probe every few calls does not reset the detectors or the breaker.
pub const ONE_OFF_CREDIT: u32 = 2;
/// The model turn a context-window overflow ends with (guard contract §2).
const CONTEXT_WINDOW_EXCEEDED: &str = "model_context_window_exceeded";

/// Which keys of one tool's output are runtime metadata, resolved once per result: the
/// built-in keys, the run's and the tool's lists, usage counters (unless the tool's
/// counts are its content) and epoch numbers under time keys (unless the tool switched
/// the epoch mask off).
struct Volatility<'a> {
    run_keys: &'a [String],
    tool_keys: &'a [String],
    usage: bool,
    epochs: bool,
}

impl<'a> Volatility<'a> {
    fn of(policy: &'a Policy, tool: &str, mask: &TextMask<'_>) -> Self {
        let own = policy.tool(tool);
        Volatility {
            run_keys: &policy.volatile_result_keys,
            tool_keys: own.map_or(&[], |t| t.volatile_result_keys.as_slice()),
            usage: own.and_then(|t| t.volatile_usage).unwrap_or(true),
            epochs: masks_epochs(mask.masks),
        }
    }

    fn is_volatile(&self, key: &str, value: &serde_json::Value) -> bool {
        if is_default_volatile(key)
            || self.run_keys.iter().any(|k| same_key(key, k))
            || self.tool_keys.iter().any(|k| same_key(key, k))
        {
            return true;
        }
        match value {
            serde_json::Value::Number(n) => {
                (self.usage && is_usage_counter_key(key))
                    || (self.epochs && is_time_key(key) && is_epoch_number(n))
            }
            // A sub-agent's report carries its `usage` object beside its content.
            serde_json::Value::Object(_) => self.usage && key.eq_ignore_ascii_case("usage"),
            _ => false,
        }
    }
}

/// The masking of volatile tokens inside a tool's output strings: the tool's own mask set
/// when it has one, else the run's; the run's patterns plus the tool's.
fn text_mask<'a>(policy: &'a Policy, tool: &str) -> TextMask<'a> {
    let own = policy.tool(tool).and_then(|t| t.volatile_text.as_ref());
    let masks = own
        .and_then(|t| t.mask.as_deref())
        .unwrap_or(&policy.volatile_text.mask);
    TextMask {
        masks: MaskSet::of(masks),
        patterns: &policy.volatile_text.patterns,
        extra_patterns: own.map_or(&[], |t| t.patterns.as_slice()),
    }
}

/// Also returns the `op_key` of the call it answers, whose ledger entry it may change.
pub(crate) fn tool_result(
    run: &mut RunState,
    ledger: &mut Ledger,
    scratch: &mut Vec<u8>,
    event: &Event,
    result: &ToolResult,
) -> (Decision, Option<String>) {
    let mut pending = run.pending.remove(&result.call_id);
    let op_key = pending.as_mut().and_then(|p| p.op_key.take());
    let kind = kind_of(&run.policy, result);
    let decided = answer(
        run,
        ledger,
        scratch,
        event,
        (result, kind),
        pending.as_ref(),
        op_key.as_deref(),
    );
    // A PENDING answer is not the operation's last word: its final result comes under the
    // same call id and completes the op_key (the key stays in flight, its lease renewed,
    // until then). Only calls with an op_key wait for it: a poll is a new call each time.
    if let (ResultKind::Pending, Some(mut call), Some(key)) = (kind, pending, &op_key) {
        call.op_key = Some(key.clone());
        run.pending.insert(result.call_id.clone(), call);
    }
    (decided, op_key)
}

/// The kind a result counts as: the producer's, except a SUCCESS of a tool whose policy
/// says this answer means "still running" (`running_when`: a check on a background
/// task), which is a PENDING answer.
fn kind_of(policy: &Policy, result: &ToolResult) -> ResultKind {
    let running = || {
        let conditions = &policy.tool(&result.tool)?.running_when;
        match &result.output {
            Some(Output::Json(output)) => Some(crate::policy::says_running(conditions, output)),
            _ => None,
        }
    };
    match result.kind {
        ResultKind::Success if running() == Some(true) => ResultKind::Pending,
        kind => kind,
    }
}

/// `tool_result` once the call it answers (its `op_key` taken out) and the kind the
/// answer counts as are known.
fn answer(
    run: &mut RunState,
    ledger: &mut Ledger,
    scratch: &mut Vec<u8>,
    event: &Event,
    (result, kind): (&ToolResult, ResultKind),
    pending: Option<&PendingCall>,
    op_key: Option<&str>,
) -> Decision {
    let call_id = Some(result.call_id.as_str());
    // The ledger first: a side effect that happened is recorded even when the run was
    // stopped while it ran, so a resumed or new run never repeats it.
    if let Some(op_key) = op_key {
        match kind {
            ResultKind::Success => {
                let stored = stored_result(result.output.as_ref(), event, &result.call_id);
                ledger.complete(&event.tenant, op_key, &event.run, &result.call_id, stored);
                run.note_completed_operation(op_key);
            }
            // Still running: the key stays in flight, its lease starts again.
            ResultKind::Pending => {
                ledger.renew(&event.tenant, op_key, &result.call_id, event.ts_ms)
            }
            _ => ledger.release(&event.tenant, op_key, &result.call_id),
        }
    }
    if let Some(decided) = latched(run, event, call_id) {
        return decided;
    }

    let policy = run.policy.clone();
    let effect = pending
        .as_ref()
        .map(|p| p.effect)
        .unwrap_or_else(|| effect_of(run, &result.tool, None, false));
    // A result the guard never gated (a producer bug, or passive mode started mid-run)
    // still counts; it gets an identity of its own.
    let call_fp = pending.map(|p| p.call).unwrap_or_else(|| {
        call_fingerprint_in(
            scratch,
            &result.tool,
            &Args::Hash(result.call_id.clone()),
            ArgFilter::ignoring(&[]),
        )
    });
    let mask = text_mask(&policy, &result.tool);
    let volatility = Volatility::of(&policy, &result.tool, &mask);
    let result_fp = result_fingerprint_in(
        scratch,
        kind,
        result.code.as_deref(),
        result.output.as_ref(),
        &|key, value| volatility.is_volatile(key, value),
        &mask,
    );
    let tool_fp = tool_fingerprint(&result.tool);

    if kind.is_error() {
        run.counters.tool_errors += 1;
        run.task.tool_errors += 1;
    }
    if result.code.as_deref() == Some("unknown_tool") {
        let detection = &mut run.detection;
        detection.unknown_tool_hits += 1;
        if !detection.unknown_tools_reported.contains(&tool_fp) {
            detection.unknown_tools_reported.push(tool_fp);
        }
    }

    let mut one_off = false;
    // A result of a call the guard never gated has an identity made up for it: a new
    // pair every time, which must not pass for a sweep.
    let gated = pending.is_some();
    let wording = pending.and_then(|p| p.wording.as_ref());
    let version_moved = result
        .progress
        .map(|version| run.progress_version.is_none_or(|last| version > last));
    let progress = !kind.is_error()
        && match version_moved {
            Some(moved) => moved,
            None => {
                let novel = novel(run, kind, effect, call_fp, result_fp, wording, gated);
                let of_the_run = novel && progress_of_the_run(run, call_fp, pending);
                one_off = novel && !of_the_run;
                of_the_run
            }
        };
    // The same "wait" answer to a call that waited as told, and what the agent did
    // between two checks of a task it waits on: the wait budget's, neither progress nor
    // a repeat.
    let waited_as_told = pending.is_some_and(|p| {
        (p.patient && matches!(kind, ResultKind::Pending | ResultKind::Retryable))
            || (p.interlude && !kind.is_error())
    });
    let reworded = !progress && !one_off && wording.is_some() && kind == ResultKind::Success;
    remember(run, kind, effect, call_fp, result_fp);
    if let (Some(p), Some(wording), ResultKind::Success) = (pending, wording, kind) {
        remember_wording(
            run,
            (p.serial, tool_fp, call_fp),
            wording,
            result_fp,
            reworded,
        );
    }
    if let Some(entry) = pending.and_then(|p| {
        run.detection
            .window
            .iter_mut()
            .find(|e| e.serial == p.serial)
    }) {
        entry.result = Some((result_fp, kind));
    }
    if kind == ResultKind::Success {
        run.detection.retry_gates.retain(|g| g.call != call_fp);
    }
    if progress {
        if let Some(version) = result.progress {
            run.progress_version = Some(version);
        }
        run.last_safe_checkpoint = Some(event.position());
        run.unmet_precondition = None;
        run.detection.clear_on_progress(pending.map(|p| p.serial));
    } else if one_off {
        // Neither progress nor a repeat: the loop around it keeps its counts.
        let outcomes = &mut run.detection.no_progress_outcomes;
        *outcomes = outcomes.saturating_sub(ONE_OFF_CREDIT);
    } else if waited_as_told {
        // Waiting is the work, as the tool said: bounded by the wait budget at the gate.
    } else {
        // A PENDING that repeats is the poll detector's; it still feeds the breaker.
        if kind != ResultKind::Pending {
            run.detection.no_progress_streak += 1;
        }
        run.detection.no_progress_outcomes += 1;
    }
    // After progress, which ends a wait: a check that says "still running" starts one.
    match kind {
        ResultKind::Pending => wait_on(run, call_fp),
        _ if run.detection.waiting.is_some_and(|w| w.poll == call_fp) => {
            run.detection.waiting = None
        }
        _ => {}
    }
    if pending.is_some_and(|p| p.watched) {
        watch_tail(run, call_fp, result_fp, kind, version_moved == Some(true));
    }
    if kind != ResultKind::Pending {
        run.detection.poll_clocks.retain(|c| c.call != call_fp);
    }
    // The watch is for successes: errors and PENDING have their own detectors.
    let compaction_loop = pending
        .as_ref()
        .is_some_and(|p| p.watched)
        .then(|| watch_after_compaction(run, tool_fp, call_fp, result_fp, kind))
        .flatten();

    // What closes the run, most specific first.
    if kind == ResultKind::Success && result.terminal == Some(true) {
        let closing = Closing::new(TerminalState::Completed, Reason::Completed, None);
        return close::close(run, event, call_id, closing);
    }
    if kind == ResultKind::Fatal {
        return close::close(run, event, call_id, fatal(result.code.as_deref()));
    }
    if run.time_budget_spent() {
        return close::close(run, event, call_id, Closing::guard(Reason::TimeBudget));
    }
    if run.task.tool_errors > policy.max_tool_errors {
        return close::close(run, event, call_id, Closing::guard(Reason::ToolErrorLimit));
    }
    if let Some(count) = compaction_loop {
        let closing = Closing::detector(
            Reason::CompactionLoopPersisted,
            Detector::PostCompaction,
            count,
        );
        return close::close(run, event, call_id, closing);
    }
    if !progress {
        if let Some(closing) = no_progress_stop(run) {
            return close::close(run, event, call_id, closing);
        }
    }

    match kind {
        ResultKind::Retryable => retry_after(run, event, result, call_fp),
        ResultKind::Precondition => {
            let gate = PreconditionGate {
                call: call_fp,
                code: result.code.clone(),
            };
            put_per_call(&mut run.detection.precondition_gates, gate, |g| g.call);
            run.unmet_precondition = Some(
                result
                    .code
                    .clone()
                    .unwrap_or_else(|| "precondition".to_owned()),
            );
            let mut decided = decision(event, call_id, Action::WaitForChangedPrecondition);
            decided.message = Some(message::wait_for_precondition(result.code.as_deref()));
            decided
        }
        ResultKind::Pending => {
            let poll = policy.tool(&result.tool).and_then(|t| t.poll);
            // The wait that makes the next poll patient, and the one the guard suggests:
            // the tool's (or its policy's), never below the policy's minimum interval.
            let wait_ms = result
                .retry_after_ms
                .or(poll.and_then(|p| p.wait_ms))
                .unwrap_or(0)
                .max(policy.poll_min_interval_ms);
            // The retry gate of an earlier RETRYABLE answer gives way to the poll.
            run.detection.retry_gates.retain(|g| g.call != call_fp);
            let budget_s = poll
                .and_then(|p| p.wait_budget_s)
                .unwrap_or(policy.wait_budget_s);
            let clocks = &mut run.detection.poll_clocks;
            let since_ms = clocks
                .iter()
                .find(|c| c.call == call_fp && c.result == result_fp)
                .map_or(event.ts_ms, |c| c.since_ms);
            let clock = PollClock {
                call: call_fp,
                result: result_fp,
                since_ms,
                patient_from_ms: event.ts_ms.saturating_add(wait_ms),
                wait_ms,
            };
            put_per_call(clocks, clock, |c| c.call);
            let budget_left_s =
                budget_s.saturating_sub(event.ts_ms.saturating_sub(since_ms) / 1000);
            let critical = poll
                .and_then(|p| p.critical_threshold)
                .unwrap_or(policy.critical_threshold);
            let answers = run
                .detection
                .window
                .iter()
                .filter(|e| e.call == call_fp && e.result == Some((result_fp, kind)))
                .count() as u32;
            let mut decided = decision(event, call_id, Action::PollBounded);
            decided.wait_ms = Some(wait_ms);
            decided.message = Some(message::poll_bounded(
                wait_ms,
                critical.saturating_sub(answers),
                budget_left_s,
            ));
            decided
        }
        ResultKind::Success | ResultKind::Fatal => decision(event, call_id, Action::Continue),
    }
}

/// Novelty, for results that carry no progress version: a read that returned something
/// not seen before in this run, or a call never made before that answered — unless it
/// rewords a question already answered the same; a write that changed something it
/// had not changed before.
fn novel(
    run: &RunState,
    kind: ResultKind,
    effect: Effect,
    call_fp: Fingerprint,
    result_fp: Fingerprint,
    wording: Option<&crate::run::Wording>,
    gated: bool,
) -> bool {
    let detection = &run.detection;
    match (kind, effect) {
        (ResultKind::Success | ResultKind::Pending, Effect::Read) => {
            if !detection.seen_results.contains(short(result_fp)) {
                return true;
            }
            if !gated
                || detection
                    .seen_pairs
                    .contains(short_pair(call_fp, result_fp))
            {
                return false;
            }
            // A call never made before, answered as another was: a sweep's step (30
            // health checks answering ok, 30 comments moderated) — unless it rewords a
            // question already answered so (a flailing search), which is no new
            // knowledge.
            !wording.is_some_and(|wording| {
                let answer = short(result_fp);
                detection.wordings.iter().any(|w| {
                    w.answer == answer
                        && w.wording.shape == wording.shape
                        && same_question(&w.wording.words, &wording.words)
                })
            })
        }
        (ResultKind::Success, Effect::Write) => {
            !run.detection.succeeded_writes.contains(short(call_fp))
        }
        _ => false,
    }
}

/// Whether a novel answer is progress of the run rather than the novelty of one call
/// inside a repeating pattern: the same call answered otherwise before (the world moved),
/// or few enough repeats since the last progress for a new call to outweigh them
/// ([`ONE_OFF_CREDIT`]).
fn progress_of_the_run(run: &RunState, call: Fingerprint, pending: Option<&PendingCall>) -> bool {
    let serial = pending.map(|p| p.serial);
    let answered_before = run.detection.window.iter().any(|e| {
        e.call == call
            && Some(e.serial) != serial
            && e.outcome == Outcome::Executed
            && e.result.is_some()
    });
    answered_before || run.detection.no_progress_outcomes <= ONE_OFF_CREDIT
}

fn remember(
    run: &mut RunState,
    kind: ResultKind,
    effect: Effect,
    call_fp: Fingerprint,
    result_fp: Fingerprint,
) {
    let detection = &mut run.detection;
    if matches!(kind, ResultKind::Success | ResultKind::Pending) {
        detection.seen_results.insert(short(result_fp));
        if effect == Effect::Read {
            detection
                .seen_pairs
                .insert_within(short_pair(call_fp, result_fp), PAIR_MEMORY);
        }
    }
    if kind == ResultKind::Success && effect == Effect::Write {
        run.detection.succeeded_writes.insert(short(call_fp));
    }
}

/// Keeps an answered read's wording (for rewordings), and the streak of its tool's
/// same answers to calls that differ only in their words.
fn remember_wording(
    run: &mut RunState,
    (serial, tool, call): (u64, u64, Fingerprint),
    wording: &crate::run::Wording,
    result_fp: Fingerprint,
    reworded: bool,
) {
    let answer = short(result_fp);
    let detection = &mut run.detection;
    let streak = match detection.answer_streak {
        Some(s) if s.tool == tool && s.shape == wording.shape && s.answer == answer => {
            AnswerStreak {
                count: s.count + 1,
                ..s
            }
        }
        _ => AnswerStreak {
            tool,
            shape: wording.shape,
            answer,
            count: 1,
        },
    };
    detection.answer_streak = Some(streak);
    if detection.wordings.len() == WORDING_MEMORY {
        detection.wordings.pop_front();
    }
    detection.wordings.push_back(Worded {
        serial,
        tool,
        call: short(call),
        wording: wording.clone(),
        answer,
        reworded,
    });
}

/// Follows the same (call, answer) in a row after a compaction: a success extends or
/// starts the streak; anything else, or progress by version, ends it.
fn watch_tail(
    run: &mut RunState,
    call: Fingerprint,
    result: Fingerprint,
    kind: ResultKind,
    version_moved: bool,
) {
    let Some(tail) = run.detection.compaction_tail.as_mut() else {
        return;
    };
    tail.remaining = tail.remaining.saturating_sub(1);
    if kind != ResultKind::Success || version_moved {
        tail.in_row = 0;
    } else if tail.in_row > 0 && (tail.call, tail.result) == (call, result) {
        tail.in_row += 1;
    } else {
        (tail.call, tail.result, tail.in_row) = (call, result, 1);
    }
    if tail.remaining == 0 {
        run.detection.compaction_tail = None;
    }
}

/// Counts one watched result; returns the count when one triple reached `repeat_limit`.
fn watch_after_compaction(
    run: &mut RunState,
    tool: u64,
    call: Fingerprint,
    result: Fingerprint,
    kind: ResultKind,
) -> Option<u32> {
    let repeat_limit = run.policy.post_compaction.repeat_limit;
    let watch = run.detection.compaction_watch.as_mut()?;
    watch.remaining = watch.remaining.saturating_sub(1);
    let count = if kind != ResultKind::Success {
        0
    } else {
        match watch
            .triples
            .iter_mut()
            .find(|(t, c, r, _)| (*t, *c, *r) == (tool, call, result))
        {
            Some((_, _, _, n)) => {
                *n += 1;
                *n
            }
            None => {
                watch.triples.push((tool, call, result, 1));
                1
            }
        }
    };
    if watch.remaining == 0 {
        run.detection.compaction_watch = None;
    }
    (count >= repeat_limit).then_some(count)
}

/// Puts `item` in a per-call list (retry gates, precondition gates, poll clocks) in place
/// of the call's earlier one, forgetting the oldest past [`GATES_MAX`].
fn put_per_call<T>(list: &mut Vec<T>, item: T, call_of: impl Fn(&T) -> Fingerprint) {
    let call = call_of(&item);
    list.retain(|other| call_of(other) != call);
    if list.len() == GATES_MAX {
        list.remove(0);
    }
    list.push(item);
}

fn fatal(code: Option<&str>) -> Closing {
    let (terminal, reason) = match code {
        Some("permission_denied") => (TerminalState::NeedsHuman, Reason::PermissionDenied),
        Some("policy_blocked") => (TerminalState::NeedsHuman, Reason::PolicyBlocked),
        Some("needs_human") => (TerminalState::NeedsHuman, Reason::NeedsHuman),
        _ => (TerminalState::Failed, Reason::Fatal),
    };
    // Other codes fold into `fatal` to keep the reason label bounded; the report keeps
    // the producer's code.
    let detail = code.filter(|_| reason == Reason::Fatal).map(str::to_owned);
    Closing::new(terminal, reason, detail)
}

fn retry_after(
    run: &mut RunState,
    event: &Event,
    result: &ToolResult,
    call_fp: Fingerprint,
) -> Decision {
    let gates = &mut run.detection.retry_gates;
    let attempts = gates
        .iter()
        .find(|g| g.call == call_fp)
        .map_or(1, |g| g.attempts + 1);
    let backoff = BACKOFF_BASE_MS
        .saturating_mul(1u64 << (attempts - 1).min(16))
        .min(BACKOFF_MAX_MS);
    let wait_ms = result.retry_after_ms.unwrap_or(backoff);
    let since_ms = gates
        .iter()
        .find(|g| g.call == call_fp)
        .map_or(event.ts_ms, |g| g.since_ms);
    let gate = RetryGate {
        call: call_fp,
        not_before_ms: event.ts_ms.saturating_add(wait_ms),
        wait_ms,
        attempts,
        since_ms,
        told: result.retry_after_ms.is_some_and(|ms| ms > 0),
    };
    put_per_call(gates, gate, |g| g.call);
    let mut decided = decision(event, Some(&result.call_id), Action::RetryAfter);
    decided.wait_ms = Some(wait_ms);
    decided.message = Some(message::retry_after(wait_ms, attempts));
    decided
}

/// The time budget, for events that carry nothing else to judge.
fn time_check(run: &mut RunState, event: &Event) -> Decision {
    if run.time_budget_spent() {
        return close::close(run, event, None, Closing::guard(Reason::TimeBudget));
    }
    decision(event, None, Action::Continue)
}

/// The agent is about to call its model. Refused with a stop when a token, cost or
/// model-turn budget has no room for it — the run's own over its subtree, or an
/// ancestor's over its own subtree — counting what the model calls in flight there
/// already hold: so however many sub-agents call their models at once, the calls
/// together never reserve past a budget. Let through, its reservation is held (and
/// carried up to every ancestor) until the run's next model turn.
pub(crate) fn model_call(
    run: &mut RunState,
    event: &Event,
    call: &ModelCall,
    lineage: &Lineage,
) -> Decision {
    if let Some(decided) = latched(run, event, None) {
        return decided;
    }
    if let Some(closing) = lineage.stopped() {
        return close::close(run, event, None, closing);
    }
    if run.time_budget_spent() {
        return close::close(run, event, None, Closing::guard(Reason::TimeBudget));
    }
    let reservation = reservation(run, call);
    let refused = tree::model_call_refused_own(run, reservation)
        .or_else(|| lineage.model_call_refused(reservation));
    if let Some(closing) = refused {
        return close::close(run, event, None, closing);
    }
    run.reserved.hold(reservation.tokens, reservation.cost_usd);
    decision(event, None, Action::Continue)
}

/// What a model call reserves: one model turn, and the producer's estimate of its tokens
/// and cost, else the run's own mean per model turn so far (nothing before its first
/// turn: then only the turn count reserves). Rounded up, so the mean never reserves less
/// than the turns it was taken from spent.
fn reservation(run: &RunState, call: &ModelCall) -> Below {
    let turns = run.counters.model_turns;
    Below {
        steps: 0,
        model_turns: 1,
        tokens: call.estimate_tokens.unwrap_or(match turns {
            0 => 0,
            n => run.counters.tokens.div_ceil(n),
        }),
        cost_usd: call.estimate_usd.unwrap_or(match turns {
            0 => 0.0,
            n => run.counters.cost_usd / n as f64,
        }),
    }
}

pub(crate) fn model_turn(
    run: &mut RunState,
    event: &Event,
    turn: &ModelTurn,
    lineage: &Lineage,
) -> Decision {
    // The turn answers the run's oldest model call in flight: what that one reserved is
    // replaced by what the turn spent (nothing to release for a producer that sends no
    // `model_call`, which is judged exactly as before reservations).
    run.reserved.release();
    let counters = &mut run.counters;
    counters.model_turns += 1;
    run.task.model_turns += 1;
    counters.tokens = counters
        .tokens
        .saturating_add(turn.usage.map_or(0, |u| u.total()));
    counters.cost_usd += turn.cost_usd.unwrap_or(0.0);
    // Counted in a row: a valid output (or one not judged) between two invalid ones
    // means the model corrected itself when told.
    if turn.valid == Some(false) {
        counters.invalid_outputs += 1;
        counters.invalid_in_row += 1;
    } else {
        counters.invalid_in_row = 0;
    }
    if let Some(decided) = latched(run, event, None) {
        return decided;
    }
    let policy = run.policy.clone();
    let counters = run.counters;
    let overflow = turn.stop_reason == CONTEXT_WINDOW_EXCEEDED;
    if overflow {
        run.compactions.overflows += 1;
        // A second overflow before any compaction is a refill of its own.
        run.detection.overflow_open = true;
    }
    let closing = if turn.stop_reason == "refusal" {
        Some(Closing::new(
            TerminalState::Failed,
            Reason::ModelRefusal,
            None,
        ))
    } else if counters.invalid_in_row > policy.max_invalid_outputs
        || counters.invalid_outputs > policy.max_invalid_outputs_total
    {
        let mut closing = Closing::guard(Reason::InvalidModelOutput);
        closing.detail = Some(format!(
            "{} invalid model outputs in a row (max_invalid_outputs {}), {} in the run (max_invalid_outputs_total {})",
            counters.invalid_in_row,
            policy.max_invalid_outputs,
            counters.invalid_outputs,
            policy.max_invalid_outputs_total
        ));
        Some(closing)
    } else if let Some(reason) = tree::budget_spent(
        &policy,
        Below {
            // A turn is judged by the turns, tokens and cost of the run and its subtree;
            // its steps are the gate's.
            steps: 0,
            ..tree::spent(run)
        },
    ) {
        Some(Closing::guard(reason))
    } else if overflow {
        compaction_cycle(run)
    } else {
        // The turn counts in every budget above: the one it crosses stops this run,
        // and the rest of that tree at its next call.
        lineage.budget_spent(Below {
            steps: 0,
            model_turns: 1,
            tokens: turn.usage.map_or(0, |u| u.total()),
            cost_usd: turn.cost_usd.unwrap_or(0.0),
        })
    };
    match closing {
        Some(closing) => close::close(run, event, None, closing),
        None => time_check(run, event),
    }
}

pub(crate) fn progress(run: &mut RunState, event: &Event, update: &ProgressUpdate) -> Decision {
    if let Some(decided) = latched(run, event, None) {
        return decided;
    }
    if run
        .progress_version
        .is_none_or(|last| update.version > last)
    {
        run.progress_version = Some(update.version);
        run.last_safe_checkpoint = Some(event.position());
        run.unmet_precondition = None;
        run.detection.clear_on_progress(None);
        // The run moved on since its compaction: a row of identical calls after this is
        // an ordinary loop.
        run.detection.compaction_tail = None;
    }
    time_check(run, event)
}

pub(crate) fn compaction(run: &mut RunState, event: &Event, compaction: &Compaction) -> Decision {
    run.compactions
        .note_compaction(compaction.reason.as_deref());
    if let Some(decided) = latched(run, event, None) {
        return decided;
    }
    let post = run.policy.post_compaction;
    if post.enabled {
        run.detection.compaction_watch = Some(CompactionWatch {
            remaining: post.window_size,
            triples: Vec::new(),
        });
        run.detection.compaction_tail = Some(CompactionTail {
            remaining: post.window_size,
            call: 0,
            result: 0,
            in_row: 0,
        });
    }
    // The compaction that answers an overflow closes the cycle the overflow opened.
    let closing = if std::mem::take(&mut run.detection.overflow_open) {
        None
    } else {
        compaction_cycle(run)
    };
    match closing {
        Some(closing) => close::close(run, event, None, closing),
        None => time_check(run, event),
    }
}

/// One more compaction cycle: what `max_compactions` and `compaction_thrash` count. The
/// stop it may bring says what was compacted how often.
fn compaction_cycle(run: &mut RunState) -> Option<Closing> {
    run.compactions.cycles += 1;
    run.task.compaction_cycles += 1;
    run.detection.compaction_streak += 1;
    let policy = &run.policy;
    let streak = run.detection.compaction_streak;
    if run.task.compaction_cycles > policy.max_compactions {
        let mut closing = Closing::guard(Reason::CompactionBudget);
        closing.detail = Some(format!(
            "{} compaction cycles {}, max_compactions {}: {}",
            run.task.compaction_cycles,
            run.task.scope(),
            policy.max_compactions,
            run.compactions.summary()
        ));
        return Some(closing);
    }
    let thrash = policy.compaction_thrash;
    if thrash.enabled && streak >= thrash.limit {
        let mut closing =
            Closing::detector(Reason::CompactionThrash, Detector::CompactionThrash, streak);
        closing.detail = Some(format!(
            "{streak} compaction cycles in a row with no progress; in the run: {}",
            run.compactions.summary()
        ));
        return Some(closing);
    }
    None
}

/// Time passing for a run that may send nothing more: its time budget, and the leases of
/// its own calls in flight (a worker that died mid-call never answers; the stop tells an
/// operator at once instead of at the next attempt, which may never come).
pub(crate) fn tick(
    run: &mut RunState,
    ledger: &Ledger,
    event: &Event,
    lineage: &Lineage,
) -> Decision {
    if run.report().is_some() {
        return decision(event, None, Action::Continue);
    }
    // The daemon's word that a run above this one closed: its stop reaches this one.
    if let Some(closing) = lineage.stopped() {
        return close::close(run, event, None, closing);
    }
    if let Some((op_key, call_id, since_ms)) =
        stale_call(run, ledger, &event.tenant, &event.run, event.ts_ms)
    {
        let closing = crate::gate::outcome_unknown(&op_key, &event.run, &call_id, since_ms);
        return close::close(run, event, None, closing);
    }
    time_check(run, event)
}

/// The first of the run's own calls whose key it holds in flight past the lease, when
/// its policy wants a human for that: (op_key, call_id, since_ms).
fn stale_call(
    run: &RunState,
    ledger: &Ledger,
    tenant: &str,
    run_id: &str,
    now_ms: u64,
) -> Option<(String, String, u64)> {
    held_leases(run, ledger, tenant, run_id)
        .find(|(_, _, since_ms)| crate::gate::lease_ran_out(&run.policy, *since_ms, now_ms))
        .map(|(op_key, call_id, since_ms)| (op_key.to_owned(), call_id.to_owned(), since_ms))
}

/// The run's calls whose key it still holds in flight, when a stale one would stop the
/// run (policy `stale_in_flight = "needs_human"`): (op_key, call_id, since_ms).
pub(crate) fn held_leases<'a>(
    run: &'a RunState,
    ledger: &'a Ledger,
    tenant: &'a str,
    run_id: &'a str,
) -> impl Iterator<Item = (&'a str, &'a str, u64)> + 'a {
    let watched = run.policy.stale_in_flight == crate::policy::StaleInFlight::NeedsHuman;
    run.pending
        .iter()
        .filter(move |_| watched)
        .filter_map(move |(call_id, pending)| {
            let op_key = pending.op_key.as_deref()?;
            match ledger.get(tenant, op_key) {
                Some(crate::ledger::LedgerEntry::InFlight {
                    run: holder,
                    call_id: c,
                    since_ms,
                }) if holder == run_id && c == call_id => {
                    Some((op_key, call_id.as_str(), *since_ms))
                }
                _ => None,
            }
        })
}

pub(crate) fn cancel(run: &mut RunState, event: &Event, cancel: &Cancel) -> Decision {
    if let Some(decided) = latched(run, event, None) {
        return decided;
    }
    let detail = match (&cancel.by, &cancel.reason) {
        (Some(by), Some(reason)) => Some(format!("{reason} (by {by})")),
        (Some(by), None) => Some(format!("by {by}")),
        (None, reason) => reason.clone(),
    };
    let closing = Closing::new(TerminalState::Cancelled, Reason::Cancelled, detail);
    close::close(run, event, None, closing)
}

pub(crate) fn run_finished(run: &mut RunState, event: &Event, finished: &RunFinished) -> Decision {
    if run.report().is_some() {
        return decision(event, None, Action::Continue);
    }
    let (terminal, reason) = if finished.status.as_deref().is_some_and(says_failed) {
        (TerminalState::Failed, Reason::AgentFailed)
    } else {
        (TerminalState::Completed, Reason::Completed)
    };
    let closing = Closing::new(terminal, reason, finished.status.clone());
    close::close(run, event, None, closing)
}

/// A `run_finished` status that says the agent failed: `failed`, `error`, or either
/// followed by what went wrong (`failed: TimeoutError: …`), in any case. The status stays
/// the report's detail.
fn says_failed(status: &str) -> bool {
    let status = status.trim_start().as_bytes();
    ["failed", "failure", "error"].iter().any(|word| {
        status.len() >= word.len()
            && status[..word.len()].eq_ignore_ascii_case(word.as_bytes())
            && status
                .get(word.len())
                .is_none_or(|next| !next.is_ascii_alphanumeric())
    })
}

/// Guard contract §4.6: a resume is accepted only on evidence of a changed precondition;
/// it reopens the run with its ledger intact, detectors reset and budgets kept.
pub(crate) fn resume(run: &mut RunState, event: &Event, resume: &Resume) -> Decision {
    let Some(report) = run.report().cloned() else {
        let mut decided = decision(event, None, Action::Continue);
        decided.message = Some("the run is not stopped; there is nothing to resume.".to_owned());
        return decided;
    };
    let refuse = |why: String| {
        let mut decided = latched(run, event, None).expect("the run is closed");
        decided.reason = Some(Reason::PreconditionUnchanged);
        decided.message = Some(format!("resume refused: {why}; a resume is not a retry."));
        decided
    };
    match report.resume_condition {
        ResumeCondition::None => return refuse("the run finished normally".to_owned()),
        ResumeCondition::NewRun => {
            return refuse(format!(
                "the {} is spent and budgets are kept across a resume; start a new run",
                report.reason.as_str()
            ))
        }
        ResumeCondition::VerifiedPreconditionChange | ResumeCondition::HumanApproval => {}
    }
    let evidence = &resume.evidence;
    let version = evidence.get("progress_version").and_then(|v| v.as_u64());
    let version_moved =
        version.is_some_and(|v| report.progress_version.is_none_or(|last| v > last));
    let token = ["approval_id", "credential_scope"].iter().find_map(|key| {
        evidence
            .get(*key)
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .map(|s| format!("{key}:{s}"))
    });
    let token_is_new = token
        .as_ref()
        .is_some_and(|t| !run.resume_tokens.contains(t));
    // A run that needs a human resumes on a human's word, not on progress alone.
    let accepted = match report.resume_condition {
        ResumeCondition::HumanApproval => token_is_new,
        _ => version_moved || token_is_new,
    };
    if !accepted {
        let shown = match (version, &token) {
            (Some(v), _) if !version_moved => format!(
                "progress_version {v} is not above the report's {}",
                report
                    .progress_version
                    .map_or("none".to_owned(), |p| p.to_string())
            ),
            (_, Some(t)) if !token_is_new => format!("{t} was already used"),
            _ => match report.resume_condition {
                ResumeCondition::HumanApproval => {
                    "this run needs a new approval_id or credential_scope".to_owned()
                }
                _ => "the evidence names no changed precondition (progress_version, approval_id or credential_scope)".to_owned(),
            },
        };
        return refuse(shown);
    }
    if let Some(token) = token.filter(|_| token_is_new) {
        run.resume_tokens.push(token);
    }
    if version_moved {
        run.progress_version = version;
    }
    run.status = RunStatus::Open;
    run.unmet_precondition = None;
    run.detection.reset();
    let mut decided = decision(event, None, Action::Continue);
    decided.message = Some(format!(
        "resumed{} from checkpoint {}; detectors reset, budgets kept ({} of {} steps used).",
        resume
            .by
            .as_deref()
            .map(|b| format!(" by {b}"))
            .unwrap_or_default(),
        run.last_safe_checkpoint.as_deref().unwrap_or("start"),
        run.counters.steps,
        run.policy.max_steps
    ));
    decided
}

/// The user submitted a prompt: the session's next task begins, with its own step, turn,
/// error, compaction and active-time budgets (tokens and cost stay the session's). What
/// the last task left in flight without an answer is forgotten — unless it holds an
/// operation's key, whose outcome still matters — and the detectors start again: the
/// user's word is new input. A stopped run stays stopped.
pub(crate) fn prompt(run: &mut RunState, event: &Event) -> Decision {
    if let Some(decided) = latched(run, event, None) {
        return decided;
    }
    run.task = Task {
        prompts: run.task.prompts + 1,
        ..Task::default()
    };
    run.pending.retain(|_, call| call.op_key.is_some());
    // The subtree's spending is budgeted per task too.
    run.node.below = Below::default();
    run.detection.clear_on_progress(None);
    run.detection.compaction_tail = None;
    decision(event, None, Action::Continue)
}
