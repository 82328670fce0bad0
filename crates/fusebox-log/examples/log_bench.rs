//! The log's figures at scale: writes a million-event workload log with group commit,
//! then measures single-append latency (p50/p99, while a snapshot is written and between
//! snapshots) beside the disk's own floor (a 4 KiB append + `fdatasync` of a plain file
//! in the same directory, measured in the same run), start-up to ready (snapshot +
//! tail) and the full replay rate (each three times, with the median: one sample swings
//! with the virtual machine's speed), on-disk bytes per event and sled's space
//! amplification. Each timed phase also prints the process's CPU time: on a machine
//! shared with other builds the wall-clock rates follow the load, CPU time much less.
//!
//! `cargo run --release -p fusebox-log --example log_bench -- [EVENTS] [BATCH]`

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use fusebox_core::PolicySet;
use fusebox_log::workload::{Workload, WorkloadConfig};
use fusebox_log::{inspect, log, Guard, GuardOptions, LogState};

/// The allocator fuseboxd and the `fusebox` CLI use, so the figures are theirs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>().expect("a number"));
    let events = args.next().unwrap_or(1_000_000);
    let batch = args.next().unwrap_or(1_000);
    let dir = tempfile::tempdir().unwrap();
    let options = GuardOptions::default();
    let mut workload = Workload::new(WorkloadConfig {
        concurrent_runs: 1_000,
        ..WorkloadConfig::default()
    });

    let mut guard = Guard::open(dir.path(), PolicySet::default(), options.clone()).unwrap();
    let mut spent = Duration::ZERO;
    let mut cpu = Duration::ZERO;
    let mut written = 0;
    while written < events {
        let chunk = workload.batch(batch.min(events - written));
        written += chunk.len();
        let (started, cpu_started) = (Instant::now(), cpu_time());
        guard.submit_batch(chunk).unwrap();
        spent += started.elapsed();
        cpu += cpu_time().saturating_sub(cpu_started);
    }
    println!(
        "group commit: {written} events in batches of {batch}: {:.2}s, {:.0} events/s, CPU {:.2}s = {:.0} events per CPU-second (snapshots every {} records included)",
        spent.as_secs_f64(),
        written as f64 / spent.as_secs_f64(),
        cpu.as_secs_f64(),
        written as f64 / cpu.as_secs_f64(),
        options.snapshot_every_records
    );

    // The group commit ended on a snapshot point, so the writer is now encoding and
    // writing a full snapshot while these appends commit; then the same without one.
    let during = single_appends(&mut guard, &mut workload);
    guard.checkpoint().unwrap();
    let between = single_appends(&mut guard, &mut workload);
    let floor = disk_floor(dir.path());
    let pct = |latencies: &[Duration], p: f64| {
        latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)]
    };
    println!(
        "disk floor, 4 KiB append + fdatasync of a plain file: p50 {:?}, p99 {:?}, max {:?} ({} samples)",
        pct(&floor, 0.50),
        pct(&floor, 0.99),
        floor.last().unwrap(),
        floor.len()
    );
    for (when, latencies) in [
        ("while a snapshot is written", during),
        ("between snapshots", between),
    ] {
        let ratio = |p: f64| pct(&latencies, p).as_secs_f64() / pct(&floor, p).as_secs_f64();
        println!(
            "single append+flush {when}: p50 {:?}, p99 {:?}, max {:?} ({} samples); {:.1}x / {:.1}x the disk floor",
            pct(&latencies, 0.50),
            pct(&latencies, 0.99),
            latencies.last().unwrap(),
            latencies.len(),
            ratio(0.50),
            ratio(0.99)
        );
    }
    guard.checkpoint().unwrap();
    let tail = workload.batch(5_000);
    guard.submit_batch(tail).unwrap();
    let position = guard.position();
    drop(guard);

    let mut ready = Vec::new();
    for _ in 0..RUNS {
        let (started, cpu_started) = (Instant::now(), cpu_time());
        let guard = Guard::open(dir.path(), PolicySet::default(), options.clone()).unwrap();
        let (wall, cpu) = (started.elapsed(), cpu_time().saturating_sub(cpu_started));
        assert_eq!(guard.position(), position);
        println!(
            "start-up to ready: {:.2}s (CPU {:.2}s) for {position} records, {} runs (latest snapshot + 5000-record tail)",
            wall.as_secs_f64(),
            cpu.as_secs_f64(),
            guard.engine().run_count()
        );
        ready.push(wall.as_secs_f64());
    }
    println!("start-up to ready, median of {RUNS}: {:.2}s", median(ready));

    let guard = Guard::open(dir.path(), PolicySet::default(), options).unwrap();
    let mut rates = Vec::new();
    for _ in 0..RUNS {
        let (started, cpu_started) = (Instant::now(), cpu_time());
        let mut state = LogState::new(fusebox_core::sequencer::DEFAULT_MAX_HELD);
        log::replay_into(guard.log(), &mut state).unwrap();
        let (wall, cpu) = (started.elapsed(), cpu_time().saturating_sub(cpu_started));
        assert_eq!(&state, guard.state());
        let rate = position as f64 / wall.as_secs_f64();
        println!(
            "full replay: {position} records in {:.2}s, {rate:.0} records/s (CPU {:.2}s on two threads)",
            wall.as_secs_f64(),
            cpu.as_secs_f64()
        );
        rates.push(rate);
    }
    println!(
        "full replay, median of {RUNS}: {:.0} records/s",
        median(rates)
    );
    drop(guard);

    let stats = inspect::stats(&inspect::open(dir.path()).unwrap()).unwrap();
    println!(
        "space: {} events, {:.1} MB on disk, {:.0} disk bytes/event, {:.1} MB logical, space amplification {:.2}, latest snapshot {:.1} MB",
        stats.events,
        stats.disk_bytes as f64 / 1e6,
        stats.disk_bytes_per_event(),
        stats.logical_bytes as f64 / 1e6,
        stats.space_amplification(),
        stats.latest_snapshot_bytes as f64 / 1e6,
    );
}

