//! The watchdog page: the instances the cloud watchdog holds, with their deadlines and
//! the limit that set each, and its recent terminations — as fuseboxd answered
//! `fusebox.control.watchdog`.

use std::collections::HashSet;

use fusebox_nats::wire::{WatchdogInstance, WatchdogReply};
use maud::{html, Markup};

use crate::layout::{page, time};
use crate::runs_view::run_href;

/// The runs of the daemon's the instances' tags name: only these are linked (a tag may
/// name a run fuseboxd never heard of, whose page would be a 404).
pub type KnownRuns = HashSet<(String, String)>;

pub fn watchdog_page(status: &WatchdogReply, known: &KnownRuns) -> Markup {
    page(
        "Watchdog",
        html! {
            h1 { "Cloud watchdog" }
            div #watchdog data-live="/live/watchdog" { (watchdog_live(status, known)) }
        },
    )
}

/// The time left before an instance's deadline, as a person says it: `4m 10s`, or
/// `overdue by 6s` — and for a protected instance, which is never terminated, only
/// that it is past its deadline.
fn time_left(i: &WatchdogInstance) -> Markup {
    match i.time_left_ms {
        None => html! {},
        Some(ms) if ms >= 0 => html! { (left(ms)) },
        Some(ms) if i.protected => {
            html! { span.muted { "past its deadline by " (left(-ms)) " (protected: kept)" } }
        }
        Some(ms) => html! { span.a-warn { "overdue by " (left(-ms)) } },
    }
}

/// A duration in whole seconds, `-` when overdue: `1h 02m 03s`, `-4s`.
fn left(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "" };
    let s = ms.unsigned_abs() / 1000;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, sec) => format!("{sign}{sec}s"),
        (0, min, sec) => format!("{sign}{min}m {sec:02}s"),
        (h, min, sec) => format!("{sign}{h}h {min:02}m {sec:02}s"),
    }
}

fn owner(tenant: Option<&str>, run: Option<&str>, known: &KnownRuns) -> Markup {
    html! {
        @match (tenant, run) {
            (Some(t), Some(r)) if known.contains(&(t.to_owned(), r.to_owned())) => a href=(run_href(t, r)) { (t) "/" (r) },
            (Some(t), Some(r)) => span title="fuseboxd knows no such run" { (t) "/" (r) " " span.muted { "(not a run fuseboxd knows)" } },
            (Some(t), None) => (t),
            _ => span.muted { "untagged" },
        }
    }
}

fn instance_row(i: &WatchdogInstance, known: &KnownRuns) -> Markup {
    html! {
        tr data-instance=(i.instance_id) {
            td { code { (i.instance_id) } }
            td { (i.region) }
            td { (i.state) }
            td { (owner(i.tenant.as_deref(), i.run.as_deref(), known)) }
            td { @if let Some(at) = i.launch_ms { (time(at)) } }
            td.deadline { @if let Some(at) = i.deadline_ms { (time(at)) } @else { span.muted { "unknown" } } }
            td.reason { (i.reason.as_deref().unwrap_or("")) }
            td.n.left { (time_left(i)) }
            td {
                @if i.protected { "protected (never terminated) " }
                @for problem in &i.tag_problems { span.a-warn { (problem) } " " }
            }
        }
    }
}

/// The part the SSE stream replaces.
pub fn watchdog_live(status: &WatchdogReply, known: &KnownRuns) -> Markup {
    let (held, finished): (Vec<_>, Vec<_>) = status.instances.iter().partition(|i| !i.done);
    html! {
        @if !status.enabled {
            p.answer #watchdog-disabled role="status" { "The watchdog is disabled on this daemon ([watchdog] enabled = false): no cloud instance is watched or terminated. fuseboxd said: " (status.message) }
        } @else {
            @for (region, error) in &status.region_errors {
                p.answer.refused role="alert" { "Region " (region) " could not be listed: " (error) }
            }
            h2 { "Held instances (" (held.len()) ")" }
            p.muted { "Managed instances the cloud lists, soonest deadline first. " (finished.len()) " more are shutting down or terminated." }
            div.scroll {
                table.rows #instances {
                    thead { tr {
                        th { "Instance" } th { "Region" } th { "State" } th { "Run" } th { "Launched" }
                        th { "Deadline" } th { "Reason" } th { "Left" } th { "Notes" }
                    } }
                    tbody {
                        @for i in &held { (instance_row(i, known)) }
                        @if held.is_empty() { tr { td.muted colspan="9" { "No instance is held." } } }
                    }
                }
            }
            h2 { "Recent terminations (" (status.terminations.len()) ")" }
            div.scroll {
                table.rows #terminations {
                    thead { tr {
                        th { "When" } th { "Instance" } th { "Region" } th { "Run" } th { "Reason" }
                        th { "Deadline" } th { "Outcome" }
                    } }
                    tbody {
                        @for t in &status.terminations {
                            tr data-instance=(t.instance_id) {
                                td { (time(t.at_ms)) }
                                td { code { (t.instance_id) } }
                                td { (t.region) }
                                td { (owner(t.tenant.as_deref(), t.run.as_deref(), known)) }
                                td.reason { (t.reason) }
                                td { (time(t.deadline_ms)) }
                                td.outcome {
                                    (t.outcome)
                                    @if t.dry_run { " (dry run)" }
                                    @if let Some(error) = &t.error { ": " (error) }
                                }
                            }
                        }
                        @if status.terminations.is_empty() { tr { td.muted colspan="7" { "None yet." } } }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_left_reads_as_a_person_would_say_it() {
        for (ms, text) in [
            (0, "0s"),
            (59_999, "59s"),
            (61_000, "1m 01s"),
            (3_723_000, "1h 02m 03s"),
            (-4_000, "-4s"),
        ] {
            assert_eq!(left(ms), text, "{ms}");
        }
    }
}
