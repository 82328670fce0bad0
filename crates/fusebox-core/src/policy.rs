//! Policy: the thresholds and switches of every layer (guard contract §5), its presets,
//! and the field-by-field layering built-in < config < agent < run.
//!
//! Layers are JSON objects merged recursively (objects merge, everything else replaces),
//! then read into [`Policy`] with unknown keys refused, so a typo in a config file or a
//! run's overrides is an error instead of a silently ignored setting.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::Effect;
use crate::volatile::Mask;

/// Runtime metadata that changes on every call without the world changing; dropped at
/// any depth of a tool's output before its result is fingerprinted.
pub const DEFAULT_VOLATILE_RESULT_KEYS: [&str; 19] = [
    "duration",
    "duration_ms",
    "elapsed",
    "elapsed_ms",
    "took",
    "took_ms",
    "latency_ms",
    "pid",
    "session_id",
    "message_id",
    "file_id",
    "request_id",
    "trace_id",
    "span_id",
    "timestamp",
    "ts",
    "created_at",
    "updated_at",
    "sent_at",
];

/// Whether `key` is one of [`DEFAULT_VOLATILE_RESULT_KEYS`] in any case and separator
/// style (`durationMs`, `DurationMs`, `duration-ms` are `duration_ms`).
pub fn is_default_volatile(key: &str) -> bool {
    crate::volatile::is_default_volatile_key(key)
}

/// The resolved policy of one run. Every field is set; see `config/fusebox.toml` for
/// what each one does and why its default is what it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub max_steps: u64,
    pub max_duration_s: u64,
    pub max_tokens: u64,
    pub max_cost_usd: f64,
    pub max_model_turns: u64,
    pub max_tool_errors: u64,
    /// Invalid model outputs (`valid: false`) tolerated *in a row*: a valid output
    /// between two invalid ones resets the count (a model that breaks its format once,
    /// is told, and corrects itself is working).
    pub max_invalid_outputs: u64,
    /// Invalid model outputs tolerated in the whole run, however spread out: only a
    /// backstop. (Defaults here too, as for every key added after the first logs.)
    #[serde(default = "default_max_invalid_outputs_total")]
    pub max_invalid_outputs_total: u64,
    /// A gap between two events of a run longer than this, with none of its calls in
    /// flight, is the run waiting for its user (a session left open over lunch): it
    /// spends none of `max_duration_s`, which counts the run's *active* time.
    #[serde(default = "default_idle_after_s")]
    pub idle_after_s: u64,
    /// Levels of sub-agents below this run (a child is 1, its child 2).
    #[serde(default = "default_max_depth")]
    pub max_depth: u32,
    /// Runs started below this run, ever (its whole subtree).
    #[serde(default = "default_max_children")]
    pub max_children: u64,
    /// Runs below this run open at once.
    #[serde(default = "default_max_open_children")]
    pub max_open_children: u32,
    /// Compactions (and context-window overflows) in the run, progress or not. (Issue-20
    /// settings have defaults here too: a log written before them holds policy records
    /// without them.)
    #[serde(default = "default_max_compactions")]
    pub max_compactions: u64,
    pub same_call_limit: u32,
    pub read_same_call_limit: u32,
    pub ping_pong_limit: u32,
    pub churn_limit: u32,
    pub churn_min_repeats: u32,
    pub no_progress_limit: u32,
    pub history_size: u32,
    pub warning_threshold: u32,
    pub critical_threshold: u32,
    pub unknown_tool_threshold: u32,
    pub global_circuit_breaker_threshold: u32,
    pub consecutive_block_limit: u32,
    /// Minutes an `op_key` may stay in flight with no word of it (its call, or a PENDING
    /// answer) before its outcome counts as unknown. (Defaults here too: a log written
    /// before these settings holds policy records without them.)
    #[serde(default = "default_in_flight_lease_minutes")]
    pub in_flight_lease_minutes: u64,
    /// What a call gets for an `op_key` whose lease ran out.
    #[serde(default = "default_stale_in_flight")]
    pub stale_in_flight: StaleInFlight,
    /// The shortest wait between two polls of a PENDING call that counts as waiting as
    /// told: polls that wait at least this long (and at least the `retry_after_ms` the
    /// tool gave) are bounded by `wait_budget_s` instead of by a count; faster ones are
    /// counted. It is also the wait the guard suggests when the tool gave none.
    #[serde(default = "default_poll_min_interval_ms")]
    pub poll_min_interval_ms: u64,
    /// Seconds one call may keep getting the same "wait" answer (PENDING, or RETRYABLE
    /// with `retry_after_ms`) while it waits as told, before it is refused
    /// (`wait_budget`); warned from three quarters of it.
    #[serde(default = "default_wait_budget_s")]
    pub wait_budget_s: u64,
    /// Added to [`DEFAULT_VOLATILE_RESULT_KEYS`], never replacing them; matched across
    /// case and separator styles like them.
    pub volatile_result_keys: Vec<String>,
    #[serde(default = "default_volatile_text")]
    pub volatile_text: VolatileText,
    pub detectors: Detectors,
    pub post_compaction: PostCompaction,
    #[serde(default = "default_compaction_thrash")]
    pub compaction_thrash: CompactionThrash,
    pub tools: BTreeMap<String, ToolPolicy>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Detectors {
    pub exact_repeat: bool,
    pub ping_pong: bool,
    pub arg_churn: bool,
    pub poll_no_progress: bool,
    pub no_progress: bool,
    pub unknown_tool: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostCompaction {
    pub enabled: bool,
    /// Calls watched after a compaction.
    pub window_size: u32,
    /// The same (tool, call, result) this many times among them stops the run; the
    /// call that would make it so is refused at the gate.
    #[serde(default = "default_repeat_limit")]
    pub repeat_limit: u32,
}

fn default_max_invalid_outputs_total() -> u64 {
    Policy::default().max_invalid_outputs_total
}

fn default_max_depth() -> u32 {
    Policy::default().max_depth
}

fn default_max_children() -> u64 {
    Policy::default().max_children
}

fn default_max_open_children() -> u32 {
    Policy::default().max_open_children
}

fn default_idle_after_s() -> u64 {
    Policy::default().idle_after_s
}

fn default_max_compactions() -> u64 {
    Policy::default().max_compactions
}

fn default_volatile_text() -> VolatileText {
    Policy::default().volatile_text
}

fn default_compaction_thrash() -> CompactionThrash {
    Policy::default().compaction_thrash
}

fn default_repeat_limit() -> u32 {
    Policy::default().post_compaction.repeat_limit
}

/// Compactions (or context-window overflows) with no progress between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactionThrash {
    pub enabled: bool,
    /// This many compaction cycles in a row with no progress stop the run.
    pub limit: u32,
}

