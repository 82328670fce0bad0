//! The report as the operator reads it: one section per kind of change, completed runs
//! the candidate would stop first, then totals. Rows marked `~` are approximate (the run
//! had diverged before that point); the JSON form has every row in full.

use std::fmt::Write as _;

use crate::whatif::compare::Tail;
use crate::whatif::report::{ChangeKind, Outcome, Report, RunChange, Totals};

/// Renders the report; `limit` rows per section (0: all).
pub fn render(report: &Report, limit: usize) -> String {
    let mut out = String::new();
    let t = &report.totals;
    let _ = writeln!(
        out,
        "fusebox whatif: {} runs, {} events from {}",
        t.runs, report.events, report.source
    );
    let _ = writeln!(out, "  baseline:  {}", report.baseline);
    let _ = writeln!(out, "  candidate: {}", report.candidate);
    let recorded = &report.recorded_decisions;
    if recorded.checked > 0 {
        match &recorded.first {
            None => {
                let _ = writeln!(
                    out,
                    "  recorded decisions: all {} reproduced by this build's replay of the baseline",
                    recorded.checked
                );
            }
            Some((run, event, was, now)) => {
                let _ = writeln!(
                    out,
                    "  WARNING: {} of {} recorded decisions differ from this build's replay of the \
                     baseline (first: {run} event {event}, recorded {was}, replayed {now}): the log \
                     was written by another engine version or under other policies; both sides \
                     here are this build's replay",
                    recorded.differing, recorded.checked
                );
            }
        }
    }
    let mut any = false;
    for kind in ChangeKind::ALL {
        let rows: Vec<&RunChange> = report.changes.iter().filter(|c| c.kind == kind).collect();
        if rows.is_empty() {
            continue;
        }
        any = true;
        let _ = writeln!(out, "\n{} ({})", kind.heading(), rows.len());
        section(&mut out, kind, &rows, limit);
    }
    if !any {
        let _ = writeln!(
            out,
            "\nNo run changes: the candidate decides every recorded run as the baseline does."
        );
    }
    totals(&mut out, report);
    if report.changes.iter().any(|c| !c.exact) {
        let _ = writeln!(
            out,
            "\n~ approximate: the run had already diverged (a call one policy runs and the other \
             refuses or answers) before this point, so the recording after the divergence is not \
             what would have happened. `--json` gives each row's divergence point."
        );
    }
    out
}

fn section(out: &mut String, kind: ChangeKind, rows: &[&RunChange], limit: usize) {
    let shown = if limit == 0 {
        rows.len()
    } else {
        limit.min(rows.len())
    };
    let header: [&str; 5] = match kind {
        ChangeKind::CompletedRunStopped | ChangeKind::NewlyStopped => [
            "RUN",
            "AGENT",
            "STOP AT",
            "REASON",
            "WOULD CUT (recorded after the stop)",
        ],
        ChangeKind::StopsEarlier => [
            "RUN",
            "AGENT",
            "STOP AT",
            "REASON",
            "WOULD CUT, WAS STOPPED AT",
        ],
        ChangeKind::NoLongerStopped => [
            "RUN",
            "AGENT",
            "WAS STOPPED AT",
            "REASON",
            "RECORDED AFTER THE STOP (then unknown)",
        ],
        ChangeKind::StopsLater => ["RUN", "AGENT", "STOP AT", "REASON", "WAS"],
        ChangeKind::ReasonChanged => ["RUN", "AGENT", "STOP AT", "REASON", "WAS"],
        ChangeKind::WarningsOrBlocks => ["RUN", "AGENT", "WARNINGS", "BLOCKS", ""],
    };
    let mut lines: Vec<[String; 5]> = vec![header.map(str::to_owned)];
    for row in &rows[..shown] {
        let mark = if row.exact { "" } else { "~" };
        let run = format!("{}/{}", row.tenant, row.run);
        let agent = row.agent.clone().unwrap_or_else(|| "-".to_owned());
        let (b, c) = (&row.baseline, &row.candidate);
        let cells = match kind {
            ChangeKind::CompletedRunStopped | ChangeKind::NewlyStopped => [
                run,
                agent,
                format!("{mark}{}", at(c)),
                c.reason.unwrap_or("-").to_owned(),
                row.would_cut.as_ref().map(cut).unwrap_or_default(),
            ],
            ChangeKind::StopsEarlier => [
                run,
                agent,
                format!("{mark}{}", at(c)),
                c.reason.unwrap_or("-").to_owned(),
                format!(
                    "{}, was {} ({})",
                    row.would_cut.as_ref().map(cut).unwrap_or_default(),
                    at(b),
                    b.reason.unwrap_or("-")
                ),
            ],
            // The baseline's stop is recorded fact; what is uncertain is the candidate's
            // path to it, so the divergence goes in the last column instead of a mark.
            ChangeKind::NoLongerStopped => [
                run,
                agent,
                at(b),
                b.reason.unwrap_or("-").to_owned(),
                format!(
                    "{} events, {} calls attempted{}",
                    row.recorded_after_original_stop.map_or(0, |t| t.events),
                    row.recorded_after_original_stop
                        .map_or(0, |t| t.calls_attempted),
                    row.diverged_at
                        .as_ref()
                        .map(|d| format!(
                            "; diverged earlier, at call {} ({} -> {})",
                            d.at_call, d.baseline, d.candidate
                        ))
                        .filter(|_| !row.exact)
                        .unwrap_or_default()
                ),
            ],
            ChangeKind::StopsLater | ChangeKind::ReasonChanged => [
                run,
                agent,
                format!("{mark}{}", at(c)),
                c.reason.unwrap_or("-").to_owned(),
                format!("{} ({})", at(b), b.reason.unwrap_or("-")),
            ],
            ChangeKind::WarningsOrBlocks => [
                run,
                agent,
                format!("{mark}{} -> {}", b.warnings, c.warnings),
                format!("{} -> {}", b.blocks, c.blocks),
                String::new(),
            ],
        };
        lines.push(cells);
    }
    write_columns(out, &lines);
    if shown < rows.len() {
        let _ = writeln!(
            out,
            "  ... and {} more (--limit 0 shows all; --json lists every row)",
            rows.len() - shown
        );
    }
}

