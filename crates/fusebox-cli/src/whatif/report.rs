//! From traces to the report: what changed in each run, in a fixed order (completed runs
//! the candidate would stop first: they are the cost of the change), totals per agent
//! and per reason, and which figures are exact.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::whatif::compare::{Close, Disagreements, RunTrace, Side, Tail};

/// What changed for one run, in report order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Ended normally in the recording; the candidate stops it.
    CompletedRunStopped,
    /// Not stopped in the recording (open at its end, or ended otherwise); stopped now.
    NewlyStopped,
    /// Stopped in the recording; the candidate lets it go on.
    NoLongerStopped,
    StopsEarlier,
    StopsLater,
    /// Stopped at the same event, for another reason.
    ReasonChanged,
    /// Same outcome; warnings or blocks appear or vanish.
    WarningsOrBlocks,
}

impl ChangeKind {
    pub const ALL: [ChangeKind; 7] = [
        ChangeKind::CompletedRunStopped,
        ChangeKind::NewlyStopped,
        ChangeKind::NoLongerStopped,
        ChangeKind::StopsEarlier,
        ChangeKind::StopsLater,
        ChangeKind::ReasonChanged,
        ChangeKind::WarningsOrBlocks,
    ];

    pub fn heading(self) -> &'static str {
        match self {
            ChangeKind::CompletedRunStopped => {
                "COMPLETED RUNS THE CANDIDATE WOULD STOP (the cost of this change)"
            }
            ChangeKind::NewlyStopped => "NEWLY STOPPED",
            ChangeKind::NoLongerStopped => {
                "NO LONGER STOPPED (what these runs would have done after the original stop is unknown)"
            }
            ChangeKind::StopsEarlier => "STOPS EARLIER",
            ChangeKind::StopsLater => {
                "STOPS LATER (approximate: the recording after the original stop is the agent reacting to it)"
            }
            ChangeKind::ReasonChanged => "SAME STOP, ANOTHER REASON",
            ChangeKind::WarningsOrBlocks => "WARNINGS AND BLOCKS THAT APPEAR OR VANISH (outcome unchanged)",
        }
    }
}

/// A side's outcome of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// OPEN at the end of the recording, or the terminal state of the first close.
    pub state: &'static str,
    pub reason: Option<&'static str>,
    pub at_call: Option<u64>,
    pub at_event: Option<u64>,
    pub event_id: Option<String>,
    pub warnings: u64,
    pub blocks: u64,
}