/// Volatile tokens masked inside the strings of tool outputs, for the result
/// fingerprint only (`volatile.rs` says what each mask matches).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolatileText {
    /// The built-in masks that are on.
    pub mask: Vec<Mask>,
    /// Extra patterns: literal text, `#` for digits, `*` for an id-like run.
    pub patterns: Vec<String>,
}

/// A tool's own masking: `mask` replaces the run's set (`[]` switches masking off for
/// the tool), `patterns` are added to the run's.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolVolatileText {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mask: Option<Vec<Mask>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub patterns: Vec<String>,
}

/// The next attempt of an operation whose outcome is unknown (its in-flight lease ran
/// out with no result): it may have happened — the email may have gone out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StaleInFlight {
    /// Stop the run `NEEDS_HUMAN`, naming the key: an operator finds out what happened
    /// and resolves the key (`fusebox ledger resolve`), then resumes the run.
    NeedsHuman,
    /// Let the call run again, with a warning: for operations that are safe to repeat.
    Retry,
}

fn default_poll_min_interval_ms() -> u64 {
    Policy::default().poll_min_interval_ms
}

fn default_wait_budget_s() -> u64 {
    Policy::default().wait_budget_s
}

fn default_in_flight_lease_minutes() -> u64 {
    Policy::default().in_flight_lease_minutes
}

fn default_stale_in_flight() -> StaleInFlight {
    Policy::default().stale_in_flight
}

