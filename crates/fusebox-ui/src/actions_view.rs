//! The confirmation step of each action and the daemon's answer to it. Every action is
//! two requests: a page that says what will happen (GET), and the confirmed form
//! (POST, with the page's CSRF token) whose answer is the daemon's.

use fusebox_client::ClientError;
use fusebox_core::decision::StopReport;
use fusebox_core::Decision;
use maud::{html, Markup};

use crate::layout::{folded_json, page};
use crate::run_view::resume_condition;
use crate::runs_view::run_href;

/// `open_below`: runs below this one open now, which a cancel stops with it.
pub fn confirm_cancel(tenant: &str, run: &str, open_below: u32, csrf: &str, by: &str) -> Markup {
    let base = run_href(tenant, run);
    page(
        "Cancel run",
        html! {
            h1 { "Cancel " (tenant) "/" (run) "?" }
            p { "fuseboxd will stop the run: its next tool call is refused and the stop goes out on its kill switch. Recorded as done by " code { (by) } "." }
            @if open_below > 0 {
                p #subtree .answer role="note" {
                    strong { (runs(open_below)) " below it " (if open_below == 1 { "is" } else { "are" }) " open" }
                    ": cancelling this run cancels its whole subtree. fuseboxd stops each of them with it, with a stop of its own ("
                    code { "ancestor_stopped" } ") on its own kill switch."
                }
            }
            form method="post" action={(base) "/cancel"} {
                input type="hidden" name="csrf" value=(csrf);
                p { label { "Reason (for the audit trail) " input name="reason" size="40"; } }
                div.actions { button #confirm type="submit" { "Confirm: cancel the run" } a href=(base) { "Back" } }
            }
        },
    )
}

/// `1 run`, `3 runs`.
fn runs(n: u32) -> String {
    format!("{n} run{}", if n == 1 { "" } else { "s" })
}

/// What a cancel's answer adds: the runs below that were open and are stopped with it.
pub fn stopped_below(open_below: Option<u32>) -> Markup {
    html! {
        @if let Some(n) = open_below.filter(|n| *n > 0) {
            p #stopped-below {
                (runs(n)) " below it " (if n == 1 { "was" } else { "were" }) " open: each is stopped with it ("
                code { "ancestor_stopped" } "), on its own kill switch."
            }
        }
    }
}

/// Evidence to start from, by what the report asks for.
fn evidence_template(report: &StopReport) -> String {
    match report.resume_condition {
        fusebox_core::decision::ResumeCondition::VerifiedPreconditionChange => {
            format!(
                "{{\"progress_version\": {}}}",
                report.progress_version.map_or(1, |v| v + 1)
            )
        }
        _ => "{\"approval_id\": \"\"}".to_owned(),
    }
}

pub fn confirm_resume(
    tenant: &str,
    run: &str,
    report: &StopReport,
    csrf: &str,
    by: &str,
) -> Markup {
    let base = run_href(tenant, run);
    let (condition, meaning) = resume_condition(report.resume_condition);
    page(
        "Resume run",
        html! {
            h1 { "Resume " (tenant) "/" (run) "?" }
            p { "Stopped: " code { (report.terminal_state.as_str()) } " / " code { (report.reason.as_str()) } "." }
            p #resume-condition { "Resume condition " code { (condition) } ": it needs " (meaning) "." }
            p { "fuseboxd judges the evidence and answers; a refusal is shown as such. Recorded as done by " code { (by) } "." }
            form method="post" action={(base) "/resume"} {
                input type="hidden" name="csrf" value=(csrf);
                p { label for="evidence" { "Evidence (a JSON object)" } br; textarea #evidence name="evidence" { (evidence_template(report)) } }
                div.actions { button #confirm type="submit" { "Confirm: ask to resume" } a href=(base) { "Back" } }
            }
        },
    )
}

pub fn confirm_resolve(tenant: &str, run: &str, op_key: &str, csrf: &str, by: &str) -> Markup {
    let base = run_href(tenant, run);
    page(
        "Resolve op_key",
        html! {
            h1 { "Resolve op_key " code { (op_key) } }
            p { "Your word on what became of the operation, sent to " (tenant) "/" (run) " as a ledger_resolve event (as " code { "fusebox ledger resolve" } " does). Recorded as done by " code { (by) } "." }
            form method="post" action={(base) "/resolve"} {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="op_key" value=(op_key);
                fieldset {
                    legend { "What happened" }
                    p { label { input type="radio" name="resolution" value="completed" checked; " It happened: later calls get this result" } }
                    p { label for="output" { "Result (JSON)" } br; textarea #output name="output" { "{}" } }
                    p { label { input type="radio" name="resolution" value="released"; " It did not happen (release: the next call runs)" } }
                }
                p { label { "Reason (for the audit trail) " input name="reason" size="40"; } }
                div.actions { button #confirm type="submit" { "Confirm: resolve" } a href=(base) { "Back" } }
            }
        },
    )
}

/// The status code and page for a command's outcome: the decision, or the refusal.
/// `note`: what else the command did (a cancel's subtree), shown with the decision.
pub fn answer(
    what: &str,
    tenant: &str,
    run: &str,
    outcome: &Result<Decision, ClientError>,
    note: &Markup,
) -> (axum::http::StatusCode, Markup) {
    use axum::http::StatusCode;
    let base = run_href(tenant, run);
    let (code, body) = match outcome {
        Ok(decision) => (
            StatusCode::OK,
            html! {
                div #answer .answer role="status" {
                    p { "fuseboxd answered " strong.answer-action { (decision.action.as_str()) }
                        @if let Some(reason) = decision.reason { " (" (reason.as_str()) ")" } "." }
                    @if let Some(message) = &decision.message { p { (message) } }
                    (note)
                    (folded_json("answer", &serde_json::to_value(decision).unwrap_or_default()))
                }
            },
        ),
        Err(err) => {
            let code = match err {
                ClientError::Refused(e) if e.reason == "unknown_run" => StatusCode::NOT_FOUND,
                ClientError::Refused(_) | ClientError::Usage(_) => StatusCode::UNPROCESSABLE_ENTITY,
                ClientError::PermissionDenied { .. } => StatusCode::FORBIDDEN,
                ClientError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
                _ => StatusCode::BAD_GATEWAY,
            };
            let reason = match err {
                ClientError::Refused(e) => Some(e.reason.as_str()),
                _ => None,
            };
            (
                code,
                html! {
                    div #answer .answer.refused role="alert" {
                        p { "Refused" @if let Some(r) = reason { " (" code { (r) } ")" } ": " (err.to_string()) }
                    }
                },
            )
        }
    };
    (
        code,
        page(
            what,
            html! {
                h1 { (what) " " (tenant) "/" (run) }
                (body)
                p.actions { a href=(base) { "Back to the run" } a href="/" { "All runs" } }
            },
        ),
    )
}
