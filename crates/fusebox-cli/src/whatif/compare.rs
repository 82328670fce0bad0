//! The counterfactual itself: every recorded event goes to two engines, one under the
//! baseline policy (what happened, or what the current policy would do) and one under
//! the candidate, and each run keeps a trace of where the two part.
//!
//! Both engines see the *recorded* events. That is exact up to the first event of a run
//! where the two decide differently in a way the agent would notice (a call one lets
//! run and the other refuses, answers from the ledger, or ends the run): from there on
//! the recording shows what the agent did under the baseline's decision, not what it
//! would have done under the candidate's. Each trace keeps that point (`divergence`) so
//! the report can say which of its figures are exact. A warning alone is not counted
//! as a divergence: the call runs either way, though the agent does read the message.

use std::collections::{BTreeMap, HashMap};

use fusebox_core::{Action, Decision, Engine, Event, EventBody, PolicySet, Reason, TerminalState};
use fusebox_log::LogOp;
use serde::Serialize;

use crate::whatif::source::Item;

/// What a decision meant to the agent, reduced to what the comparison needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compact {
    pub action: Action,
    /// The run closed at or before this decision: its terminal state and reason.
    pub closed: Option<(TerminalState, Reason)>,
}

impl Compact {
    pub fn of(decision: &Decision) -> Self {
        Compact {
            action: decision.action,
            closed: decision
                .report
                .as_deref()
                .map(|r| (r.terminal_state, r.reason)),
        }
    }

    /// The agent-visible class of the action: two decisions of one class lead the agent
    /// to the same next step.
    fn class(self) -> u8 {
        match self.action {
            Action::Execute | Action::Warn => 0,
            Action::UseCompletedResult => 1,
            Action::Block => 2,
            Action::Stop => 3,
            Action::Continue => 4,
            Action::Complete => 5,
            Action::RetryAfter => 6,
            Action::WaitForChangedPrecondition => 7,
            Action::PollBounded => 8,
        }
    }

    fn same_for_the_agent(self, other: Compact) -> bool {
        self.class() == other.class() && self.closed == other.closed
    }
}

/// Where in a run something happened.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// 1-based index of the event among the run's events.
    pub event: u64,
    /// Tool calls of the run up to and including this event.
    pub call: u64,
    pub event_id: String,
    pub event_type: &'static str,
    pub ts_ms: u64,
}

/// The first time a side closed the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Close {
    pub at: Point,
    pub terminal: TerminalState,
    pub reason: Reason,
}

impl Close {
    /// A close the guard caused (or a cancel): anything but the run's own end.
    pub fn is_stop(&self) -> bool {
        self.terminal != TerminalState::Completed
    }
}

/// One engine's view of one run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Side {
    pub close: Option<Close>,
    /// Decisions while the run was open.
    pub warnings: u64,
    pub blocks: u64,
    pub answered: u64,
}

impl Side {
    fn observe(&mut self, at: impl FnOnce() -> Point, decided: Compact) {
        if self.close.is_some() {
            return;
        }
        match decided.action {
            Action::Warn => self.warnings += 1,
            Action::Block => self.blocks += 1,
            Action::UseCompletedResult => self.answered += 1,
            _ => {}
        }
        if let Some((terminal, reason)) = decided.closed {
            self.close = Some(Close {
                at: at(),
                terminal,
                reason,
            });
        }
    }

    pub fn stop(&self) -> Option<&Close> {
        self.close.as_ref().filter(|c| c.is_stop())
    }
}

/// What the recording holds from a point on: what a stop there would have cut.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Tail {
    pub events: u64,
    /// Calls the baseline let run.
    pub tool_calls: u64,
    /// Calls the agent asked for, run or refused.
    pub calls_attempted: u64,
    pub model_turns: u64,
    pub tokens: u64,
    pub cost_usd: f64,
    /// Event time from the point to the run's last recorded event.
    pub event_ms: u64,
}

impl Tail {
    fn add(&mut self, event: &Event, baseline: Compact, from_ts: u64) {
        self.events += 1;
        match &event.body {
            EventBody::ToolCall(_) => {
                self.calls_attempted += 1;
                if baseline.action.lets_tool_run() {
                    self.tool_calls += 1;
                }
            }
            EventBody::ModelTurn(turn) => {
                self.model_turns += 1;
                self.tokens += turn.usage.map_or(0, |u| u.total());
                self.cost_usd += turn.cost_usd.unwrap_or(0.0);
            }
            _ => {}
        }
        self.event_ms = self.event_ms.max(event.ts_ms.saturating_sub(from_ts));
    }
}

/// Everything the report needs about one run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunTrace {
    pub agent: Option<String>,
    pub events: u64,
    pub tool_calls: u64,
    pub baseline: Side,
    pub candidate: Side,
    /// The first event the two sides answered differently for the agent.
    pub divergence: Option<Divergence>,
    /// Recorded after the candidate's stop (the stopping call included).
    pub after_candidate_stop: Tail,
    /// Recorded after the baseline's stop: the agent's reaction to being stopped.
    pub after_baseline_stop: Tail,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Divergence {
    pub at: Point,
    pub baseline: Action,
    pub candidate: Action,
}

