//! `fusebox log export | verify | stats` on real logs.

mod common;

use common::{open, options};
use fusebox_core::{parse_event, Engine, PolicySet};
use fusebox_log::record::{decode_frame, FrameEntry, FrameWriter};
use fusebox_log::workload::{Workload, WorkloadConfig};
use fusebox_log::{inspect, log, EventLog, SledLog, Tree, WriteBatch};

fn written_log(events: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut guard = open(dir.path(), options(500));
    let workload = Workload::new(WorkloadConfig {
        concurrent_runs: 32,
        ..WorkloadConfig::default()
    });
    let events: Vec<_> = workload.take(events).collect();
    for chunk in events.chunks(100) {
        guard.submit_batch(chunk.to_vec()).unwrap();
    }
    dir
}

#[test]
fn the_export_replayed_through_a_fresh_engine_reproduces_the_recorded_decisions() {
    let dir = written_log(3_000);
    let log = inspect::open(dir.path()).unwrap();
    let mut jsonl = Vec::new();
    let summary = inspect::export(&log, &mut jsonl).unwrap();
    assert_eq!(summary.events, 3_000);
    assert_eq!(summary.operations_skipped, 1, "the initial policy record");

    let recorded: Vec<Vec<u8>> = log::frames(&log, 1)
        .flat_map(|frame| {
            let (_, bytes) = frame.unwrap();
            decode_frame(&bytes)
                .unwrap()
                .entries()
                .filter(|entry| !entry.is_op)
                .map(|entry| serde_json::to_vec(&entry.decode_decision().unwrap()).unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    let mut engine = Engine::new(PolicySet::default());
    let replayed: Vec<Vec<u8>> = jsonl
        .split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| serde_json::to_vec(&engine.apply(&parse_event(line).unwrap())).unwrap())
        .collect();
    assert_eq!(replayed.len(), recorded.len());
    assert!(replayed == recorded, "decisions differ");
}

#[test]
fn verify_passes_a_good_log_and_names_each_kind_of_damage() {
    let dir = written_log(1_200);
    let report = inspect::verify(&inspect::open(dir.path()).unwrap()).unwrap();
    assert!(report.is_ok(), "{report:#?}");
    assert_eq!((report.events, report.decisions_matched), (1_200, 1_200));
    assert_eq!(report.snapshots_matched, 2);

    type Tamper = fn(&mut WriteBatch, &SledLog);
    let cases: [(&str, Tamper, &str); 5] = [
        (
            "altered decision",
            |b, log| rewrite(b, log, 10, |_, decision| *decision = br#"{"v":1}"#.to_vec()),
            "decision at position 10",
        ),
        (
            "missing record",
            |b, log| {
                let (key, _) = log
                    .floor(Tree::Events, &600u64.to_be_bytes())
                    .unwrap()
                    .unwrap();
                b.remove(Tree::Events, key.to_vec());
            },
            "records are missing",
        ),
        (
            "unparsable event",
            |b, log| rewrite(b, log, 7, |record, _| *record = b"{not json".to_vec()),
            "position 7",
        ),
        (
            "ledger drift",
            |b, _| b.insert(Tree::Ledger, b"tenant-0\0bogus".to_vec(), b"{}".to_vec()),
            "ledger entry",
        ),
        (
            "damaged snapshot",
            |b, _| b.insert(Tree::Snapshots, 501u64.to_be_bytes(), b"FBSNAP2\n".to_vec()),
            "snapshot at position 501",
        ),
    ];
    for (name, tamper, expected) in cases {
        let dir = written_log(1_200);
        let mut log = inspect::open(dir.path()).unwrap();
        let mut batch = WriteBatch::default();
        tamper(&mut batch, &log);
        log.write(batch).unwrap();
        let report = inspect::verify(&log).unwrap();
        assert!(
            report.problems.iter().any(|p| p.contains(expected)),
            "{name}: {:#?}",
            report.problems
        );
    }
}

#[test]
fn stats_count_what_the_log_holds() {
    let dir = written_log(2_000);
    let stats = inspect::stats(&inspect::open(dir.path()).unwrap()).unwrap();
    assert_eq!(
        (stats.events, stats.decisions, stats.operations),
        (2_000, 2_000, 1)
    );
    assert_eq!(stats.snapshots, 2);
    assert_eq!(stats.latest_snapshot_position, Some(1_501));
    assert!(stats.runs > 32 && stats.ledger_keys > 0);
    assert!(stats.disk_bytes > 0 && stats.logical_bytes > 2_000 * 100);
    assert!(inspect::open(&dir.path().join("missing")).is_err());
}

/// Stages the frame holding `pos` rewritten with that position's record and decision
/// changed by `change`.
fn rewrite(
    batch: &mut WriteBatch,
    log: &SledLog,
    pos: u64,
    change: fn(&mut Vec<u8>, &mut Vec<u8>),
) {
    let (key, bytes) = log
        .floor(Tree::Events, &pos.to_be_bytes())
        .unwrap()
        .unwrap();
    let first = u64::from_be_bytes(key.as_ref().try_into().unwrap());
    let mut writer = FrameWriter::default();
    let frame = decode_frame(&bytes).unwrap();
    for (at, entry) in (first..).zip(frame.entries()) {
        let (mut record, mut decision) = (entry.record.to_vec(), entry.decision.to_vec());
        if at == pos {
            change(&mut record, &mut decision);
        }
        let changed = FrameEntry {
            record: &record,
            decision: &decision,
            ..entry
        };
        writer.push_raw(at, &changed);
    }
    for (first, frame) in writer.into_frames() {
        batch.insert(Tree::Events, first.to_be_bytes(), frame);
    }
}
