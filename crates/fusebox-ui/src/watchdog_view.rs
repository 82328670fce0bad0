//! The watchdog page: the instances the cloud watchdog holds, with their deadlines and
//! the limit that set each, and its recent terminations — as fuseboxd answered
//! `fusebox.control.watchdog`.

use fusebox_nats::wire::{WatchdogInstance, WatchdogReply};
use maud::{html, Markup};

use crate::layout::{page, time};
use crate::runs_view::run_href;

pub fn watchdog_page(status: &WatchdogReply) -> Markup {
    page(
        "Watchdog",
        html! {
            h1 { "Cloud watchdog" }
            div #watchdog data-live="/live/watchdog" { (watchdog_live(status)) }
        },
    )
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

fn owner(tenant: Option<&str>, run: Option<&str>) -> Markup {
    html! {
        @match (tenant, run) {
            (Some(t), Some(r)) => a href=(run_href(t, r)) { (t) "/" (r) },
            (Some(t), None) => (t),
            _ => span.muted { "untagged" },
        }
    }
}

fn instance_row(i: &WatchdogInstance) -> Markup {
    html! {
        tr data-instance=(i.instance_id) {
            td { code { (i.instance_id) } }
            td { (i.region) }
            td { (i.state) }
            td { (owner(i.tenant.as_deref(), i.run.as_deref())) }
            td { @if let Some(at) = i.launch_ms { (time(at)) } }
            td.deadline { @if let Some(at) = i.deadline_ms { (time(at)) } @else { span.muted { "unknown" } } }
            td.reason { (i.reason.as_deref().unwrap_or("")) }
            td.n { @if let Some(ms) = i.time_left_ms { (left(ms)) } }
            td {
                @if i.protected { "protected (never terminated) " }
                @for problem in &i.tag_problems { span.a-warn { (problem) } " " }
            }
        }
    }
}

/// The part the SSE stream replaces.
pub fn watchdog_live(status: &WatchdogReply) -> Markup {
    let (held, finished): (Vec<_>, Vec<_>) = status.instances.iter().partition(|i| !i.done);
    html! {
        @if !status.enabled {
            p.answer role="status" { "The watchdog is disabled on this daemon ([watchdog] enabled = false)." }
        } @else {
            @for (region, error) in &status.region_errors {
                p.answer.refused role="alert" { "Region " (region) " could not be listed: " (error) }
            }
            h2 { "Held instances (" (held.len()) ")" }
            p.muted { "Managed instances the cloud lists, soonest deadline first. " (finished.len()) " more are shutting down or terminated." }
            div.scroll {
                table #instances {
                    thead { tr {
                        th { "Instance" } th { "Region" } th { "State" } th { "Run" } th { "Launched" }
                        th { "Deadline" } th { "Reason" } th { "Left" } th { "Notes" }
                    } }
                    tbody {
                        @for i in &held { (instance_row(i)) }
                        @if held.is_empty() { tr { td.muted colspan="9" { "No instance is held." } } }
                    }
                }
            }
            h2 { "Recent terminations (" (status.terminations.len()) ")" }
            div.scroll {
                table #terminations {
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
                                td { (owner(t.tenant.as_deref(), t.run.as_deref())) }
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