/// Start-up and replay are measured this many times.
const RUNS: usize = 3;

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Latencies of 2,000 appends of 4 KiB to a plain file, each followed by `fdatasync`,
/// sorted: what one durable write costs on this disk, with nothing of sled or fusebox.
fn disk_floor(dir: &Path) -> Vec<Duration> {
    let path = dir.join("disk-floor");
    let file = File::create(&path).unwrap();
    let block = [0x5a_u8; 4096];
    let mut latencies: Vec<Duration> = (0..2_000u64)
        .map(|i| {
            let started = Instant::now();
            file.write_all_at(&block, i * block.len() as u64).unwrap();
            file.sync_data().unwrap();
            started.elapsed()
        })
        .collect();
    std::fs::remove_file(path).unwrap();
    latencies.sort();
    latencies
}

/// Latencies of 2,000 appends, each committed alone, sorted.
fn single_appends(guard: &mut Guard, workload: &mut Workload) -> Vec<Duration> {
    let mut latencies: Vec<Duration> = (0..2_000)
        .map(|_| {
            let event = workload.next().unwrap();
            let started = Instant::now();
            guard.submit(event).unwrap();
            started.elapsed()
        })
        .collect();
    latencies.sort();
    latencies
}

/// CPU time of this process (all threads, user + system) from `/proc/self/stat`, in
/// Linux's fixed 100 ticks a second; zero where there is no `/proc`.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name may hold spaces: fields are counted after its closing ')',
    // where `state` is field 3, so utime (14) and stime (15) are at 11 and 12.
    let fields: Vec<u64> = stat
        .rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|f| f.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    Duration::from_millis(fields.iter().sum::<u64>() * 10)
}
