//! The runs page: the fleet's first figures, filters (any case, with the values they
//! can take), counts per state, one page of runs newest activity first with its place
//! in the whole.

use std::time::{SystemTime, UNIX_EPOCH};

use fusebox_nats::wire::{Fleet, RunRow, RunsCursor, RunsPage, RunsQuery};
use maud::{html, Markup};
use serde::{Deserialize, Serialize};

use crate::layout::{count, page, state, time};

/// Rows per page: a page renders in well under the budget even at 100 k runs, because
/// the daemon builds and sends only these rows.
pub const PAGE_ROWS: usize = 100;

/// The window of the fleet's figures: the last hour.
const FLEET_WINDOW_MS: u64 = 3_600_000;

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
    /// Search: runs whose id contains this (any case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q: Option<String>,
    /// One tree of runs: this root and every run below it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// Active since: a UTC time (`2026-12-04 16:55`) or a span back from now (`1h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Active until: as `from`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// `<last_ts_ms>.<tenant>.<run>` of the row the page continues after (ids never
    /// contain a dot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// The same, of the row the page ends just ahead of (the previous page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<String>,
}

fn given(value: &Option<String>) -> Option<String> {
    value
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A time a person typed, in ms: a UTC date and time (`2026-12-04 16:55[:30]`, a `T`
/// between them, or a date alone), or a span back from `now_ms` (`90s`, `15m`, `1h`,
/// `2d`).
pub fn parse_when(text: &str, now_ms: u64) -> Result<u64, String> {
    let text = text.trim();
    let span = text.char_indices().last().and_then(|(i, unit)| {
        let n: u64 = text[..i].trim().parse().ok()?;
        let ms = match unit {
            's' => 1_000,
            'm' => 60_000,
            'h' => 3_600_000,
            'd' => 86_400_000,
            _ => return None,
        };
        Some(now_ms.saturating_sub(n.saturating_mul(ms)))
    });
    if let Some(at) = span {
        return Ok(at);
    }
    let spaced = text.replacen('T', " ", 1);
    let parsed = ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%d %H:%M"]
        .iter()
        .find_map(|f| chrono::NaiveDateTime::parse_from_str(&spaced, f).ok())
        .or_else(|| {
            chrono::NaiveDate::parse_from_str(&spaced, "%Y-%m-%d")
                .ok()
                .and_then(|d| d.and_hms_opt(0, 0, 0))
        });
    parsed
        .and_then(|t| u64::try_from(t.and_utc().timestamp_millis()).ok())
        .ok_or_else(|| {
            format!("{text:?} is not a time: write a UTC time (2026-12-04 16:55) or a span back from now (15m, 1h, 2d)")
        })
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
            from: given(&self.from),
            to: given(&self.to),
            after: given(&self.after),
            before: given(&self.before),
        }
    }

    /// The daemon's query for this page: filters in any case, and the fleet's figures of
    /// the last hour (`now_ms`, this machine's clock).
    pub fn query(&self, now_ms: u64) -> Result<RunsQuery, String> {
        let cursor = |text: &Option<String>| text.as_deref().map(parse_cursor).transpose();
        let when =
            |text: &Option<String>| text.as_deref().map(|t| parse_when(t, now_ms)).transpose();
        Ok(RunsQuery {
            tenant: self.tenant.clone(),
            agent: self.agent.clone(),
            state: self.state.clone(),
            reason: self.reason.clone(),
            run_contains: self.q.clone(),
            root: self.root.clone(),
            after: cursor(&self.after)?,
            before: cursor(&self.before)?,
            limit: Some(PAGE_ROWS),
            loose: true,
            active_since_ms: when(&self.from)?,
            active_until_ms: when(&self.to)?,
            fleet_since_ms: Some(now_ms.saturating_sub(FLEET_WINDOW_MS)),
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

    /// The same filters, from the first page.
    fn first_page(&self) -> RunsParams {
        RunsParams {
            after: None,
            before: None,
            ..self.clone()
        }
    }

    fn with_state(&self, state: Option<&str>) -> RunsParams {
        RunsParams {
            state: state.map(str::to_owned),
            ..self.first_page()
        }
    }
}

pub fn now() -> u64 {
    now_ms()
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

fn datalist(id: &str, values: &[String]) -> Markup {
    html! { datalist id=(id) { @for v in values { option value=(v) {} } } }
}

/// The whole page: the filter form (offering the values the filters can take), then
/// the live part.
pub fn runs_page(params: &RunsParams, view: &RunsPage, unanswered: &[u32]) -> Markup {
    let live = format!("/live/runs{}", params.href());
    let known = view.fleet.clone().unwrap_or_default();
    page(
        "Runs",
        html! {
            h1 { "Runs" }
            form.filters method="get" action="/" role="search" {
                label { "Tenant" input name="tenant" list="known-tenants" autocomplete="off" value=[params.tenant.as_deref()]; }
                label { "Agent" input name="agent" list="known-agents" autocomplete="off" value=[params.agent.as_deref()]; }
                label { "State"
                    select name="state" {
                        option value="" { "any" }
                        @for s in STATES {
                            option value=(s) selected[params.state.as_deref() == Some(s)] { (s) }
                        }
                    }
                }
                label { "Reason" input name="reason" list="known-reasons" autocomplete="off" value=[params.reason.as_deref()] placeholder="same_call_repeat"; }
                label { "Run id contains" input type="search" name="q" value=[params.q.as_deref()]; }
                label { "Tree of run" input name="root" value=[params.root.as_deref()] placeholder="root run id"; }
                label { "Active from (UTC)" input name="from" size="16" value=[params.from.as_deref()] placeholder="2026-12-04 16:55 or 1h"; }
                label { "to" input name="to" size="16" value=[params.to.as_deref()] placeholder="now"; }
                button type="submit" { "Filter" }
                a href="/" { "Clear" }
                (datalist("known-tenants", &known.tenants))
                (datalist("known-agents", &known.agents))
                (datalist("known-reasons", &known.reasons))
            }
            p.muted { "Text filters match any part of the value, in any case; the lists offer every value known." }
            div #runs data-live=(live) { (runs_live(params, view, unanswered)) }
        },
    )
}

/// The runs page of the last hour, narrowed by `f`.
fn last_hour(f: impl FnOnce(&mut RunsParams)) -> String {
    let mut params = RunsParams {
        from: Some("1h".to_owned()),
        ..RunsParams::default()
    };
    f(&mut params);
    format!("/{}", params.href())
}

/// The few figures a person looks at first: the last hour by state, its top stop
/// reasons, and the open runs costing most now — each a link to those runs.
fn fleet_figures(fleet: &Fleet) -> Markup {
    let mut reasons: Vec<(&String, &u64)> = fleet.stop_reasons.iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    html! {
        section.fleet #fleet aria-label="The fleet" {
            div #fleet-states {
                h2 { "Last hour, by state" }
                @if fleet.states.is_empty() { p.muted { "No run was active." } }
                ul { @for (s, n) in &fleet.states {
                    li { a href=(last_hour(|p| p.state = Some(s.clone()))) { (state(s)) } " " (count(*n)) }
                } }
            }
            div #fleet-reasons {
                h2 { "Top stop reasons, last hour" }
                @if reasons.is_empty() { p.muted { "No run was stopped." } }
                ol { @for (reason, n) in reasons.iter().take(5) {
                    li { a href=(last_hour(|p| p.reason = Some((*reason).clone()))) { code { (reason) } } " " (count(**n)) }
                } }
            }
            div #fleet-costliest {
                h2 { "Costing most now (open runs)" }
                @if fleet.costliest.is_empty() { p.muted { "No open run has spent anything." } }
                ol { @for row in &fleet.costliest {
                    li {
                        a href=(run_href(&row.summary.tenant, &row.summary.run)) { (row.summary.tenant) "/" (row.summary.run) }
                        " " (format!("${:.4}", row.cost_usd))
                        @if let Some(agent) = &row.summary.agent { " " span.muted { (agent) } }
                    }
                } }
            }
        }
    }
}

