//! The recorded runs held in memory for the many replays a calibration takes: every
//! record, the baseline's decision for each event (computed once), and what each run was
//! under the baseline — completed (ended normally), a runaway (stopped by the guard), or
//! neither.

use std::collections::HashMap;
use std::io::IsTerminal;

use fusebox_core::{Engine, EventBody, PolicySet, TerminalState};
use fusebox_log::LogOp;
use indicatif::{ProgressBar, ProgressStyle};

use crate::whatif::compare::{apply_op, Baseline, Compact};
use crate::whatif::source::Item;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Ended normally (run_finished, a terminal result) and never stopped first.
    Completed,
    /// Stopped by the loop guard, at this call.
    Runaway { stopped_at_call: u64 },
    /// Open at the end of the recording, cancelled, failed, needing a human.
    Other,
}

#[derive(Debug, Clone)]
pub struct RunInfo {
    pub tenant: String,
    pub run: String,
    pub agent: Option<String>,
    pub kind: Kind,
    /// Some call of it has an `op_key`: through the ledger it can change how other
    /// runs of its tenant are decided. Runs interact in no other way.
    pub touches_ledger: bool,
}

pub struct History {
    pub items: Vec<Item>,
    /// Per item: the run index of an event (u32::MAX for an operation).
    run_of: Vec<u32>,
    /// Per item: the baseline's decision (meaningless for an operation).
    baseline: Vec<Compact>,
    pub runs: Vec<RunInfo>,
    /// The policies in force at the end of the recording under the baseline: where a
    /// calibration starts.
    pub policies: PolicySet,
    /// A spinner on stderr for long calibrations: one tick per replay.
    progress: Option<ProgressBar>,
}

/// Records from which a calibration's replays are worth a spinner.
const SPINNER_FROM: usize = 100_000;

const NO_RUN: u32 = u32::MAX;

