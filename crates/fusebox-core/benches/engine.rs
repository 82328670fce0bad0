//! Gate + observe throughput on parsed events, one thread.
//!
//! `cargo bench -p fusebox-core --bench engine` — the figure to read is `thrpt` in
//! elements (events) per second. The trace mixes legitimate pagination, runaway repeats
//! and side effects over 1,000 interleaved runs, so every layer is exercised.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use fusebox_core::{Engine, Event, Policy, PolicySet};

#[path = "support/interleaved.rs"]
mod interleaved;

/// The mixed trace: pagination, a runaway repeat and side effects.
fn trace(events: usize) -> Vec<Event> {
    interleaved::interleaved(events, 1, |run, n, call| {
        interleaved::mixed(run % 3, run, n, call)
    })
}

fn gate_and_observe(c: &mut Criterion) {
    let events = trace(100_000);
    let mut group = c.benchmark_group("engine");
    group.throughput(Throughput::Elements(events.len() as u64));
    group.sample_size(20);
    group.bench_function("apply_100k_mixed", |b| {
        b.iter_batched(
            Engine::default,
            |mut engine| {
                for event in &events {
                    std::hint::black_box(engine.apply(event));
                }
                engine
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

/// Exec-style polls whose output text carries pids, session ids, timestamps and
/// durations (what `volatile_text` masks), over 1,000 interleaved runs.
fn exec_trace(events: usize) -> Vec<Event> {
    interleaved::interleaved(events, 1, |_, n, call| {
        if n % 2 == 1 {
            format!(
                r#""type":"tool_call","call_id":"c{call}","tool":"exec","args":{{"cmd":"make","step":{}}}"#,
                call / 4
            )
        } else {
            // The tokens depend only on the step, as the call does: masked or not, the
            // same results repeat, so both runs take the same decisions and the
            // difference between them is the scanning.
            let step = call / 4;
            format!(
                r#""type":"tool_result","call_id":"c{call}","tool":"exec","kind":"PENDING","output":{{"out":"[{}/9] still running (pid {}, session 9f3c{:04x}, 2026-12-01T09:{:02}:00Z, {}.5s)","lines":["cc -O2 -c src/file{step}.c","ok"]}}"#,
                step % 9,
                4000 + step,
                step,
                step % 60,
                step
            )
        }
    })
}

/// The cost of masking volatile tokens in text: the same exec trace with the built-in
/// masks on (the default) and off, in one run, so the ratio is free of machine noise.
/// Both take the same decisions (see `exec_trace`), so the ratio is the scanners' cost.
fn text_masking(c: &mut Criterion) {
    let events = exec_trace(100_000);
    let mut unmasked = Policy::default();
    unmasked.volatile_text.mask.clear();
    let mut group = c.benchmark_group("engine");
    group.throughput(Throughput::Elements(events.len() as u64));
    group.sample_size(20);
    for (name, policy) in [
        ("apply_100k_exec_text_masked", Policy::default()),
        ("apply_100k_exec_text_unmasked", unmasked),
    ] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || Engine::new(PolicySet::new(policy.clone())),
                |mut engine| {
                    for event in &events {
                        std::hint::black_box(engine.apply(event));
                    }
                    engine
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, gate_and_observe, text_masking);
criterion_main!(benches);
