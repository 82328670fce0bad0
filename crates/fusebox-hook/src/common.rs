//! What every agent's protocol shares: session ids as run ids, what came back from the
//! guard, and the words the model reads.

use fusebox_core::event::hex_sha256;
use fusebox_core::{Action, Decision};

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

/// The stored result of a completed operation, as text for a deny reason.
pub fn stored_result(decision: &Decision) -> String {
    decision
        .result
        .as_ref()
        .map(|r| serde_json::to_string(r).expect("JSON values serialise"))
        .unwrap_or_else(|| "null".to_owned())
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
}
