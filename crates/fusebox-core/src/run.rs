//! The state of one run: counters for the budget fuse, the detection window, the
//! error-contract gates, and whether the run is still open.
//!
//! Everything here is bounded by the policy (the window by `history_size`, the novelty
//! memories by [`NOVELTY_MEMORY`], the report lists by [`REPORT_LIST_MAX`]), so a run
//! that lives for days costs the same memory as one that lives for a minute.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::decision::StopReport;
use crate::event::{Effect, ResultKind};
use crate::fingerprint::Fingerprint;
use crate::policy::Policy;

/// How many distinct results (and succeeded writes) a run remembers for novelty. Older
/// ones are forgotten first: a result last seen this many results ago counts as new
/// again, which a loop cannot exploit without also tripping the step and no-progress
/// budgets.
pub const NOVELTY_MEMORY: usize = 64;
/// How many (call, answer) pairs — and (question, answer) pairs — a run remembers: a
/// sweep's every call is a new pair, so this bounds the cycle a loop through distinct
/// calls would need to look new again (a cycle of 256 calls trips the step budget first).
pub const PAIR_MEMORY: usize = 256;
/// Fired guards and completed operations kept for the stop report (the newest).
pub const REPORT_LIST_MAX: usize = 32;
/// Distinct compaction reasons counted for the stop report; later ones count as `other`.
pub const COMPACTION_REASONS_MAX: usize = 8;
/// Longest compaction reason kept (a reason is a producer's word, not prose).
const COMPACTION_REASON_LEN: usize = 40;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    pub agent: Option<String>,
    pub policy: Arc<Policy>,
    /// `run_started.tools`, sorted; `None` when the run declared no list.
    pub allowed_tools: Option<Vec<String>>,
    pub status: RunStatus,
    pub first_ts_ms: u64,
    pub last_ts_ms: u64,
    pub last_seq: Option<u64>,
    pub counters: Counters,
    /// The task the run is on: the whole run, or in an interactive session the work
    /// since the user's last prompt. Steps, turns, tool errors, compactions and active
    /// time are budgeted per task. (Defaults here too: older snapshots lack it.)
    #[serde(default)]
    pub task: Task,
    pub progress_version: Option<u64>,
    pub last_safe_checkpoint: Option<String>,
    pub unmet_precondition: Option<String>,
    pub detection: Detection,
    /// Calls that executed and have no result yet, by `call_id`.
    pub pending: BTreeMap<String, PendingCall>,
    pub completed_operations: Vec<String>,
    pub fired_guards: Vec<String>,
    /// What was compacted how often, for `max_compactions` and the stop report.
    pub compactions: CompactionLog,
    /// Approval ids and credential scopes already used to resume this run: each counts
    /// as a changed precondition once.
    pub resume_tokens: Vec<String>,
    /// Where the run sits in its tree of runs, and what its subtree spent.
    #[serde(default)]
    pub node: Node,
    /// Model calls of this run and of its subtree that were let through and have no
    /// model turn yet. (Defaults here too: older snapshots lack it.)
    #[serde(default)]
    pub reserved: Reserved,
}

/// A run's place in its tree (guard contract §6): its parent, its depth, and what the
/// runs below it spent and are doing — so a budget at any node counts its subtree.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Node {
    /// The run that started this one; `None` for a root.
    pub parent: Option<String>,
    /// 0 for a root, its parent's depth + 1 for a child.
    pub depth: u32,
    /// Runs started below this one, ever.
    pub spawned: u64,
    /// Runs below this one that are open now.
    pub open_below: u32,
    /// Open children, by id: where a stop of this run goes next.
    pub children: Vec<String>,
    /// What the runs below spent since this run's task began (its own spending is in
    /// `counters` and `task`).
    pub below: Below,
    /// This run's sub-task, known at its first call: its agent and that call.
    pub subtask: Option<u64>,
    /// How the sub-tasks of this run's children ended: (sub-task, outcome, times).
    pub child_outcomes: Vec<(u64, u64, u32)>,
    /// Children stopped by the guard that the model has not been told of yet.
    pub stopped_children: Vec<String>,
}

