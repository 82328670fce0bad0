//! The sentences the model reads (Principle 7: tell the model why). Each says what was
//! refused and what to do next; a refusal that returns nothing makes a blind agent that
//! retries.

use crate::decision::{Reason, StopReport, TerminalState};
use crate::event::Args;

const LABEL_MAX: usize = 120;

/// `tool({"q":"x"})`, cut to a readable length.
pub fn call_label(tool: &str, args: &Args) -> String {
    let rendered = match args {
        Args::Json(value) => compact_json(value),
        Args::Hash(hash) => format!("#{}", cut(hash, 12)),
    };
    let mut label = format!("{tool}({rendered})");
    if label.len() > LABEL_MAX {
        let end = floor_char_boundary(&label, LABEL_MAX);
        label.truncate(end);
        label.push_str("…)");
    }
    label
}

/// `value` as compact JSON, the same text as `value.to_string()`: `Display` writes it
/// through the formatting machinery a few bytes at a time, which was most of the cost
/// of storing a completed operation's result (replay does it for every one).
pub(crate) fn compact_json(value: &serde_json::Value) -> String {
    serde_json::to_string(value).expect("a JSON value always serialises")
}

fn floor_char_boundary(s: &str, mut index: usize) -> usize {
    while !s.is_char_boundary(index) {
        index -= 1;
    }
    index
}

fn cut(s: &str, max: usize) -> &str {
    &s[..floor_char_boundary(s, max.min(s.len()))]
}

fn times(n: u32) -> String {
    match n {
        1 => "once".to_owned(),
        2 => "twice".to_owned(),
        n => format!("{n} times"),
    }
}

/// `ran` counts executions, `refused` the identical calls refused since: the model
/// reads this, and "already ran 4 times" after 3 executions would be false.
pub fn same_call_repeat(label: &str, ran: u32, refused: u32, blocked: bool) -> String {
    let refused = match refused {
        0 => String::new(),
        n => format!(" (and was refused {} since)", times(n)),
    };
    if blocked {
        format!(
            "{label} already ran {}{refused} with the same result and no progress; use that result or change the query.",
            times(ran)
        )
    } else {
        format!(
            "{label} already ran {}{refused} with the same result and no progress; one more identical call will be blocked, so use the result you have or change the arguments.",
            times(ran)
        )
    }
}

pub fn rewording(label: &str, prior: u32, blocked: bool) -> String {
    let lead = format!(
        "{label} asks again, in other words, what was asked {} already with the same answer each time",
        times(prior)
    );
    if blocked {
        format!("{lead}; rewording does not change the answer. Use that answer, try a different tool or source, or report that it is not there.")
    } else {
        format!(
            "{lead}; rewording does not change the answer, and more rewordings will be blocked."
        )
    }
}

pub fn same_answer_streak(tool: &str, count: u32) -> String {
    format!(
        "the last {count} calls of {tool} asked different things and all got the same answer. If you are going through a list, go on; if you are looking for one thing, it is not found this way: change approach or report it."
    )
}

pub fn ping_pong(label: &str, length: u32, blocked: bool) -> String {
    let lead = format!(
        "the last {length} calls alternate between the same two calls with no progress (next: {label})"
    );
    if blocked {
        format!("{lead}; stop switching back and forth and act on what you already have, or try another approach.")
    } else {
        format!("{lead}; one more round trip will be blocked, so act on what you already have.")
    }
}

pub fn poll_no_progress(label: &str, answers: u32, critical: u32, blocked: bool) -> String {
    if blocked {
        format!(
            "{label} answered PENDING with the same result {}; the job is not moving. Stop polling and report it as stuck, or wait for an external change.",
            times(answers)
        )
    } else {
        format!(
            "{label} answered PENDING with the same result {}; wait longer between polls. After {critical} identical answers polling is blocked.",
            times(answers)
        )
    }
}

pub fn arg_churn(tool: &str, variants: usize, count: u32, blocked: bool) -> String {
    let lead = format!(
        "{tool} was called {count} times with {variants} argument variants that all return the same result"
    );
    if blocked {
        format!("{lead}; rewording does not change the answer. Use it, or try a different tool.")
    } else {
        format!("{lead}; rewording does not change the answer, and more variants will be blocked.")
    }
}

