//! Label values come from events and policy, i.e. from outside the process. Every value
//! passes through a [`Bounded`] set first, so a producer with a bug (or a hostile one)
//! cannot create unbounded series: unknown values are counted as `other`.

use std::collections::HashSet;
use std::sync::RwLock;

/// The value recorded in place of anything outside a label's bounds.
pub const OTHER: &str = "other";

/// Event types of guard.md §2.
pub const EVENT_TYPES: &[&str] = &[
    "run_started",
    "tool_call",
    "tool_result",
    "progress",
    "model_turn",
    "compaction",
    "cancel",
    "resume",
    "run_finished",
    "instance_launched",
    "tick",
    "ledger_resolve",
    "prompt",
    "model_call",
];

/// Gate and observe actions of guard.md §3.
pub const ACTIONS: &[&str] = &[
    "execute",
    "warn",
    "use_completed_result",
    "block",
    "stop",
    "continue",
    "complete",
    "retry_after",
    "wait_for_changed_precondition",
    "poll_bounded",
];

/// Reason codes of guard.md §3, plus `none` for decisions that carry no reason.
pub const REASONS: &[&str] = &[
    "none",
    "step_budget",
    "time_budget",
    "token_budget",
    "cost_budget",
    "turn_budget",
    "tool_error_limit",
    "same_call_repeat",
    "ping_pong",
    "arg_churn",
    "no_progress",
    "poll_no_progress",
    "unknown_tool",
    "global_circuit_breaker",
    "compaction_loop_persisted",
    "compaction_thrash",
    "compaction_budget",
    "consecutive_blocks",
    "operation_in_flight",
    "operation_outcome_unknown",
    "precondition_unchanged",
    "retry_too_soon",
    "wait_budget",
    "same_answer_streak",
    "ancestor_stopped",
    "tree_budget",
    "spawn_limit",
    "concurrency_limit",
    "depth_limit",
    "subtask_repeat",
    "child_stopped",
    "invalid_model_output",
    "model_refusal",
    "cancelled",
    "run_closed",
    "completed",
    "agent_failed",
    "permission_denied",
    "policy_blocked",
    "needs_human",
    "fatal",
];

/// Terminal states of guard.md §3.
pub const TERMINAL_STATES: &[&str] = &[
    "STOPPED_LOOP_GUARD",
    "NEEDS_HUMAN",
    "FAILED",
    "CANCELLED",
    "COMPLETED",
];

/// EC2 instance states the watchdog reports (watchdog.md "Deadlines").
pub const INSTANCE_STATES: &[&str] = &[
    "pending",
    "running",
    "stopping",
    "stopped",
    "shutting-down",
    "terminated",
];

/// Depths of sub-agents below their tree's root (guard contract §6): runs deeper than the
/// last are counted in it (the default `max_depth` is 3).
pub const DEPTHS: &[&str] = &["1", "2", "3", "4+"];

/// Termination reasons of watchdog.md "Termination".
pub const TERMINATION_REASONS: &[&str] = &["deadline", "max_lifetime", "run_ended", "leftover"];

/// How a daemon's set of served partitions changes (cluster mode): `claimed` (lease
/// taken and caught up), `released` (given up: shutdown or above the fair share),
/// `lost` (lease taken by another daemon or not renewed in time), `failed` (its
/// service stopped: a fenced or failed batch).
pub const PARTITION_CHANGES: &[&str] = &["claimed", "released", "lost", "failed"];

/// Distinct values kept for labels without a fixed vocabulary (detector, rejection
/// reason, API operation, region) before new ones become `other`.
pub const OPEN_LABEL_CAP: usize = 64;

/// Longest label value accepted for open labels; ids are short, prose is not a label.
const MAX_OPEN_VALUE_LEN: usize = 64;

/// The values one label may take.
#[derive(Debug)]
pub enum Bounded {
    /// A fixed vocabulary from the spec.
    Fixed(&'static [&'static str]),
    /// Any identifier-like value, the first `cap` distinct ones only.
    Open {
        cap: usize,
        seen: RwLock<HashSet<String>>,
    },
}

impl Bounded {
    pub fn open(cap: usize) -> Self {
        Bounded::Open {
            cap,
            seen: RwLock::new(HashSet::new()),
        }
    }

    /// The value to record for `value`: itself when in bounds, otherwise [`OTHER`].
    pub fn bound<'a>(&self, value: &'a str) -> &'a str {
        match self {
            Bounded::Fixed(allowed) => allowed
                .iter()
                .copied()
                .find(|a| *a == value)
                .map_or(OTHER, |_| value),
            Bounded::Open { cap, seen } => {
                if !is_identifier(value) {
                    return OTHER;
                }
                // Poisoning only means another recorder panicked mid-insert; the set is
                // still a valid set, so keep counting rather than take metrics down.
                if seen
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .contains(value)
                {
                    return value;
                }
                let mut seen = seen.write().unwrap_or_else(|e| e.into_inner());
                if seen.contains(value) || seen.len() < *cap {
                    seen.insert(value.to_string());
                    value
                } else {
                    OTHER
                }
            }
        }
    }
}

fn is_identifier(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= MAX_OPEN_VALUE_LEN
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_maps_unknown_to_other() {
        let b = Bounded::Fixed(TERMINAL_STATES);
        assert_eq!(b.bound("FAILED"), "FAILED");
        assert_eq!(b.bound("failed"), OTHER);
    }

    #[test]
    fn open_keeps_first_cap_values_then_other() {
        let b = Bounded::open(2);
        assert_eq!(b.bound("a"), "a");
        assert_eq!(b.bound("b"), "b");
        assert_eq!(b.bound("c"), OTHER);
        assert_eq!(b.bound("a"), "a");
    }

    #[test]
    fn open_rejects_non_identifiers() {
        let b = Bounded::open(10);
        assert_eq!(b.bound(""), OTHER);
        assert_eq!(b.bound("has space"), OTHER);
        assert_eq!(b.bound(&"x".repeat(65)), OTHER);
        assert_eq!(b.bound("us-east-1"), "us-east-1");
    }
}