/// A subtree's spending, below its node.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Below {
    pub steps: u64,
    pub model_turns: u64,
    pub tokens: u64,
    pub cost_usd: f64,
}

/// Most reservations a run holds at once. A model call that failed sends no
/// `model_turn`, so its reservation would be held until the run closes; past this many,
/// the oldest is let go, which bounds both the state and the room a producer's failed
/// calls can hold.
pub const RESERVATION_MEMORY: usize = 16;

/// What model calls in flight hold (`model_call` let through, its `model_turn` not in
/// yet): the run's own, oldest first, and the sum of its subtree's. Budgets are judged
/// on spent + held at a model call only; a tool call never waits on a turn in flight.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Reserved {
    /// Each own model call in flight: (tokens, cost) it reserved.
    pub held: VecDeque<(u64, f64)>,
    /// The sum of `held`, its count as `model_turns` (steps stay 0).
    pub own: Below,
    /// What the runs below hold, carried up as they reserve and release.
    pub below: Below,
}

impl Reserved {
    /// Holds one more model call's reservation (letting go of the oldest past
    /// [`RESERVATION_MEMORY`]).
    pub fn hold(&mut self, tokens: u64, cost_usd: f64) {
        if self.held.len() == RESERVATION_MEMORY {
            self.release();
        }
        self.held.push_back((tokens, cost_usd));
        self.own.model_turns += 1;
        self.own.tokens = self.own.tokens.saturating_add(tokens);
        self.own.cost_usd += cost_usd;
    }

    /// Lets go of the oldest reservation: its model turn came in (FIFO, as a run's
    /// turns answer its calls in order). Nothing when none is held.
    pub fn release(&mut self) {
        let Some((tokens, cost_usd)) = self.held.pop_front() else {
            return;
        };
        self.own.model_turns -= 1;
        self.own.tokens = self.own.tokens.saturating_sub(tokens);
        // Sums of floats do not come back to exactly 0 by subtraction.
        self.own.cost_usd = if self.held.is_empty() {
            0.0
        } else {
            (self.own.cost_usd - cost_usd).max(0.0)
        };
    }

    /// Lets go of everything the run holds itself (it closed).
    pub fn release_all(&mut self) {
        self.held.clear();
        self.own = Below::default();
    }

    /// The run's and its subtree's reservations together.
    pub fn total(&self) -> Below {
        add(self.own, self.below)
    }
}

/// Two spendings (or reservations) added.
pub(crate) fn add(a: Below, b: Below) -> Below {
    Below {
        steps: a.steps + b.steps,
        model_turns: a.model_turns + b.model_turns,
        tokens: a.tokens.saturating_add(b.tokens),
        cost_usd: a.cost_usd + b.cost_usd,
    }
}

/// Sub-task outcomes and stopped children remembered per run (newest kept).
pub const CHILD_MEMORY: usize = 32;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RunStatus {
    Open,
    /// The report is shared with every decision that carries it, and the message is
    /// written once: a latched run answers without rebuilding either.
    Closed {
        report: Arc<StopReport>,
        message: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Counters {
    /// Events applied to this run.
    pub events: u64,
    /// Calls that executed (`execute` or `warn`): what `max_steps` counts.
    pub steps: u64,
    pub calls_refused: u64,
    /// Calls answered from the ledger (`use_completed_result`).
    pub calls_answered: u64,
    pub model_turns: u64,
    pub tokens: u64,
    pub cost_usd: f64,
    pub tool_errors: u64,
    pub invalid_outputs: u64,
    /// Invalid model outputs since the last valid one: what `max_invalid_outputs` counts.
    #[serde(default)]
    pub invalid_in_row: u64,
}

/// What one task of a run has spent (guard contract §4.1): a run is one task until its
/// first `prompt`; each prompt starts the next one from zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Task {
    /// Prompts the run has had: 0 while it is one task.
    pub prompts: u64,
    /// Active time up to the run's last event: every gap between two events, except a
    /// gap longer than `idle_after_s` with none of the run's calls in flight.
    pub active_ms: u64,
    pub steps: u64,
    pub model_turns: u64,
    pub tool_errors: u64,
    pub compaction_cycles: u64,
}

impl Task {
    /// What the task's budgets count over, in a report's words.
    pub fn scope(&self) -> &'static str {
        if self.prompts == 0 {
            "in the run"
        } else {
            "since the user's last prompt"
        }
    }
}