pub fn unknown_tool(tool: &str, allowed: Option<&[String]>, blocked: bool) -> String {
    let allowed = match allowed {
        Some(tools) if !tools.is_empty() => format!(" Available tools: {}.", tools.join(", ")),
        _ => String::new(),
    };
    if blocked {
        format!("tool {tool} is not available in this run; calls to it are refused.{allowed}")
    } else {
        format!("tool {tool} is not available in this run; use an available tool instead.{allowed}")
    }
}

pub fn retry_too_soon(label: &str, wait_ms: u64) -> String {
    format!("{label} failed with a retryable error; retry in {wait_ms} ms, not before.")
}

pub fn retry_after(wait_ms: u64, attempts: u32) -> String {
    format!("retryable error (attempt {attempts}); retry the same call after {wait_ms} ms, or change the call.")
}

pub fn precondition_unchanged(label: &str, code: Option<&str>) -> String {
    let code = code.map(|c| format!(" ({c})")).unwrap_or_default();
    format!(
        "{label} failed its precondition{code} and nothing has changed since; change that precondition first or ask for help, do not retry as is."
    )
}

pub fn wait_for_precondition(code: Option<&str>) -> String {
    let code = code.map(|c| format!(" ({c})")).unwrap_or_default();
    format!("precondition not met{code}; the same call is refused until something changes.")
}

pub fn poll_bounded(wait_ms: u64, left: u32, budget_s: u64) -> String {
    format!(
        "still pending; poll again in {wait_ms} ms or later. Polls that wait that long may go on for {} while the answer stays the same; quicker ones are blocked after {left} more identical answers.",
        minutes(budget_s)
    )
}

pub fn wait_budget(label: &str, waited_ms: u64, budget_s: u64, blocked: bool) -> String {
    let waited = minutes(waited_ms / 1000);
    let budget = minutes(budget_s);
    if blocked {
        format!("{label} has waited {waited} for the same answer, its whole wait budget of {budget}; stop waiting and report it as stuck, or ask for help.")
    } else {
        format!("{label} has waited {waited} of its {budget} wait budget for the same answer; plan for it not to finish, and report it if it does not.")
    }
}

