//! Time for idle runs. The engine knows only event time, so a run whose tool hangs sends
//! nothing and would never see its time budget expire, nor the lease of an operation it
//! holds in flight run out. The daemon writes a `tick` for it through the log (so replay
//! reproduces the stop), stamped with the time the engine names (`Engine::wake_ms`).
//!
//! Event time is taken to advance with the wall clock from the run's last event: the tick
//! is due once the run has been idle for as long as its budget had left then. Producers'
//! clocks are never compared with ours, so a trace with old timestamps is not stopped
//! the moment it arrives.
//!
//! When each open run is due is kept in an index as runs change, not computed for every
//! run at every timer: a daemon holds thousands of idle runs, and the timer runs on the
//! thread that applies batches.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use fusebox_core::event::Tick;
use fusebox_core::{Engine, Event, EventBody, RunState};

use crate::applier::RunKey;

/// The open runs' wake-ups.
///
/// Invariant: a run's wake moves earlier only through an event of its own (its time
/// budget is fixed by its `run_started`; the leases it holds are those of its own calls),
/// and every applied event passes through [`Wakes::applied`]. Anything else can only free
/// a lease (an operator's resolve, a key settled by another daemon), which makes the wake
/// later; a run that comes due is computed again before its tick is written, so an entry
/// may be early, never late.
#[derive(Default)]
pub(crate) struct Wakes {
    /// Runs with an event applied since the last timer, and when the last one was.
    changed: HashMap<RunKey, Instant>,
    /// Every open run known: when its last event was applied, and when it is due next
    /// (`None` once its tick is written, until its next event).
    runs: HashMap<RunKey, Indexed>,
    /// The due instants, earliest first.
    queue: BTreeSet<(Instant, RunKey)>,
    /// Open sub-agents (runs at depth 1 and below in a tree of runs) by depth, counted
    /// with `runs` (a run's depth is set by its own `run_started`).
    subagents: BTreeMap<u32, u64>,
}

#[derive(Clone, Copy)]
struct Indexed {
    seen: Instant,
    due: Option<Instant>,
    depth: u32,
}

impl Wakes {
    /// The open runs of a rebuilt state, idle since `started` (this process has applied
    /// nothing of theirs yet).
    pub(crate) fn rebuilt(engine: &Engine, started: Instant) -> Self {
        let mut wakes = Wakes::default();
        for (tenant, run, state) in engine.runs() {
            if state.is_open() {
                wakes
                    .changed
                    .insert((tenant.to_owned(), run.to_owned()), started);
            }
        }
        wakes
    }

    /// An event of the run was applied now.
    pub(crate) fn applied(&mut self, run: RunKey, now: Instant) {
        self.changed.insert(run, now);
    }

    /// Open runs, as of the last [`Wakes::due`].
    pub(crate) fn open_runs(&self) -> usize {
        self.runs.len()
    }

    /// Open sub-agents by depth (1, 2, …), as of the last [`Wakes::due`].
    pub(crate) fn open_subagents(&self) -> &BTreeMap<u32, u64> {
        &self.subagents
    }

    /// The ticks due at `now`, one per run whose wake has come.
    pub(crate) fn due(&mut self, engine: &Engine, now: Instant) -> Vec<Event> {
        for (key, seen) in std::mem::take(&mut self.changed) {
            self.unqueue(&key);
            self.index(engine, key, seen);
        }
        let mut ticks = Vec::new();
        while let Some((at, _)) = self.queue.first() {
            if *at > now {
                break;
            }
            let Some((_, key)) = self.queue.pop_first() else {
                break;
            };
            let Some(indexed) = self.runs.get_mut(&key) else {
                continue;
            };
            indexed.due = None;
            let seen = indexed.seen;
            let Some(run) = open(engine, &key) else {
                self.forget(&key);
                continue;
            };
            let (wake, at) = wake(engine, &key, run, seen);
            if at <= now {
                ticks.push(tick(key, wake));
            } else {
                self.enqueue(key, at);
            }
        }
        ticks
    }

    fn index(&mut self, engine: &Engine, key: RunKey, seen: Instant) {
        let Some(run) = open(engine, &key) else {
            self.forget(&key);
            return;
        };
        let (_, at) = wake(engine, &key, run, seen);
        let depth = run.node.depth;
        let indexed = Indexed {
            seen,
            due: None,
            depth,
        };
        if let Some(old) = self.runs.insert(key.clone(), indexed) {
            self.count(old.depth, false);
        }
        self.count(depth, true);
        self.enqueue(key, at);
    }

