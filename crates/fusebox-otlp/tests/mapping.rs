//! Data-driven tests of the OTLP → events mapping: each `fixtures/<name>.otlp.json` (an
//! OTLP/JSON `ExportTraceServiceRequest`) must map to `fixtures/<name>.expected.jsonl`:
//! one line per event as the daemon receives it, then one `{"rejected":…}` line per
//! refused span, then a `{"mapped":…,"skipped":…}` count. The same request sent as
//! protobuf must map to the same lines. `FUSEBOX_BLESS=1` rewrites the expected files
//! (read the diff before committing it). The log records' fixtures (`fixtures/logs/`)
//! go through the same harness.

use std::path::{Path, PathBuf};

use fusebox_core::parse_event;
use fusebox_otlp::{map_logs, map_request, ExportLogsServiceRequest, ExportTraceServiceRequest};
use fusebox_otlp::{Mapped, Rejected};
use prost::Message;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

const MAX_EVENT_BYTES: usize = 1 << 20;

/// The `*.otlp.json` fixtures of `tests/<dir>`, in name order.
fn fixtures_in(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixtures dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".otlp.json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in {}", dir.display());
    files
}

/// What a request maps to, one line each: the events (each one the daemon accepts),
/// the refusals (`refused` names the span or record), the counts.
fn render(mapped: &Mapped, refused: fn(&Rejected) -> (&'static str, Value)) -> String {
    let mut lines = Vec::new();
    for event in &mapped.events {
        let line = serde_json::to_string(event).expect("serialises");
        // Whatever the receiver publishes must be an event the daemon accepts.
        parse_event(line.as_bytes()).unwrap_or_else(|e| panic!("daemon would refuse {line}: {e}"));
        lines.push(line);
    }
    for r in &mapped.rejected {
        let (key, which) = refused(r);
        let mut line = json!({"rejected": r.reason, "run": r.run, "detail": r.detail});
        line[key] = which;
        lines.push(line.to_string());
    }
    lines.push(json!({"mapped": mapped.mapped_spans, "skipped": mapped.skipped_spans}).to_string());
    lines.join("\n") + "\n"
}

/// Every fixture of `dir` maps to its `.expected.jsonl`, also sent as protobuf; a
/// re-sent batch maps to the same ids, and no two events share one.
fn check_fixtures<R: Message + Default + DeserializeOwned>(
    dir: &str,
    map: fn(&R) -> Mapped,
    refused: fn(&Rejected) -> (&'static str, Value),
) {
    for input in fixtures_in(dir) {
        let text = std::fs::read_to_string(&input).expect("read fixture");
        let request: R =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", input.display()));
        let got = render(&map(&request), refused);
        let expected_path = PathBuf::from(
            input
                .to_string_lossy()
                .replace(".otlp.json", ".expected.jsonl"),
        );
        if std::env::var_os("FUSEBOX_BLESS").is_some() {
            std::fs::write(&expected_path, &got).expect("bless");
        }
        let expected = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()));
        assert_eq!(got, expected, "{}", input.display());

        // The binary encoding of the same request maps identically.
        let decoded = R::decode(request.encode_to_vec().as_slice()).expect("protobuf round trip");
        assert_eq!(
            render(&map(&decoded), refused),
            expected,
            "{} as protobuf",
            input.display()
        );
        // The exporter retries a batch it got no answer for: the ids (the JetStream dedup
        // key) must not depend on anything but what the batch carries.
        let ids = |r: &R| {
            map(r)
                .events
                .iter()
                .map(|e| (e.run.clone(), e.id.clone()))
                .collect::<Vec<_>>()
        };
        let all = ids(&request);
        assert_eq!(all, ids(&decoded));
        let mut unique = all.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), all.len(), "{}: ids collide", input.display());
    }
}

fn map_spans(request: &ExportTraceServiceRequest) -> Mapped {
    map_request(request, "acme", MAX_EVENT_BYTES)
}

#[test]
fn fixtures_map_to_their_expected_events() {
    check_fixtures("fixtures", map_spans, |r| ("span_id", json!(r.span_id)));
}

