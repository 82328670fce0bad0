//! `fusebox run TENANT/RUN` for a person: the run's counters and stop report, then its
//! tree of runs (guard contract §6) — the root, each run under its parent, with its state,
//! reason, steps and what its subtree spent, and for a run its ancestor's stop closed,
//! whose stop that was. `--json` prints the daemon's status answer instead.

use std::fmt::Write as _;

use fusebox_client::{RunStatusReply, TreeView};

/// The run, and its tree when it is in one (`tree` is `None` for a run on its own).
pub fn render(tenant: &str, run: &str, status: &RunStatusReply, tree: Option<&TreeView>) -> String {
    let mut out = String::new();
    let s = &status.summary;
    let c = &status.counters;
    let state = s.terminal_state.as_deref().unwrap_or("OPEN");
    let reason = s
        .reason
        .as_deref()
        .map_or(String::new(), |r| format!(" ({r})"));
    let _ = writeln!(out, "{tenant}/{run}: {state}{reason}");
    let _ = writeln!(
        out,
        "  agent {}, events {}, steps {}, refused {}, answered from the ledger {}, model turns {}, tokens {}, cost ${:.4}, tool errors {}",
        s.agent.as_deref().unwrap_or("-"),
        c.events,
        c.steps,
        c.calls_refused,
        c.calls_answered,
        c.model_turns,
        c.tokens,
        c.cost_usd,
        c.tool_errors
    );
    if let Some(version) = status.progress_version {
        let _ = writeln!(out, "  progress version {version}");
    }
    let held = &status.reserved;
    if held.model_turns > 0 {
        let _ = writeln!(
            out,
            "  held by model calls in flight (its own and below): {} call{}, {} tokens, ${:.4}",
            held.model_turns,
            if held.model_turns == 1 { "" } else { "s" },
            held.tokens,
            held.cost_usd
        );
    }
    if let Some(report) = &status.report {
        let _ = writeln!(
            out,
            "  stop report: {} {}, resume condition {}",
            report.terminal_state.as_str(),
            report.reason.as_str(),
            wire_name(report.resume_condition)
        );
        if let Some(detail) = &report.detail {
            let _ = writeln!(out, "    detail: {detail}");
        }
        for (what, items) in [
            ("fired guards", &report.fired_guards),
            ("completed operations", &report.completed_operations),
        ] {
            if !items.is_empty() {
                let _ = writeln!(out, "    {what}: {}", items.join(", "));
            }
        }
        if let Some(checkpoint) = &report.last_safe_checkpoint {
            let _ = writeln!(out, "    last safe checkpoint: {checkpoint}");
        }
        if let Some(precondition) = &report.unmet_precondition {
            let _ = writeln!(out, "    unmet precondition: {precondition}");
        }
    }
    for d in &status.last_decisions {
        let _ = writeln!(
            out,
            "  decision: {} {} {}",
            d.action.as_str(),
            d.reason.map_or("", |r| r.as_str()),
            d.message.as_deref().unwrap_or("")
        );
    }
    if let (Some(place), Some(tree)) = (&status.tree, tree) {
        let b = &place.below;
        let _ = writeln!(
            out,
            "  in the tree of {tenant}/{}: depth {}, {} runs started below it, {} open; the runs below spent {} steps, {} model turns, {} tokens, ${:.4}",
            place.root, place.depth, place.spawned, place.open_below, b.steps, b.model_turns, b.tokens, b.cost_usd
        );
        out.push_str(&tree_table(run, tree));
    }
    out
}

/// A unit variant's name on the wire (`human_approval`).
fn wire_name(value: impl serde::Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        other => format!("{other:?}"),
    }
}

/// The tree, one run a line, each under its parent; `this` is marked.
fn tree_table(this: &str, tree: &TreeView) -> String {
    let mut out = String::new();
    let names: Vec<String> = tree
        .nodes
        .iter()
        .map(|n| format!("{}{}", "  ".repeat(n.row.depth as usize), n.row.summary.run))
        .collect();
    let width = names.iter().map(String::len).max().unwrap_or(0).max(4);
    let _ = writeln!(
        out,
        "\n{:<width$}  {:<18}  {:<34}  {:>6}  {:>10}  {:>10}",
        "TREE", "STATE", "REASON", "STEPS", "TREE STEPS", "TREE COST"
    );
    for (node, name) in tree.nodes.iter().zip(&names) {
        let row = &node.row;
        let reason = match (&row.summary.reason, &row.stopped_by) {
            (Some(reason), Some(by)) => format!("{reason} (from {by})"),
            (Some(reason), None) => reason.clone(),
            (None, _) => String::new(),
        };
        let mut notes = Vec::new();
        if row.summary.run == this {
            notes.push("<- this run".to_owned());
        }
        if node.detached {
            notes.push(format!(
                "(under {}, not listed)",
                row.parent.as_deref().unwrap_or("?")
            ));
        }
        let line = format!(
            "{name:<width$}  {:<18}  {reason:<34}  {:>6}  {:>10}  {:>10}  {}",
            row.state(),
            row.summary.steps,
            node.tree_steps,
            format!("${:.4}", node.tree_cost_usd),
            notes.join(" ")
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    if tree.unlisted > 0 {
        let _ = writeln!(
            out,
            "... and {} more runs of this tree, not listed (the most recently active are)",
            tree.unlisted
        );
    }
    if !tree.unanswered.is_empty() {
        let _ = writeln!(
            out,
            "warning: partitions {:?} did not answer; their runs are missing",
            tree.unanswered
        );
    }
    out
}

/// What `fusebox cancel` adds to the cancel's decision: the runs below that were open
/// and are stopped with it.
pub fn cancelled_below(tenant: &str, run: &str, open_below: Option<u32>) -> Option<String> {
    match open_below? {
        0 => None,
        n => Some(format!(
            "{n} run{} below {tenant}/{run} {} open: each is stopped with it, with a stop of its own (ancestor_stopped) on its own kill switch; `fusebox run {tenant}/{run}` shows the tree",
            if n == 1 { "" } else { "s" },
            if n == 1 { "was" } else { "were" },
        )),
    }
}