    fn forget(&mut self, key: &RunKey) {
        if let Some(old) = self.runs.remove(key) {
            self.count(old.depth, false);
        }
    }

    fn count(&mut self, depth: u32, open: bool) {
        if depth == 0 {
            return;
        }
        let n = self.subagents.entry(depth).or_default();
        if open {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.subagents.remove(&depth);
            }
        }
    }

    fn enqueue(&mut self, key: RunKey, at: Instant) {
        if let Some(indexed) = self.runs.get_mut(&key) {
            indexed.due = Some(at);
            self.queue.insert((at, key));
        }
    }

    fn unqueue(&mut self, key: &RunKey) {
        if let Some(Indexed { due: Some(at), .. }) = self.runs.get(key) {
            self.queue.remove(&(*at, key.clone()));
        }
    }
}

/// A budget longer than this is as good as none (and `Instant` arithmetic must not
/// overflow on a policy's `u64::MAX`).
const LONGEST_WAIT: Duration = Duration::from_secs(100 * 365 * 86_400);

fn open<'a>(engine: &'a Engine, (tenant, run): &RunKey) -> Option<&'a RunState> {
    engine.run(tenant, run).filter(|run| run.is_open())
}

/// The run's wake in event time, and the instant it comes once the run has been idle
/// since `seen` for as long as it had left then.
fn wake(
    engine: &Engine,
    (tenant, run_id): &RunKey,
    run: &RunState,
    seen: Instant,
) -> (u64, Instant) {
    let wake = engine.wake_ms(tenant, run_id, run);
    let left = Duration::from_millis(wake.saturating_sub(run.last_ts_ms)).min(LONGEST_WAIT);
    (wake, seen + left)
}