/// `45 s`, `12 min`, `2 h 5 min`.
fn minutes(seconds: u64) -> String {
    match seconds {
        s if s < 120 => format!("{s} s"),
        s if s < 7200 => format!("{} min", s / 60),
        s => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

pub fn operation_in_flight(op_key: &str) -> String {
    format!("operation {op_key} is already executing; wait for its result instead of starting it again.")
}

pub fn outcome_unknown_retry(op_key: &str, run: &str, since_ms: u64) -> String {
    format!("operation {op_key} was started before (run {run}) and not heard of since event time {since_ms}; whether it happened is unknown, and this run's policy lets it run again: make sure it does not happen twice.")
}

pub fn outcome_unknown_detail(op_key: &str, run: &str, call_id: &str, since_ms: u64) -> String {
    format!("op_key {op_key}: call {call_id} of run {run} never answered (no word since event time {since_ms}); find out whether it happened, then `fusebox ledger resolve` it")
}

/// What an operator's `ledger_resolve` did, for the audit trail.
pub fn resolved(
    resolve: &crate::event::LedgerResolve,
    before: Option<&crate::ledger::LedgerEntry>,
) -> String {
    use crate::event::Resolution;
    use crate::ledger::LedgerEntry;
    let by = resolve
        .by
        .as_deref()
        .map(|b| format!(" by {b}"))
        .unwrap_or_default();
    let was = match before {
        Some(LedgerEntry::InFlight {
            run,
            call_id,
            since_ms,
        }) => format!("in flight (call {call_id} of run {run}, since event time {since_ms})"),
        Some(LedgerEntry::Completed { run, call_id, .. }) => {
            format!("completed (call {call_id} of run {run})")
        }
        None => "not in the ledger".to_owned(),
    };
    let why = resolve
        .reason
        .as_deref()
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    let now = match resolve.resolution {
        Resolution::Completed => "marked completed: later calls with it get the given result",
        Resolution::Released => "released: the next call with it runs",
    };
    format!("operation {} {now}{by}{why}; it was {was}.", resolve.op_key)
}

pub fn completed_result(op_key: &str) -> String {
    format!("operation {op_key} already completed; its stored result is attached. Do not repeat it; use a new operation key for a deliberate second one.")
}

/// A completed operation whose result was too large to store: where it came from.
pub fn completed_result_not_stored(op_key: &str, elsewhere: &serde_json::Value) -> String {
    let text = |key: &str| elsewhere.get(key).and_then(|v| v.as_str()).unwrap_or("?");
    let at = elsewhere
        .get("completed_at_ms")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or_default();
    format!(
        "operation {op_key} already completed (run {}, call {}, at {at} ms since the epoch), but its result was too large to store and is not attached (its SHA-256 is {}): look it up where the tool keeps it. Do not repeat it; use a new operation key for a deliberate second one.",
        text("run"),
        text("call_id"),
        text("output_hash"),
    )
}

/// The message of every stop: what happened and what the agent must do now.
pub fn stop(report: &StopReport) -> String {
    let why = match report.reason {
        Reason::StepBudget => "the step budget is spent".to_owned(),
        Reason::TimeBudget => "the time budget is spent".to_owned(),
        // A model call refused for what it would reserve says how far the budget is.
        Reason::TokenBudget | Reason::CostBudget | Reason::TurnBudget
            if report.detail.is_some() =>
        {
            report.detail.clone().unwrap_or_default()
        }
        Reason::TokenBudget => "the token budget is spent".to_owned(),
        Reason::CostBudget => "the cost budget is spent".to_owned(),
        Reason::TurnBudget => "the model-turn budget is spent".to_owned(),
        Reason::ToolErrorLimit => "too many tool errors".to_owned(),
        Reason::InvalidModelOutput => "too many invalid model outputs".to_owned(),
        Reason::NoProgress => "too many results in a row without progress".to_owned(),
        Reason::GlobalCircuitBreaker => "too many outcomes without progress".to_owned(),
        Reason::ConsecutiveBlocks => "refused calls kept being retried".to_owned(),
        Reason::CompactionLoopPersisted => {
            "the same loop went on after a context compaction".to_owned()
        }
        Reason::CompactionThrash => {
            "the context was compacted again and again with nothing done in between".to_owned()
        }
        Reason::CompactionBudget => "the compaction budget is spent".to_owned(),
        Reason::ModelRefusal => "the model refused".to_owned(),
        Reason::Cancelled => "an operator cancelled it".to_owned(),
        Reason::OperationOutcomeUnknown => format!(
            "whether an operation happened is unknown ({})",
            report
                .detail
                .as_deref()
                .unwrap_or("an operation never answered")
        ),
        Reason::Completed | Reason::RunClosed => "the run has finished".to_owned(),
        Reason::AgentFailed => "the agent reported that it failed".to_owned(),
        // The tree's stops say which run and which budget or cap: the detail is that.
        Reason::AncestorStopped
        | Reason::TreeBudget
        | Reason::SpawnLimit
        | Reason::ConcurrencyLimit
        | Reason::DepthLimit
        | Reason::SubtaskRepeat => report
            .detail
            .clone()
            .unwrap_or_else(|| report.reason.as_str().to_owned()),
        other => format!("{} (a tool reported a fatal error)", other.as_str()),
    };
    let next = match report.terminal_state {
        TerminalState::Completed => "do not call more tools.",
        TerminalState::NeedsHuman => {
            "do not call more tools; a human must act before this run can resume."
        }
        _ => "do not call more tools; report what you have to the user.",
    };
    // Compaction stops say what was compacted how often: the operator's first question.
    let detail = match (report.reason, &report.detail) {
        (Reason::CompactionThrash | Reason::CompactionBudget, Some(detail)) => {
            format!(" ({detail})")
        }
        _ => String::new(),
    };
    format!(
        "run stopped ({}): {why}{detail}; {next}",
        report.terminal_state.as_str()
    )
}

pub fn child_stopped(children: &[String]) -> String {
    format!(
        "a sub-agent of this run was stopped by the guard: {}. Its work is not done; do it another way or report it, rather than starting the same sub-agent again.",
        children.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_json_is_the_text_display_gives() {
        // Stored results and labels were `to_string()` text when logs were written: the
        // same event must keep giving the same decision bytes.
        let values = [
            r#"null"#,
            r#"{"b":[1,-2,3.5,1e300,18446744073709551615],"a":"é\"\\\n\u0001 ","c":{}}"#,
            r#"[true,false,{"x":[[]]},"\ud83d\ude00",0.1,-0.0]"#,
        ];
        for text in values {
            let value: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(compact_json(&value), value.to_string());
        }
    }
}
