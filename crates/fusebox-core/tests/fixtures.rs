//! The contract's example traces, with what the contract says must happen to each.

use std::path::Path;

use fusebox_core::{parse_event, Action, Admission, Decision, Engine, Event, EventBody, Sequencer};

fn replay(name: &str) -> Vec<(Event, Decision)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("fixture present");
    let mut engine = Engine::default();
    let mut sequencer = Sequencer::default();
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let event = parse_event(line.as_bytes()).expect("fixture lines are valid");
        let Admission::Ready(ready) = sequencer.admit(event).expect("admitted") else {
            panic!("fixture events arrive in order");
        };
        for event in ready {
            let decision = engine.apply(&event);
            out.push((event, decision));
        }
    }
    out
}

fn gates(trace: &[(Event, Decision)]) -> Vec<&Decision> {
    trace
        .iter()
        .filter(|(e, _)| matches!(e.body, EventBody::ToolCall(_)))
        .map(|(_, d)| d)
        .collect()
}

fn executions(trace: &[(Event, Decision)]) -> usize {
    gates(trace)
        .iter()
        .filter(|d| d.action.lets_tool_run())
        .count()
}

fn first_stop(trace: &[(Event, Decision)]) -> Option<usize> {
    trace.iter().position(|(_, d)| d.action == Action::Stop)
}

#[test]
fn exact_repeat_runs_at_most_four_times_then_stops_for_good() {
    let trace = replay("exact-repeat.jsonl");
    assert!(executions(&trace) <= 4, "executed {}", executions(&trace));
    let stop = first_stop(&trace).expect("the run stops");
    let reason = trace[stop].1.reason.expect("a stop has a reason").as_str();
    assert!(["same_call_repeat", "no_progress", "consecutive_blocks"].contains(&reason));
    assert!(trace[stop..].iter().all(|(_, d)| !d.action.lets_tool_run()));
}

#[test]
fn ping_pong_stops_before_the_eighth_call() {
    let trace = replay("ping-pong.jsonl");
    let stop = first_stop(&trace).expect("the run stops");
    let calls_before_stop = trace[..=stop]
        .iter()
        .filter(|(e, _)| matches!(e.body, EventBody::ToolCall(_)))
        .count();
    assert!(calls_before_stop < 8, "stopped at call {calls_before_stop}");
    assert!(trace[stop..].iter().all(|(_, d)| !d.action.lets_tool_run()));
}

#[test]
fn no_progress_stops_at_the_third_result_without_progress() {
    let trace = replay("no-progress.jsonl");
    let stop = first_stop(&trace).expect("the run stops");
    let (event, decision) = &trace[stop];
    assert_eq!(
        event.seq,
        Some(9),
        "the fourth result is the third without progress"
    );
    assert_eq!(decision.reason.map(|r| r.as_str()), Some("no_progress"));
}

#[test]
fn duplicate_side_effect_is_answered_from_the_ledger() {
    let trace = replay("duplicate-side-effect.jsonl");
    let gates = gates(&trace);
    assert_eq!(gates[0].action, Action::Execute);
    assert_eq!(gates[1].action, Action::UseCompletedResult);
    let result = gates[1].result.as_ref().expect("the stored result");
    assert_eq!(result["sent"], true);
}

#[test]
fn permission_denied_needs_a_human_and_refuses_the_retry() {
    let trace = replay("permission-denied.jsonl");
    let stop = first_stop(&trace).expect("the run stops");
    let report = trace[stop].1.report.as_ref().expect("a report");
    assert_eq!(report.terminal_state.as_str(), "NEEDS_HUMAN");
    assert_eq!(trace[stop].0.seq, Some(3), "stops at the FATAL result");
    assert_eq!(gates(&trace)[1].action, Action::Stop);
}

#[test]
fn pagination_and_an_advancing_poll_complete_untouched() {
    let trace = replay("pagination-ok.jsonl");
    assert!(trace
        .iter()
        .all(|(_, d)| !matches!(d.action, Action::Block | Action::Stop | Action::Warn)));
    assert_eq!(trace.last().expect("events").1.action, Action::Complete);
}