/// The loop detectors' memory. Reset by progress (mostly) and by an accepted resume.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Detection {
    pub window: VecDeque<Entry>,
    pub next_serial: u64,
    /// Consecutive results (and refusals) with no progress: `no_progress`.
    pub no_progress_streak: u32,
    /// Every no-progress outcome since the last progress, polls included: the breaker.
    pub no_progress_outcomes: u32,
    pub blocks_in_row: u32,
    /// Calls to tools outside `run_started.tools` plus results with code `unknown_tool`.
    pub unknown_tool_hits: u32,
    /// Tools the tool side answered `unknown_tool` for.
    pub unknown_tools_reported: Vec<u64>,
    pub seen_results: Ring,
    /// (call, answer) pairs of reads: a call never made before that answers is new
    /// knowledge even when the answer equals another call's (a sweep).
    pub seen_pairs: Ring,
    /// Answered calls' wordings (the newest [`WORDING_MEMORY`]): a call that rewords a
    /// question already answered the same is no new knowledge.
    #[serde(default)]
    pub wordings: VecDeque<Worded>,
    #[serde(default)]
    pub answer_streak: Option<AnswerStreak>,
    #[serde(default)]
    pub waiting: Option<Waiting>,
    pub succeeded_writes: Ring,
    pub retry_gates: Vec<RetryGate>,
    pub precondition_gates: Vec<PreconditionGate>,
    /// Calls whose last answer was PENDING: since when, and from when a poll waited as
    /// told.
    pub poll_clocks: Vec<PollClock>,
    pub compaction_watch: Option<CompactionWatch>,
    /// The same (call, answer) in a row after a compaction; unlike the watch, progress
    /// found by novelty does not end it (a loop that starts after the compaction begins
    /// with a new answer).
    pub compaction_tail: Option<CompactionTail>,
    /// Compaction cycles (a compaction, or a context-window overflow not followed by
    /// one) since the last progress: `compaction_thrash`.
    pub compaction_streak: u32,
    /// The last cycle began with an overflow whose compaction has not come yet: that
    /// compaction closes the same cycle.
    pub overflow_open: bool,
}

/// The run's compactions, whatever happened between them. Budgets are not detection: an
/// accepted resume keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CompactionLog {
    /// Compaction cycles: what `max_compactions` counts.
    pub cycles: u64,
    pub compactions: u64,
    /// Model turns that ended `model_context_window_exceeded`.
    pub overflows: u64,
    /// `compaction.reason` → how often, the first [`COMPACTION_REASONS_MAX`] distinct.
    pub reasons: Vec<(String, u32)>,
}

impl CompactionLog {
    pub(crate) fn note_compaction(&mut self, reason: Option<&str>) {
        self.compactions += 1;
        let mut reason = reason.unwrap_or("unspecified").trim();
        if reason.len() > COMPACTION_REASON_LEN {
            let mut end = COMPACTION_REASON_LEN;
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            reason = &reason[..end];
        }
        let slot = match self.reasons.iter().position(|(r, _)| r == reason) {
            Some(i) => i,
            None if self.reasons.len() < COMPACTION_REASONS_MAX => {
                self.reasons.push((reason.to_owned(), 0));
                self.reasons.len() - 1
            }
            None => match self.reasons.iter().position(|(r, _)| r == "other") {
                Some(i) => i,
                None => {
                    // The last slot becomes `other`, keeping its count.
                    let last = self.reasons.len() - 1;
                    self.reasons[last].0 = "other".to_owned();
                    last
                }
            },
        };
        self.reasons[slot].1 += 1;
    }

