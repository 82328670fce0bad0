//! Loop detection at the gate (guard contract §4.3): each detector looks at the run's
//! window and the incoming call and may warn or block it.
//!
//! Every detector measures a pattern count `c` and blocks at its threshold `T`. It warns
//! from `max(evidence, min(warning_threshold, T - 1))` up to `T - 1`, where `evidence` is
//! the smallest count that already contains a repeat without progress: a warning on the
//! second read of a screen that changed in between would teach the model to ignore
//! warnings, and a warning that never comes before a block leaves it blind.

use crate::decision::{Action, Detector, Reason};
use crate::event::{Effect, ResultKind};
use crate::fingerprint::{same_question, Fingerprint, QUESTION_WORDS};
use crate::message;
use crate::run::{Outcome, RunState, Wording};

/// A detector's verdict on one call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Verdict {
    pub action: Action,
    pub reason: Reason,
    pub detector: Option<Detector>,
    pub count: Option<u32>,
    pub message: String,
}

/// The incoming call, as the detectors see it.
pub(crate) struct Call<'a> {
    pub tool: &'a str,
    pub tool_fp: u64,
    pub fp: Fingerprint,
    pub effect: Effect,
    /// It waited as its last "wait" answer told it (PENDING, or RETRYABLE with
    /// `retry_after_ms`): bounded by the wait budget, not by the repeat counts.
    pub patient: bool,
    /// It comes between two checks of a task the run waits on: part of the wait.
    pub interlude: bool,
    /// The words of its text arguments, for a read that has any.
    pub wording: Option<Wording>,
    pub label: &'a dyn Fn() -> String,
}

enum Level {
    Quiet,
    Warn,
    Block,
}

fn level(count: u32, threshold: u32, warning_threshold: u32, evidence: u32) -> Level {
    let warn_from = evidence.max(warning_threshold.min(threshold.saturating_sub(1)));
    if count >= threshold {
        Level::Block
    } else if count >= warn_from {
        Level::Warn
    } else {
        Level::Quiet
    }
}

fn verdict(
    level: Level,
    reason: Reason,
    detector: Detector,
    count: u32,
    message: impl FnOnce(bool) -> String,
) -> Option<Verdict> {
    // The message is only written for a call that gets one: this runs on every call.
    let action = match level {
        Level::Quiet => return None,
        Level::Warn => Action::Warn,
        Level::Block => Action::Block,
    };
    Some(Verdict {
        action,
        reason,
        detector: Some(detector),
        count: Some(count),
        message: message(action == Action::Block),
    })
}

/// Runs every enabled detector in contract order; the first block wins, else the first
/// warning. Also returns whether the call counts as an unknown-tool hit.
pub(crate) fn detect(run: &RunState, call: &Call<'_>) -> (Option<Verdict>, bool) {
    let (unknown, unknown_hit) = unknown_tool(run, call);
    let verdicts = [
        unknown,
        exact_repeat(run, call),
        ping_pong(run, call),
        poll_no_progress(run, call),
        arg_churn(run, call),
        rewording(run, call),
        answer_streak(run, call),
    ];
    let mut first_warning = None;
    for verdict in verdicts.into_iter().flatten() {
        if verdict.action == Action::Block {
            return (Some(verdict), unknown_hit);
        }
        first_warning.get_or_insert(verdict);
    }
    (first_warning, unknown_hit)
}

fn unknown_tool(run: &RunState, call: &Call<'_>) -> (Option<Verdict>, bool) {
    let policy = &run.policy;
    if !policy.detectors.unknown_tool {
        return (None, false);
    }
    let outside_list = run.allowed_tools.as_ref().is_some_and(|tools| {
        tools
            .binary_search_by(|t| t.as_str().cmp(call.tool))
            .is_err()
    });
    let reported = run.detection.unknown_tools_reported.contains(&call.tool_fp);
    if !outside_list && !reported {
        return (None, false);
    }
    let count = run.detection.unknown_tool_hits + u32::from(outside_list);
    let threshold = policy.unknown_tool_threshold;
    let level = if count >= threshold {
        Level::Block
    } else {
        Level::Warn
    };
    let message = |blocked| message::unknown_tool(call.tool, run.allowed_tools.as_deref(), blocked);
    (
        verdict(
            level,
            Reason::UnknownTool,
            Detector::UnknownTool,
            count,
            message,
        ),
        outside_list,
    )
}

/// Calls whose answer was PENDING belong to the poll detector, not to repetition.
fn is_poll(result: Option<(Fingerprint, ResultKind)>) -> bool {
    matches!(result, Some((_, ResultKind::Pending)))
}

