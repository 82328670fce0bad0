//! Data-driven tests of the OTLP → events mapping: each `fixtures/<name>.otlp.json` (an
//! OTLP/JSON `ExportTraceServiceRequest`) must map to `fixtures/<name>.expected.jsonl`:
//! one line per event as the daemon receives it, then one `{"rejected":…}` line per
//! refused span, then a `{"mapped":…,"skipped":…}` count. The same request sent as
//! protobuf must map to the same lines. `FUSEBOX_BLESS=1` rewrites the expected files
//! (read the diff before committing it).

use std::path::{Path, PathBuf};

use fusebox_core::parse_event;
use fusebox_otlp::{map_request, ExportTraceServiceRequest};
use prost::Message;
use serde_json::json;

const MAX_EVENT_BYTES: usize = 1 << 20;

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixtures dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".otlp.json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in {}", dir.display());
    files
}

fn render(request: &ExportTraceServiceRequest) -> String {
    let mapped = map_request(request, "acme", MAX_EVENT_BYTES);
    let mut lines = Vec::new();
    for event in &mapped.events {
        let line = serde_json::to_string(event).expect("serialises");
        // Whatever the receiver publishes must be an event the daemon accepts.
        parse_event(line.as_bytes()).unwrap_or_else(|e| panic!("daemon would refuse {line}: {e}"));
        lines.push(line);
    }
    for r in &mapped.rejected {
        lines.push(
            json!({"rejected": r.reason, "span_id": r.span_id, "run": r.run, "detail": r.detail})
                .to_string(),
        );
    }
    lines.push(json!({"mapped": mapped.mapped_spans, "skipped": mapped.skipped_spans}).to_string());
    lines.join("\n") + "\n"
}

#[test]
fn fixtures_map_to_their_expected_events() {
    for input in fixtures() {
        let text = std::fs::read_to_string(&input).expect("read fixture");
        let request: ExportTraceServiceRequest =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", input.display()));
        let got = render(&request);
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
        let decoded = ExportTraceServiceRequest::decode(request.encode_to_vec().as_slice())
            .expect("protobuf round trip");
        assert_eq!(
            render(&decoded),
            expected,
            "{} as protobuf",
            input.display()
        );
    }
}

#[test]
fn a_resent_batch_maps_to_the_same_ids() {
    // The exporter retries a batch it got no answer for: the ids (the JetStream dedup
    // key) must not depend on anything but the spans.
    for input in fixtures() {
        let text = std::fs::read_to_string(&input).expect("read fixture");
        let request: ExportTraceServiceRequest = serde_json::from_str(&text).expect("decodes");
        let ids = |r: &ExportTraceServiceRequest| {
            map_request(r, "acme", MAX_EVENT_BYTES)
                .events
                .iter()
                .map(|e| (e.run.clone(), e.id.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&request), ids(&request.clone()));
        let all = ids(&request);
        let mut unique = all.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), all.len(), "{}: ids collide", input.display());
    }
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

fn log_fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/logs");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("log fixtures dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".otlp.json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in {}", dir.display());
    files
}

fn render_logs(request: &fusebox_otlp::ExportLogsServiceRequest) -> String {
    let mapped = fusebox_otlp::map_logs(request, "acme", MAX_EVENT_BYTES);
    let mut lines = Vec::new();
    for event in &mapped.events {
        let line = serde_json::to_string(event).expect("serialises");
        parse_event(line.as_bytes()).unwrap_or_else(|e| panic!("daemon would refuse {line}: {e}"));
        lines.push(line);
    }
    for r in &mapped.rejected {
        lines.push(
            json!({"rejected": r.reason, "event": r.span_name, "run": r.run, "detail": r.detail})
                .to_string(),
        );
    }
    lines.push(json!({"mapped": mapped.mapped_spans, "skipped": mapped.skipped_spans}).to_string());
    lines.join("\n") + "\n"
}

#[test]
fn log_fixtures_map_to_their_expected_events() {
    for input in log_fixtures() {
        let text = std::fs::read_to_string(&input).expect("read fixture");
        let request: fusebox_otlp::ExportLogsServiceRequest =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", input.display()));
        let got = render_logs(&request);
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
        let decoded =
            fusebox_otlp::ExportLogsServiceRequest::decode(request.encode_to_vec().as_slice())
                .expect("protobuf round trip");
        assert_eq!(
            render_logs(&decoded),
            expected,
            "{} as protobuf",
            input.display()
        );
        // A re-sent batch maps to the same ids, and no two events share one.
        let ids = |r: &fusebox_otlp::ExportLogsServiceRequest| {
            fusebox_otlp::map_logs(r, "acme", MAX_EVENT_BYTES)
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
