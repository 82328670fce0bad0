//! Start-up = latest valid snapshot + tail, and it equals a full replay: for random
//! logs, batchings, snapshot points and retention, with damaged snapshots skipped.

mod common;

use std::time::Duration;

use common::{full_replay, open, options};
use fusebox_core::{Event, Sequencer};
use fusebox_log::workload::{Workload, WorkloadConfig};
use fusebox_log::{keys, EventLog, GuardOptions, LogState, SledLog, SledOptions, Tree, WriteBatch};
use proptest::prelude::*;

/// Workload events, perturbed the way delivery perturbs them: some re-delivered, some
/// swapped with their successor (out of `seq` order within a run, now and then).
fn delivered(
    seed: u64,
    runs: usize,
    len: usize,
    duplicate_every: usize,
    swap_every: usize,
) -> Vec<Event> {
    let mut events = Workload::new(WorkloadConfig {
        seed,
        concurrent_runs: runs,
        max_steps: 12,
        ..WorkloadConfig::default()
    })
    .batch(len);
    for i in (0..events.len()).step_by(swap_every).skip(1) {
        if i + 1 < events.len() {
            events.swap(i, i + 1);
        }
    }
    let copies: Vec<(usize, Event)> = (0..events.len())
        .step_by(duplicate_every)
        .map(|i| (i, events[i].clone()))
        .collect();
    for (offset, (i, event)) in copies.into_iter().enumerate() {
        let at = (i + offset + 3).min(events.len());
        events.insert(at, event);
    }
    events
}