    /// `auto ×3, manual ×1; 2 context-window overflows`.
    pub fn summary(&self) -> String {
        let reasons = self
            .reasons
            .iter()
            .map(|(r, n)| format!("{r} ×{n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut out = format!("{} compactions", self.compactions);
        if !reasons.is_empty() {
            out.push_str(&format!(" ({reasons})"));
        }
        match self.overflows {
            0 => {}
            1 => out.push_str(", 1 model turn ended model_context_window_exceeded"),
            n => out.push_str(&format!(
                ", {n} model turns ended model_context_window_exceeded"
            )),
        }
        out
    }
}

/// One call in the detection window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub serial: u64,
    pub call: Fingerprint,
    pub tool: u64,
    pub outcome: Outcome,
    /// The answer's fingerprint and kind, once known.
    pub result: Option<(Fingerprint, ResultKind)>,
    /// Made while the run waits on a task between two of its checks (a `sleep`, a look
    /// at a log): part of the wait, left out of the repeat counts.
    #[serde(default)]
    pub interlude: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Executed,
    Refused,
    Answered,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingCall {
    pub serial: u64,
    pub call: Fingerprint,
    pub effect: Effect,
    pub op_key: Option<String>,
    /// Gated after the last compaction: its result is watched.
    pub watched: bool,
    /// It came after waiting as its last "wait" answer told it: its answer, if the same
    /// again, is neither progress nor a repeat.
    pub patient: bool,
    /// Made between two checks of a task the run waits on (see [`Entry::interlude`]).
    #[serde(default)]
    pub interlude: bool,
    /// The wording of its free text, when its arguments hold any.
    #[serde(default)]
    pub wording: Option<Wording>,
}

/// The words of a call's text arguments: content words in order (lower case, common
/// words left out, plural and tense endings cut), each as a 32-bit hash, at most
/// [`WORDING_MAX`]. Two wordings of one question share most of their words; two items
/// of a sweep (comments, names, cities in one template) do not.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Wording {
    /// The call's shape: its tool and its arguments with the text left out (ids,
    /// numbers, paths and flags stay): only calls of one shape can reword each other.
    pub shape: u64,
    pub words: Vec<u32>,
}

/// Longest wording kept (words); longer texts are compared on their first words.
pub const WORDING_MAX: usize = 24;
/// Answered wordings a run remembers for rewordings (the newest).
pub const WORDING_MEMORY: usize = 32;

/// An answered call's wording.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Worded {
    pub serial: u64,
    pub tool: u64,
    /// The call ([`short`]): the same call again is a repeat, not a rewording.
    pub call: u64,
    pub wording: Wording,
    pub answer: u64,
    /// It was judged a rewording of an earlier call answered the same.
    pub reworded: bool,
}

/// One tool answering the same to a streak of distinct calls that differ only in their
/// words (30 comments moderated, 25 names looked up, 30 one-word searches).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerStreak {
    pub tool: u64,
    pub shape: u64,
    pub answer: u64,
    pub count: u32,
}

/// The run waits on a task: `poll`'s last answer said it is still running. Up to
/// [`INTERLUDE_MAX`] calls between two of its checks are part of the wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    pub poll: Fingerprint,
    pub between: u32,
}

/// Calls between two checks of a waited-on task that are still the wait.
pub const INTERLUDE_MAX: u32 = 3;

/// A RETRYABLE answer: the same call may not run again before `not_before_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryGate {
    pub call: Fingerprint,
    pub not_before_ms: u64,
    /// The wait it was told (or the guard's backoff), for the tolerance of a retry a
    /// little early.
    #[serde(default)]
    pub wait_ms: u64,
    pub attempts: u32,
    /// The first RETRYABLE answer of this streak: what the wait budget counts from.
    pub since_ms: u64,
    /// The tool itself said how long to wait (`retry_after_ms` > 0): a retry after that
    /// wait is what the error contract asked for.
    pub told: bool,
}

