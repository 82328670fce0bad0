//! One run's page: what it is, its stop report, its timeline, its op_key ledger
//! entries, and the actions an operator may take on it.

use fusebox_client::{LedgerItem, TreeView};
use fusebox_core::decision::{ResumeCondition, StopReport};
use fusebox_nats::wire::{HistoryEntry, RunHistory, RunStatusReply};
use maud::{html, Markup};
use serde_json::Value;

use crate::layout::{folded, folded_json, page, state, time};
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
            a href="/" { "All runs" }
        }
        @if let Some(report) = &view.status.report {
            (stop_report(report))
        }
        @if let Some(tree) = view.tree {
            (tree_section(view, tree))
        }
        (timeline(view))
        (ledger(view))
    }
}

fn list(items: &[String]) -> Markup {
    html! {
        @if items.is_empty() { span.muted { "none" } }
        @else { ul { @for item in items { li { (folded(item)) } } } }
    }
}

fn stop_report(report: &StopReport) -> Markup {
    let (condition, meaning) = resume_condition(report.resume_condition);
    html! {
        section #stop-report aria-labelledby="stop-report-h" {
            h2 #stop-report-h { "Stop report" }
            dl.facts {
                dt { "Terminal state" } dd { (state(report.terminal_state.as_str())) }
                dt { "Reason" } dd { (report.reason.as_str()) }
                @if let Some(detail) = &report.detail { dt { "Detail" } dd { (folded(detail)) } }
                dt { "Fired guards" } dd { (list(&report.fired_guards)) }
                dt { "Completed operations" } dd { (list(&report.completed_operations)) }
                dt { "Completed steps" } dd { (report.completed_steps) }
                dt { "Progress version" } dd { (report.progress_version.map_or("—".to_owned(), |v| v.to_string())) }
                dt { "Last safe checkpoint" } dd { (report.last_safe_checkpoint.as_deref().unwrap_or("—")) }
                dt { "Unmet precondition" } dd { (report.unmet_precondition.as_deref().unwrap_or("—")) }
                dt { "Resume condition" } dd { code { (condition) } " — " (meaning) }
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
            div.scroll { table #tree-table {
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

fn timeline_row(entry: &HistoryEntry) -> Markup {
    let event = &entry.event;
    let kind = event.get("type").and_then(Value::as_str).unwrap_or("?");
    let tool = event.get("tool").and_then(Value::as_str);
    let result_kind = (kind == "tool_result")
        .then(|| event.get("kind").and_then(Value::as_str))
        .flatten();
    let details: serde_json::Map<String, Value> = event
        .as_object()
        .map(|fields| {
            fields
                .iter()
                .filter(|(k, _)| !ENVELOPE.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    let d = &entry.decision;
    let action = d.action.as_str();
    html! {
        tr class={"e-" (kind)} data-action=(action) {
            td.n { (entry.position) }
            td { (time(event.get("ts_ms").and_then(Value::as_u64).unwrap_or(0))) }
            td { strong { (kind) } @if let Some(tool) = tool { " " code { (tool) } } }
            td { (folded_json(&Value::Object(details))) }
            td { (result_kind.unwrap_or("")) }
            td { span class={"a-" (action)} { (action) } }
            td { (d.reason.map(|r| r.as_str()).unwrap_or("")) }
            td { (d.detector.map(|x| x.as_str()).unwrap_or("")) }
            td.n { (d.count.map(|n| n.to_string()).unwrap_or_default()) }
            td { @if let Some(message) = &d.message { (folded(message)) } }
        }
    }
}

fn timeline(view: &RunPage<'_>) -> Markup {
    let base = run_href(view.tenant, view.run);
    let entries = &view.history.entries;
    html! {
        section #timeline aria-labelledby="timeline-h" {
            h2 #timeline-h { "Timeline" }
            p.muted {
                (entries.len()) " events"
                @if let Some(after) = view.after { " after position " (after) }
                ", in the order the daemon applied them. Long arguments and outputs are folded: open them to read all of it."
            }
            div.scroll {
                table {
                    thead { tr {
                        th { "#" } th { "Time" } th { "Event" } th { "Arguments / output" } th { "Result" }
                        th { "Decision" } th { "Reason" } th { "Detector" } th { "Count" } th { "Message" }
                    } }
                    tbody { @for entry in entries { (timeline_row(entry)) } }
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
                            td { @if let Some(result) = &item.result { (folded_json(result)) } }
                            td { a href={(base) "/resolve?" (serde_urlencoded::to_string([("op_key", &item.op_key)]).unwrap_or_default())} { "Resolve…" } }
                        }
                    } }
                } }
            }
        }
    }
}
