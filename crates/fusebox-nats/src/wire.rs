//! JSON shapes on the wire besides events and decisions (which are `fusebox-core`'s):
//! error replies, dead letters, operator requests and run summaries. Shared by the
//! daemon and `fusebox-client`, so both ends agree by construction.

use fusebox_core::decision::StopReport;
use fusebox_core::run::{Below, Counters};
use fusebox_core::{Decision, EventError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Why a request was refused: `reason` is the `fusebox_events_rejected_total` label
/// (`malformed_json`, `tenant_mismatch`, …), `message` says what to fix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireError {
    pub reason: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
}

impl From<&EventError> for WireError {
    fn from(err: &EventError) -> Self {
        WireError {
            reason: err.reason.as_str().to_owned(),
            message: err.to_string(),
            event_id: err.event_id.clone(),
        }
    }
}

/// The reply to a request the daemon refused (a decision has `action`, this has
/// `error`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub error: WireError,
}

/// What lands on `fusebox.dlq.<tenant>`: the refusal, where the input came from, and the
/// input itself (lossily decoded when it was not UTF-8), so nothing vanishes silently.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub subject: String,
    pub error: WireError,
    pub payload: String,
}

/// Body of `fusebox.control.<t>.<r>.cancel`. `id` makes a retried command idempotent:
/// the same id is applied once and answered with the same decision.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CancelRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Body of `fusebox.control.<t>.<r>.resume` (guard.md §4.6 evidence).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResumeRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    pub evidence: Value,
}

/// Body of `fusebox.control.<t>.<r>.resolve`: the operator's word on an op_key, sent to
/// the run that holds it (`fusebox ledger resolve`). `resolution` is `completed` (with
/// `output`, the result later calls get) or `released`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolveRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub op_key: String,
    pub resolution: fusebox_core::event::Resolution,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
}

/// Body of `fusebox.control.ledger`: which entries (all filters optional).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LedgerQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_key: Option<String>,
    /// Only keys in flight.
    #[serde(default)]
    pub in_flight_only: bool,
    /// At most this many entries (default [`LEDGER_LIMIT`]); `truncated` says when more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// Only the keys held by this run (the operator's page of one run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

pub const LEDGER_LIMIT: usize = 1000;

/// One op_key as a daemon's ledger holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerItem {
    pub tenant: String,
    pub op_key: String,
    /// `in_flight` or `completed`.
    pub state: String,
    pub run: String,
    pub call_id: String,
    /// In flight: event time of the last word of the call (where its lease starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// In flight: the event time its lease ends, by the policy of the run holding it
    /// (absent when that run is no longer known here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ends_ms: Option<u64>,
    /// Completed: the stored result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

/// The answer of `fusebox.control.ledger`; in a cluster one per partition (each
/// partition's view), with `partition` / `partitions` set, gathered by the asker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerListing {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<u32>,
    pub entries: Vec<LedgerItem>,
    pub truncated: bool,
}

/// One run in `fusebox.control.runs`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub tenant: String,
    pub run: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    pub open: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal_state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub events: u64,
    pub steps: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seq: Option<u64>,
    pub last_ts_ms: u64,
}

/// One partition's answer to `fusebox.control.runs` in a cluster (a single daemon
/// answers with the plain list): the asker knows from it how many answers to gather.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionRuns {
    pub partition: u32,
    pub partitions: u32,
    pub runs: Vec<RunSummary>,
}

/// The answer of `fusebox.control.<t>.<r>.status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStatusReply {
    pub summary: RunSummary,
    pub counters: Counters,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_version: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<StopReport>,
    /// The words the model was told when the run closed (the stop decision's message,
    /// written by the engine with the report): what an operator reads first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_message: Option<String>,
    /// The run's latest notable decisions seen by this daemon process, oldest first.
    pub last_decisions: Vec<Decision>,
    /// What model calls in flight hold now (`model_call` reservations not yet answered
    /// by their `model_turn`), the run's own and its subtree's: counted by every budget
    /// check before a model call, so a budget can refuse while these are outstanding.
    /// `model_turns` counts the calls. Absent when nothing is held.
    #[serde(default, skip_serializing_if = "is_nothing_held")]
    pub reserved: Below,
    /// The run's place in its tree of runs (guard contract §6). Absent from daemons
    /// before run trees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<RunTree>,
}

fn is_nothing_held(reserved: &Below) -> bool {
    reserved.model_turns == 0
}