/// Per-tool settings; every field optional, falling back to the run's policy.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolPolicy {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effect: Option<Effect>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub same_call_limit: Option<u32>,
    /// Top-level argument keys left out of the call fingerprint (a nonce, a client
    /// timestamp). Never list page, cursor, version, tenant or destination here: they are
    /// what makes two calls different.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ignore_args: Vec<String>,
    /// The tool's own default values: a top-level argument equal to its default is the
    /// same call as one without it (`offset: 1` on a read that starts at line 1 anyway).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub defaults: BTreeMap<String, Value>,
    /// When a SUCCESS answer of this tool says a task is still running (a check on a
    /// background shell or sub-agent): such an answer is a PENDING one, so waiting for it
    /// is judged by the wait rules, not by the repeat counts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub running_when: Vec<OutputCondition>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volatile_result_keys: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volatile_text: Option<ToolVolatileText>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll: Option<PollPolicy>,
    /// Whether the usage and statistics counters in this tool's results (token and
    /// tool-use counts, durations, a `usage` object) are runtime metadata, as they are by
    /// default; `false` for a tool whose counts are its content.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volatile_usage: Option<bool>,
}

/// One condition on a tool's output, for `running_when` (every condition of the list
/// must hold). `field` is a dotted path into an object output (absent: the output
/// itself, when it is text); each list that is given must match: `equals` one of its
/// values (a boolean as `"true"` / `"false"`), `contains` one of its texts, `ends_with`
/// one of its texts, `lacks` none of its texts.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutputCondition {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub equals: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub contains: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ends_with: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lacks: Vec<String>,
}

impl OutputCondition {
    fn holds(&self, output: &Value) -> bool {
        let mut at = output;
        if let Some(field) = &self.field {
            for part in field.split('.') {
                match at.get(part) {
                    Some(next) => at = next,
                    None => return false,
                }
            }
        }
        let text = match at {
            Value::String(text) => text.clone(),
            Value::Bool(b) => b.to_string(),
            Value::Number(n) => n.to_string(),
            _ => return false,
        };
        (self.equals.is_empty() || self.equals.contains(&text))
            && (self.contains.is_empty() || self.contains.iter().any(|t| text.contains(t.as_str())))
            && (self.ends_with.is_empty()
                || self.ends_with.iter().any(|t| text.ends_with(t.as_str())))
            && !self.lacks.iter().any(|t| text.contains(t.as_str()))
    }
}

/// Whether a tool's output says the task it checks is still running: every condition
/// holds (an empty list never does).
pub fn says_running(conditions: &[OutputCondition], output: &Value) -> bool {
    !conditions.is_empty() && conditions.iter().all(|c| c.holds(output))
}

/// For tools that are polled (job status, build state): their own thresholds for the
/// same PENDING answer, and the wait suggested between polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PollPolicy {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning_threshold: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub critical_threshold: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// This tool's own `wait_budget_s` (a build or a training job may take hours).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_budget_s: Option<u64>,
}

/// A named starting point for a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// The seed fixture values: a short leash for untrusted or expensive agents.
    Strict,
    /// The default.
    Balanced,
    /// Long-running agents with noisy tools.
    Lenient,
}

impl Preset {
    pub const ALL: [Preset; 3] = [Preset::Strict, Preset::Balanced, Preset::Lenient];