fn at(outcome: &Outcome) -> String {
    match (outcome.at_call, outcome.at_event) {
        (Some(call), Some(event)) => format!("call {call} (event {event})"),
        _ => "-".to_owned(),
    }
}

/// What a cut saves, in one cell.
fn cut(tail: &Tail) -> String {
    format!(
        "{} calls, {} turns, {} tokens, ${:.2}, {}",
        tail.tool_calls,
        tail.model_turns,
        tail.tokens,
        tail.cost_usd,
        duration(tail.event_ms)
    )
}

pub fn duration(ms: u64) -> String {
    let s = ms / 1000;
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}.{}s", s, (ms % 1000) / 100)
    }
}

fn write_columns(out: &mut String, lines: &[[String; 5]]) {
    let mut widths = [0usize; 5];
    for line in lines {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for line in lines {
        let mut text = String::from(" ");
        for (i, cell) in line.iter().enumerate() {
            let _ = write!(text, " {cell:<width$}", width = widths[i]);
        }
        let _ = writeln!(out, "{}", text.trim_end());
    }
}

fn totals(out: &mut String, report: &Report) {
    let _ = writeln!(out, "\nBY AGENT");
    let mut lines: Vec<Vec<String>> = vec![[
        "AGENT",
        "RUNS",
        "COMPLETED STOPPED",
        "NEWLY STOPPED",
        "NO LONGER",
        "EARLIER",
        "LATER",
        "CALLS CUT",
        "TOKENS CUT",
        "COST CUT",
    ]
    .map(str::to_owned)
    .to_vec()];
    let row = |name: &str, t: &Totals| {
        vec![
            name.to_owned(),
            t.runs.to_string(),
            t.completed_runs_stopped.to_string(),
            t.newly_stopped.to_string(),
            t.no_longer_stopped.to_string(),
            t.stops_earlier.to_string(),
            t.stops_later.to_string(),
            t.would_cut.tool_calls.to_string(),
            t.would_cut.tokens.to_string(),
            format!("${:.2}", t.would_cut.cost_usd),
        ]
    };
    for (agent, t) in &report.by_agent {
        lines.push(row(agent, t));
    }
    lines.push(row("all", &report.totals));
    write_rows(out, &lines);
    let _ = writeln!(out, "\nBY REASON (runs stopped)");
    let mut lines: Vec<Vec<String>> = vec![["REASON", "BASELINE", "CANDIDATE"]
        .map(str::to_owned)
        .to_vec()];
    for (reason, t) in &report.by_reason {
        lines.push(vec![
            (*reason).to_owned(),
            t.baseline_stops.to_string(),
            t.candidate_stops.to_string(),
        ]);
    }
    write_rows(out, &lines);
}

fn write_rows(out: &mut String, lines: &[Vec<String>]) {
    let columns = lines.first().map_or(0, Vec::len);
    let mut widths = vec![0usize; columns];
    for line in lines {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for line in lines {
        let mut text = String::from(" ");
        for (i, cell) in line.iter().enumerate() {
            if i == 0 {
                let _ = write!(text, " {cell:<width$}", width = widths[i]);
            } else {
                let _ = write!(text, "  {cell:>width$}", width = widths[i]);
            }
        }
        let _ = writeln!(out, "{}", text.trim_end());
    }
}
