//! One run's page: what it is, its stop report, its timeline, its op_key ledger
//! entries, and the actions an operator may take on it.

use fusebox_client::{LedgerItem, TreeView};
use fusebox_core::decision::{ResumeCondition, StopReport};
use std::collections::HashMap;

use fusebox_core::decision::TerminalState;
use fusebox_nats::wire::{HistoryEntry, RunHistory, RunStatusReply};
use maud::{html, Markup};
use serde_json::Value;

use crate::layout::{clock, duration, folded, folded_json, folded_prose, page, state, time};
use crate::runs_view::{run_href, RunsParams};

/// What the run page shows, as the daemon told it.
pub struct RunPage<'a> {
    pub tenant: &'a str,
    pub run: &'a str,
    pub status: &'a RunStatusReply,
    pub history: &'a RunHistory,
    /// The position the timeline starts after (`?after=`), if not the first.
    pub after: Option<u64>,
    pub ledger: &'a [LedgerItem],
    /// The run's tree of runs, when it is in one.
    pub tree: Option<&'a TreeView>,
}

pub fn run_page(view: &RunPage<'_>) -> Markup {
    let live = match view.after {
        Some(after) => format!("/live{}?after={after}", run_href(view.tenant, view.run)),
        None => format!("/live{}", run_href(view.tenant, view.run)),
    };
    page(
        &format!("{}/{}", view.tenant, view.run),
        html! { div #run data-live=(live) { (run_live(view)) } },
    )
}

/// A resume condition in the words of what it asks for.
pub fn resume_condition(condition: ResumeCondition) -> (&'static str, &'static str) {
    match condition {
        ResumeCondition::VerifiedPreconditionChange => (
            "verified_precondition_change",
            "evidence that something changed: a progress_version above the report's, or a new approval_id or credential_scope",
        ),
        ResumeCondition::HumanApproval => (
            "human_approval",
            "a human's word: a new approval_id or credential_scope",
        ),
        ResumeCondition::NewRun => (
            "new_run",
            "nothing: a budget is spent and budgets survive a resume; start a new run",
        ),
        ResumeCondition::None => ("none", "nothing: the run ended normally"),
    }
}

pub fn resumable(report: &StopReport) -> bool {
    matches!(
        report.resume_condition,
        ResumeCondition::VerifiedPreconditionChange | ResumeCondition::HumanApproval
    )
}

/// The part the SSE stream replaces: everything of the run.
pub fn run_live(view: &RunPage<'_>) -> Markup {
    let s = &view.status.summary;
    let c = &view.status.counters;
    let run_state = s.terminal_state.as_deref().unwrap_or("OPEN");
    let base = run_href(view.tenant, view.run);
    html! {
        h1 { (view.tenant) "/" (view.run) " " (state(run_state)) }
        dl.facts {
            dt { "Agent" } dd { (s.agent.as_deref().unwrap_or("—")) }
            @if let Some(reason) = &s.reason { dt { "Reason" } dd { (reason) } }
            dt { "Events" } dd { (c.events) }
            dt { "Steps" } dd { (c.steps) }
            dt { "Refused calls" } dd { (c.calls_refused) }
            dt { "Answered from the ledger" } dd { (c.calls_answered) }
            dt { "Model turns" } dd { (c.model_turns) }
            dt { "Tokens" } dd { (c.tokens) }
            dt { "Cost" } dd { (format!("${:.4}", c.cost_usd)) }
            dt { "Tool errors" } dd { (c.tool_errors) }
            @if view.status.reserved.model_turns > 0 {
                @let held = &view.status.reserved;
                dt { "Held by model calls in flight" }
                dd #reserved {
                    (held.model_turns) (if held.model_turns == 1 { " call, " } else { " calls, " })
                    (held.tokens) " tokens, " (format!("${:.4}", held.cost_usd))
                    " (its own and below; every budget counts them before a model call)"
                }
            }
            dt { "Progress version" } dd { (view.status.progress_version.map_or("—".to_owned(), |v| v.to_string())) }
            dt { "Last activity" } dd { (time(s.last_ts_ms)) }
            @if let Some(place) = view.status.tree.as_ref().filter(|_| view.tree.is_some()) {
                @if let Some(parent) = &place.parent {
                    dt { "Parent" } dd { a href=(run_href(view.tenant, parent)) { (parent) } }
                }
                dt { "Tree" } dd { "root " a href=(run_href(view.tenant, &place.root)) { (place.root) } ", depth " (place.depth) }
                @if let Some(by) = &place.stopped_by {
                    dt { "Stopped by" } dd { "the stop of " a href=(run_href(view.tenant, by)) { (by) } }
                }
            }
        }
        nav.actions aria-label="Actions" {
            @if s.open {
                a #cancel href={(base) "/cancel"} { "Cancel run…" }
            }
            @if let Some(report) = view.status.report.as_ref().filter(|r| resumable(r)) {
                a #resume href={(base) "/resume"} { "Resume… (" (resume_condition(report.resume_condition).0) ")" }
            }
            a #export href={(base) "/history.json"} download { "Download history (JSON)" }
            a href="/" { "All runs" }
        }
        @if let Some(report) = &view.status.report {
            (summary(view, report))
        }
        @if let Some(tree) = view.tree {
            (tree_section(view, tree))
        }
        (timeline(view))
        @if let Some(report) = &view.status.report {
            (stop_report(report))
        }
        (ledger(view))
    }
}