    pub fn name(self) -> &'static str {
        match self {
            Preset::Strict => "strict",
            Preset::Balanced => "balanced",
            Preset::Lenient => "lenient",
        }
    }

    pub fn from_name(name: &str) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.name() == name)
    }

    pub fn policy(self) -> Policy {
        let balanced = Policy {
            // A backstop, not a leash: long coding sessions run hundreds of tool calls.
            max_steps: 500,
            // "Burning tokens for hours" is the failure this stops.
            max_duration_s: 3600,
            // Cache reads included: 200 turns re-reading a 100k context is 20 M tokens.
            max_tokens: 20_000_000,
            max_cost_usd: 25.0,
            max_model_turns: 500,
            max_tool_errors: 50,
            // In a row: a model that breaks its output format and corrects itself at the
            // next turn is working (resolved SWE-bench runs do it 6-31 times in a run).
            max_invalid_outputs: 5,
            max_invalid_outputs_total: 50,
            // Longer than a model takes to think, shorter than a lunch break.
            idle_after_s: 600,
            // Claude Code keeps sub-agents to depth 3 and 20 at once; 100 in one tree
            // stops the 905-sub-agent prompt at a ninth of its cost.
            max_depth: 3,
            max_children: 100,
            max_open_children: 20,
            // A worker with progress compacts every few tens of minutes; 20 in an hour
            // is a worker that does little else (config/fusebox.toml says more).
            max_compactions: 20,
            // The anchors (guard issue 20): an identical write refused at the 3rd call,
            // an identical read at the 4th, an alternation at its 6th call.
            same_call_limit: 2,
            read_same_call_limit: 3,
            ping_pong_limit: 5,
            churn_limit: 8,
            churn_min_repeats: 2,
            no_progress_limit: 10,
            history_size: 20,
            warning_threshold: 5,
            critical_threshold: 10,
            unknown_tool_threshold: 2,
            global_circuit_breaker_threshold: 20,
            consecutive_block_limit: 3,
            // Minutes, not seconds: a write that takes this long without a PENDING
            // answer has lost its worker far more often than it is still running.
            in_flight_lease_minutes: 15,
            // A blind retry may send the email twice.
            stale_in_flight: StaleInFlight::NeedsHuman,
            // Faster than every 2 s is a hot loop whatever the tool says (80 polls of a
            // queue in 96 s); a CI poll every 30 s is waiting as told.
            poll_min_interval_ms: 2000,
            // CI runs, builds and training jobs take 10–60 minutes: a patient poll may
            // wait as long as the run's own time budget.
            wait_budget_s: 3600,
            volatile_result_keys: Vec::new(),
            volatile_text: VolatileText {
                mask: Mask::ALL.to_vec(),
                patterns: Vec::new(),
            },
            detectors: Detectors {
                exact_repeat: true,
                ping_pong: true,
                arg_churn: true,
                poll_no_progress: true,
                no_progress: true,
                unknown_tool: true,
            },
            post_compaction: PostCompaction {
                enabled: true,
                window_size: 5,
                // The one re-read of what compaction dropped runs; the second is the loop.
                repeat_limit: 2,
            },
            // Claude Code gives up after 3 failed auto-compactions.
            compaction_thrash: CompactionThrash {
                enabled: true,
                limit: 3,
            },
            tools: BTreeMap::new(),
        };
        match self {
            Preset::Balanced => balanced,
            Preset::Strict => Policy {
                max_steps: 20,
                max_duration_s: 900,
                wait_budget_s: 600,
                max_tokens: 2_000_000,
                max_cost_usd: 5.0,
                max_model_turns: 40,
                max_tool_errors: 10,
                max_invalid_outputs: 2,
                max_invalid_outputs_total: 10,
                idle_after_s: 300,
                max_depth: 2,
                max_children: 10,
                max_open_children: 5,
                max_compactions: 5,
                same_call_limit: 2,
                read_same_call_limit: 3,
                ping_pong_limit: 4,
                churn_limit: 6,
                no_progress_limit: 3,
                history_size: 12,
                warning_threshold: 3,
                critical_threshold: 6,
                unknown_tool_threshold: 1,
                global_circuit_breaker_threshold: 10,
                consecutive_block_limit: 2,
                post_compaction: PostCompaction {
                    enabled: true,
                    window_size: 3,
                    repeat_limit: 2,
                },
                compaction_thrash: CompactionThrash {
                    enabled: true,
                    limit: 2,
                },
                ..balanced
            },
            Preset::Lenient => Policy {
                max_steps: 2000,
                max_duration_s: 4 * 3600,
                wait_budget_s: 2 * 3600,
                max_tokens: 100_000_000,
                max_cost_usd: 100.0,
                max_model_turns: 2000,
                max_tool_errors: 200,
                max_invalid_outputs: 10,
                max_invalid_outputs_total: 200,
                idle_after_s: 1800,
                max_depth: 5,
                max_children: 500,
                max_open_children: 50,
                max_compactions: 100,
                same_call_limit: 5,
                read_same_call_limit: 8,
                ping_pong_limit: 10,
                churn_limit: 12,
                no_progress_limit: 20,
                history_size: 30,
                warning_threshold: 10,
                critical_threshold: 20,
                unknown_tool_threshold: 3,
                global_circuit_breaker_threshold: 30,
                consecutive_block_limit: 5,
                post_compaction: PostCompaction {
                    enabled: true,
                    window_size: 8,
                    repeat_limit: 3,
                },
                // OpenHands' 10 consecutive condensations is the loosest anchor.
                compaction_thrash: CompactionThrash {
                    enabled: true,
                    limit: 5,
                },
                ..balanced
            },
        }
    }
}

