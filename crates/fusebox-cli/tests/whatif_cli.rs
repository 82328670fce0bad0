//! `fusebox whatif` and `fusebox tune` on recorded traces, as a real process.
//!
//! Data-driven: every candidate `tests/whatif/<case>.toml`, laid over the pinned
//! `baseline.toml`, is run against `tests/whatif/fleet.jsonl` with that baseline (see
//! `tests/whatif/README.md` for its runs), and the report, reduced to one line per
//! changed run, must equal `tests/whatif/<case>.expected`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use fusebox_core::{parse_event, PolicySet};
use fusebox_log::{Guard, GuardOptions};
use serde_json::Value;

const FUSEBOX: &str = env!("CARGO_BIN_EXE_fusebox");

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/whatif")
}

fn fleet() -> String {
    dir().join("fleet.jsonl").display().to_string()
}

fn baseline() -> String {
    dir().join("baseline.toml").display().to_string()
}

/// Tables merge key by key; anything else in `over` replaces.
fn merge(base: &mut toml::Table, over: &toml::Table) {
    for (key, value) in over {
        match (base.get_mut(key), value) {
            (Some(toml::Value::Table(inner)), toml::Value::Table(patch)) => merge(inner, patch),
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

/// A case's candidate: the baseline with the case's TOML laid over it, as a file.
fn candidate(case: &str) -> tempfile::NamedTempFile {
    let read = |path: PathBuf| -> toml::Table {
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let mut merged = read(dir().join("baseline.toml"));
    merge(&mut merged, &read(dir().join(format!("{case}.toml"))));
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), toml::to_string(&merged).expect("TOML")).expect("write");
    file
}

/// `fusebox whatif` of a candidate file against the fleet, with the pinned baseline.
fn whatif_with(policy: &Path, extra: &[&str]) -> Output {
    let baseline = baseline();
    let fleet = fleet();
    let mut args = vec![
        "whatif",
        "--baseline",
        &baseline,
        "--policy",
        policy.to_str().unwrap(),
    ];
    args.extend(extra);
    args.push(&fleet);
    fusebox(&args)
}

/// `fusebox whatif` of a case against the fleet, with the pinned baseline.
fn whatif_case(case: &str, extra: &[&str]) -> Output {
    whatif_with(candidate(case).path(), extra)
}

fn fusebox(args: &[&str]) -> Output {
    Command::new(FUSEBOX)
        .args(args)
        .output()
        .expect("fusebox runs")
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is one JSON document ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The report reduced to what a case pins: the exit status, then per changed run its
/// kind, run, the candidate's stop (or the baseline's, for a stop that goes away),
/// whether that is exact, and what the stop cuts or what the recording holds after it.
fn projection(status: i32, report: &Value) -> String {
    let mut lines = vec![format!("exit {status}")];
    for change in report["changes"].as_array().expect("changes") {
        let kind = change["kind"].as_str().expect("kind");
        let side = if kind == "no_longer_stopped" {
            &change["baseline"]
        } else {
            &change["candidate"]
        };
        let mut line = format!(
            "{kind} {}/{} {} call={} {}",
            change["tenant"].as_str().expect("tenant"),
            change["run"].as_str().expect("run"),
            side["reason"].as_str().unwrap_or("-"),
            side["at_call"],
            if change["exact"] == true {
                "exact"
            } else {
                "approximate"
            },
        );
        if let Some(cut) = change.get("would_cut") {
            line += &format!(
                " cut: calls={} turns={} tokens={} cost={} ms={}",
                cut["tool_calls"],
                cut["model_turns"],
                cut["tokens"],
                cut["cost_usd"],
                cut["event_ms"]
            );
        }
        if let Some(after) = change.get("recorded_after_original_stop") {
            line += &format!(
                " after-original-stop: events={} attempted={}",
                after["events"], after["calls_attempted"]
            );
        }
        if kind == "warnings_or_blocks" {
            line += &format!(
                " warnings={}->{} blocks={}->{}",
                change["baseline"]["warnings"],
                change["candidate"]["warnings"],
                change["baseline"]["blocks"],
                change["candidate"]["blocks"]
            );
        }
        lines.push(line);
    }
    lines.join("\n") + "\n"
}

fn cases() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .expect("case dir")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".toml").map(str::to_owned)
        })
        .collect();
    names.sort();
    names
}