/// Where a run sits in its tree of runs, and what the runs below it spent and are doing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunTree {
    /// The run that started this one (`run_started.parent`); none for a root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// 0 for a root, its parent's depth + 1 below.
    pub depth: u32,
    /// The tree's root: the parents followed up as far as the daemon knows them (the
    /// run itself for a root). [`RunsQuery::root`] lists the whole tree.
    pub root: String,
    /// For a run closed by `ancestor_stopped`: the run whose own stop or cancel reached
    /// it (the nearest closed ancestor not itself closed by an ancestor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<String>,
    /// Runs started below this one, ever.
    pub spawned: u64,
    /// Runs below this one open now.
    pub open_below: u32,
    /// What the runs below spent since this run's task began: what its budgets count
    /// besides its own spending (the tree's, at a root).
    pub below: Below,
    /// Its children, open and closed, in the order they started (at most
    /// [`RUNS_PAGE_LIMIT`]; `more_children` says there are more).
    pub children: Vec<RunRow>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub more_children: bool,
}

/// Body of `fusebox.control.runs` asking for one page of runs (the operator's page,
/// `fusebox ui`); an empty body still asks for the whole list (`fusebox runs`). Runs are
/// ordered newest activity first (`last_ts_ms` descending, then tenant and run), and
/// every filter is optional.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RunsQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// `OPEN` or a terminal state (`STOPPED_LOOP_GUARD`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// A stop reason (`same_call_repeat`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Runs whose id contains this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_contains: Option<String>,
    /// The runs of one tree: this root and every run below it (guard contract §6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// Only runs after this one in the order (keyset paging: the last row of the
    /// previous page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<RunsCursor>,
    /// The page of runs just ahead of this one in the order (keyset paging backwards:
    /// the first row of the page after it). Ignored when `after` is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<RunsCursor>,
    /// At most this many runs (default and cap [`RUNS_PAGE_LIMIT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// Tenant, agent and reason match any part of the value, and they and
    /// `run_contains` match in any case (what a person types on the operator's page);
    /// otherwise tenant, agent and reason match exactly.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub loose: bool,
    /// Only runs active at some time in this range (from their first event to their
    /// last, `ts_ms`): active since …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_since_ms: Option<u64>,
    /// … and until.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_until_ms: Option<u64>,
    /// Also answer the fleet's figures ([`RunsPage::fleet`]) for runs active since this
    /// time, and the filters' known values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet_since_ms: Option<u64>,
}

/// Values a filter may take, as many as [`KNOWN_VALUES_LIMIT`] each, in order.
pub const KNOWN_VALUES_LIMIT: usize = 200;

/// Open runs listed as costing most.
pub const COSTLIEST_LIMIT: usize = 5;

/// What a person looks at first across the fleet (all runs, no filter), and what the
/// filters can choose from.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Fleet {
    /// Runs active since `fleet_since_ms`, per state (`OPEN` or terminal).
    pub states: std::collections::BTreeMap<String, u64>,
    /// Runs closed by a stop (not completed) active since then, per reason.
    pub stop_reasons: std::collections::BTreeMap<String, u64>,
    /// The open runs that spent most, most first (at most [`COSTLIEST_LIMIT`]).
    pub costliest: Vec<RunRow>,
    /// Every tenant, agent and stop reason of the runs known (capped: `known_truncated`).
    pub tenants: Vec<String>,
    pub agents: Vec<String>,
    pub reasons: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub known_truncated: bool,
}

pub const RUNS_PAGE_LIMIT: usize = 500;

/// A place in the runs order: the row a page continues after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunsCursor {
    pub last_ts_ms: u64,
    pub tenant: String,
    pub run: String,
}

/// One run on a page: its summary and what the operator's table shows besides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRow {
    #[serde(flatten)]
    pub summary: RunSummary,
    pub first_ts_ms: u64,
    pub calls_refused: u64,
    pub tokens: u64,
    pub cost_usd: f64,
    /// The run's parent in its tree of runs; none for a root or a run on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The root of the run's tree, for a run with a parent: the token its subjects
    /// carry before the run (`subjects::tree_control`), so a client reaches it where
    /// the tree is served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub depth: u32,
    /// As [`RunTree::stopped_by`]: whose stop closed this run, when an ancestor's did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl RunRow {
    /// `OPEN`, or the run's terminal state: what the state filter and counts use.
    pub fn state(&self) -> &str {
        self.summary.terminal_state.as_deref().unwrap_or("OPEN")
    }

    pub fn cursor(&self) -> RunsCursor {
        RunsCursor {
            last_ts_ms: self.summary.last_ts_ms,
            tenant: self.summary.tenant.clone(),
            run: self.summary.run.clone(),
        }
    }
}