#[test]
fn an_event_past_the_daemons_bound_is_refused_with_its_span() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pydantic_ai_run.otlp.json"),
    )
    .expect("fixture");
    let request: ExportTraceServiceRequest = serde_json::from_str(&text).expect("decodes");
    let mapped = map_request(&request, "acme", 200);
    assert!(mapped.events.is_empty());
    assert_eq!(mapped.rejected.len(), 4, "{:?}", mapped.rejected);
    assert!(mapped.rejected.iter().all(|r| r.reason == "invalid_event"));
    assert_eq!(mapped.skipped_spans, 1);
}

#[test]
fn run_ids_stay_in_the_guards_character_set_and_length() {
    let cases = [
        (
            "01a242f9-6ffe-77f4-8fee-289d8ebfb06b",
            "01a242f9-6ffe-77f4-8fee-289d8ebfb06b".to_owned(),
        ),
        ("sess 42/α", "sess_42__".to_owned()),
        ("a.b:c", "a_b_c".to_owned()),
    ];
    for (raw, want) in cases {
        assert_eq!(fusebox_otlp::map::run_token(raw), want);
    }
    let long_a = "x".repeat(300) + "a";
    let long_b = "x".repeat(300) + "b";
    let (a, b) = (
        fusebox_otlp::map::run_token(&long_a),
        fusebox_otlp::map::run_token(&long_b),
    );
    assert_eq!(a.len(), 128);
    assert_ne!(a, b, "two long ids sharing a prefix stay two runs");
}

// -- Log records (the coding agents' own telemetry) ------------------------------------
//
// `fixtures/logs/<name>.otlp.json` (an OTLP/JSON `ExportLogsServiceRequest`, as an agent
// exported it, trimmed) must map to `fixtures/logs/<name>.expected.jsonl`, in the same
// line format as the spans' fixtures (`mapped` and `skipped` count records); the same
// request sent as protobuf must map to the same lines. `FUSEBOX_BLESS=1` rewrites them.

fn map_records(request: &ExportLogsServiceRequest) -> Mapped {
    map_logs(request, "acme", MAX_EVENT_BYTES)
}

#[test]
fn log_fixtures_map_to_their_expected_events() {
    check_fixtures("fixtures/logs", map_records, |r| {
        ("event", json!(r.span_name))
    });
}

// -- Sub-agents: the run's parent ------------------------------------------------------

fn delegation() -> ExportTraceServiceRequest {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/pydantic_ai_delegation.otlp.json"),
    )
    .expect("fixture");
    serde_json::from_str(&text).expect("decodes")
}

fn starts(request: &ExportTraceServiceRequest) -> Vec<(String, Option<String>)> {
    map_request(request, "acme", MAX_EVENT_BYTES)
        .events
        .iter()
        .filter_map(|e| match &e.body {
            fusebox_core::EventBody::RunStarted(s) => Some((e.run.clone(), s.parent.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_sub_agents_parent_does_not_depend_on_the_order_of_spans() {
    let mut request = delegation();
    let want = vec![("pai-researcher-1".to_owned(), Some("pai-lead".to_owned()))];
    assert_eq!(starts(&request), want);
    request.resource_spans[0].scope_spans[0].spans.reverse();
    assert_eq!(starts(&request), want);
}

#[test]
fn a_sub_agent_exported_before_the_spans_around_it_stays_a_root() {
    // As a slow sub-agent is exported: its steps in one batch, its own agent span and the
    // lead's tool span (which end after them) in the next. The first batch cannot say
    // where it ran; the second names the parent too late (the run has events already)
    // and has none of the sub-agent's events to start: no `run_started` in either.
    let request = delegation();
    let spans = &request.resource_spans[0].scope_spans[0].spans;
    let boundary = spans
        .iter()
        .position(|s| s.name == "invoke_agent researcher")
        .expect("the researcher's agent span");
    let (mut first, mut second) = (request.clone(), request.clone());
    first.resource_spans[0].scope_spans[0].spans = spans[..boundary].to_vec();
    second.resource_spans[0].scope_spans[0].spans = spans[boundary..].to_vec();
    let first_mapped = map_request(&first, "acme", MAX_EVENT_BYTES);
    assert!(first_mapped
        .events
        .iter()
        .any(|e| e.run == "pai-researcher-1"));
    assert_eq!(starts(&first), vec![]);
    assert_eq!(starts(&second), vec![]);
}
