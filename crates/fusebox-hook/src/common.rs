//! What every agent's protocol shares: session ids as run ids, what came back from the
//! guard, and the words the model reads.

use std::collections::BTreeMap;

use fusebox_core::event::{hex_sha256, op_key_from_arg, Output, DEFAULT_MAX_STORED_RESULT_BYTES};
use fusebox_core::ledger::RESULT_NOT_STORED;
use fusebox_core::parse::{RejectReason, DEFAULT_MAX_EVENT_BYTES};
use fusebox_core::{check_event, Action, Decision, Event, EventBody};
use serde_json::Value;

/// A session id as a run id of the contract (`[A-Za-z0-9_-]{1,128}`). Claude Code's ids
/// are UUIDs and pass unchanged; anything else has its other characters replaced and a
/// hash of the original appended, so two different sessions never share a run.
pub fn run_id(session_id: &str) -> String {
    const MAX: usize = 128;
    let safe = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if !session_id.is_empty() && session_id.len() <= MAX && session_id.chars().all(safe) {
        return session_id.to_owned();
    }
    let suffix = &hex_sha256(session_id.as_bytes())[..16];
    let cleaned: String = session_id
        .chars()
        .map(|c| if safe(c) { c } else { '_' })
        .take(MAX - suffix.len() - 1)
        .collect();
    format!("{cleaned}-{suffix}")
}

/// The first run of sub-agent `agent_id` of the session run `session_run`:
/// `<session run>-<agent id>`, in the run id charset (see [`run_id`]). The run is a
/// child of the session's run (guard contract §6); a sub-agent continued after it ended
/// goes on in `<that>-2`, `-3` … (the caller keeps which).
pub fn sub_agent_run(session_run: &str, agent_id: &str) -> String {
    run_id(&format!("{session_run}-{agent_id}"))
}

/// A sub-agent's `run_started`: a child of the session's run, with the session's agent
/// name, so its tool knowledge and policy apply to the sub-agent's calls too. `prefix`
/// names the protocol in the event id (`cc`, `cx`); one id per run, so a start sent
/// twice (its SubagentStart, and the first call of a sub-agent whose start was not seen)
/// is applied once.
pub fn sub_agent_started(
    prefix: &str,
    tenant: &str,
    run: &str,
    parent: &str,
    agent: &str,
    ts_ms: u64,
) -> Event {
    Event {
        v: 1,
        id: format!("{prefix}-subagent-start"),
        tenant: tenant.to_owned(),
        run: run.to_owned(),
        seq: None,
        ts_ms,
        body: EventBody::RunStarted(fusebox_core::event::RunStarted {
            agent: Some(agent.to_owned()),
            tools: None,
            policy: None,
            parent: Some(parent.to_owned()),
        }),
    }
}

/// A sub-agent's `run_finished`: it ended (its SubagentStop), or its session did while
/// it was still open.
pub fn sub_agent_finished(prefix: &str, tenant: &str, run: &str, why: &str, ts_ms: u64) -> Event {
    Event {
        v: 1,
        id: format!("{prefix}-subagent-stop"),
        tenant: tenant.to_owned(),
        run: run.to_owned(),
        seq: None,
        ts_ms,
        body: EventBody::RunFinished(fusebox_core::event::RunFinished {
            status: Some(why.to_owned()),
        }),
    }
}

/// What a sub-agent the guard refused to start is told before its first call (the
/// agents let a sub-agent's start hook add context, not prevent the start).
pub fn sub_agent_refused(report: &str) -> String {
    format!(
        "{report}\nThe guard did not let this sub-agent start: every tool call it makes is \
         refused. End now, and say in your answer that the guard refused to start you and why."
    )
}

/// What the agent that started a sub-agent reads with the sub-agent's result when the
/// guard stopped the sub-agent (its own answer does not say so).
pub fn sub_agent_stopped_note(agent_id: &str, report: &str) -> String {
    format!(
        "fusebox: the guard stopped sub-agent {agent_id} before it finished; it was told: \
         {report}"
    )
}