fn list(key: &str, items: &[String]) -> Markup {
    html! {
        @if items.is_empty() { span.muted { "none" } }
        @else { ul { @for (i, item) in items.iter().enumerate() { li { (folded(&format!("{key}-{i}"), item)) } } } }
    }
}

/// A `fired_guards` entry, `guard:action@step`, with its step linked to the timeline
/// row of that step (the report counts steps as the timeline's first column does).
fn fired_guard(entry: &str) -> Markup {
    let parsed = entry.rsplit_once('@').and_then(|(what, step)| {
        let (guard, action) = what.split_once(':')?;
        Some((guard, action, step.parse::<u64>().ok()?))
    });
    match parsed {
        Some((guard, action, step)) => html! {
            code { (guard) } " " span class={"a-" (action)} { (action) } " at "
            a href={"#step-" (step)} { "step " (step) }
        },
        None => html! { code { (entry) } },
    }
}

/// The report as the daemon sent it, field by field (the summary above says it in
/// words); a completed run's is its final report, not a stop report.
fn stop_report(report: &StopReport) -> Markup {
    let (condition, meaning) = resume_condition(report.resume_condition);
    let completed = report.terminal_state == TerminalState::Completed;
    html! {
        section #stop-report aria-labelledby="stop-report-h" {
            h2 #stop-report-h { @if completed { "Final report" } @else { "Stop report" } }
            dl.facts {
                dt { "Terminal state" } dd { (state(report.terminal_state.as_str())) }
                dt { "Reason" } dd { code { (report.reason.as_str()) } }
                @if let Some(detail) = &report.detail { dt { "Detail" } dd { (folded("report-detail", detail)) } }
                dt { "Fired guards" } dd {
                    @if report.fired_guards.is_empty() { span.muted { "none" } }
                    @else { ul #fired-guards { @for entry in &report.fired_guards { li { (fired_guard(entry)) } } } }
                }
                dt { "Completed operations" } dd { (list("report-ops", &report.completed_operations)) }
                dt { "Completed steps" } dd { (report.completed_steps) }
                dt { "Progress version" } dd { (report.progress_version.map_or("—".to_owned(), |v| v.to_string())) }
                dt { "Last safe checkpoint" } dd { (report.last_safe_checkpoint.as_deref().unwrap_or("—")) }
                dt { "Unmet precondition" } dd { (report.unmet_precondition.as_deref().unwrap_or("—")) }
                dt { "Resume condition" } dd { code { (condition) } " — " (meaning) }
            }
        }
    }
}

/// A run's own step number for an entry: the event's `seq` (what the stop report's
/// `@N` counts), else its place in the daemon's log.
fn step_of(entry: &HistoryEntry) -> u64 {
    entry
        .event
        .get("seq")
        .and_then(Value::as_u64)
        .unwrap_or(entry.position)
}

/// `6`, `6, 7 and 9`, `8, 9, 10, … (12 times)`.
fn steps_text(steps: &[u64]) -> String {
    const SHOWN: usize = 6;
    let shown: Vec<String> = steps.iter().take(SHOWN).map(u64::to_string).collect();
    match steps.len() {
        0 => String::new(),
        1 => shown[0].clone(),
        n if n <= SHOWN => format!("{} and {}", shown[..n - 1].join(", "), shown[n - 1]),
        n => format!("{}, … ({n} times)", shown.join(", ")),
    }
}

