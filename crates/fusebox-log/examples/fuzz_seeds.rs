//! Writes the seed corpora under `fuzz/corpus/<target>/` from the project's own inputs:
//! the contract fixtures (events), the log's writers (frames, snapshot payloads), the
//! shipped configs (policy). Small on purpose: the fuzzer grows its working corpus
//! elsewhere (`scripts/fuzz.sh`), and only these are committed. An example of this crate,
//! not a bin of the fuzz workspace, so it builds on stable with the workspace's target:
//! `cargo run -p fusebox-log --example fuzz_seeds`. (The subject seeds are plain text
//! files, written by hand.)

use std::fs;
use std::path::{Path, PathBuf};

use fusebox_core::parse_event;
use fusebox_log::record::{FrameWriter, LogOp, OpRef, RunRef};
use fusebox_log::workload::{Workload, WorkloadConfig};
use fusebox_log::{snapshot, LogState};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = root().join("fuzz/corpus").join(target);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(name), bytes).unwrap();
}

fn main() {
    // Events: every fixture line, once per event type and shape (the first 40).
    let mut events = Vec::new();
    let fixtures = root().join("crates/fusebox-core/tests/fixtures");
    let mut files: Vec<_> = fs::read_dir(&fixtures)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    for file in files {
        for line in fs::read_to_string(&file).unwrap().lines() {
            if let Ok(event) = parse_event(line.as_bytes()) {
                events.push(event);
            }
        }
    }
    events.extend(Workload::new(WorkloadConfig::default()).take(400));
    let mut seen = std::collections::BTreeSet::new();
    let mut n = 0;
    for event in &events {
        let json = serde_json::to_vec(event).unwrap();
        // One seed per event type and set of fields: enough shapes, few files.
        let shape: Vec<String> =
            serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&json)
                .unwrap()
                .keys()
                .cloned()
                .collect();
        if seen.insert((event.type_name(), shape)) {
            write("event_parse", &format!("e{n:03}.json"), &json);
            n += 1;
        }
    }
    for (i, extra) in [
        &br#"{"v":1,"id":"x1","tenant":"t","run":"r","ts_ms":1,"type":"resume","by":"ops","evidence":{"approval_id":"A-1"}}"#[..],
        br#"{"v":1,"id":"x2","tenant":"t","run":"r","ts_ms":2,"type":"instance_launched","provider":"aws","region":"us-east-1","instance_id":"i-1","max_lifetime_s":60}"#,
        br#"{"v":1,"id":"x3","tenant":"t","run":"r","ts_ms":3,"type":"model_turn","stop_reason":"end_turn","usage":{"input_tokens":5,"cache_read_input_tokens":7},"cost_usd":0.125,"valid":true}"#,
        br#"{"v":1,"id":"x4","tenant":"t","run":"r","ts_ms":4,"type":"run_started","agent":"a","tools":["x","y"],"policy":{"max_steps":9,"tools":{"x":{"poll":{"wait_ms":5}}}}}"#,
        br#"{"v":1,"id":"x5","tenant":"t","run":"r","ts_ms":5,"type":"tick"}"#,
        br#"{"v":1,"id":"x6","tenant":"t","run":"r","ts_ms":6,"type":"ledger_resolve","op_key":"k","resolution":"completed","output":{"sent":true},"by":"ops","reason":"mail log"}"#,
        // A child run of a tree, with the subtree budgets a root sets.
        br#"{"v":1,"id":"x7","tenant":"t","run":"c","ts_ms":6,"type":"run_started","agent":"sub","parent":"r","policy":{"max_children":3,"max_depth":2,"max_open_children":2}}"#,
        // A reservation before a model call, and one without an estimate.
        br#"{"v":1,"id":"x8","tenant":"t","run":"r","ts_ms":8,"type":"model_call","estimate_tokens":1200,"estimate_usd":0.02}"#,
        br#"{"v":1,"id":"x9","tenant":"t","run":"r","ts_ms":9,"type":"model_call"}"#,
        br#"{"v":1,"id":"x10","tenant":"t","run":"r","ts_ms":10,"type":"prompt"}"#,
    ]
    .iter()
    .enumerate()
    {
        write("event_parse", &format!("x{i}.json"), extra);
    }

    // Frames: workload events with their decisions, and every operation kind.
    let mut state = LogState::new(16);
    let mut pos = 0;
    for chunk in events.chunks(25).take(6) {
        let mut writer = FrameWriter::default();
        for event in chunk {
            pos += 1;
            let decision = state.apply_event(event);
            writer.push_event(pos, event, &decision).unwrap();
        }
        for (first, bytes) in writer.into_frames() {
            write("log_frame", &format!("f{first:04}.bin"), &bytes);
        }
    }
    let mut writer = FrameWriter::default();
    let ops = [
        LogOp::SetPolicies {
            policies: Default::default(),
        },
        LogOp::Prune {
            runs: vec![RunRef {
                tenant: "t".into(),
                run: "r".into(),
            }],
        },
        LogOp::ForgetOperations {
            operations: vec![OpRef {
                tenant: "t".into(),
                op_key: "k".into(),
            }],
        },
        LogOp::AdoptOperations { operations: vec![] },
    ];
    for (i, op) in ops.iter().enumerate() {
        writer.push_op(i as u64 + 1, op).unwrap();
    }
    for (first, bytes) in writer.into_frames() {
        write("log_frame", &format!("ops{first}.bin"), &bytes);
    }

    // Snapshot payloads: the decompressed MessagePack of an empty and a busy state.
    let payload = |state: &LogState| {
        let bytes = snapshot::encode(state).unwrap();
        lz4_flex::decompress_size_prepended(&bytes[40..]).unwrap()
    };
    write(
        "snapshot_decode",
        "empty.msgpack",
        &payload(&LogState::new(16)),
    );
    write("snapshot_decode", "busy.msgpack", &payload(&state));

    // Policy: the shipped configs and a few layered documents.
    for entry in fs::read_dir(root().join("config")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            write("policy_config", &name, &fs::read(&path).unwrap());
        }
    }
    write(
        "policy_config",
        "layers.toml",
        b"[guard]\npreset = \"strict\"\n[policy]\nwarning_threshold = 9\ncritical_threshold = 2\n[agents.a.policy]\nping_pong_limit = 1\n[agents.a.policy.tools.poll_job.poll]\ncritical_threshold = 1\n[run]\nhistory_size = 0\nchurn_min_repeats = 7\n",
    );
}