fn exact_repeat(run: &RunState, call: &Call<'_>) -> Option<Verdict> {
    let policy = &run.policy;
    if !policy.detectors.exact_repeat || call.patient || call.interlude {
        return None;
    }
    let window = &run.detection.window;
    // A call whose last answer was RETRYABLE without a wait of the tool's own is being
    // retried on the guard's backoff: it gets the read limit, three attempts by default
    // — OpenHands stops at the third identical action that errors.
    let retrying = window
        .iter()
        .rev()
        .find(|e| e.call == call.fp && e.result.is_some())
        .is_some_and(|e| matches!(e.result, Some((_, ResultKind::Retryable))));
    let effect_limit = match call.effect {
        Effect::Read => policy.read_same_call_limit,
        Effect::Write if retrying => policy.same_call_limit.max(policy.read_same_call_limit),
        Effect::Write => policy.same_call_limit,
    };
    let limit = policy
        .tool(call.tool)
        .and_then(|t| t.same_call_limit)
        .unwrap_or(effect_limit);
    let repeats = || {
        window
            .iter()
            .filter(|e| e.call == call.fp && !is_poll(e.result) && !e.interlude)
    };
    let prior = repeats().count() as u32;
    let count = prior + 1;
    // Refusals count towards the limit; the model is told how often the call ran.
    let ran = repeats().filter(|e| e.outcome == Outcome::Executed).count() as u32;
    let refused = repeats().filter(|e| e.outcome == Outcome::Refused).count() as u32;
    // The second identical write already repeats a change to the world; a second read
    // may be a re-read of a screen that changed, which only its answer tells.
    let evidence = match call.effect {
        Effect::Write if !retrying => 2,
        _ => 3,
    };
    let level = level(count, limit + 1, policy.warning_threshold, evidence);
    verdict(
        level,
        Reason::SameCallRepeat,
        Detector::ExactRepeat,
        count,
        |blocked| message::same_call_repeat(&(call.label)(), ran, refused, blocked),
    )
}

/// Post-compaction (guard contract §4.3, `post_compaction`): after a compaction, the call
/// that would repeat a (tool, call, result) triple `repeat_limit` times with no progress
/// is refused before it runs — the result is predicted from the last one, because a
/// loop that survives a compaction re-sends a whole context with every call. Returns the
/// count it would reach. Runs even when the other detectors are off.
pub(crate) fn post_compaction(run: &RunState, call: &Call<'_>) -> Option<u32> {
    let post = run.policy.post_compaction;
    if !post.enabled {
        return None;
    }
    let from_before = run
        .detection
        .compaction_watch
        .as_ref()
        .filter(|watch| watch.remaining > 0)
        .and_then(|watch| {
            watch
                .triples
                .iter()
                .filter(|(tool, fp, _, _)| *tool == call.tool_fp && *fp == call.fp)
                .map(|(_, _, _, n)| *n)
                .max()
        })
        .filter(|seen| seen + 1 >= post.repeat_limit)
        .map(|seen| seen + 1);
    // Any call, seen before the compaction or not: the third identical (call, answer) in
    // a row is the loop — OpenClaw's post-compaction guard aborts there.
    let in_a_row = run
        .detection
        .compaction_tail
        .as_ref()
        .filter(|tail| tail.call == call.fp && tail.in_row + 1 >= POST_COMPACTION_IN_A_ROW)
        .map(|tail| tail.in_row + 1);
    from_before.or(in_a_row)
}

/// After a compaction, this many identical (call, answer) in a row stop the run.
pub const POST_COMPACTION_IN_A_ROW: u32 = 3;

fn ping_pong(run: &RunState, call: &Call<'_>) -> Option<Verdict> {
    let policy = &run.policy;
    // Checking a task that is still running, and what the agent does between two
    // checks (a sleep), alternate by nature: that is waiting, judged by the wait rules.
    if !policy.detectors.ping_pong || call.patient || call.interlude {
        return None;
    }
    let waits = |e: &crate::run::Entry| e.interlude || is_poll(e.result);
    let mut history = run.detection.window.iter().rev();
    let other = history
        .next()
        .filter(|e| !waits(e))
        .map(|e| e.call)
        .filter(|fp| *fp != call.fp)?;
    let mut length = 2u32;
    for (i, entry) in history.enumerate() {
        let expected = if i % 2 == 0 { call.fp } else { other };
        if entry.call != expected || waits(entry) {
            break;
        }
        length += 1;
    }
    let level = level(length, policy.ping_pong_limit, policy.warning_threshold, 4);
    verdict(
        level,
        Reason::PingPong,
        Detector::PingPong,
        length,
        |blocked| message::ping_pong(&(call.label)(), length, blocked),
    )
}

fn poll_no_progress(run: &RunState, call: &Call<'_>) -> Option<Verdict> {
    let policy = &run.policy;
    // A poll that waited as told is the wait budget's; only a hasty one is counted.
    if !policy.detectors.poll_no_progress || call.patient {
        return None;
    }
    let window = &run.detection.window;
    let last_answer = window
        .iter()
        .rev()
        .find(|e| e.call == call.fp && e.result.is_some())?
        .result?;
    if last_answer.1 != ResultKind::Pending {
        return None;
    }
    let answers = window
        .iter()
        .filter(|e| e.call == call.fp && e.result == Some(last_answer))
        .count() as u32;
    let poll = policy.tool(call.tool).and_then(|t| t.poll);
    let warning = poll
        .and_then(|p| p.warning_threshold)
        .unwrap_or(policy.warning_threshold);
    let critical = poll
        .and_then(|p| p.critical_threshold)
        .unwrap_or(policy.critical_threshold)
        .max(warning + 1);
    let level = if answers >= critical {
        Level::Block
    } else if answers >= warning {
        Level::Warn
    } else {
        Level::Quiet
    };
    verdict(
        level,
        Reason::PollNoProgress,
        Detector::PollNoProgress,
        answers,
        |blocked| message::poll_no_progress(&(call.label)(), answers, critical, blocked),
    )
}