impl History {
    pub fn new(items: Vec<Item>, baseline: Baseline) -> Self {
        let (mut engine, follow) = match baseline {
            Baseline::Fixed(set) => (Engine::new(set), false),
            Baseline::AsRecorded => (Engine::default(), true),
        };
        let mut index: HashMap<(String, String), u32> = HashMap::new();
        let mut runs: Vec<RunInfo> = Vec::new();
        let mut calls: Vec<u64> = Vec::new();
        let mut closed_once: Vec<bool> = Vec::new();
        let items_len = items.len();
        let mut run_of = Vec::with_capacity(items.len());
        let mut decided = Vec::with_capacity(items.len());
        for item in &items {
            match item {
                Item::Event(event) => {
                    let d = Compact::of(&engine.apply(event));
                    let key = (event.tenant.clone(), event.run.clone());
                    let r = *index.entry(key).or_insert_with(|| {
                        runs.push(RunInfo {
                            tenant: event.tenant.clone(),
                            run: event.run.clone(),
                            agent: None,
                            kind: Kind::Other,
                            touches_ledger: false,
                        });
                        calls.push(0);
                        closed_once.push(false);
                        (runs.len() - 1) as u32
                    });
                    let info = &mut runs[r as usize];
                    if let EventBody::RunStarted(started) = &event.body {
                        if started.agent.is_some() {
                            info.agent = started.agent.clone();
                        }
                    }
                    if let EventBody::ToolCall(call) = &event.body {
                        calls[r as usize] += 1;
                        info.touches_ledger |= call.op_key.is_some();
                    }
                    // A run is what its first close says (a resumed run stays a runaway).
                    if !closed_once[r as usize] {
                        if let Some((terminal, _)) = d.closed {
                            closed_once[r as usize] = true;
                            info.kind = match terminal {
                                TerminalState::Completed => Kind::Completed,
                                TerminalState::StoppedLoopGuard => Kind::Runaway {
                                    stopped_at_call: calls[r as usize],
                                },
                                _ => Kind::Other,
                            };
                        }
                    }
                    run_of.push(r);
                    decided.push(d);
                }
                Item::Op(op) => {
                    if follow || !matches!(op, LogOp::SetPolicies { .. }) {
                        apply_op(&mut engine, op);
                    }
                    run_of.push(NO_RUN);
                    decided.push(Compact {
                        action: fusebox_core::Action::Continue,
                        closed: None,
                    });
                }
            }
        }
        History {
            items,
            run_of,
            baseline: decided,
            runs,
            policies: engine.policies().clone(),
            progress: (items_len >= SPINNER_FROM && std::io::stderr().is_terminal()).then(|| {
                let bar = ProgressBar::new_spinner();
                bar.set_style(
                    ProgressStyle::with_template("{spinner} {pos} replays, {elapsed} {msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                bar
            }),
        }
    }

    /// Says on the spinner what is being calibrated.
    pub fn note(&self, what: &str) {
        if let Some(bar) = &self.progress {
            bar.set_message(what.to_owned());
        }
    }

    pub fn done(&self) {
        if let Some(bar) = &self.progress {
            bar.finish_and_clear();
        }
    }

    pub fn completed(&self) -> impl Iterator<Item = &RunInfo> {
        self.runs.iter().filter(|r| r.kind == Kind::Completed)
    }

    pub fn runaways(&self) -> usize {
        self.runs
            .iter()
            .filter(|r| matches!(r.kind, Kind::Runaway { .. }))
            .count()
    }

    /// Replays the records under `candidate` and says which completed runs it
    /// interferes with (stops, or refuses a call the baseline let run) and, with
    /// `runaways`, how much sooner it stops the runaways. With `give_up_after`, stops
    /// counting once more runs than that are interfered with (the answer is then "too
    /// many"). Only the runs the answer needs are replayed, with every run that touches
    /// the ledger (the one way runs affect each other): the answer is the same as a
    /// replay of everything.
    pub fn evaluate(
        &self,
        candidate: &PolicySet,
        give_up_after: Option<usize>,
        runaways: bool,
    ) -> Evaluation {
        let needed: Vec<bool> = self
            .runs
            .iter()
            .map(|run| match run.kind {
                Kind::Completed => true,
                Kind::Runaway { .. } => runaways || run.touches_ledger,
                Kind::Other => run.touches_ledger,
            })
            .collect();
        if let Some(bar) = &self.progress {
            bar.inc(1);
        }
        let mut engine = Engine::new(candidate.clone());
        let mut calls = vec![0u64; self.runs.len()];
        let mut settled = vec![false; self.runs.len()];
        let mut evaluation = Evaluation::default();
        for ((item, &r), &baseline) in self.items.iter().zip(&self.run_of).zip(&self.baseline) {
            let event = match item {
                Item::Event(event) => event,
                Item::Op(op) => {
                    // A data directory's recorded policy changes are what the candidate
                    // replaces; its other operations apply to both.
                    if !matches!(op, LogOp::SetPolicies { .. }) {
                        apply_op(&mut engine, op);
                    }
                    continue;
                }
            };
            let r = r as usize;
            if !needed[r] {
                continue;
            }
            let decided = Compact::of(&engine.apply(event));
            if matches!(event.body, EventBody::ToolCall(_)) {
                calls[r] += 1;
            }
            if settled[r] {
                continue;
            }
            let stops = decided
                .closed
                .is_some_and(|(terminal, _)| terminal != TerminalState::Completed);
            match self.runs[r].kind {
                Kind::Completed => {
                    let refuses = decided.action.refuses() && baseline.action.lets_tool_run();
                    if stops || refuses {
                        settled[r] = true;
                        evaluation.interfered.push(r);
                        if give_up_after.is_some_and(|n| evaluation.interfered.len() > n) {
                            evaluation.gave_up = true;
                            return evaluation;
                        }
                    } else if decided.closed.is_some() {
                        settled[r] = true;
                    }
                }
                Kind::Runaway { stopped_at_call } => {
                    if stops {
                        settled[r] = true;
                        if calls[r] < stopped_at_call {
                            evaluation.sooner.push((r, stopped_at_call - calls[r]));
                        }
                    }
                }
                Kind::Other => settled[r] = true,
            }
        }
        evaluation
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Evaluation {
    /// Completed runs (indices into `runs`) the candidate stops or refuses a call of.
    pub interfered: Vec<usize>,
    pub gave_up: bool,
    /// Runaways the candidate stops at an earlier call than the baseline did, with how
    /// many calls earlier.
    pub sooner: Vec<(usize, u64)>,
}