impl RunTrace {
    pub fn observe(&mut self, event: &Event, baseline: Compact, candidate: Compact) {
        self.events += 1;
        let is_call = matches!(event.body, EventBody::ToolCall(_));
        if is_call {
            self.tool_calls += 1;
        }
        if let EventBody::RunStarted(started) = &event.body {
            if started.agent.is_some() {
                self.agent = started.agent.clone();
            }
        }
        let (index, calls) = (self.events, self.tool_calls);
        let point = || Point {
            event: index,
            call: calls,
            event_id: event.id.clone(),
            event_type: event.type_name(),
            ts_ms: event.ts_ms,
        };
        // Tails first: a stop on a tool call cuts that call too, so the tail starts at
        // the stopping event when it is a call, after it otherwise.
        for (side, tail) in [
            (&self.candidate, &mut self.after_candidate_stop),
            (&self.baseline, &mut self.after_baseline_stop),
        ] {
            if let Some(stop) = side.stop() {
                tail.add(event, baseline, stop.at.ts_ms);
            }
        }
        self.baseline.observe(point, baseline);
        self.candidate.observe(point, candidate);
        for (side, tail) in [
            (&self.candidate, &mut self.after_candidate_stop),
            (&self.baseline, &mut self.after_baseline_stop),
        ] {
            if let Some(stop) = side.stop() {
                if stop.at.event == index && is_call {
                    tail.add(event, baseline, stop.at.ts_ms);
                }
            }
        }
        if self.divergence.is_none() && !baseline.same_for_the_agent(candidate) {
            self.divergence = Some(Divergence {
                at: point(),
                baseline: baseline.action,
                candidate: candidate.action,
            });
        }
    }

    /// Is what the candidate did up to and including `event` exact (no divergence
    /// before it)?
    pub fn exact_through(&self, event: u64) -> bool {
        self.divergence.as_ref().is_none_or(|d| d.at.event >= event)
    }
}

/// Per-run traces, keyed by tenant then run: the lookup borrows the event's strings.
#[derive(Default)]
pub struct Traces {
    runs: HashMap<String, HashMap<String, RunTrace>>,
}

impl Traces {
    pub fn observe(&mut self, event: &Event, baseline: Compact, candidate: Compact) {
        if !self.runs.contains_key(event.tenant.as_str()) {
            self.runs.insert(event.tenant.clone(), HashMap::new());
        }
        let runs = self.runs.get_mut(event.tenant.as_str()).expect("inserted");
        if !runs.contains_key(event.run.as_str()) {
            runs.insert(event.run.clone(), RunTrace::default());
        }
        runs.get_mut(event.run.as_str())
            .expect("inserted")
            .observe(event, baseline, candidate);
    }

    /// Ordered by tenant then run: the report never depends on hash order.
    pub fn into_sorted(self) -> BTreeMap<(String, String), RunTrace> {
        self.runs
            .into_iter()
            .flat_map(|(tenant, runs)| {
                runs.into_iter()
                    .map(move |(run, trace)| ((tenant.clone(), run), trace))
            })
            .collect()
    }
}

/// The baseline's policies: fixed, or the ones the log records (a data directory's
/// `set_policies` operations, repeated at their position).
pub enum Baseline {
    Fixed(PolicySet),
    AsRecorded,
}

/// The baseline's half of a comparison: its engine, deciding each record.
pub struct BaselineHalf {
    engine: Engine,
    follow_recorded_policies: bool,
    pub disagreements: Disagreements,
}

/// Events where this build's replay of the baseline decides otherwise than the daemon
/// recorded (a log written by another version of the engine, or with other policies
/// than the baseline named).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Disagreements {
    pub checked: u64,
    pub differing: u64,
    /// The first: tenant/run, event id, recorded action, replayed action.
    pub first: Option<(String, String, &'static str, &'static str)>,
}

impl BaselineHalf {
    pub fn new(baseline: Baseline) -> Self {
        let (engine, follow) = match baseline {
            Baseline::Fixed(policies) => (Engine::new(policies), false),
            Baseline::AsRecorded => (Engine::default(), true),
        };
        BaselineHalf {
            engine,
            follow_recorded_policies: follow,
            disagreements: Disagreements::default(),
        }
    }

