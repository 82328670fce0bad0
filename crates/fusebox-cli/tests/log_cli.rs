//! `fusebox log export | replay` round trip: what the daemon recorded, exported and
//! replayed offline, gives the same decisions byte for byte.

use std::io::Write;
use std::process::{Command, Stdio};

use fusebox_core::{parse_event, Decision, EventBody, PolicySet};
use fusebox_log::{Guard, GuardOptions, Outcome};

const FUSEBOX: &str = env!("CARGO_BIN_EXE_fusebox");

#[test]
fn an_exported_log_replays_to_the_recorded_decisions() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fixtures = format!(
        "{}/../fusebox-core/tests/fixtures",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut recorded: Vec<Decision> = Vec::new();
    {
        let mut guard = Guard::open(dir.path(), PolicySet::default(), GuardOptions::default())
            .expect("log opens");
        for name in [
            "exact-repeat.jsonl",
            "duplicate-side-effect.jsonl",
            "pagination-ok.jsonl",
        ] {
            let text = std::fs::read_to_string(format!("{fixtures}/{name}")).expect("fixture");
            let events: Vec<_> = text
                .lines()
                .map(|l| parse_event(l.as_bytes()).expect("valid"))
                .collect();
            let kinds: Vec<bool> = events
                .iter()
                .map(|e| matches!(e.body, EventBody::ToolCall(_) | EventBody::ToolResult(_)))
                .collect();
            let outcomes = guard.submit_batch(events).expect("durable");
            for (outcome, gate_or_result) in outcomes.into_iter().zip(kinds) {
                let Outcome::Applied(decisions) = outcome else {
                    panic!("in-order events apply")
                };
                // `replay` prints calls' and results' decisions, and the notable rest.
                recorded.extend(
                    decisions
                        .into_iter()
                        .filter(|d| gate_or_result || d.is_notable()),
                );
            }
        }
    }
    let export = Command::new(FUSEBOX)
        .args([
            "log",
            "--data-dir",
            dir.path().to_str().expect("utf-8"),
            "export",
        ])
        .output()
        .expect("fusebox runs");
    assert!(
        export.status.success(),
        "{}",
        String::from_utf8_lossy(&export.stderr)
    );

    let mut replay = Command::new(FUSEBOX)
        .args(["replay", "--quiet", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("fusebox runs");
    let mut stdin = replay.stdin.take().expect("stdin");
    let feeder = std::thread::spawn(move || stdin.write_all(&export.stdout).expect("written"));
    let out = replay.wait_with_output().expect("finished");
    feeder.join().expect("fed");
    assert!(out.status.success());
    let replayed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with("{\"summary\""))
        .map(str::to_owned)
        .collect();
    let expected: Vec<String> = recorded
        .iter()
        .map(|d| serde_json::to_string(d).expect("serialises"))
        .collect();
    assert_eq!(replayed, expected);

    let verify = Command::new(FUSEBOX)
        .args([
            "log",
            "--data-dir",
            dir.path().to_str().expect("utf-8"),
            "verify",
        ])
        .output()
        .expect("fusebox runs");
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
}
