//! The engine's cost per event, in instructions: the `benches/engine.rs` trace (1,000
//! interleaved runs of pagination, repeats and side effects) plus a coding agent's and a
//! support agent's shapes (free-text queries, shell commands with a description),
//! applied once. Run under callgrind, counting only the applying:
//!
//! ```text
//! cargo build --release -p fusebox-core --example engine_instructions
//! valgrind --tool=callgrind --collect-atstart=no \
//!   --toggle-collect='*apply_all*' target/release/examples/engine_instructions
//! ```
//!
//! and divide the total by the event count it prints. With the argument `tree` or
//! `flat` the events are instead 200,000 calls and results spread over 64 children of
//! one root, or over 64 unrelated runs: the tree's bookkeeping is the difference.

use fusebox_core::{parse_event, Engine, Event};

#[path = "../benches/support/interleaved.rs"]
mod interleaved;

/// The engine bench's mixed trace over 1,000 runs, with two more kinds of run: a
/// support agent's free-text question, and a shell command with its description.
fn trace(events: usize) -> Vec<Event> {
    interleaved::interleaved(events, 50, |run, n, call| match (run % 5, n % 2 == 1) {
        (3, true) => format!(
            r#""type":"tool_call","call_id":"c{call}","tool":"kb_search","args":{{"question":"how do I change the billing address on invoice {}","limit":5}}"#,
            call % 7
        ),
        (3, false) => format!(
            r#""type":"tool_result","call_id":"c{call}","tool":"kb_search","kind":"SUCCESS","output":{{"articles":[]}}"#
        ),
        (4, true) => format!(
            r#""type":"tool_call","call_id":"c{call}","tool":"Bash","args":{{"command":"cargo test -p crate_{}","description":"Run the tests of crate {} again"}}"#,
            call % 9,
            call % 9
        ),
        (4, false) => format!(
            r#""type":"tool_result","call_id":"c{call}","tool":"Bash","kind":"SUCCESS","output":{{"stdout":"test result: ok. {} passed","stderr":""}}"#,
            call % 3
        ),
        (kind, _) => interleaved::mixed(kind, run, n, call),
    })
}

/// What callgrind counts: every event through `Engine::apply`, nothing else.
#[inline(never)]
fn apply_all(events: &[Event]) -> usize {
    let mut engine = Engine::default();
    events
        .iter()
        .filter(|event| engine.apply(event).action.lets_tool_run())
        .count()
}

/// Calls and their results over 64 runs, children of `root` when `tree`.
fn spread(events: usize, tree: bool) -> Vec<Event> {
    let runs = 64;
    let policy = r#""policy":{"max_steps":100000000,"max_open_children":1000,"max_children":1000}"#;
    let mut lines = Vec::new();
    if tree {
        lines.push(format!(
            r#"{{"v":1,"id":"s","tenant":"t","run":"root","ts_ms":1000,"type":"run_started",{policy}}}"#
        ));
    }
    for n in 0..runs {
        let parent = if tree { r#","parent":"root""# } else { "" };
        lines.push(format!(
            r#"{{"v":1,"id":"s","tenant":"t","run":"r{n}","ts_ms":1000,"type":"run_started",{policy}{parent}}}"#
        ));
    }
    for i in 0..events / 2 {
        let run = i % runs;
        let ts = 2000 + i;
        lines.push(format!(
            r#"{{"v":1,"id":"c{i}","tenant":"t","run":"r{run}","ts_ms":{ts},"type":"tool_call","call_id":"c{i}","tool":"search","args":{{"q":"query {i}"}}}}"#
        ));
        lines.push(format!(
            r#"{{"v":1,"id":"r{i}","tenant":"t","run":"r{run}","ts_ms":{ts},"type":"tool_result","call_id":"c{i}","tool":"search","kind":"SUCCESS","output":{{"hits":[{i}]}}}}"#
        ));
    }
    lines
        .iter()
        .map(|line| parse_event(line.as_bytes()).expect("valid"))
        .collect()
}

fn main() {
    let events = match std::env::args().nth(1).as_deref() {
        Some("tree") => spread(200_000, true),
        Some("flat") => spread(200_000, false),
        _ => trace(200_000),
    };
    let executed = apply_all(&events);
    println!("{} events applied, {executed} calls let run", events.len());
}