/// What the model was told before the stop: each distinct message the guard sent with
/// a decision, in the order first sent, with the steps it was sent at.
struct Told<'a> {
    action: &'a str,
    message: &'a str,
    steps: Vec<u64>,
}

/// The tool calls of the timeline: per tool, how many there were and how many the
/// guard refused or answered from the ledger instead of running them.
struct Calls<'a> {
    tool: &'a str,
    calls: u64,
    refused: u64,
    answered: u64,
}

fn told_and_calls<'a>(entries: &'a [HistoryEntry], stop: &str) -> (Vec<Told<'a>>, Vec<Calls<'a>>) {
    let mut told: Vec<Told<'a>> = Vec::new();
    let mut calls: Vec<Calls<'a>> = Vec::new();
    for entry in entries {
        let d = &entry.decision;
        let action = d.action.as_str();
        if entry.event.get("type").and_then(Value::as_str) == Some("tool_call") {
            let tool = entry
                .event
                .get("tool")
                .and_then(Value::as_str)
                .unwrap_or("?");
            let at = match calls.iter().position(|c| c.tool == tool) {
                Some(at) => at,
                None => {
                    calls.push(Calls {
                        tool,
                        calls: 0,
                        refused: 0,
                        answered: 0,
                    });
                    calls.len() - 1
                }
            };
            let c = &mut calls[at];
            c.calls += 1;
            match action {
                "block" | "stop" => c.refused += 1,
                "use_completed_result" => c.answered += 1,
                _ => {}
            }
        }
        let Some(message) = d.message.as_deref().filter(|m| *m != stop) else {
            continue;
        };
        let step = step_of(entry);
        match told
            .iter_mut()
            .find(|t| t.message == message && t.action == action)
        {
            Some(t) => t.steps.push(step),
            None => told.push(Told {
                action,
                message,
                steps: vec![step],
            }),
        }
    }
    (told, calls)
}

/// The run's end said first, in words: the sentence the model was told when the run
/// closed, what ran how often and what was refused, what else the guard told the model
/// on the way, and what a resume needs. Every sentence is the daemon's (the stop
/// decision's message, the decisions' messages, the producer's detail); the counts are
/// the timeline's.
fn summary(view: &RunPage<'_>, report: &StopReport) -> Markup {
    let completed = report.terminal_state == TerminalState::Completed;
    let stop = view.status.stop_message.as_deref().unwrap_or("");
    let (told, calls) = told_and_calls(&view.history.entries, stop);
    let (condition, meaning) = resume_condition(report.resume_condition);
    let partial = view.after.is_some() || view.history.more;
    html! {
        section #summary .summary.ended[completed] aria-labelledby="summary-h" {
            h2 #summary-h { @if completed { "How it ended" } @else { "Why it stopped" } }
            @if completed {
                p.headline { "It finished normally after " (report.completed_steps) " steps"
                    @if let Some(detail) = &report.detail { ": " q { (detail) } } "." }
            } @else {
                @if !stop.is_empty() { p.headline #stop-message { (stop) } }
                @if let Some(detail) = &report.detail {
                    p { "In its own words: " q #stop-detail { (detail) } }
                }
            }
            @if !calls.is_empty() {
                p { "What it called" @if partial { " (on the events shown below)" } ":" }
                ul #summary-calls {
                    @for c in &calls {
                        li {
                            code { (c.tool) } " " (c.calls) (if c.calls == 1 { " call" } else { " calls" })
                            @if c.refused > 0 { ", " strong.a-block { (c.refused) " refused" } }
                            @if c.answered > 0 { ", " (c.answered) " answered from the ledger" }
                        }
                    }
                }
            }
            @if !told.is_empty() {
                p { "What the guard told the model on the way:" }
                ul #summary-told {
                    @for (i, t) in told.iter().enumerate().take(12) {
                        li {
                            span class={"a-" (t.action)} { (t.action) } " at step " (steps_text(&t.steps)) ": "
                            (folded_prose(&format!("told-{i}"), t.message))
                        }
                    }
                }
            }
            @if !completed {
                p #summary-resume {
                    "To resume: " (meaning) "."
                    @if let Some(unmet) = &report.unmet_precondition { " Unmet precondition: " code { (unmet) } "." }
                    " (" code { (condition) } ")"
                }
            }
        }
    }
}