    /// The baseline's decision for an event (checked against the recorded one, if
    /// any); `None` for an operation.
    pub fn decide(&mut self, item: &Item, recorded: Option<Compact>) -> Option<Compact> {
        match item {
            Item::Event(event) => {
                let decided = Compact::of(&self.engine.apply(event));
                if let Some(recorded) = recorded {
                    let d = &mut self.disagreements;
                    d.checked += 1;
                    if recorded != decided {
                        d.differing += 1;
                        d.first.get_or_insert_with(|| {
                            (
                                format!("{}/{}", event.tenant, event.run),
                                event.id.clone(),
                                recorded.action.as_str(),
                                decided.action.as_str(),
                            )
                        });
                    }
                }
                Some(decided)
            }
            Item::Op(LogOp::SetPolicies { .. }) if !self.follow_recorded_policies => None,
            Item::Op(op) => {
                apply_op(&mut self.engine, op);
                None
            }
        }
    }
}

/// The candidate's half: its engine and the traces, given the baseline's decisions.
pub struct CandidateHalf {
    engine: Engine,
    pub traces: Traces,
    pub events: u64,
}

impl CandidateHalf {
    pub fn new(candidate: PolicySet) -> Self {
        CandidateHalf {
            engine: Engine::new(candidate),
            traces: Traces::default(),
            events: 0,
        }
    }

    pub fn take(&mut self, item: &Item, baseline: Option<Compact>) {
        match (item, baseline) {
            (Item::Event(event), Some(baseline)) => {
                self.events += 1;
                let candidate = Compact::of(&self.engine.apply(event));
                self.traces.observe(event, baseline, candidate);
            }
            // The candidate replaces the policies the log recorded.
            (Item::Op(LogOp::SetPolicies { .. }), _) => {}
            (Item::Op(op), _) => apply_op(&mut self.engine, op),
            (Item::Event(_), None) => unreachable!("the baseline decides every event"),
        }
    }
}

/// Both halves on one thread, fed one record at a time.
pub struct Comparison {
    baseline: BaselineHalf,
    pub candidate: CandidateHalf,
}

impl Comparison {
    pub fn new(baseline: Baseline, candidate: PolicySet) -> Self {
        Comparison {
            baseline: BaselineHalf::new(baseline),
            candidate: CandidateHalf::new(candidate),
        }
    }

    pub fn feed(&mut self, item: &Item) {
        let decided = self.baseline.decide(item, None);
        self.candidate.take(item, decided);
    }
}

/// Records with the baseline's decisions, handed to the candidate's thread in batches.
type Batch = Vec<(Item, Option<Compact>)>;

const BATCH: usize = 1024;

/// The halves on two threads: the caller's applies the baseline, a second one the
/// candidate, so a comparison costs little more wall time than one replay when there
/// is a core for each.
pub struct Pipeline {
    baseline: BaselineHalf,
    batch: Batch,
    sender: Option<std::sync::mpsc::SyncSender<Batch>>,
    candidate: Option<std::thread::JoinHandle<CandidateHalf>>,
}

impl Pipeline {
    pub fn new(baseline: Baseline, candidate: PolicySet) -> Self {
        let (sender, batches) = std::sync::mpsc::sync_channel::<Batch>(8);
        let handle = std::thread::spawn(move || {
            let mut half = CandidateHalf::new(candidate);
            for batch in batches {
                for (item, decided) in &batch {
                    half.take(item, *decided);
                }
            }
            half
        });
        Pipeline {
            baseline: BaselineHalf::new(baseline),
            batch: Vec::with_capacity(BATCH),
            sender: Some(sender),
            candidate: Some(handle),
        }
    }

    pub fn feed(&mut self, item: Item, recorded: Option<Compact>) {
        let decided = self.baseline.decide(&item, recorded);
        self.batch.push((item, decided));
        if self.batch.len() == BATCH {
            self.send();
        }
    }

    fn send(&mut self) {
        let full = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH));
        if let Some(sender) = &self.sender {
            // A closed channel means the candidate thread died; `finish` reports it.
            let _ = sender.send(full);
        }
    }

    /// Waits for the candidate's thread and returns its half, and what the baseline
    /// found about the recording.
    pub fn finish(mut self) -> Result<(CandidateHalf, Disagreements), String> {
        self.send();
        self.sender = None;
        let candidate = self
            .candidate
            .take()
            .expect("finished once")
            .join()
            .map_err(|_| "the candidate's thread panicked".to_owned())?;
        Ok((candidate, std::mem::take(&mut self.baseline.disagreements)))
    }
}

/// What the log's own replay does with an operation that is not a policy change.
pub fn apply_op(engine: &mut Engine, op: &LogOp) {
    match op {
        LogOp::SetPolicies { policies } => engine.set_policies(policies.clone()),
        LogOp::Prune { runs } => {
            for run in runs {
                engine.forget_run(&run.tenant, &run.run);
            }
        }
        LogOp::ForgetOperations { operations } => {
            for op in operations {
                engine.forget_operation(&op.tenant, &op.op_key);
            }
        }
        LogOp::AdoptOperations { operations } => {
            for op in operations {
                engine.adopt_operation(&op.tenant, &op.op_key, op.entry.clone());
            }
        }
    }
}