/// The same tool cycling through argument variants that come back interleaved, all with
/// one answer. A variant counts its *visits*: calls of it that follow a call of another
/// variant (the same call twice in a row is one visit, and `exact_repeat`'s). Two or more
/// variants visited `churn_min_repeats` times make churn; a sweep that checks each target
/// twice in a row visits each once.
fn arg_churn(run: &RunState, call: &Call<'_>) -> Option<Verdict> {
    let policy = &run.policy;
    if !policy.detectors.arg_churn || call.patient || call.interlude {
        return None;
    }
    let window = &run.detection.window;
    // The answer this very call got last time: churn is about variants that all come back
    // with it.
    let (answer, _) = window
        .iter()
        .rev()
        .find(|e| e.call == call.fp && e.result.is_some())?
        .result?;
    let mut variants: Vec<(Fingerprint, u32)> = Vec::new();
    let mut calls = 0u32;
    let mut previous = None;
    let mut visit = |fp: Fingerprint, variants: &mut Vec<(Fingerprint, u32)>| {
        let new_visit = previous != Some(fp);
        previous = Some(fp);
        match variants.iter_mut().find(|(v, _)| *v == fp) {
            Some((_, n)) => *n += u32::from(new_visit),
            None => variants.push((fp, 1)),
        }
    };
    for entry in window {
        let same_answer = matches!(entry.result, Some((fp, _)) if fp == answer);
        if entry.tool == call.tool_fp && same_answer && entry.outcome != Outcome::Refused {
            calls += 1;
            visit(entry.call, &mut variants);
        }
    }
    visit(call.fp, &mut variants);
    let repeated = variants
        .iter()
        .filter(|(_, n)| *n >= policy.churn_min_repeats)
        .count();
    if repeated < 2 {
        return None;
    }
    let count = calls + 1;
    let evidence = 2 * policy.churn_min_repeats + 1;
    let level = level(
        count,
        policy.churn_limit,
        policy.warning_threshold,
        evidence,
    );
    verdict(
        level,
        Reason::ArgChurn,
        Detector::ArgChurn,
        count,
        |blocked| message::arg_churn(call.tool, variants.len(), count, blocked),
    )
}

/// One question asked again and again in new words, every answer the same (a flailing
/// search): the calls of the same tool and shape whose wording overlaps this call's —
/// or that were themselves judged rewordings — and got one answer, since the last
/// progress. The call that would be the `no_progress_limit`-th is refused before it
/// runs: the no-progress stop would come one call later.
fn rewording(run: &RunState, call: &Call<'_>) -> Option<Verdict> {
    let policy = &run.policy;
    if !policy.detectors.arg_churn || call.patient || call.interlude {
        return None;
    }
    let wording = call.wording.as_ref()?;
    let detection = &run.detection;
    let since_progress = |serial: u64| {
        detection
            .window
            .iter()
            .any(|e| e.serial == serial && e.outcome == Outcome::Executed)
    };
    let this_call = crate::run::short(call.fp);
    let asked = || {
        detection.wordings.iter().filter(move |w| {
            w.tool == call.tool_fp
                && w.call != this_call
                && w.wording.shape == wording.shape
                && since_progress(w.serial)
        })
    };
    // The answer of the latest earlier wording of this question.
    let answer = asked()
        .rfind(|w| same_question(&w.wording.words, &wording.words))?
        .answer;
    let prior = asked()
        .filter(|w| {
            w.answer == answer && (w.reworded || same_question(&w.wording.words, &wording.words))
        })
        .count() as u32;
    let count = prior + 1;
    let level = level(count, policy.no_progress_limit, policy.warning_threshold, 3);
    verdict(
        level,
        Reason::ArgChurn,
        Detector::ArgChurn,
        count,
        |blocked| message::rewording(&(call.label)(), prior, blocked),
    )
}

/// A long streak of calls of one tool and shape that differ only in their words, all
/// answered the same: a batch over a list, or a search that finds nothing however it
/// is worded. Only a nudge — warned at every `critical_threshold`-th such answer, never
/// refused: the model is told what the guard sees and decides.
fn answer_streak(run: &RunState, call: &Call<'_>) -> Option<Verdict> {
    let wording = call.wording.as_ref()?;
    if call.patient || call.interlude || wording.words.len() > QUESTION_WORDS {
        return None;
    }
    let streak = run.detection.answer_streak?;
    let every = run.policy.critical_threshold;
    if streak.tool != call.tool_fp
        || streak.shape != wording.shape
        || streak.count < every
        || streak.count % every != 0
    {
        return None;
    }
    Some(Verdict {
        action: Action::Warn,
        reason: Reason::SameAnswerStreak,
        detector: None,
        count: Some(streak.count),
        message: message::same_answer_streak(call.tool, streak.count),
    })
}