#[test]
fn every_candidate_gives_its_expected_report() {
    let cases = cases();
    assert!(cases.len() >= 3, "cases found: {cases:?}");
    let mut failures = Vec::new();
    for case in &cases {
        let out = whatif_case(case, &["--json"]);
        let got = projection(out.status.code().expect("exit code"), &json_of(&out));
        let expected_path = dir().join(format!("{case}.expected"));
        let expected = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()));
        if got != expected {
            failures.push(format!("{case}:\n--- expected\n{expected}--- got\n{got}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_candidate_that_stops_a_completed_run_lists_it_first_and_exits_1() {
    let out = whatif_case("max-steps-10", &[]);
    assert_eq!(out.status.code(), Some(1));
    let table = String::from_utf8_lossy(&out.stdout);
    let first_section = table
        .lines()
        .find(|l| l.chars().next().is_some_and(|c| c.is_ascii_uppercase()) && l.contains('('))
        .expect("a section");
    assert!(
        first_section.starts_with("COMPLETED RUNS THE CANDIDATE WOULD STOP"),
        "{table}"
    );
    assert!(table.contains("acme/batch-1"), "{table}");
}

#[test]
fn loosening_says_the_future_after_the_original_stop_is_unknown() {
    let out = whatif_case("lenient", &["--json"]);
    let report = json_of(&out);
    let loosened: Vec<&Value> = report["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["kind"] == "no_longer_stopped")
        .collect();
    assert!(!loosened.is_empty(), "{report:#}");
    for change in loosened {
        let note = change["note"].as_str().unwrap();
        assert!(note.contains("unknown"), "{note}");
        assert!(change.get("would_cut").is_none());
        assert!(change["recorded_after_original_stop"]["events"]
            .as_u64()
            .is_some());
    }
}

#[test]
fn the_same_input_gives_the_same_report_byte_for_byte() {
    let policy = candidate("researcher-strict");
    for format in [&[][..], &["--json"][..]] {
        let first = whatif_with(policy.path(), format);
        let second = whatif_with(policy.path(), format);
        assert!(!first.stdout.is_empty());
        assert_eq!(first.stdout, second.stdout, "{format:?}");
    }
}

/// tune with k = 0 from the pinned baseline, its proposal (laid over the baseline, as an
/// operator merges it) run through whatif: no completed run is stopped, and the report
/// tune printed agrees.
fn tune_never_stops_a_completed_run(inputs: &[String]) {
    let baseline = baseline();
    let mut args = vec!["tune", "--json", "--min-runs", "2", "--baseline", &baseline];
    args.extend(inputs.iter().map(String::as_str));
    let out = fusebox(&args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tuned = json_of(&out);
    assert_eq!(tuned["whatif"]["totals"]["completed_runs_stopped"], 0);
    let toml = tuned["toml"].as_str().expect("a fragment");
    let fragment: toml::Table = toml::from_str(toml).expect("the fragment is TOML");
    assert!(fragment.contains_key("policy"), "{toml}");
    let mut merged: toml::Table =
        toml::from_str(&std::fs::read_to_string(&baseline).expect("baseline")).expect("TOML");
    merge(&mut merged, &fragment);
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), toml::to_string(&merged).expect("TOML")).expect("write");
    let mut args = vec![
        "whatif",
        "--json",
        "--baseline",
        &baseline,
        "--policy",
        file.path().to_str().unwrap(),
    ];
    args.extend(inputs.iter().map(String::as_str));
    let out = fusebox(&args);
    assert_eq!(out.status.code(), Some(0), "{toml}");
    let report = json_of(&out);
    assert_eq!(report["totals"]["completed_runs_stopped"], 0, "{toml}");
    assert_eq!(report["changes"], tuned["whatif"]["changes"]);
}

#[test]
fn tune_with_k_0_never_proposes_a_policy_that_stops_a_completed_run() {
    tune_never_stops_a_completed_run(&[fleet()]);
    let core = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fusebox-core/tests/fixtures");
    let mut inputs: Vec<String> = std::fs::read_dir(&core)
        .expect("core fixtures")
        .filter_map(|e| {
            let path = e.ok()?.path();
            (path.extension()? == "jsonl").then(|| path.display().to_string())
        })
        .collect();
    inputs.sort();
    inputs.push(fleet());
    tune_never_stops_a_completed_run(&inputs);
}

#[test]
fn tune_tightens_what_the_history_supports_and_says_why() {
    let out = fusebox(&[
        "tune",
        "--min-runs",
        "2",
        "--baseline",
        &baseline(),
        &fleet(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    let parsed: toml::Table = toml::from_str(&text).expect("the whole output is TOML");
    let policy = parsed["policy"].as_table().expect("[policy]");
    // batch-1 makes 12 calls: 12 is the strictest step budget that lets it finish.
    assert_eq!(policy["max_steps"].as_integer(), Some(12), "{text}");
    // Nothing recorded comes near the repeat limits of completed runs: they stay.
    assert!(!policy.contains_key("same_call_limit"), "{text}");
    assert!(text.contains("# same_call_limit = 3 stays"), "{text}");
    // A comment per key says what the value rests on.
    assert!(
        text.contains("# was 500; 4 completed runs pass; margin: 11 would stop or refuse 1"),
        "{text}"
    );
}

#[test]
fn tune_with_k_1_stops_at_most_one_completed_run() {
    let out = fusebox(&[
        "tune",
        "--json",
        "-k",
        "1",
        "--min-runs",
        "100",
        "--baseline",
        &baseline(),
        &fleet(),
    ]);
    let tuned = json_of(&out);
    let stopped = tuned["whatif"]["totals"]["completed_runs_stopped"]
        .as_u64()
        .expect("a count");
    assert!(stopped <= 1, "{tuned:#}");
}

fn file_bytes(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("readable") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.insert(path.clone(), std::fs::read(&path).expect("readable"));
            }
        }
    }
    files
}

#[test]
fn a_live_daemons_data_dir_is_read_from_a_copy_and_left_untouched() {
    let data = tempfile::tempdir().expect("temp dir");
    let text = std::fs::read_to_string(fleet()).expect("fleet");
    let events: Vec<_> = text
        .lines()
        .map(|l| parse_event(l.as_bytes()).expect("valid"))
        .collect();
    // The guard stays open, holding sled's lock, as a running fuseboxd does.
    let mut guard =
        Guard::open(data.path(), PolicySet::default(), GuardOptions::default()).expect("opens");
    guard.submit_batch(events).expect("durable");
    let before = file_bytes(data.path());

    let policy = dir().join("max-steps-10.toml");
    let out = fusebox(&[
        "whatif",
        "--json",
        "--policy",
        policy.to_str().unwrap(),
        "--data-dir",
        data.path().to_str().unwrap(),
    ]);
    let from_dir = json_of(&out);
    assert_eq!(
        file_bytes(data.path()),
        before,
        "the data dir was not written"
    );
    drop(guard);

    // The log's own policies (balanced) are the baseline: the same report as the JSONL.
    let from_jsonl = fusebox(&[
        "whatif",
        "--json",
        "--policy",
        policy.to_str().unwrap(),
        &fleet(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(from_dir["changes"], json_of(&from_jsonl)["changes"]);
    assert_eq!(from_dir["totals"], json_of(&from_jsonl)["totals"]);
    assert!(from_dir["baseline"]
        .as_str()
        .unwrap()
        .contains("as recorded"));
    // Every recorded decision was checked against the baseline's replay, and matched.
    assert_eq!(from_dir["recorded_decisions"]["checked"], 134);
    assert_eq!(from_dir["recorded_decisions"]["differing"], 0);

    // A baseline other than what the daemon ran is said to disagree with the recording.
    let out = fusebox(&[
        "whatif",
        "--baseline-preset",
        "strict",
        "--policy",
        policy.to_str().unwrap(),
        "--data-dir",
        data.path().to_str().unwrap(),
    ]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("recorded decisions differ"), "{table}");
}

#[test]
fn no_candidate_or_two_sources_is_a_clear_error() {
    let out = fusebox(&["whatif", &fleet()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--policy"));
    let out = fusebox(&[
        "whatif",
        "--preset",
        "strict",
        "--data-dir",
        "/nonexistent",
        &fleet(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not both"));
    let empty = tempfile::tempdir().expect("temp dir");
    let out = fusebox(&[
        "whatif",
        "--preset",
        "strict",
        "--data-dir",
        empty.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a fusebox data dir"));
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0);
}

#[test]
fn a_data_dir_being_written_is_read_as_a_consistent_prefix() {
    let data = tempfile::tempdir().expect("temp dir");
    let text = std::fs::read_to_string(fleet()).expect("fleet");
    let mut guard =
        Guard::open(data.path(), PolicySet::default(), GuardOptions::default()).expect("opens");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut copies = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Each copy of the fleet under other run ids: the same six outcomes again.
                let events: Vec<_> = text
                    .lines()
                    .map(|l| {
                        let l = l
                            .replace("\"run\":\"", &format!("\"run\":\"w{copies}-"))
                            .replace("\"id\":\"", &format!("\"id\":\"w{copies}-"));
                        parse_event(l.as_bytes()).expect("valid")
                    })
                    .collect();
                guard.submit_batch(events).expect("durable");
                copies += 1;
            }
            copies
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    let policy = dir().join("max-steps-10.toml");
    for _ in 0..3 {
        let out = fusebox(&[
            "whatif",
            "--json",
            "--policy",
            policy.to_str().unwrap(),
            "--data-dir",
            data.path().to_str().unwrap(),
        ]);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report = json_of(&out);
        // Whole batches only, each the fleet again: batch-1 of every copy, and nothing else.
        let runs = report["totals"]["runs"].as_u64().unwrap();
        let stopped = report["totals"]["completed_runs_stopped"].as_u64().unwrap();
        assert!(runs > 0 && runs.is_multiple_of(6), "{runs} runs");
        assert_eq!(stopped, runs / 6);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let copies = writer.join().expect("writer");
    assert!(copies > 0);
}
