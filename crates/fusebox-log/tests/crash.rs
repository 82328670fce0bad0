//! Crash test: a child process appends the workload under load and is SIGKILLed at a
//! random moment, 100 times (25 logs, four crashes each). After each crash the log must
//! reopen, hold a prefix of what was submitted, hold every event whose decision was
//! returned, verify clean, and rebuild to exactly what a full replay gives.

mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{full_replay, open, options};
use fusebox_core::Event;
use fusebox_log::workload::{Workload, WorkloadConfig};
use fusebox_log::{inspect, log, EventLog, GuardOptions, Record};

const CHILD: &str = "FUSEBOX_LOG_CRASH_CHILD";
const LOGS: u64 = 25;
const CRASHES_PER_LOG: u64 = 4;
const READY: &str = "ready";

fn workload() -> Workload {
    Workload::new(WorkloadConfig {
        seed: 7,
        concurrent_runs: 64,
        ..WorkloadConfig::default()
    })
}

fn child_options() -> GuardOptions {
    GuardOptions {
        snapshot_every_records: 400,
        snapshots_kept: 2,
        ..options(400)
    }
}

fn events_in(log: &impl EventLog) -> Vec<Event> {
    log::records(log, 1)
        .filter_map(|item| match item.unwrap().1 {
            Record::Event(event) => Some(*event),
            Record::Op(_) => None,
        })
        .collect()
}

/// Appends the workload from where the log ends, printing each acknowledged id.
fn child(dir: &Path, seed: u64) {
    let mut guard = open(dir, child_options());
    let done = events_in(guard.log()).len();
    let mut events = workload().skip(done);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{READY}").unwrap();
    out.flush().unwrap();
    let mut rng = seed | 1;
    let mut previous: Option<Event> = None;
    loop {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let mut batch: Vec<Event> = events.by_ref().take(1 + (rng % 64) as usize).collect();
        // Re-deliveries ride along now and then; they must not reach the log twice.
        if let Some(again) = previous.take().filter(|_| rng.is_multiple_of(3)) {
            batch.insert(0, again);
        }
        previous = batch.last().cloned();
        let ids: Vec<String> = batch.iter().map(|e| e.id.clone()).collect();
        guard.submit_batch(batch).unwrap();
        for id in ids {
            writeln!(out, "{id}").unwrap();
        }
        out.flush().unwrap();
    }
}

struct Crash {
    acked: Vec<String>,
}

/// Runs the child, kills it at a moment picked from `roll`, returns what it acked.
fn crash_once(dir: &Path, roll: u64) -> Crash {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(CHILD, dir)
        .env("FUSEBOX_LOG_CRASH_SEED", roll.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the crash child");
    let stdout = child.stdout.take().unwrap();
    let (lines, received) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    // One crash in five lands anywhere, start-up and recovery included; the others
    // while appending.
    if !roll.is_multiple_of(5) {
        let ready = received.recv_timeout(Duration::from_secs(20));
        assert_eq!(ready.as_deref(), Ok(READY), "the child did not start");
    }
    std::thread::sleep(Duration::from_millis(roll % 150));
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
    let acked = received.try_iter().filter(|line| line != READY).collect();
    Crash { acked }
}

/// The workload, generated as far as the logs have got.
struct Expected {
    source: Workload,
    events: Vec<Event>,
}

impl Expected {
    fn get(&mut self, i: usize) -> &Event {
        while self.events.len() <= i {
            self.events.push(self.source.next().unwrap());
        }
        &self.events[i]
    }
}

/// A well-mixed pseudo-random number for crash number `n` (splitmix64 finaliser).
fn mix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn check(dir: &Path, acked: &HashSet<String>, expected: &mut Expected) -> usize {
    let guard = open(dir, child_options());
    let stored = events_in(guard.log());
    let mut ids = HashSet::new();
    for (i, event) in stored.into_iter().enumerate() {
        assert_eq!(
            &event,
            expected.get(i),
            "record {i} is not the event written there"
        );
        ids.insert(event.id);
    }
    let lost: Vec<_> = acked.difference(&ids).collect();
    assert!(lost.is_empty(), "acknowledged but lost: {lost:?}");
    assert_eq!(&full_replay(guard.log()), guard.state());
    let len = ids.len();
    drop(guard);
    let report = inspect::verify(&inspect::open(dir).unwrap()).unwrap();
    assert!(report.is_ok(), "{report:#?}");
    len
}

fn main() {
    if let Ok(dir) = std::env::var(CHILD) {
        let seed = std::env::var("FUSEBOX_LOG_CRASH_SEED")
            .unwrap()
            .parse()
            .unwrap();
        child(Path::new(&dir), seed);
        return;
    }
    let started = Instant::now();
    let mut expected = Expected {
        source: workload(),
        events: Vec::new(),
    };
    let mut total_acked = 0;
    let mut longest = 0;
    for log_index in 0..LOGS {
        let dir = tempfile::tempdir().unwrap();
        let mut acked = HashSet::new();
        for crash in 0..CRASHES_PER_LOG {
            let roll = mix(log_index * CRASHES_PER_LOG + crash);
            let outcome = crash_once(dir.path(), roll);
            total_acked += outcome.acked.len();
            acked.extend(outcome.acked);
            longest = longest.max(check(dir.path(), &acked, &mut expected));
        }
    }
    println!(
        "crash: {} SIGKILLs, {total_acked} acknowledged events all durable, longest log {longest} events, {:.1}s",
        LOGS * CRASHES_PER_LOG,
        started.elapsed().as_secs_f64()
    );
}
