//! Bytes of guard state per active run, at the lenient preset's history of 30.
//!
//! `cargo run --release -p fusebox-core --example state_bytes`
//!
//! Drives 1,000 runs through 200 tool calls each (reads and writes, mixed results,
//! model turns, an op_key now and then), so every bounded memory is full, then counts
//! each run's inline size plus the heap it owns. The policy is shared (one `Arc` per
//! agent), so it is counted once, not per run.

use std::mem::size_of;

use fusebox_core::run::{Entry, PendingCall, RetryGate, RunState, NOVELTY_MEMORY};
use fusebox_core::{parse_event, Engine, PolicySet, Preset};

fn heap_bytes(run: &RunState) -> usize {
    let detection = &run.detection;
    let strings = |list: &[String]| {
        list.iter()
            .map(|s| size_of::<String>() + s.capacity())
            .sum::<usize>()
    };
    detection.window.capacity() * size_of::<Entry>()
        + 2 * NOVELTY_MEMORY * size_of::<u64>()
        + detection.retry_gates.capacity() * size_of::<RetryGate>()
        + detection.precondition_gates.capacity() * 48
        + detection.unknown_tools_reported.capacity() * size_of::<u64>()
        + run
            .pending
            .iter()
            .map(|(k, v)| {
                k.capacity()
                    + size_of::<PendingCall>()
                    + 48
                    + v.op_key.as_ref().map_or(0, String::capacity)
            })
            .sum::<usize>()
        + strings(&run.completed_operations)
        + strings(&run.fired_guards)
        + strings(&run.resume_tokens)
        + run.agent.as_ref().map_or(0, String::capacity)
}

fn main() {
    let mut engine = Engine::new(PolicySet::new(Preset::Lenient.policy()));
    let runs = 1000;
    let mut ts = 1_000_000u64;
    for step in 0..200u64 {
        for run in 0..runs {
            ts += 1;
            let (call, result) = if step % 3 == 0 {
                (
                    format!(
                        r#""type":"tool_call","call_id":"c{step}","tool":"write_file","effect":"write","op_key":"r{run}-{step}","args":{{"path":"/f/{step}"}}"#
                    ),
                    format!(
                        r#""type":"tool_result","call_id":"c{step}","tool":"write_file","kind":"SUCCESS","output":{{"ok":true}}"#
                    ),
                )
            } else {
                (
                    format!(
                        r#""type":"tool_call","call_id":"c{step}","tool":"search","args":{{"q":"q{}","page":{}}}"#,
                        step % 7,
                        step % 5
                    ),
                    format!(
                        r#""type":"tool_result","call_id":"c{step}","tool":"search","kind":"SUCCESS","output":{{"hits":[{}]}}"#,
                        step % 11
                    ),
                )
            };
            for body in [call, result] {
                let line = format!(
                    r#"{{"v":1,"id":"{run}-{step}-{ts}","tenant":"t","run":"r{run}","ts_ms":{ts},{body}}}"#
                );
                engine.apply(&parse_event(line.as_bytes()).expect("valid"));
            }
        }
    }
    let sizes: Vec<usize> = engine
        .runs()
        .filter(|(_, _, run)| run.is_open())
        .map(|(_, id, run)| size_of::<RunState>() + heap_bytes(run) + 2 * id.len() + 64)
        .collect();
    let mut sorted = sizes.clone();
    sorted.sort_unstable();
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0);
    let max = sorted.last().copied().unwrap_or(0);
    println!(
        "{} open runs of {runs} (history_size 30): median {median} bytes, max {max} bytes of guard state per run",
        sizes.len()
    );
}