/// Which tool calls name a business operation, and how much of such a call's result
/// goes to the daemon: for the hooks what the MCP gateway's `op_key_arg` and
/// `max_stored_result_bytes` are. The hook only names the operation and sends what it
/// has; whether the call runs, and what a repeat gets, the daemon's ledger decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operations {
    /// Tool name → the argument whose value names the call's operation (op_key
    /// `<tool>:<value>`): one such operation per value, ever, in the tenant.
    pub op_key_args: BTreeMap<String, String>,
    /// Up to this many bytes of JSON a keyed call's result is sent whole, and the ledger
    /// answers a repeat with it; past it, as its hash (a repeat is told the operation
    /// completed and where). Other results go as their hash past 32 KiB.
    pub max_stored_result_bytes: usize,
}

impl Default for Operations {
    fn default() -> Self {
        Operations {
            op_key_args: BTreeMap::new(),
            max_stored_result_bytes: DEFAULT_MAX_STORED_RESULT_BYTES,
        }
    }
}

impl Operations {
    /// The call's op_key, if its tool names one and the input carries the argument.
    pub fn op_key(&self, tool: &str, input: Option<&Value>) -> Option<String> {
        let arg = self.op_key_args.get(tool)?;
        op_key_from_arg(tool, input?.get(arg)?)
    }

    /// A call's result as the daemon is sent it: a keyed call's whole up to
    /// `max_stored_result_bytes`, any other's up to
    /// [`INLINE_LIMIT`](fusebox_core::event::INLINE_LIMIT). The result
    /// payload carries the call's input, so the key is found again without state.
    pub fn output(&self, tool: &str, input: Option<&Value>, value: Value) -> Output {
        match self.op_key(tool, input) {
            Some(_) => Output::inline_up_to(value, self.max_stored_result_bytes),
            None => Output::inline_or_hash(value),
        }
    }
}

/// The event as the hook sends it, or the hook's own error for a payload the daemon
/// would refuse (an empty tool name, an id past the contract's length). A result too
/// large for an event goes as its hash instead: it still completes or releases the
/// call's op_key, which must not stay in flight for want of the result's bytes.
pub fn checked(event: Event, hook_event_name: &str) -> Result<Event, String> {
    let refused =
        |message: String| format!("cannot guard this {hook_event_name} payload: {message}");
    match check_event(&event, DEFAULT_MAX_EVENT_BYTES) {
        Ok(()) => Ok(event),
        Err(err) if err.reason == RejectReason::TooLarge => match with_result_hashed(&event) {
            Some(hashed) => check_event(&hashed, DEFAULT_MAX_EVENT_BYTES)
                .map(|()| hashed)
                .map_err(|err| refused(err.message)),
            None => Err(refused(err.message)),
        },
        Err(err) => Err(refused(err.message)),
    }
}

/// A `tool_result` whose output went inline, with its hash instead; `None` for any other
/// event. For a result the daemon refused `too_large` (its `max_event_bytes` set below
/// the default): the hook sends it again so.
pub fn with_result_hashed(event: &Event) -> Option<Event> {
    let mut hashed = event.clone();
    let EventBody::ToolResult(result) = &mut hashed.body else {
        return None;
    };
    result.hash_output().then_some(hashed)
}

/// What came back from the guard.
pub enum Outcome<'a> {
    Decided(&'a Decision),
    /// No decision: the guard was silent or refused the event. `allowed` is the
    /// configured `--on-error` policy (a refused event is never allowed).
    Failed {
        why: String,
        allowed: bool,
    },
}

/// The guard's message, always starting with `fusebox:` so the model (and the user
/// reading the transcript) can tell who refused.
pub fn message_of(decision: &Decision) -> String {
    match &decision.message {
        Some(message) => format!("fusebox: {message}"),
        None => format!(
            "fusebox: {}{}",
            decision.action.as_str(),
            decision
                .reason
                .map(|r| format!(" ({})", r.as_str()))
                .unwrap_or_default()
        ),
    }
}