/// A call answered PENDING: the same answer since `since_ms`; a poll at or after
/// `patient_from_ms` waited as told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollClock {
    pub call: Fingerprint,
    pub result: Fingerprint,
    pub since_ms: u64,
    pub patient_from_ms: u64,
    /// The wait it was told, for the tolerance of a poll a little early.
    #[serde(default)]
    pub wait_ms: u64,
}

/// Whether an attempt at `ts_ms` honoured a wait of `wait_ms` that ends at `due_ms`:
/// schedulers and clocks jitter, so a tenth of the wait early still counts (a poll 29 s
/// after a 30 s `retry_after_ms` waited as told).
pub fn honoured(ts_ms: u64, due_ms: u64, wait_ms: u64) -> bool {
    ts_ms.saturating_add(wait_ms / 10) >= due_ms
}

/// A PRECONDITION answer: the same call may not run again before progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreconditionGate {
    pub call: Fingerprint,
    pub code: Option<String>,
}

/// After a compaction, the next `remaining` results are watched for one identical
/// (tool, call, result) triple repeating; progress ends the watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionWatch {
    pub remaining: u32,
    pub triples: Vec<(u64, Fingerprint, Fingerprint, u32)>,
}

/// After a compaction, the next `remaining` results are watched for the same (call,
/// answer) `in_row` times in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionTail {
    pub remaining: u32,
    pub call: Fingerprint,
    pub result: Fingerprint,
    pub in_row: u32,
}

/// A fixed-capacity memory of 64-bit fingerprints, oldest forgotten first.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Ring {
    items: VecDeque<u64>,
}

impl Ring {
    pub fn contains(&self, fp: u64) -> bool {
        self.items.contains(&fp)
    }

    /// Remembers `fp` among the last [`NOVELTY_MEMORY`]; returns whether it was new.
    pub fn insert(&mut self, fp: u64) -> bool {
        self.insert_within(fp, NOVELTY_MEMORY)
    }

    /// Remembers `fp` among the last `capacity`; returns whether it was new.
    pub fn insert_within(&mut self, fp: u64, capacity: usize) -> bool {
        if self.contains(fp) {
            return false;
        }
        if self.items.len() >= capacity {
            self.items.pop_front();
        }
        self.items.push_back(fp);
        true
    }
}

/// Short form of a fingerprint for the novelty rings.
pub fn short(fp: Fingerprint) -> u64 {
    (fp >> 64) as u64
}

/// Short form of a pair of fingerprints (a call and its answer) for the pair rings.
pub fn short_pair(a: Fingerprint, b: Fingerprint) -> u64 {
    short(a) ^ (b as u64).rotate_left(17)
}

impl RunState {
    pub fn new(policy: Arc<Policy>, agent: Option<String>, ts_ms: u64) -> Self {
        RunState {
            agent,
            policy,
            allowed_tools: None,
            status: RunStatus::Open,
            first_ts_ms: ts_ms,
            last_ts_ms: ts_ms,
            last_seq: None,
            counters: Counters::default(),
            task: Task::default(),
            progress_version: None,
            last_safe_checkpoint: None,
            unmet_precondition: None,
            detection: Detection::default(),
            pending: BTreeMap::new(),
            completed_operations: Vec::new(),
            fired_guards: Vec::new(),
            compactions: CompactionLog::default(),
            resume_tokens: Vec::new(),
            node: Node::default(),
            reserved: Reserved::default(),
        }
    }

    pub fn is_open(&self) -> bool {
        matches!(self.status, RunStatus::Open)
    }

    pub fn report(&self) -> Option<&Arc<StopReport>> {
        match &self.status {
            RunStatus::Open => None,
            RunStatus::Closed { report, .. } => Some(report),
        }
    }

