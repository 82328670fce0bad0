//! `fusebox replay` as scripts use it: a real process, files and stdin, exit codes.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

const FUSEBOX: &str = env!("CARGO_BIN_EXE_fusebox");

fn fixture(name: &str) -> String {
    format!(
        "{}/../fusebox-core/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("every stdout line is JSON"))
        .collect()
}

#[test]
fn replays_fixtures_into_decisions_and_summaries() {
    let out = Command::new(FUSEBOX)
        .args([
            "replay",
            "--quiet",
            &fixture("exact-repeat.jsonl"),
            &fixture("pagination-ok.jsonl"),
        ])
        .output()
        .expect("fusebox runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = lines(&out.stdout);
    let summaries: Vec<&Value> = lines.iter().filter_map(|l| l.get("summary")).collect();
    assert_eq!(summaries.len(), 2);
    let runaway = summaries
        .iter()
        .find(|s| s["run"] == "exact-repeat")
        .expect("a summary");
    assert_eq!(runaway["terminal_state"], "STOPPED_LOOP_GUARD");
    assert!(runaway["calls_executed"].as_u64().expect("a count") <= 4);
    let legit = summaries
        .iter()
        .find(|s| s["run"] == "pagination-ok")
        .expect("a summary");
    assert_eq!(legit["terminal_state"], "COMPLETED");
    // Every tool_call and tool_result got exactly one decision line.
    assert_eq!(lines.len() - 2, 16 + 28);
}

#[test]
fn bad_lines_are_reported_with_their_place_and_the_good_ones_still_count() {
    let good = std::fs::read_to_string(fixture("permission-denied.jsonl")).expect("fixture");
    let mut input: Vec<String> = good.lines().map(str::to_owned).collect();
    input.insert(1, "{not json".to_owned());
    input.insert(
        3,
        r#"{"v":1,"id":"x","tenant":"demo","run":"permission-denied","ts_ms":1,"type":"warp"}"#
            .to_owned(),
    );
    let mut child = Command::new(FUSEBOX)
        .args(["replay", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fusebox runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.join("\n").as_bytes())
        .expect("written");
    let out = child.wait_with_output().expect("finished");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("-:2: malformed_json"), "{stderr}");
    assert!(stderr.contains("-:4: unknown_type"), "{stderr}");
    let lines = lines(&out.stdout);
    let actions: Vec<&str> = lines.iter().filter_map(|l| l["action"].as_str()).collect();
    assert_eq!(actions, ["execute", "stop", "stop"]);
}

/// An instance of a cloud the daemon's watchdog would not watch is refused with its
/// line, as fuseboxd refuses it on the wire (`unwatched_provider`); the other runs
/// are undisturbed. Without a watchdog (`[watchdog] enabled = false`) every launch is.
#[test]
fn an_instance_nobody_would_watch_is_reported_with_its_line() {
    let launch = |run: &str, provider: &str| {
        format!(
            r#"{{"v":1,"id":"{run}-i","tenant":"t","run":"{run}","ts_ms":2,"type":"instance_launched","provider":"{provider}","region":"us-east-1","instance_id":"i-{run}"}}"#
        )
    };
    let input = [
        launch("watched", "ec2"),
        launch("elsewhere", "gcp"),
        r#"{"v":1,"id":"f","tenant":"t","run":"watched","ts_ms":3,"type":"run_finished"}"#
            .to_owned(),
    ]
    .join("\n");
    let dir = tempfile::tempdir().expect("tempdir");
    let no_watchdog = dir.path().join("fusebox.toml");
    std::fs::write(&no_watchdog, "[watchdog]\nenabled = false\n").expect("config");
    let cases: [(&[&str], &[&str]); 2] = [
        (
            &[],
            &["-:2: unwatched_provider: instance i-elsewhere of provider \"gcp\""],
        ),
        (
            &["--policy", no_watchdog.to_str().unwrap()],
            &[
                "-:1: unwatched_provider: instance i-watched",
                "-:2: unwatched_provider: instance i-elsewhere",
                "runs no cloud watchdog",
            ],
        ),
    ];
    for (flags, expected) in cases {
        let mut child = Command::new(FUSEBOX)
            .arg("replay")
            .args(flags)
            .arg("-")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("fusebox runs");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("written");
        let out = child.wait_with_output().expect("finished");
        assert_eq!(out.status.code(), Some(2), "{flags:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        for want in expected {
            assert!(stderr.contains(want), "{flags:?}: {want:?} in {stderr}");
        }
        // The watched run's own events still apply: it finishes.
        let summaries: Vec<Value> = lines(&out.stdout)
            .into_iter()
            .filter_map(|l| l.get("summary").cloned())
            .collect();
        assert!(
            summaries
                .iter()
                .any(|s| s["run"] == "watched" && s["terminal_state"] == "COMPLETED"),
            "{flags:?}: {summaries:?}"
        );
    }
}

#[test]
fn a_missing_file_is_a_clear_error() {
    let out = Command::new(FUSEBOX)
        .args(["replay", "/nonexistent/trace.jsonl"])
        .output()
        .expect("fusebox runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/trace.jsonl"));
}

#[test]
fn a_policy_file_and_a_preset_change_the_outcome() {
    let dir = tempfile::tempdir().expect("temp dir");
    let policy = dir.path().join("fusebox.toml");
    std::fs::write(
        &policy,
        "[guard]\npreset = \"strict\"\n[policy]\nmax_steps = 3\n",
    )
    .expect("written");
    let out = Command::new(FUSEBOX)
        .args([
            "replay",
            "--quiet",
            "--policy",
            policy.to_str().expect("utf-8"),
            &fixture("pagination-ok.jsonl"),
        ])
        .output()
        .expect("fusebox runs");
    let lines = lines(&out.stdout);
    let summary = &lines.last().expect("a summary")["summary"];
    // The run's own policy says max_steps 20; a run's overrides win over the file.
    assert_eq!(summary["terminal_state"], "COMPLETED");

    std::fs::write(&policy, "[policy]\nsame_cal_limit = 3\n").expect("written");
    let out = Command::new(FUSEBOX)
        .args([
            "replay",
            "--policy",
            policy.to_str().expect("utf-8"),
            &fixture("pagination-ok.jsonl"),
        ])
        .output()
        .expect("fusebox runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("same_cal_limit"));
}

#[test]
fn the_generator_is_deterministic_and_its_trace_replays_cleanly() {
    let run = |seed: &str| {
        Command::new(FUSEBOX)
            .args(["generate", "--events", "5000", "--seed", seed])
            .output()
            .expect("fusebox runs")
            .stdout
    };
    let trace = run("7");
    assert_eq!(trace, run("7"));
    assert_ne!(trace, run("8"));
    let mut child = Command::new(FUSEBOX)
        .args(["replay", "--quiet", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fusebox runs");
    // Feed stdin from another thread: the child's stdout fills its pipe long before
    // the whole trace is written.
    let mut stdin = child.stdin.take().expect("stdin");
    let feeder = std::thread::spawn(move || stdin.write_all(&trace).expect("written"));
    let out = child.wait_with_output().expect("finished");
    feeder.join().expect("fed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = lines(&out.stdout);
    let stopped = lines
        .iter()
        .filter_map(|l| l.get("summary"))
        .filter(|s| s["terminal_state"] == "STOPPED_LOOP_GUARD")
        .count();
    assert!(stopped > 0, "the runaway shapes get stopped");
}