fn tick((tenant, run): RunKey, wake: u64) -> Event {
    Event {
        v: 1,
        // Deterministic: a second tick for the same wake is a duplicate.
        id: format!("tick-{wake}"),
        tenant,
        run,
        seq: None,
        ts_ms: wake,
        body: EventBody::Tick(Tick {}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_core::{parse_event, Action, Reason};

    /// An engine and its index, fed as the applier feeds them: each applied event marks
    /// its run at the instant it was applied.
    struct Daemon {
        engine: Engine,
        wakes: Wakes,
        start: Instant,
    }

    impl Daemon {
        fn new() -> Self {
            Daemon {
                engine: Engine::default(),
                wakes: Wakes::default(),
                start: Instant::now(),
            }
        }

        /// A run whose call holds `k` in flight since event time 2000, its lease 1 min.
        fn leased_call() -> Self {
            let mut daemon = Daemon::new();
            for line in LEASED_CALL {
                daemon.apply(0, line);
            }
            daemon
        }

        fn at(&self, ms: u64) -> Instant {
            self.start + Duration::from_millis(ms)
        }

        /// Applies `json` `after_ms` into the test.
        fn apply(&mut self, after_ms: u64, json: &str) -> fusebox_core::Decision {
            let event = parse_event(json.as_bytes()).unwrap();
            let decision = self.engine.apply(&event);
            let at = self.at(after_ms);
            self.wakes.applied((event.tenant, event.run), at);
            decision
        }

        /// The ticks due `after_ms` into the test, as (run, ts_ms).
        fn due(&mut self, after_ms: u64) -> Vec<(String, u64)> {
            let now = self.at(after_ms);
            let ticks = self.wakes.due(&self.engine, now);
            ticks
                .into_iter()
                .map(|tick| {
                    assert_eq!(tick.id, format!("tick-{}", tick.ts_ms));
                    (tick.run, tick.ts_ms)
                })
                .collect()
        }

        fn tick(&mut self, after_ms: u64, run: &str, ts_ms: u64) -> fusebox_core::Decision {
            self.apply(
                after_ms,
                &format!(r#"{{"v":1,"id":"tick-{ts_ms}","tenant":"t","run":"{run}","ts_ms":{ts_ms},"type":"tick"}}"#),
            )
        }
    }

    const BUDGET_2S: &str = r#"{"v":1,"id":"a","tenant":"t","run":"r","ts_ms":1000,"type":"run_started","policy":{"max_duration_s":2}}"#;

    #[test]
    fn a_tick_is_due_only_after_the_budget_left_has_passed_idle() {
        let mut daemon = Daemon::new();
        daemon.apply(0, BUDGET_2S);
        assert_eq!(daemon.due(1999), []);
        assert_eq!(daemon.due(2000), [("r".to_owned(), 3000)]);
        // Written once: nothing more comes due until the run's next event.
        assert_eq!(daemon.due(2250), []);
        let decision = daemon.tick(2250, "r", 3000);
        assert_eq!(decision.action, Action::Stop);
        assert_eq!(daemon.due(10_000), []);
        assert_eq!(daemon.wakes.open_runs(), 0, "a closed run leaves the index");
    }

    #[test]
    fn a_later_event_counts_the_idle_time_from_itself() {
        let mut daemon = Daemon::new();
        daemon.apply(0, BUDGET_2S);
        assert_eq!(daemon.due(500), []);
        // Half a second of the run's own time gone 1.5 s into ours: 1.5 s left from here.
        daemon.apply(
            1500,
            r#"{"v":1,"id":"b","tenant":"t","run":"r","ts_ms":1500,"type":"progress","version":1}"#,
        );
        assert_eq!(daemon.due(2999), []);
        assert_eq!(daemon.due(3000), [("r".to_owned(), 3000)]);
    }

    #[test]
    fn a_rebuilt_run_is_idle_from_the_start_of_the_process() {
        let mut daemon = Daemon::new();
        daemon.apply(0, BUDGET_2S);
        let started = daemon.at(5000);
        daemon.wakes = Wakes::rebuilt(&daemon.engine, started);
        assert_eq!(daemon.due(6999), []);
        assert_eq!(daemon.due(7000), [("r".to_owned(), 3000)]);
    }

    const LEASED_CALL: [&str; 2] = [
        r#"{"v":1,"id":"a","tenant":"t","run":"r","ts_ms":1000,"type":"run_started","policy":{"in_flight_lease_minutes":1}}"#,
        r#"{"v":1,"id":"b","tenant":"t","run":"r","ts_ms":2000,"type":"tool_call","call_id":"c","tool":"send","args":{},"op_key":"k"}"#,
    ];

    #[test]
    fn a_run_holding_a_key_in_flight_is_woken_when_its_lease_runs_out() {
        let mut daemon = Daemon::leased_call();
        assert_eq!(daemon.due(59_999), []);
        assert_eq!(daemon.due(60_000), [("r".to_owned(), 62_000)]);
        let decision = daemon.tick(60_000, "r", 62_000);
        assert_eq!(decision.reason, Some(Reason::OperationOutcomeUnknown));
    }

    #[test]
    fn a_lease_freed_by_another_run_is_computed_again_before_any_tick() {
        let mut daemon = Daemon::leased_call();
        assert_eq!(daemon.due(1000), []);
        // An operator releases the key on a run of its own: r's wake becomes its budget's
        // end, and r itself saw no event.
        daemon.apply(
            2000,
            r#"{"v":1,"id":"o","tenant":"t","run":"ops","ts_ms":5,"type":"ledger_resolve","op_key":"k","resolution":"released"}"#,
        );
        assert_eq!(daemon.due(60_000), []);
        assert_eq!(daemon.wakes.open_runs(), 2);
    }

    #[test]
    fn open_sub_agents_are_counted_by_depth() {
        let mut daemon = Daemon::new();
        let start = |run: &str, parent: &str| {
            let parent = match parent {
                "" => String::new(),
                p => format!(r#","parent":"{p}""#),
            };
            format!(
                r#"{{"v":1,"id":"s","tenant":"t","run":"{run}","ts_ms":1,"type":"run_started"{parent}}}"#
            )
        };
        let finish = |run: &str| {
            format!(
                r#"{{"v":1,"id":"f","tenant":"t","run":"{run}","ts_ms":2,"type":"run_finished"}}"#
            )
        };
        // (events applied, open sub-agents by depth after the next timer)
        let steps = [
            (
                vec![
                    start("root", ""),
                    start("a", "root"),
                    start("b", "root"),
                    start("a1", "a"),
                ],
                vec![(1, 2), (2, 1)],
            ),
            (vec![start("lone", "")], vec![(1, 2), (2, 1)]),
            (vec![finish("a1")], vec![(1, 2)]),
            (vec![finish("a"), finish("b")], vec![]),
        ];
        for (events, want) in steps {
            for event in &events {
                daemon.apply(0, event);
            }
            daemon.due(0);
            let got: Vec<(u32, u64)> = daemon
                .wakes
                .open_subagents()
                .iter()
                .map(|(d, n)| (*d, *n))
                .collect();
            assert_eq!(got, want, "after {events:?}");
        }
        assert_eq!(daemon.wakes.open_runs(), 2, "the root and the lone run");
    }
}