    /// Takes the run's clock to `ts_ms` (an event of the run): the gap since its last
    /// event is active time, unless it is longer than `idle_after_s` with none of its
    /// calls in flight — the run was waiting for its user, not working.
    pub(crate) fn advance_clock(&mut self, ts_ms: u64) {
        if ts_ms > self.last_ts_ms {
            let gap = ts_ms - self.last_ts_ms;
            if self.counts_as_active(gap) {
                self.task.active_ms = self.task.active_ms.saturating_add(gap);
            }
            self.last_ts_ms = ts_ms;
        }
    }

    fn counts_as_active(&self, gap_ms: u64) -> bool {
        !self.pending.is_empty() || gap_ms <= self.policy.idle_after_s.saturating_mul(1000)
    }

    fn time_budget_ms(&self) -> u64 {
        self.policy.max_duration_s.saturating_mul(1000)
    }

    /// Event time at which the time budget runs out if nothing else arrives: the daemon
    /// writes a `tick` then, so a hung tool still gets its run stopped. A run with
    /// nothing in flight and more budget left than `idle_after_s` waits for its user:
    /// no deadline (`u64::MAX`).
    pub fn deadline_ms(&self) -> u64 {
        let left = self.time_budget_ms().saturating_sub(self.task.active_ms);
        if self.counts_as_active(left) {
            self.last_ts_ms.saturating_add(left)
        } else {
            u64::MAX
        }
    }

    /// The task's active time has reached `max_duration_s` (the clock is at the run's
    /// last event).
    pub fn time_budget_spent(&self) -> bool {
        self.task.active_ms >= self.time_budget_ms()
    }

    pub(crate) fn note_fired(&mut self, guard: &str, action: &str, position: u64) {
        push_bounded(
            &mut self.fired_guards,
            format!("{guard}:{action}@{position}"),
            REPORT_LIST_MAX,
        );
    }

    pub(crate) fn note_completed_operation(&mut self, op_key: &str) {
        push_bounded(
            &mut self.completed_operations,
            op_key.to_owned(),
            REPORT_LIST_MAX,
        );
    }
}

/// Appends `item`, forgetting the oldest beyond `max`.
pub(crate) fn push_bounded<T>(list: &mut Vec<T>, item: T, max: usize) {
    if list.len() == max {
        list.remove(0);
    }
    list.push(item);
}

impl Detection {
    /// Adds a call to the window, forgetting the oldest beyond `history_size`.
    pub(crate) fn push(&mut self, entry: Entry, history_size: u32) {
        if self.window.len() >= history_size as usize {
            self.window.pop_front();
        }
        self.window.push_back(entry);
    }

    pub(crate) fn new_serial(&mut self) -> u64 {
        self.next_serial += 1;
        self.next_serial
    }

    /// Progress: the world moved, so what repeated before is no longer a loop. The call
    /// that made progress stays as the new first entry (calling it again and getting the
    /// same answer is a repeat), and calls still in flight stay to receive their results.
    pub(crate) fn clear_on_progress(&mut self, keep_serial: Option<u64>) {
        self.window.retain(|e| {
            Some(e.serial) == keep_serial || (e.outcome == Outcome::Executed && e.result.is_none())
        });
        self.no_progress_streak = 0;
        self.no_progress_outcomes = 0;
        self.precondition_gates.clear();
        self.compaction_streak = 0;
        self.overflow_open = false;
        // The run recovered from its compaction: later repeats are plain repeats. (The
        // tail of identical calls is the result's to end: see `observe::watch_tail`.)
        self.compaction_watch = None;
        self.waiting = None;
    }

    /// An accepted resume: every detector starts again; budgets are not detection.
    pub(crate) fn reset(&mut self) {
        let serial = self.next_serial;
        let seen = std::mem::take(&mut self.seen_results);
        let pairs = std::mem::take(&mut self.seen_pairs);
        let wordings = std::mem::take(&mut self.wordings);
        let writes = std::mem::take(&mut self.succeeded_writes);
        *self = Detection {
            next_serial: serial,
            seen_results: seen,
            seen_pairs: pairs,
            wordings,
            succeeded_writes: writes,
            ..Detection::default()
        };
    }
}
