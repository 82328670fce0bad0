//! The runs page: filters, counts per state, one page of runs newest activity first.

use fusebox_nats::wire::{RunRow, RunsCursor, RunsPage, RunsQuery};
use maud::{html, Markup};
use serde::{Deserialize, Serialize};

use crate::layout::{page, state, time};

/// Rows per page: a page renders in well under the budget even at 100 k runs, because
/// the daemon builds and sends only these rows.
pub const PAGE_ROWS: usize = 100;

/// Every state a run can be in, for the state filter.
const STATES: [&str; 6] = [
    "OPEN",
    "STOPPED_LOOP_GUARD",
    "NEEDS_HUMAN",
    "FAILED",
    "CANCELLED",
    "COMPLETED",
];

/// The runs page's query string: filters, search and the paging cursor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunsParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Search: runs whose id contains this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q: Option<String>,
    /// One tree of runs: this root and every run below it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// `<last_ts_ms>.<tenant>.<run>` of the row the page continues after (ids never
    /// contain a dot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

fn given(value: &Option<String>) -> Option<String> {
    value
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

impl RunsParams {
    /// Blank fields dropped, so `?tenant=&state=OPEN` is the same page as `?state=OPEN`.
    pub fn normalised(&self) -> RunsParams {
        RunsParams {
            tenant: given(&self.tenant),
            agent: given(&self.agent),
            state: given(&self.state),
            reason: given(&self.reason),
            q: given(&self.q),
            root: given(&self.root),
            after: given(&self.after),
        }
    }

    pub fn query(&self) -> Result<RunsQuery, String> {
        let after = match &self.after {
            None => None,
            Some(text) => Some(parse_cursor(text)?),
        };
        Ok(RunsQuery {
            tenant: self.tenant.clone(),
            agent: self.agent.clone(),
            state: self.state.clone(),
            reason: self.reason.clone(),
            run_contains: self.q.clone(),
            root: self.root.clone(),
            after,
            limit: Some(PAGE_ROWS),
        })
    }

    /// The query string of this page (`?…`, or empty).
    pub fn href(&self) -> String {
        let query = serde_urlencoded::to_string(self).unwrap_or_default();
        if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        }
    }

    fn with_state(&self, state: Option<&str>) -> RunsParams {
        RunsParams {
            state: state.map(str::to_owned),
            after: None,
            ..self.clone()
        }
    }
}

fn parse_cursor(text: &str) -> Result<RunsCursor, String> {
    let mut parts = text.splitn(3, '.');
    let bad = || format!("{text:?} is not a page position (<last_ts_ms>.<tenant>.<run>)");
    let last_ts_ms = parts.next().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
    let tenant = parts.next().filter(|t| !t.is_empty()).ok_or_else(bad)?;
    let run = parts.next().filter(|r| !r.is_empty()).ok_or_else(bad)?;
    Ok(RunsCursor {
        last_ts_ms,
        tenant: tenant.to_owned(),
        run: run.to_owned(),
    })
}

fn cursor_text(row: &RunRow) -> String {
    format!(
        "{}.{}.{}",
        row.summary.last_ts_ms, row.summary.tenant, row.summary.run
    )
}

pub fn run_href(tenant: &str, run: &str) -> String {
    format!("/runs/{tenant}/{run}")
}

/// The whole page: the filter form, then the live part.
pub fn runs_page(params: &RunsParams, view: &RunsPage, unanswered: &[u32]) -> Markup {
    let live = format!("/live/runs{}", params.href());
    page(
        "Runs",
        html! {
            h1 { "Runs" }
            form.filters method="get" action="/" role="search" {
                label { "Tenant" input name="tenant" value=[params.tenant.as_deref()]; }
                label { "Agent" input name="agent" value=[params.agent.as_deref()]; }
                label { "State"
                    select name="state" {
                        option value="" { "any" }
                        @for s in STATES {
                            option value=(s) selected[params.state.as_deref() == Some(s)] { (s) }
                        }
                    }
                }
                label { "Reason" input name="reason" value=[params.reason.as_deref()] placeholder="same_call_repeat"; }
                label { "Run id contains" input type="search" name="q" value=[params.q.as_deref()]; }
                label { "Tree of run" input name="root" value=[params.root.as_deref()] placeholder="root run id"; }
                button type="submit" { "Filter" }
                a href="/" { "Clear" }
            }
            div #runs data-live=(live) { (runs_live(params, view, unanswered)) }
        },
    )
}

/// The part of the page the SSE stream replaces: counts, the table, the pager.
pub fn runs_live(params: &RunsParams, view: &RunsPage, unanswered: &[u32]) -> Markup {
    let total: u64 = view.states.values().sum();
    html! {
        nav.counts aria-label="Runs per state" {
            a href={"/" (params.with_state(None).href())} { "all (" (total) ")" }
            @for (s, n) in &view.states {
                a href={"/" (params.with_state(Some(s)).href())} { (state(s)) " (" (n) ")" }
            }
        }
        @if !unanswered.is_empty() {
            p.answer.refused role="alert" {
                "Partitions " (format!("{unanswered:?}")) " did not answer in time: their runs are missing."
            }
        }
        p.muted { (view.matched) " runs match; " (view.runs.len()) " shown, newest activity first." }
        div.scroll {
            table #runs-table {
                thead { tr {
                    th { "Tenant" } th { "Run" } th { "Parent" } th { "Agent" } th { "State" } th { "Reason" }
                    th { "Steps" } th { "Refused" } th { "Tokens" } th { "Cost" }
                    th { "Started" } th { "Last activity" }
                } }
                tbody {
                    @for row in &view.runs {
                        tr data-run={(row.summary.tenant) "/" (row.summary.run)} {
                            td { (row.summary.tenant) }
                            td { a href=(run_href(&row.summary.tenant, &row.summary.run)) { (row.summary.run) } }
                            td { @if let Some(parent) = &row.parent { a href=(run_href(&row.summary.tenant, parent)) { (parent) } } }
                            td { (row.summary.agent.as_deref().unwrap_or("")) }
                            td { (state(row.state())) }
                            td { (row.summary.reason.as_deref().unwrap_or("")) }
                            td.n { (row.summary.steps) }
                            td.n { (row.calls_refused) }
                            td.n { (row.tokens) }
                            td.n { (format!("{:.4}", row.cost_usd)) }
                            td { (time(row.first_ts_ms)) }
                            td { (time(row.summary.last_ts_ms)) }
                        }
                    }
                    @if view.runs.is_empty() {
                        tr { td.muted colspan="12" { "No runs match." } }
                    }
                }
            }
        }
        nav.actions aria-label="Pages" {
            @if params.after.is_some() {
                a href={"/" (RunsParams { after: None, ..params.clone() }.href())} { "← Newest" }
            }
            @if let Some(last) = view.runs.last().filter(|_| view.runs.len() >= PAGE_ROWS) {
                a rel="next" href={"/" (RunsParams { after: Some(cursor_text(last)), ..params.clone() }.href())} { "Older →" }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_bad_ones_are_refused() {
        let cursor = parse_cursor("1700000000000.acme.r-1").unwrap();
        assert_eq!(cursor.tenant, "acme");
        assert_eq!(cursor.run, "r-1");
        for bad in ["", "x.acme.r", "12.acme", "12..r"] {
            assert!(parse_cursor(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn blank_filters_are_no_filters() {
        let params = RunsParams {
            tenant: Some(" ".to_owned()),
            state: Some("OPEN".to_owned()),
            ..RunsParams::default()
        };
        assert_eq!(params.normalised().href(), "?state=OPEN");
    }
}