impl Outcome {
    fn of(side: &Side) -> Self {
        let close = side.close.as_ref();
        Outcome {
            state: close.map_or("OPEN", |c| c.terminal.as_str()),
            reason: close.map(|c| c.reason.as_str()),
            at_call: close.map(|c| c.at.call),
            at_event: close.map(|c| c.at.event),
            event_id: close.map(|c| c.at.event_id.clone()),
            warnings: side.warnings,
            blocks: side.blocks,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DivergenceView {
    pub at_call: u64,
    pub at_event: u64,
    pub event_id: String,
    pub baseline: &'static str,
    pub candidate: &'static str,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunChange {
    pub kind: ChangeKind,
    pub tenant: String,
    pub run: String,
    pub agent: Option<String>,
    pub baseline: Outcome,
    pub candidate: Outcome,
    /// For a stop the candidate adds or moves earlier: the recorded work from its stop
    /// point on, which would not have happened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub would_cut: Option<Tail>,
    /// For a stop the candidate removes or moves later: what the recording holds after
    /// the original stop (the agent reacting to being stopped, not the work it would
    /// have gone on with).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_after_original_stop: Option<Tail>,
    /// Whether the candidate's side of this row follows from the recording exactly.
    pub exact: bool,
    /// The first event the two policies answered differently for the agent.
    pub diverged_at: Option<DivergenceView>,
    pub note: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Totals {
    pub runs: u64,
    pub completed_runs_stopped: u64,
    pub newly_stopped: u64,
    pub no_longer_stopped: u64,
    pub stops_earlier: u64,
    pub stops_later: u64,
    pub reason_changed: u64,
    pub warnings_or_blocks: u64,
    /// Sum of `would_cut` over the stops added or moved earlier.
    pub would_cut: Tail,
}

impl Totals {
    fn count(&mut self, kind: Option<ChangeKind>, cut: Option<&Tail>) {
        self.runs += 1;
        let Some(kind) = kind else { return };
        *match kind {
            ChangeKind::CompletedRunStopped => &mut self.completed_runs_stopped,
            ChangeKind::NewlyStopped => &mut self.newly_stopped,
            ChangeKind::NoLongerStopped => &mut self.no_longer_stopped,
            ChangeKind::StopsEarlier => &mut self.stops_earlier,
            ChangeKind::StopsLater => &mut self.stops_later,
            ChangeKind::ReasonChanged => &mut self.reason_changed,
            ChangeKind::WarningsOrBlocks => &mut self.warnings_or_blocks,
        } += 1;
        if let Some(cut) = cut {
            let sum = &mut self.would_cut;
            sum.events += cut.events;
            sum.tool_calls += cut.tool_calls;
            sum.calls_attempted += cut.calls_attempted;
            sum.model_turns += cut.model_turns;
            sum.tokens += cut.tokens;
            sum.cost_usd = round_usd(sum.cost_usd + cut.cost_usd);
            sum.event_ms += cut.event_ms;
        }
    }
}

/// Stops per reason, each side counted over every run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ReasonTotals {
    pub baseline_stops: u64,
    pub candidate_stops: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub source: String,
    pub baseline: String,
    pub candidate: String,
    pub events: u64,
    pub totals: Totals,
    pub by_agent: BTreeMap<String, Totals>,
    pub by_reason: BTreeMap<&'static str, ReasonTotals>,
    /// For a data directory: the recorded decisions checked against this build's
    /// replay of the baseline.
    pub recorded_decisions: Disagreements,
    /// Runs that changed, in [`ChangeKind`] order, then by tenant and run.
    pub changes: Vec<RunChange>,
}

impl Report {
    pub fn count(&self, kind: ChangeKind) -> usize {
        self.changes.iter().filter(|c| c.kind == kind).count()
    }
}

fn round_usd(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// What changed in one run, if anything.
pub fn classify(trace: &RunTrace) -> Option<ChangeKind> {
    let (b, c) = (&trace.baseline, &trace.candidate);
    let kind = match (b.stop(), c.stop()) {
        (None, Some(_)) if b.close.is_some() => ChangeKind::CompletedRunStopped,
        (None, Some(_)) => ChangeKind::NewlyStopped,
        (Some(_), None) => ChangeKind::NoLongerStopped,
        (Some(b), Some(c)) if c.at.event < b.at.event => ChangeKind::StopsEarlier,
        (Some(b), Some(c)) if c.at.event > b.at.event => ChangeKind::StopsLater,
        (Some(b), Some(c)) if (b.terminal, b.reason) != (c.terminal, c.reason) => {
            ChangeKind::ReasonChanged
        }
        _ if (b.warnings, b.blocks) != (c.warnings, c.blocks) => ChangeKind::WarningsOrBlocks,
        _ => return None,
    };
    Some(kind)
}

fn describe_stop(close: &Close) -> String {
    format!(
        "call {} (event {}, {})",
        close.at.call, close.at.event, close.at.event_type
    )
}

fn change(kind: ChangeKind, tenant: &str, run: &str, trace: &RunTrace) -> RunChange {
    let (b, c) = (&trace.baseline, &trace.candidate);
    let divergence = trace.divergence.as_ref();
    let diverged = |what: &str| {
        match divergence {
        Some(d) => format!(
            "{what}: the run diverged at call {} (event {}): {} under the baseline, {} under the candidate; the recording after that is not what would have happened",
            d.at.call,
            d.at.event,
            d.baseline.as_str(),
            d.candidate.as_str()
        ),
        None => what.to_owned(),
    }
    };
    let (exact, would_cut, after, note) = match kind {
        ChangeKind::CompletedRunStopped
        | ChangeKind::NewlyStopped
        | ChangeKind::StopsEarlier
        | ChangeKind::ReasonChanged => {
            let stop = c.stop().expect("the candidate stops these");
            let exact = trace.exact_through(stop.at.event);
            let what = format!(
                "stopped at {} for {}",
                describe_stop(stop),
                stop.reason.as_str()
            );
            let note = if exact {
                format!("{what}; exact: the recording up to that call is what would have happened")
            } else {
                diverged(&format!("{what} (approximate)"))
            };
            let cut = (kind != ChangeKind::ReasonChanged).then_some(trace.after_candidate_stop);
            (exact, cut, None, note)
        }
        ChangeKind::NoLongerStopped => {
            let stop = b.stop().expect("the baseline stops these");
            let exact = trace.exact_through(stop.at.event);
            let after = trace.after_baseline_stop;
            let note = format!(
                "no longer stopped at {} ({}); the recording holds {} event(s) after that stop, the agent's reaction to being stopped: what the run would have done instead is unknown",
                describe_stop(stop),
                stop.reason.as_str(),
                after.events
            );
            (exact, None, Some(after), note)
        }
        ChangeKind::StopsLater => {
            let (bs, cs) = (b.stop().expect("stopped"), c.stop().expect("stopped"));
            let note = format!(
                "stopped at {} ({}) instead of {} ({}); approximate: after the original stop the recording is the agent reacting to it, and what it would have done instead is unknown",
                describe_stop(cs),
                cs.reason.as_str(),
                describe_stop(bs),
                bs.reason.as_str()
            );
            (false, None, Some(trace.after_baseline_stop), note)
        }
        ChangeKind::WarningsOrBlocks => {
            let exact = divergence.is_none();
            let what = format!(
                "warnings {} -> {}, blocks {} -> {}",
                b.warnings, c.warnings, b.blocks, c.blocks
            );
            let note = if exact {
                what
            } else {
                diverged(&format!("{what} (approximate)"))
            };
            (exact, None, None, note)
        }
    };
    RunChange {
        kind,
        tenant: tenant.to_owned(),
        run: run.to_owned(),
        agent: trace.agent.clone(),
        baseline: Outcome::of(b),
        candidate: Outcome::of(c),
        would_cut: would_cut.map(|mut t| {
            t.cost_usd = round_usd(t.cost_usd);
            t
        }),
        recorded_after_original_stop: after.map(|mut t| {
            t.cost_usd = round_usd(t.cost_usd);
            t
        }),
        exact,
        diverged_at: divergence.map(|d| DivergenceView {
            at_call: d.at.call,
            at_event: d.at.event,
            event_id: d.at.event_id.clone(),
            baseline: d.baseline.as_str(),
            candidate: d.candidate.as_str(),
        }),
        note,
    }
}

/// Builds the report from every run's trace.
pub fn build(
    traces: &BTreeMap<(String, String), RunTrace>,
    source: String,
    baseline: String,
    candidate: String,
    events: u64,
) -> Report {
    let mut totals = Totals::default();
    let mut by_agent: BTreeMap<String, Totals> = BTreeMap::new();
    let mut by_reason: BTreeMap<&'static str, ReasonTotals> = BTreeMap::new();
    let mut changes = Vec::new();
    for ((tenant, run), trace) in traces {
        let kind = classify(trace);
        let row = kind.map(|kind| change(kind, tenant, run, trace));
        let cut = row.as_ref().and_then(|r| r.would_cut.as_ref());
        totals.count(kind, cut);
        let agent = trace.agent.clone().unwrap_or_else(|| "-".to_owned());
        by_agent.entry(agent).or_default().count(kind, cut);
        if let Some(stop) = trace.baseline.stop() {
            by_reason
                .entry(stop.reason.as_str())
                .or_default()
                .baseline_stops += 1;
        }
        if let Some(stop) = trace.candidate.stop() {
            by_reason
                .entry(stop.reason.as_str())
                .or_default()
                .candidate_stops += 1;
        }
        changes.extend(row);
    }
    // Stable: equal kinds keep the tenant/run order of the map.
    changes.sort_by_key(|c| c.kind);
    Report {
        source,
        baseline,
        candidate,
        events,
        totals,
        by_agent,
        by_reason,
        recorded_decisions: Disagreements::default(),
        changes,
    }
}
