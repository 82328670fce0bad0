//! The proposal as a `fusebox.toml` fragment: `[policy]` and `[agents.<name>.policy]`
//! with the keys that change, each with a comment saying what it rests on; keys that stay
//! are listed as comments with the reason.

use std::fmt::Write as _;

use crate::tune::search::{Calibration, Proposal};

pub struct Header<'a> {
    pub source: &'a str,
    pub baseline: &'a str,
    pub runaways: usize,
    pub k: usize,
    pub min_runs: usize,
}

pub fn render(calibration: &Calibration, header: &Header<'_>) -> String {
    let mut out = String::new();
    let n = calibration.completed;
    let _ = writeln!(out, "# fusebox tune: calibrated on {}", header.source);
    let _ = writeln!(out, "# starting from: {}", header.baseline);
    let _ = writeln!(
        out,
        "# {n} completed runs, {} runaways. Each key is the strictest value that stops or refuses a",
        header.runaways
    );
    let _ = writeln!(
        out,
        "# call of at most k = {} of the completed runs, checked by replaying every recorded run.",
        header.k
    );
    let _ = writeln!(
        out,
        "# A new run like them is interfered with, per key, with probability <= (k+1)/(n+1) = {:.3}",
        (header.k + 1) as f64 / (n + 1) as f64
    );
    let _ = writeln!(
        out,
        "# (conformal calibration: holds when new runs are exchangeable with the recorded ones)."
    );
    let _ = writeln!(out, "\n[policy]");
    section(&mut out, &calibration.base_proposals, n);
    for (agent, count) in &calibration.completed_by_agent {
        let Some(list) = calibration.agent_proposals.get(agent) else {
            if agent != "-" {
                let _ = writeln!(
                    out,
                    "\n# agent {agent}: {count} completed run(s), fewer than --min-runs {}: uses [policy]",
                    header.min_runs
                );
            }
            continue;
        };
        let _ = writeln!(out, "\n[agents.{}.policy]", toml_key(agent));
        let _ = writeln!(out, "# calibrated on this agent's {count} completed runs");
        // Only what differs from the calibrated [policy] belongs here; `was` is the
        // agent's value before (its own override, or the calibrated [policy]).
        let own: Vec<Proposal> = list
            .iter()
            .filter(|p| {
                calibration
                    .base_proposals
                    .iter()
                    .find(|b| b.key == p.key)
                    .is_none_or(|b| b.proposed != p.proposed)
            })
            .cloned()
            .collect();
        if own.is_empty() {
            let _ = writeln!(out, "# nothing stricter than [policy] holds for this agent");
        }
        section(&mut out, &own, *count);
    }
    out
}

fn section(out: &mut String, proposals: &[Proposal], runs: usize) {
    for p in proposals {
        let key = &p.key;
        if !p.evidence {
            let _ = writeln!(
                out,
                "# {} = {} stays: no recorded completed run comes near it (even its floor stops none), so nothing supports a value",
                key.path,
                key.toml(p.was)
            );
            continue;
        }
        let stricter = match &p.one_stricter {
            Some((0, _)) => "one stricter still passed (a non-monotone key)".to_owned(),
            Some((count, first)) => format!(
                "{} would stop or refuse {count} of them (first {first})",
                key.toml(p.proposed - 1)
            ),
            None => "the lowest the policy's rules allow".to_owned(),
        };
        if p.proposed < p.was {
            let sooner = if p.runaways_sooner > 0 {
                format!(
                    "; alone it stops {} recorded runaway(s) sooner, {} call(s) earlier in all",
                    p.runaways_sooner, p.calls_sooner
                )
            } else {
                "; stops no recorded runaway sooner".to_owned()
            };
            let _ = writeln!(
                out,
                "# was {}; {runs} completed runs pass; margin: {stricter}{sooner}",
                key.toml(p.was)
            );
            let _ = writeln!(out, "{} = {}", key.path, key.toml(p.proposed));
        } else {
            let _ = writeln!(
                out,
                "# {} = {} stays: {stricter}",
                key.path,
                key.toml(p.was)
            );
        }
    }
}

/// An agent name as a TOML key: bare when it can be, quoted otherwise.
fn toml_key(name: &str) -> String {
    if !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        name.to_owned()
    } else {
        format!("{name:?}")
    }
}