/// Why a call answered from the ledger (`use_completed_result`) does not run: the
/// guard's message and the stored result, as text the model reads. A result the daemon
/// kept only as where it is (too large to store) is not a result: the message alone
/// says the operation completed, where and when.
pub fn completed_reason(decision: &Decision) -> String {
    let message = message_of(decision);
    match &decision.result {
        Some(stored) if stored.get(RESULT_NOT_STORED).is_some() => message,
        stored => format!(
            "{message}\nStored result: {}",
            serde_json::to_string(stored.as_ref().unwrap_or(&Value::Null))
                .expect("JSON values serialise")
        ),
    }
}

/// Words for the model after a tool ran, when the guard has any: a wait, a warning.
/// `retry_after` with no wait is how a failed command is reported and says nothing the
/// model does not know.
pub fn observe_context(decision: &Decision) -> Option<String> {
    if decision.action == Action::RetryAfter && decision.wait_ms.unwrap_or(0) == 0 {
        return None;
    }
    decision.message.as_ref().map(|m| format!("fusebox: {m}"))
}

/// Why the user's prompt is blocked: the daemon answers a prompt `stop` only for a run
/// that was stopped before it (the latch), with that stop's report. The user reads it,
/// not the model, so it says what became of the prompt and how to go on.
pub fn prompt_refused(report: &str) -> String {
    format!(
        "{report}\nThis session was stopped before your prompt, which did not reach the \
         model. Start a new session to go on."
    )
}

/// The reason a call is refused when the guard could not be asked.
pub fn unasked_reason(why: &str) -> String {
    format!(
        "fusebox: {why}; the call is refused because the guard could not be asked. \
         Do not retry it until the guard is back."
    )
}

/// What the model reads when a call runs unguarded by the user's choice.
pub fn unguarded_note(why: &str) -> String {
    format!("fusebox: {why}; the call runs unguarded (--on-error allow).")
}

/// A shell command's output with its lines in one order, as the loop detector must
/// compare it. Codex CLI and headless Gemini CLI read a command's stdout and stderr on
/// two pipes and join them in arrival order, so one command answers `err⏎out` one time
/// and `out⏎err` the next (seen with `cat missing || echo running` in both); each new
/// order would look like a new answer (progress) and let a runaway loop run on. The
/// price: an output that only reorders the same lines is no news.
pub fn lines_in_one_order<'a>(lines: impl IntoIterator<Item = &'a str>) -> String {
    let mut lines: Vec<&str> = lines.into_iter().collect();
    lines.sort_unstable();
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_session_ids_are_run_ids_unchanged() {
        let id = "418b4508-5f3f-48e9-adee-d7dbaac95e56";
        assert_eq!(run_id(id), id);
    }

    #[test]
    fn other_session_ids_are_made_safe_and_stay_distinct() {
        let a = run_id("a.b");
        let b = run_id("a/b");
        assert!(a.starts_with("a_b-") && b.starts_with("a_b-"));
        assert_ne!(a, b);
        let long = run_id(&"x".repeat(300));
        assert_eq!(long.len(), 128);
        assert!(run_id("").len() > 1);
        for id in [a, b, long] {
            assert!(id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        }
    }

    #[test]
    fn a_sub_agents_run_extends_its_sessions() {
        let session = "418b4508-5f3f-48e9-adee-d7dbaac95e56";
        assert_eq!(
            sub_agent_run(session, "a34c78a2a729c0ecf"),
            format!("{session}-a34c78a2a729c0ecf")
        );
        // Codex names a sub-agent by its thread id; anything else is made safe.
        let codex = sub_agent_run(session, "01a24223-b348-77c3-8a39-9996fb074da6");
        assert_eq!(codex.len(), 73);
        let odd = sub_agent_run(session, "agent/1");
        assert!(odd.starts_with(&format!("{session}-agent_1-")), "{odd}");
        let long = sub_agent_run(&"s".repeat(120), "a34c78a2a729c0ecf");
        assert_eq!(long.len(), 128);
        assert_ne!(long, sub_agent_run(&"s".repeat(120), "b34c78a2a729c0ecf"));
    }
}