/// The answer to a [`RunsQuery`]; in a cluster one per partition (with `partition` /
/// `partitions` set), merged by the asker: each partition's first `limit` rows after
/// the cursor hold the merged page's.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RunsPage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<u32>,
    pub runs: Vec<RunRow>,
    /// Runs matching every filter (all pages).
    pub matched: u64,
    /// Runs per state matching every filter but the state's.
    pub states: std::collections::BTreeMap<String, u64>,
    /// Matching runs ahead of this page's first row in the order: the page shows rows
    /// `ahead + 1 ..= ahead + runs.len()` of `matched`.
    #[serde(default)]
    pub ahead: u64,
    /// Asked for with [`RunsQuery::fleet_since_ms`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<Fleet>,
}

/// Body of `fusebox.control.<t>.<r>.history`: which part of the run's timeline.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct HistoryQuery {
    /// Only entries after this log position (the last `position` of the previous page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
    /// At most this many entries (default and cap [`HISTORY_LIMIT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

pub const HISTORY_LIMIT: usize = 1000;

/// One applied event of a run, as the daemon's log holds it, with its decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub position: u64,
    /// The event in its wire form (`fusebox_core::Event`'s JSON).
    pub event: Value,
    pub decision: Decision,
}

/// The answer of `fusebox.control.<t>.<r>.history`: the run's events in applied order.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RunHistory {
    pub entries: Vec<HistoryEntry>,
    /// More entries follow the last one (ask again with `after`).
    pub more: bool,
}

/// A request on `fusebox.control.watchdog`: an empty body (or `{}`) asks for the status;
/// `resume` resumes a watchdog halted by `on_blast_radius = "halt"`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct WatchdogRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<WatchdogResume>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchdogResume {
    /// Who resumes it (journaled with the resume).
    pub by: String,
}

/// The answer on `fusebox.control.watchdog`, one per daemon: the watchdog's state after
/// the request (halted or not), what it holds (the instances with their deadlines) and
/// its recent terminations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchdogReply {
    /// Halted: terminating nothing until an operator resumes it.
    pub halted: bool,
    /// When it halted (Unix ms) and why, while halted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted_since_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// This request resumed it.
    #[serde(default)]
    pub resumed: bool,
    /// The answer in words.
    pub message: String,
    /// `false` when `[watchdog] enabled = false` (then nothing else is filled).
    pub enabled: bool,
    /// Every managed instance the cloud lists now, soonest deadline first (finished ones
    /// last), as `fusebox watchdog list` shows them.
    #[serde(default)]
    pub instances: Vec<WatchdogInstance>,
    /// Regions the cloud could not list, with the error.
    #[serde(default)]
    pub region_errors: std::collections::BTreeMap<String, String>,
    /// The latest terminations (and dry-run or failed attempts), newest first: the
    /// records published on `fusebox.watchdog.<tenant>.terminated`.
    #[serde(default)]
    pub terminations: Vec<WatchdogTermination>,
}

/// One managed instance with its deadline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchdogInstance {
    pub region: String,
    pub instance_id: String,
    /// The cloud's state name (`pending`, `running`, `stopped`, `terminated`, …).
    pub state: String,
    pub tenant: Option<String>,
    pub run: Option<String>,
    pub launch_ms: Option<u64>,
    /// When it must be gone, Unix ms, and which limit says so (`deadline`,
    /// `max_lifetime`, `run_ended`); `None` when nothing is known yet.
    pub deadline_ms: Option<u64>,
    pub reason: Option<String>,
    /// Until the deadline; negative when overdue.
    pub time_left_ms: Option<i64>,
    /// `fusebox:protect=true`: reported, never terminated.
    pub protected: bool,
    pub done: bool,
    #[serde(default)]
    pub tag_problems: Vec<String>,
}

/// One termination record, as published on `fusebox.watchdog.<tenant>.terminated`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchdogTermination {
    pub tenant: Option<String>,
    pub run: Option<String>,
    pub provider: String,
    pub region: String,
    pub instance_id: String,
    /// `deadline`, `max_lifetime`, `run_ended` or `leftover`.
    pub reason: String,
    pub deadline_ms: u64,
    pub at_ms: u64,
    pub dry_run: bool,
    /// `terminated`, `already_gone`, `would_terminate`, `termination_protected`, `failed`.
    pub outcome: String,
    pub error: Option<String>,
}