impl Default for Policy {
    fn default() -> Self {
        Preset::Balanced.policy()
    }
}

/// A policy layer could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    pub layer: String,
    pub message: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "policy {}: {}", self.layer, self.message)
    }
}

impl std::error::Error for PolicyError {}

impl Policy {
    /// Merges `patch` over this policy field by field, then raises any setting that
    /// cannot work to one that can. Returns the policy and one line per raised setting.
    pub fn layered(
        &self,
        patch: &Value,
        layer: &str,
    ) -> Result<(Policy, Vec<String>), PolicyError> {
        if !patch.is_object() {
            return Err(PolicyError {
                layer: layer.to_owned(),
                message: "must be an object (a table)".to_owned(),
            });
        }
        let mut merged = serde_json::to_value(self).expect("a policy always serialises");
        let mismatch = shape_mismatch(&merged, patch, "");
        merge(&mut merged, patch);
        let mut policy: Policy = serde_json::from_value(merged).map_err(|e| PolicyError {
            layer: layer.to_owned(),
            // serde names an unknown key but not the key of a wrongly typed value.
            message: mismatch.unwrap_or_else(|| e.to_string()),
        })?;
        policy.check_patterns().map_err(|message| PolicyError {
            layer: layer.to_owned(),
            message,
        })?;
        let warnings = policy.normalize();
        Ok((policy, warnings))
    }

    /// Enforces the invariants the detectors rely on, raising (never lowering) what
    /// breaks them, and says what it changed:
    /// `warning_threshold < critical_threshold < global_circuit_breaker_threshold`, limits
    /// of at least 1 (2 for patterns that need two calls), and a history window long
    /// enough for every window-based limit to be reachable.
    pub fn normalize(&mut self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.in_flight_lease_minutes == 0 {
            warnings.push(
                "in_flight_lease_minutes raised from 0 to 1: a lease of 0 would call every operation's outcome unknown at once".to_owned(),
            );
            self.in_flight_lease_minutes = 1;
        }
        let mut raise = |name: &str, field: &mut u32, min: u32, why: &str| {
            if *field < min {
                warnings.push(format!("{name} raised from {} to {min}: {why}", *field));
                *field = min;
            }
        };
        raise(
            "same_call_limit",
            &mut self.same_call_limit,
            1,
            "a limit of 0 would refuse every call",
        );
        raise(
            "read_same_call_limit",
            &mut self.read_same_call_limit,
            1,
            "a limit of 0 would refuse every read",
        );
        raise(
            "ping_pong_limit",
            &mut self.ping_pong_limit,
            3,
            "alternation needs at least A B A",
        );
        raise(
            "churn_min_repeats",
            &mut self.churn_min_repeats,
            1,
            "a variant must run at least once",
        );
        let churn_floor = 2 * self.churn_min_repeats + 1;
        raise(
            "churn_limit",
            &mut self.churn_limit,
            churn_floor,
            "churn needs two variants each repeated churn_min_repeats times, plus the call",
        );
        raise(
            "no_progress_limit",
            &mut self.no_progress_limit,
            1,
            "a limit of 0 would stop every run",
        );
        raise(
            "unknown_tool_threshold",
            &mut self.unknown_tool_threshold,
            1,
            "a threshold of 0 is never reached",
        );
        raise(
            "consecutive_block_limit",
            &mut self.consecutive_block_limit,
            1,
            "a limit of 0 is never reached",
        );
        raise(
            "warning_threshold",
            &mut self.warning_threshold,
            1,
            "a threshold of 0 would warn on every call",
        );
        let critical_floor = self.warning_threshold + 1;
        raise(
            "critical_threshold",
            &mut self.critical_threshold,
            critical_floor,
            "warning_threshold < critical_threshold is required",
        );
        let breaker_floor = self.critical_threshold + 1;
        raise(
            "global_circuit_breaker_threshold",
            &mut self.global_circuit_breaker_threshold,
            breaker_floor,
            "critical_threshold < global_circuit_breaker_threshold is required",
        );
        raise(
            "post_compaction.repeat_limit",
            &mut self.post_compaction.repeat_limit,
            2,
            "one call is not a loop",
        );
        let repeat_limit = self.post_compaction.repeat_limit;
        raise(
            "post_compaction.window_size",
            &mut self.post_compaction.window_size,
            repeat_limit,
            "the watch must hold repeat_limit calls",
        );
        raise(
            "compaction_thrash.limit",
            &mut self.compaction_thrash.limit,
            2,
            "one compaction is not thrash",
        );
        let mut window_limits = vec![
            self.same_call_limit,
            self.read_same_call_limit,
            self.ping_pong_limit,
            self.churn_limit,
            self.critical_threshold,
        ];
        for tool in self.tools.values_mut() {
            if let Some(limit) = tool.same_call_limit.as_mut() {
                raise(
                    "tools.*.same_call_limit",
                    limit,
                    1,
                    "a limit of 0 would refuse every call",
                );
                window_limits.push(*limit);
            }
            if let Some(poll) = tool.poll.as_mut() {
                let warn = poll.warning_threshold.unwrap_or(self.warning_threshold);
                if let Some(critical) = poll.critical_threshold.as_mut() {
                    raise(
                        "tools.*.poll.critical_threshold",
                        critical,
                        warn + 1,
                        "warning_threshold < critical_threshold is required",
                    );
                    window_limits.push(*critical);
                }
            }
        }
        let needed = window_limits.into_iter().max().unwrap_or(0);
        raise(
            "history_size",
            &mut self.history_size,
            needed.max(2),
            "every window-based limit must fit in the window",
        );
        if self.wait_budget_s == 0 {
            warnings.push(
                "wait_budget_s raised from 0 to 1: a budget of 0 would refuse every patient poll"
                    .to_owned(),
            );
            self.wait_budget_s = 1;
        }
        if self.max_invalid_outputs_total < self.max_invalid_outputs {
            warnings.push(format!(
                "max_invalid_outputs_total raised from {} to {}: the run-wide backstop cannot be below the count in a row",
                self.max_invalid_outputs_total, self.max_invalid_outputs
            ));
            self.max_invalid_outputs_total = self.max_invalid_outputs;
        }
        if self.idle_after_s == 0 {
            warnings.push(
                "idle_after_s raised from 0 to 1: a threshold of 0 would make every gap idle"
                    .to_owned(),
            );
            self.idle_after_s = 1;
        }
        if self.max_compactions == 0 {
            warnings.push(
                "max_compactions raised from 0 to 1: a budget of 0 would stop every run that compacts"
                    .to_owned(),
            );
            self.max_compactions = 1;
        }
        warnings
    }

