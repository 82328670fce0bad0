//! Durable appends: a batch of 1,000 workload events made durable with one flush
//! (group commit), and one event appended and flushed on its own (the latency an
//! inline gate request pays). Start-up, replay rate and space figures are measured by
//! `examples/log_bench.rs` (they need a million-event log, too slow to rebuild per
//! criterion sample).

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fusebox_core::PolicySet;
use fusebox_log::workload::{Workload, WorkloadConfig};
use fusebox_log::{Guard, GuardOptions};

fn durable_appends(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut guard = Guard::open(dir.path(), PolicySet::default(), GuardOptions::default()).unwrap();
    let mut workload = Workload::new(WorkloadConfig {
        concurrent_runs: 1_000,
        ..WorkloadConfig::default()
    });
    let mut group = c.benchmark_group("durable_append");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(8));

    group.throughput(Throughput::Elements(1_000));
    group.bench_function("group_commit_batch_1000", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                let batch = workload.batch(1_000);
                let started = Instant::now();
                guard.submit_batch(batch).unwrap();
                spent += started.elapsed();
            }
            spent
        })
    });

    group.throughput(Throughput::Elements(1));
    group.bench_function("single_event_append_and_flush", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                let event = workload.next().unwrap();
                let started = Instant::now();
                guard.submit(event).unwrap();
                spent += started.elapsed();
            }
            spent
        })
    });
    group.finish();
}

criterion_group!(benches, durable_appends);
criterion_main!(benches);