/// The run's tree: every run of it under its parent, what each subtree spent, and for
/// a run an ancestor's stop closed, whose stop that was.
fn tree_section(view: &RunPage<'_>, tree: &TreeView) -> Markup {
    let place = view.status.tree.as_ref();
    let whole = RunsParams {
        tenant: Some(view.tenant.to_owned()),
        root: place.map(|p| p.root.clone()),
        ..RunsParams::default()
    };
    html! {
        section #tree aria-labelledby="tree-h" {
            h2 #tree-h { "Tree of runs" }
            @if let Some(place) = place {
                p #tree-summary .muted {
                    (place.spawned) " runs started below this one, " (place.open_below) " open now. "
                    "The runs below spent " (place.below.steps) " steps, " (place.below.model_turns) " model turns, "
                    (place.below.tokens) " tokens, " (format!("${:.4}", place.below.cost_usd))
                    " since this run's task began: what its budgets count besides its own. Cancelling a run cancels every run below it."
                }
            }
            div.scroll { table.rows #tree-table {
                thead { tr {
                    th { "Run" } th { "Agent" } th { "State" } th { "Reason" } th { "Steps" }
                    th title="the run's and every listed run's below it" { "Tree steps" }
                    th title="the run's and every listed run's below it" { "Tree cost" }
                    th { "Last activity" }
                } }
                tbody { @for node in &tree.nodes {
                    @let row = &node.row;
                    @let this = row.summary.run == view.run;
                    tr data-run=(row.summary.run) data-depth=(row.depth) aria-current=[this.then_some("page")] {
                        td style={"padding-left:" (0.5 + 1.5 * f64::from(row.depth)) "em"} {
                            @if this { strong { (row.summary.run) } }
                            @else { a href=(run_href(view.tenant, &row.summary.run)) { (row.summary.run) } }
                            @if node.detached {
                                " " span.muted { "(under " (row.parent.as_deref().unwrap_or("?")) ", not listed)" }
                            }
                        }
                        td { (row.summary.agent.as_deref().unwrap_or("")) }
                        td { (state(row.state())) }
                        td.reason {
                            (row.summary.reason.as_deref().unwrap_or(""))
                            @if let Some(by) = &row.stopped_by {
                                " from " a.stopped-by href=(run_href(view.tenant, by)) { (by) }
                            }
                        }
                        td.n { (row.summary.steps) }
                        td.n.tree-steps { (node.tree_steps) }
                        td.n.tree-cost { (format!("{:.4}", node.tree_cost_usd)) }
                        td { (time(row.summary.last_ts_ms)) }
                    }
                } }
            } }
            @if tree.unlisted > 0 {
                p.muted { (tree.unlisted) " more runs of this tree are not listed (the most recently active are)." }
            }
            @if !tree.unanswered.is_empty() {
                p.answer.refused role="alert" {
                    "Partitions " (format!("{:?}", tree.unanswered)) " did not answer in time: their runs are missing."
                }
            }
            nav.actions aria-label="Tree" { a href={"/" (whole.href())} { "All runs of this tree in the runs list" } }
        }
    }
}

/// Envelope fields every event has: shown in their own columns, not in the details.
const ENVELOPE: [&str; 7] = ["v", "id", "tenant", "run", "seq", "ts_ms", "type"];