    pub fn tool(&self, name: &str) -> Option<&ToolPolicy> {
        self.tools.get(name)
    }

    /// Every `volatile_text.patterns` entry can match: not empty, no lone trailing `\`.
    fn check_patterns(&self) -> Result<(), String> {
        let tools = self.tools.iter().flat_map(|(name, tool)| {
            tool.volatile_text.iter().flat_map(move |t| {
                t.patterns
                    .iter()
                    .map(move |p| (format!("tools.{name}."), p))
            })
        });
        let global = self
            .volatile_text
            .patterns
            .iter()
            .map(|p| (String::new(), p));
        match global
            .chain(tools)
            .find(|(_, p)| !crate::volatile::pattern_is_valid(p))
        {
            Some((at, p)) => Err(format!(
                "`{at}volatile_text.patterns` entry {p:?} cannot match (empty, or ends in a lone \\)"
            )),
            None => Ok(()),
        }
    }
}

/// The first key of `patch` whose value has another JSON type than the same key in
/// `base`, as a sentence; keys `base` lacks are left to serde to judge.
fn shape_mismatch(base: &Value, patch: &Value, path: &str) -> Option<String> {
    let (Value::Object(base), Value::Object(patch)) = (base, patch) else {
        return None;
    };
    patch.iter().find_map(|(key, value)| {
        let here = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        let expected = base.get(key)?;
        let same_type = match (expected, value) {
            (Value::Null, _) => true,
            (Value::Number(e), Value::Number(v)) => !e.is_u64() || v.is_u64(),
            (Value::Object(_), Value::Object(_)) => return shape_mismatch(expected, value, &here),
            (e, v) => std::mem::discriminant(e) == std::mem::discriminant(v),
        };
        (!same_type).then(|| format!("`{here}` must be like {expected}, got {value}"))
    })
}

