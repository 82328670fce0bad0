//! Time for idle runs. The engine knows only event time, so a run whose tool hangs sends
//! nothing and would never see its time budget expire, nor the lease of an operation it
//! holds in flight run out. The daemon writes a `tick` for it through the log (so replay
//! reproduces the stop), stamped with the time the engine names (`Engine::wake_ms`).
//!
//! Event time is taken to advance with the wall clock from the run's last event: the tick
//! is due once the run has been idle for as long as its budget had left then. Producers'
//! clocks are never compared with ours, so a trace with old timestamps is not stopped
//! the moment it arrives.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use fusebox_core::event::Tick;
use fusebox_core::{Engine, Event, EventBody};

use crate::applier::RunKey;

pub(crate) fn due(
    engine: &Engine,
    last_seen: &HashMap<RunKey, Instant>,
    fallback_seen: Instant,
    now: Instant,
) -> Vec<Event> {
    engine
        .runs()
        .filter(|(_, _, run)| run.is_open())
        .filter_map(|(tenant, run_id, run)| {
            let deadline = engine.wake_ms(tenant, run_id, run);
            let left = Duration::from_millis(deadline.saturating_sub(run.last_ts_ms));
            let seen = last_seen
                .get(&(tenant.to_owned(), run_id.to_owned()))
                .copied()
                .unwrap_or(fallback_seen);
            (now.saturating_duration_since(seen) >= left).then(|| Event {
                v: 1,
                // Deterministic: a second tick for the same deadline is a duplicate.
                id: format!("tick-{deadline}"),
                tenant: tenant.to_owned(),
                run: run_id.to_owned(),
                seq: None,
                ts_ms: deadline,
                body: EventBody::Tick(Tick {}),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_core::parse_event;

    #[test]
    fn a_tick_is_due_only_after_the_budget_left_has_passed_idle() {
        let mut engine = Engine::default();
        let started = parse_event(
            br#"{"v":1,"id":"a","tenant":"t","run":"r","ts_ms":1000,"type":"run_started","policy":{"max_duration_s":2}}"#,
        )
        .unwrap();
        engine.apply(&started);
        let seen = Instant::now();
        let map = HashMap::from([(("t".to_owned(), "r".to_owned()), seen)]);
        assert!(due(&engine, &map, seen, seen + Duration::from_millis(1500)).is_empty());
        let ticks = due(&engine, &map, seen, seen + Duration::from_millis(2000));
        assert_eq!(ticks.len(), 1);
        assert_eq!(ticks[0].ts_ms, 3000);
        assert_eq!(ticks[0].id, "tick-3000");
        let decision = engine.apply(&ticks[0]);
        assert_eq!(decision.action, fusebox_core::Action::Stop);
        assert!(due(&engine, &map, seen, seen + Duration::from_secs(10)).is_empty());
    }

    #[test]
    fn a_run_holding_a_key_in_flight_is_woken_when_its_lease_runs_out() {
        let mut engine = Engine::default();
        for line in [
            &br#"{"v":1,"id":"a","tenant":"t","run":"r","ts_ms":1000,"type":"run_started","policy":{"in_flight_lease_minutes":1}}"#[..],
            br#"{"v":1,"id":"b","tenant":"t","run":"r","ts_ms":2000,"type":"tool_call","call_id":"c","tool":"send","args":{},"op_key":"k"}"#,
        ] {
            engine.apply(&parse_event(line).unwrap());
        }
        let seen = Instant::now();
        let map = HashMap::from([(("t".to_owned(), "r".to_owned()), seen)]);
        assert!(due(&engine, &map, seen, seen + Duration::from_secs(59)).is_empty());
        let ticks = due(&engine, &map, seen, seen + Duration::from_secs(60));
        assert_eq!(ticks.len(), 1);
        assert_eq!(ticks[0].ts_ms, 62_000);
        let decision = engine.apply(&ticks[0]);
        assert_eq!(
            decision.reason,
            Some(fusebox_core::Reason::OperationOutcomeUnknown)
        );
    }
}