/// What the arguments column shows of an event: a call's arguments, a result's
/// output, anything else's own fields (the envelope has columns of its own).
fn payload(event: &Value, kind: &str) -> Value {
    let field = match kind {
        "tool_call" => Some("args"),
        "tool_result" => Some("output"),
        _ => None,
    };
    if let Some(value) = field.and_then(|f| event.get(f)) {
        return value.clone();
    }
    let skip: &[&str] = match kind {
        "tool_call" | "tool_result" => &["call_id", "tool", "kind"],
        _ => &[],
    };
    Value::Object(
        event
            .as_object()
            .map(|fields| {
                fields
                    .iter()
                    .filter(|(k, _)| !ENVELOPE.contains(&k.as_str()) && !skip.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default(),
    )
}

fn timeline_row(entry: &HistoryEntry, called_at: &HashMap<&str, u64>) -> Markup {
    let event = &entry.event;
    let kind = event.get("type").and_then(Value::as_str).unwrap_or("?");
    let tool = event.get("tool").and_then(Value::as_str);
    let ts_ms = event.get("ts_ms").and_then(Value::as_u64).unwrap_or(0);
    let result_kind = (kind == "tool_result")
        .then(|| event.get("kind").and_then(Value::as_str))
        .flatten();
    // A result's time after its call's (when the call is on this page).
    let took = (kind == "tool_result")
        .then(|| event.get("call_id").and_then(Value::as_str))
        .flatten()
        .and_then(|call| called_at.get(call))
        .map(|at| duration(ts_ms.saturating_sub(*at)));
    let step = step_of(entry);
    let d = &entry.decision;
    let action = d.action.as_str();
    let position = entry.position;
    html! {
        tr id={"step-" (step)} class={"e-" (kind)} data-action=(action) data-step=(step) {
            td.n title={"log position " (position)} { (step) }
            td { (clock(ts_ms)) @if let Some(took) = took { br; span.muted.took { "+" (took) } } }
            td { strong { (kind) } @if let Some(tool) = tool { " " code { (tool) } } }
            td.wrap.args { (folded_json(&format!("a{position}"), &payload(event, kind))) }
            td { (result_kind.unwrap_or("")) }
            td { span class={"a-" (action)} { (action) } }
            td { (d.reason.map(|r| r.as_str()).unwrap_or("")) }
            td { (d.detector.map(|x| x.as_str()).unwrap_or("")) }
            td.n { (d.count.map(|n| n.to_string()).unwrap_or_default()) }
            td.wrap { @if let Some(message) = &d.message { (folded_prose(&format!("m{position}"), message)) } }
        }
    }
}

fn timeline(view: &RunPage<'_>) -> Markup {
    let base = run_href(view.tenant, view.run);
    let entries = &view.history.entries;
    let called_at: HashMap<&str, u64> = entries
        .iter()
        .filter(|e| e.event.get("type").and_then(Value::as_str) == Some("tool_call"))
        .filter_map(|e| {
            Some((
                e.event.get("call_id")?.as_str()?,
                e.event.get("ts_ms")?.as_u64()?,
            ))
        })
        .collect();
    html! {
        section #timeline aria-labelledby="timeline-h" {
            h2 #timeline-h { "Timeline" }
            p.muted {
                (entries.len()) " events"
                @if let Some(after) = view.after { " after log position " (after) }
                ", in the order the daemon applied them. Step is the run's own number for the event (its "
                code { "seq" } "), the one the stop report's " code { "@N" } " names; times are UTC, a result's "
                code { "+" } " the time since its call. Long arguments and outputs are folded: open them to read all of it."
            }
            div.scroll {
                table.rows {
                    thead { tr {
                        th title="the event's seq in its run" { "Step" } th { "Time (UTC)" } th { "Event" } th { "Arguments / output" } th { "Result" }
                        th { "Decision" } th { "Reason" } th { "Detector" } th { "Count" } th { "Message" }
                    } }
                    tbody { @for entry in entries { (timeline_row(entry, &called_at)) } }
                }
            }
            nav.actions aria-label="Timeline pages" {
                @if view.after.is_some() { a href=(base) { "← First events" } }
                @if let Some(last) = entries.last().filter(|_| view.history.more) {
                    a rel="next" href={(base) "?after=" (last.position)} { "Later events →" }
                }
            }
        }
    }
}

fn ledger(view: &RunPage<'_>) -> Markup {
    let base = run_href(view.tenant, view.run);
    html! {
        section #ledger aria-labelledby="ledger-h" {
            h2 #ledger-h { "op_key ledger" }
            @if view.ledger.is_empty() {
                p.muted { "This run holds no op_key." }
            } @else {
                div.scroll { table {
                    thead { tr { th { "op_key" } th { "State" } th { "Call" } th { "Since" } th { "Lease ends" } th { "Result" } th {} } }
                    tbody { @for item in view.ledger {
                        tr data-op-key=(item.op_key) {
                            td { code { (item.op_key) } }
                            td { (item.state) }
                            td { code { (item.call_id) } }
                            td { @if let Some(t) = item.since_ms { (time(t)) } }
                            td { @if let Some(t) = item.lease_ends_ms { (time(t)) } }
                            td { @if let Some(result) = &item.result { (folded_json(&format!("ledger-{}", item.op_key), result)) } }
                            td { a href={(base) "/resolve?" (serde_urlencoded::to_string([("op_key", &item.op_key)]).unwrap_or_default())} { "Resolve…" } }
                        }
                    } }
                } }
            }
        }
    }
}