/// Recursive merge: objects merge key by key, anything else replaces.
fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(base), Value::Object(patch)) => {
            for (key, value) in patch {
                match base.get_mut(key) {
                    Some(slot) if slot.is_object() && value.is_object() => merge(slot, value),
                    _ => {
                        base.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (base, patch) => *base = patch.clone(),
    }
}

/// All the policies a guard knows before any run starts: the base (preset + `[policy]`)
/// and each agent's (`[agents.<name>.policy]`), already layered. A run's own overrides
/// are layered on top when it starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicySet {
    base: Arc<Policy>,
    agents: BTreeMap<String, Arc<Policy>>,
}

impl Default for PolicySet {
    fn default() -> Self {
        PolicySet::new(Policy::default())
    }
}

impl PolicySet {
    /// The base policy, and for each agent fusebox knows (`crate::agents`) the base with
    /// that agent's tool knowledge layered on it.
    pub fn new(base: Policy) -> Self {
        let agents = crate::agents::profiles()
            .into_iter()
            .map(|(agent, profile)| {
                // The profiles are the crate's own, and `agents.rs`'s tests layer each
                // over every preset.
                let (policy, _) = base
                    .layered(&profile, &agent)
                    .expect("a built-in agent profile layers over any policy");
                (agent, Arc::new(policy))
            })
            .collect();
        PolicySet {
            base: Arc::new(base),
            agents,
        }
    }

    /// Builds the set from a preset, the config's `[policy]` table and its
    /// `[agents.<name>.policy]` tables (as JSON). Returns the warnings of every raised
    /// setting, for the caller to log.
    pub fn from_layers(
        preset: Preset,
        config_policy: Option<&Value>,
        agent_policies: &BTreeMap<String, Value>,
    ) -> Result<(PolicySet, Vec<String>), PolicyError> {
        let mut warnings = Vec::new();
        let mut base = preset.policy();
        if let Some(patch) = config_policy {
            let (policy, raised) = base.layered(patch, "[policy]")?;
            base = policy;
            warnings.extend(raised);
        }
        let mut set = PolicySet::new(base);
        for (agent, patch) in agent_policies {
            let layer = format!("[agents.{agent}.policy]");
            let (policy, raised) = set.for_agent(Some(agent)).layered(patch, &layer)?;
            warnings.extend(raised.into_iter().map(|w| format!("{layer}: {w}")));
            set.agents.insert(agent.clone(), Arc::new(policy));
        }
        Ok((set, warnings))
    }

    pub fn base(&self) -> &Arc<Policy> {
        &self.base
    }

    /// The policy for an agent (its own, or the base when it has none).
    pub fn for_agent(&self, agent: Option<&str>) -> &Arc<Policy> {
        agent
            .and_then(|name| self.agents.get(name))
            .unwrap_or(&self.base)
    }
}

impl PolicySet {
    /// Builds the set from a whole config document (a `fusebox.toml` read as JSON):
    /// `[guard].preset`, `[policy]` and `[agents.<name>.policy]`. `preset_override` (a
    /// command-line `--preset`) wins over the file's preset.
    pub fn from_config_document(
        doc: &Value,
        preset_override: Option<Preset>,
    ) -> Result<(PolicySet, Vec<String>), PolicyError> {
        let preset = match preset_override {
            Some(preset) => preset,
            None => match doc.pointer("/guard/preset") {
                None => Preset::Balanced,
                Some(Value::String(name)) => {
                    Preset::from_name(name).ok_or_else(|| PolicyError {
                        layer: "[guard]".to_owned(),
                        message: format!(
                            "unknown preset {name:?}; expected strict, balanced or lenient"
                        ),
                    })?
                }
                Some(_) => {
                    return Err(PolicyError {
                        layer: "[guard]".to_owned(),
                        message: "preset must be a string".to_owned(),
                    })
                }
            },
        };
        let mut agents = BTreeMap::new();
        if let Some(table) = doc.get("agents") {
            let table = table.as_object().ok_or_else(|| PolicyError {
                layer: "[agents]".to_owned(),
                message: "must be a table of agent names".to_owned(),
            })?;
            for (name, agent) in table {
                if let Some(policy) = agent.get("policy") {
                    agents.insert(name.clone(), policy.clone());
                }
            }
        }
        PolicySet::from_layers(preset, doc.get("policy"), &agents)
    }
}