/// The part of the page the SSE stream replaces: the fleet, counts, where this page
/// is, the table, the pager.
pub fn runs_live(params: &RunsParams, view: &RunsPage, unanswered: &[u32]) -> Markup {
    let total: u64 = view.states.values().sum();
    let first = view.ahead + 1;
    let last = view.ahead + view.runs.len() as u64;
    html! {
        @if let Some(fleet) = &view.fleet { (fleet_figures(fleet)) }
        nav.counts aria-label="Runs per state" {
            a href={"/" (params.with_state(None).href())} { "all (" (count(total)) ")" }
            @for (s, n) in &view.states {
                a href={"/" (params.with_state(Some(s)).href())} { (state(s)) " (" (count(*n)) ")" }
            }
        }
        @if !unanswered.is_empty() {
            p.answer.refused role="alert" {
                "Partitions " (format!("{unanswered:?}")) " did not answer in time: their runs are missing."
            }
        }
        p.position #position {
            @if view.runs.is_empty() { "No runs here: " (count(view.matched)) " match." }
            @else { "Runs " (count(first)) "–" (count(last)) " of " (count(view.matched)) ", newest activity first." }
        }
        div.scroll {
            table.rows #runs-table {
                thead { tr {
                    th { "Run" } th { "State" } th { "Tenant" } th { "Agent" } th { "Reason" }
                    th { "Steps" } th { "Refused" } th { "Tokens" } th { "Cost" }
                    th { "Parent" } th { "Started" } th { "Last activity" }
                } }
                tbody {
                    @for row in &view.runs {
                        tr data-run={(row.summary.tenant) "/" (row.summary.run)} {
                            td { a href=(run_href(&row.summary.tenant, &row.summary.run)) { (row.summary.run) } }
                            td { (state(row.state())) }
                            td { (row.summary.tenant) }
                            td { (row.summary.agent.as_deref().unwrap_or("")) }
                            td { (row.summary.reason.as_deref().unwrap_or("")) }
                            td.n { (row.summary.steps) }
                            td.n { (row.calls_refused) }
                            td.n { (row.tokens) }
                            td.n { (format!("{:.4}", row.cost_usd)) }
                            td { @if let Some(parent) = &row.parent { a href=(run_href(&row.summary.tenant, parent)) { (parent) } } }
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
            @if view.ahead > 0 {
                a #newest href={"/" (params.first_page().href())} { "⇤ Newest" }
                @if let Some(top) = view.runs.first() {
                    a #newer rel="prev" href={"/" (RunsParams { before: Some(cursor_text(top)), ..params.first_page() }.href())} { "← Newer" }
                }
            }
            @if let Some(bottom) = view.runs.last().filter(|_| last < view.matched) {
                a #older rel="next" href={"/" (RunsParams { after: Some(cursor_text(bottom)), ..params.first_page() }.href())} { "Older →" }
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

    #[test]
    fn times_are_utc_or_spans_back_from_now() {
        let now = 1_800_000_000_000;
        for (text, want) in [
            ("1h", Some(now - 3_600_000)),
            ("15m", Some(now - 900_000)),
            ("2d", Some(now - 172_800_000)),
            ("2026-12-04 16:55", Some(1_796_403_300_000)),
            ("2026-12-04T16:55:30", Some(1_796_403_330_000)),
            ("2026-12-04", Some(1_796_342_400_000)),
            ("yesterday", None),
            ("h", None),
        ] {
            assert_eq!(parse_when(text, now).ok(), want, "{text}");
        }
    }
}
