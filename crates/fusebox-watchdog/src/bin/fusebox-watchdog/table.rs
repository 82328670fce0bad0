//! Plain-text tables for people.

use std::fmt::Write;

use chrono::{DateTime, Utc};
use fusebox_watchdog::sink::Recorded;
use fusebox_watchdog::{Inventory, PassReport};

pub fn inventory(inv: &Inventory) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<12} {:<20} {:<13} {:<24} {:<20} {:>11} {:<12} PROTECTED",
        "REGION", "INSTANCE", "STATE", "TENANT/RUN", "DEADLINE (UTC)", "LEFT", "REASON"
    );
    for i in &inv.items {
        let owner = format!(
            "{}/{}",
            i.tenant.as_deref().unwrap_or("-"),
            i.run.as_deref().unwrap_or("-")
        );
        let (deadline, reason) = match i.deadline {
            Some(d) => (time(d.at_ms), d.reason.to_string()),
            None => ("-".to_owned(), "-".to_owned()),
        };
        let left = i.time_left_ms.map_or("-".to_owned(), duration);
        let _ = writeln!(
            s,
            "{:<12} {:<20} {:<13} {:<24} {:<20} {:>11} {:<12} {}",
            i.region,
            i.instance_id,
            i.state.as_str(),
            owner,
            deadline,
            left,
            reason,
            if i.protected { "yes" } else { "no" }
        );
        for p in &i.tag_problems {
            let _ = writeln!(s, "  warning: {p}");
        }
    }
    for (region, e) in &inv.region_errors {
        let _ = writeln!(s, "error: {region}: {e}");
    }
    s
}

pub fn sweep(r: &PassReport, rec: &Recorded) -> String {
    let mut s = String::new();
    for t in &rec.terminations {
        let _ = writeln!(
            s,
            "{:<12} {:<20} {:<13} {:<22} {}{}",
            t.region,
            t.instance_id,
            t.reason.to_string(),
            format!("{:?}", t.outcome),
            t.tenant.as_deref().unwrap_or("-"),
            t.error
                .as_deref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        );
    }
    for p in &rec.protected {
        let _ = writeln!(
            s,
            "{:<12} {:<20} protected (fusebox:protect), overdue since {}",
            p.region,
            p.instance_id,
            time(p.deadline_ms)
        );
    }
    if let Some(a) = &r.alert {
        let _ = writeln!(s, "ALERT: {}", a.why);
    }
    for (region, e) in &r.region_errors {
        let _ = writeln!(s, "error: {region}: {e}");
    }
    let _ = writeln!(
        s,
        "swept {} managed instances ({} live): {} overdue, {} reported, {} protected, {} held back, {} ms",
        r.listed,
        r.managed,
        r.overdue,
        r.terminations.len(),
        r.protected,
        r.held,
        r.finished_ms.saturating_sub(r.started_ms)
    );
    s
}

fn time(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(DateTime::<Utc>::from_timestamp_millis)
        .map_or_else(
            || ms.to_string(),
            |t| t.format("%Y-%m-%d %H:%M:%S").to_string(),
        )
}

/// `-1h02m`, `3m05s`, `42s`.
fn duration(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "" };
    let secs = ms.unsigned_abs() / 1000;
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    if h > 0 {
        format!("{sign}{h}h{m:02}m")
    } else if m > 0 {
        format!("{sign}{m}m{s:02}s")
    } else {
        format!("{sign}{s}s")
    }
}