/// The decisions a state gives to more events (applied straight to the engine, after
/// the same admission).
fn future_decisions(mut state: LogState, events: &[Event]) -> Vec<String> {
    let mut admission: Sequencer = state.applied.clone();
    let mut out = Vec::new();
    for event in events {
        if let Ok(fusebox_core::Admission::Ready(ready)) = admission.admit(event.clone()) {
            for event in ready {
                out.push(serde_json::to_string(&state.apply_event(&event)).unwrap());
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn snapshot_plus_tail_equals_full_replay(
        seed in 0u64..1_000,
        runs in 1usize..10,
        len in 20usize..400,
        batch in 1usize..50,
        snapshot_every in 1u64..80,
        duplicate_every in 5usize..40,
        swap_every in 3usize..30,
        retention_ms in proptest::option::of(20u64..400),
        ledger_retention_ms in proptest::option::of(20u64..400),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let options = GuardOptions {
            retention: retention_ms.map(Duration::from_millis),
            ledger_retention: ledger_retention_ms.map(Duration::from_millis),
            snapshots_kept: 3,
            ..options(snapshot_every)
        };
        let events = delivered(seed, runs, len, duplicate_every, swap_every);
        let mut guard = open(dir.path(), options.clone());
        for chunk in events.chunks(batch) {
            guard.submit_batch(chunk.to_vec()).unwrap();
        }
        let live = guard.state().clone();
        drop(guard);

        let guard = open(dir.path(), options);
        let replayed = full_replay(guard.log());
        prop_assert_eq!(guard.state(), &live);
        prop_assert_eq!(&replayed, &live);

        let more = Workload::new(WorkloadConfig { seed: seed + 1, concurrent_runs: runs, ..WorkloadConfig::default() }).batch(100);
        prop_assert_eq!(
            future_decisions(guard.state().clone(), &more),
            future_decisions(replayed, &more)
        );
    }
}

/// Damage done to the stored snapshots (newest first) before reopening.
type Damage = fn(usize, Vec<u8>) -> Option<Vec<u8>>;

#[test]
fn damaged_snapshots_are_skipped_for_an_older_one_or_a_full_replay() {
    let cases: [(&str, Damage); 5] = [
        ("newest truncated", |i, b| {
            (i == 0).then(|| b[..b.len() / 2].to_vec())
        }),
        ("newest bit flip", |i, mut b| {
            (i == 0).then(|| {
                let mid = b.len() / 2;
                b[mid] ^= 0x20;
                b
            })
        }),
        ("newest emptied", |i, _| (i == 0).then(Vec::new)),
        ("all garbage", |_, _| Some(b"not a snapshot".to_vec())),
        ("all torn after the header", |_, b| Some(b[..40].to_vec())),
    ];
    for (name, damage) in cases {
        let dir = tempfile::tempdir().unwrap();
        let mut guard = open(
            dir.path(),
            GuardOptions {
                snapshots_kept: 3,
                ..options(100)
            },
        );
        for chunk in Workload::new(WorkloadConfig::default())
            .batch(1_000)
            .chunks(64)
        {
            guard.submit_batch(chunk.to_vec()).unwrap();
        }
        let live = guard.state().clone();
        drop(guard);

        let mut log = SledLog::open(dir.path(), &SledOptions::default()).unwrap();
        let stored: Vec<(u64, Vec<u8>)> = fusebox_log::log::snapshot_positions(&log)
            .unwrap()
            .into_iter()
            .map(|pos| {
                let bytes = fusebox_log::log::snapshot_bytes(&log, pos)
                    .unwrap()
                    .unwrap();
                (pos, bytes)
            })
            .collect();
        assert_eq!(stored.len(), 3, "{name}");
        let mut batch = WriteBatch::default();
        for (i, (pos, bytes)) in stored.into_iter().enumerate() {
            if let Some(damaged) = damage(i, bytes) {
                replace_snapshot(&log, &mut batch, pos, &damaged);
            }
        }
        log.write(batch).unwrap();
        log.flush().unwrap();
        drop(log);

        let guard = open(dir.path(), options(100));
        assert_eq!(guard.state(), &live, "{name}");
        assert_eq!(full_replay(guard.log()), live, "{name}");
    }
}

/// Writes `bytes` in place of the snapshot at `pos`, in pieces as the writer does.
fn replace_snapshot(log: &SledLog, batch: &mut WriteBatch, pos: u64, bytes: &[u8]) {
    for item in log.scan_prefix(Tree::Snapshots, &keys::position(pos)) {
        batch.remove(Tree::Snapshots, item.unwrap().0.to_vec());
    }
    for (index, piece) in bytes.chunks(keys::SNAPSHOT_PIECE_BYTES).enumerate() {
        let key = keys::snapshot_piece(pos, index as u32);
        batch.insert(Tree::Snapshots, key.to_vec(), piece.to_vec());
    }
}

/// sled writes a value or node above a quarter segment (128 KiB) to a blob file it
/// never fsyncs, and its recovery drops every write after such a file that a power
/// loss tore. A snapshot far bigger than that must land in pieces, never in a blob.
#[test]
fn a_large_snapshot_is_stored_in_pieces_sled_keeps_out_of_blob_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut guard = open(dir.path(), options(0));
    let mut workload = Workload::new(WorkloadConfig {
        concurrent_runs: 1_000,
        ..WorkloadConfig::default()
    });
    for _ in 0..20 {
        guard.submit_batch(workload.batch(1_000)).unwrap();
    }
    guard.checkpoint().unwrap();
    let live = guard.state().clone();
    drop(guard);

    let log = SledLog::open(dir.path(), &SledOptions::default()).unwrap();
    let stats = fusebox_log::inspect::stats(&log).unwrap();
    assert_eq!(stats.snapshots, 1);
    assert!(
        stats.latest_snapshot_bytes > 2 * 128 * 1024,
        "the snapshot is large enough to have been a blob: {} bytes",
        stats.latest_snapshot_bytes
    );
    let blobs = std::fs::read_dir(dir.path().join("blobs"))
        .map(|files| files.count())
        .unwrap_or(0);
    assert_eq!(blobs, 0, "blob files in the log");
    drop(log);

    let guard = open(dir.path(), options(0));
    assert_eq!(guard.state(), &live);
}

/// A crash while a snapshot is written (or removed) leaves pieces without piece 0,
/// which the writer stores last: no reader sees them, and the next open removes them.
#[test]
fn a_torn_snapshot_is_invisible_and_removed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut guard = open(dir.path(), options(0));
    let mut workload = Workload::new(WorkloadConfig::default());
    guard.submit_batch(workload.batch(1_000)).unwrap();
    guard.checkpoint().unwrap();
    guard.submit_batch(workload.batch(1_000)).unwrap();
    guard.checkpoint().unwrap();
    let live = guard.state().clone();
    drop(guard);

    let mut log = SledLog::open(dir.path(), &SledOptions::default()).unwrap();
    let positions = fusebox_log::log::snapshot_positions(&log).unwrap();
    assert_eq!(positions.len(), 2);
    let newest = positions[0];
    let mut batch = WriteBatch::default();
    batch.remove(Tree::Snapshots, keys::snapshot_piece(newest, 0).to_vec());
    log.write(batch).unwrap();
    log.flush().unwrap();
    assert_eq!(
        fusebox_log::log::snapshot_positions(&log).unwrap(),
        positions[1..]
    );
    let report = fusebox_log::inspect::verify(&log).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    let stats = fusebox_log::inspect::stats(&log).unwrap();
    assert_eq!(
        (stats.snapshots, stats.torn_snapshots),
        (1, 1),
        "stats counts the torn snapshot as one"
    );
    assert_eq!(stats.latest_snapshot_position, Some(positions[1]));
    drop(log);

    let guard = open(dir.path(), options(0));
    assert_eq!(guard.state(), &live);
    drop(guard);
    let log = SledLog::open(dir.path(), &SledOptions::default()).unwrap();
    let left = log
        .scan_prefix(Tree::Snapshots, &keys::position(newest))
        .count();
    assert_eq!(left, 0, "pieces of the torn snapshot left");
    assert_eq!(fusebox_log::inspect::stats(&log).unwrap().torn_snapshots, 0);
}

/// A format-3 log keeps each snapshot whole under its position; a checkpoint at that
/// same position (nothing new since) must replace it, not add pieces beside it.
#[test]
fn a_checkpoint_replaces_a_whole_format_3_snapshot_at_its_position() {
    let dir = tempfile::tempdir().unwrap();
    let mut guard = open(dir.path(), options(0));
    guard
        .submit_batch(Workload::new(WorkloadConfig::default()).batch(2_000))
        .unwrap();
    guard.checkpoint().unwrap();
    let live = guard.state().clone();
    drop(guard);

    let mut log = SledLog::open(dir.path(), &SledOptions::default()).unwrap();
    let pos = live.position;
    let bytes = fusebox_log::log::snapshot_bytes(&log, pos)
        .unwrap()
        .unwrap();
    assert!(
        bytes.len() > keys::SNAPSHOT_PIECE_BYTES,
        "more than one piece"
    );
    let mut batch = WriteBatch::default();
    for item in log.scan_prefix(Tree::Snapshots, &keys::position(pos)) {
        batch.remove(Tree::Snapshots, item.unwrap().0.to_vec());
    }
    batch.insert(Tree::Snapshots, keys::position(pos).to_vec(), bytes);
    batch.insert(Tree::Meta, keys::FORMAT_VERSION_KEY.to_vec(), b"3".to_vec());
    log.write(batch).unwrap();
    log.flush().unwrap();
    drop(log);

    let mut guard = open(dir.path(), options(0));
    assert_eq!(
        guard.state(),
        &live,
        "the whole snapshot reads as one piece"
    );
    guard.checkpoint().unwrap();
    drop(guard);

    let log = SledLog::open(dir.path(), &SledOptions::default()).unwrap();
    let report = fusebox_log::inspect::verify(&log).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!(report.snapshots_matched, 1);
}

#[test]
fn garbage_in_place_of_the_log_is_a_clear_error_not_a_panic() {
    type Setup = fn(&std::path::Path) -> std::path::PathBuf;
    let cases: [(&str, Setup); 4] = [
        ("a regular file", |root| {
            let path = root.join("log");
            std::fs::write(&path, b"hello").unwrap();
            path
        }),
        ("garbage conf", |root| {
            let path = root.join("log");
            std::fs::create_dir(&path).unwrap();
            std::fs::write(path.join("conf"), [0xde; 64]).unwrap();
            path
        }),
        ("garbage db of a log", |root| {
            let path = root.join("log");
            let mut guard = open(&path, options(0));
            guard
                .submit_batch(Workload::new(WorkloadConfig::default()).batch(100))
                .unwrap();
            drop(guard);
            std::fs::write(path.join("db"), vec![0xab; 1 << 20]).unwrap();
            path
        }),
        ("garbage conf and db", |root| {
            let path = root.join("log");
            std::fs::create_dir(&path).unwrap();
            std::fs::write(path.join("conf"), b"segment_size: lots\n").unwrap();
            std::fs::write(path.join("db"), vec![0x5a; 4096]).unwrap();
            path
        }),
    ];
    for (name, setup) in cases {
        let root = tempfile::tempdir().unwrap();
        let path = setup(root.path());
        let error = match fusebox_log::Guard::open(&path, Default::default(), options(0)) {
            Ok(_) => panic!("{name}: garbage opened as a log"),
            Err(error) => error.to_string(),
        };
        assert!(
            error.contains(&path.display().to_string()),
            "{name}: {error}"
        );
        assert!(
            error.contains("fusebox log verify --data-dir"),
            "{name}: {error}"
        );
    }
}
