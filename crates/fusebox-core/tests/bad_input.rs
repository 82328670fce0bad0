//! Every kind of bad input of guard contract §2 gets its own reason and a sentence that
//! names the problem; nothing panics.

use fusebox_core::{parse_event, parse_event_bounded, Admission, RejectReason, Sequencer};

const GOOD: &str = r#"{"v":1,"id":"e1","tenant":"acme","run":"r1","seq":1,"ts_ms":5,"type":"tool_call","call_id":"c1","tool":"search","args":{"q":"x"}}"#;

/// (what is wrong, the line, the reason, a phrase the message must contain)
const CASES: &[(&str, &str, RejectReason, &str)] = &[
    (
        "not JSON",
        r#"{"v":1,"id":"#,
        RejectReason::MalformedJson,
        "not valid JSON",
    ),
    (
        "not an object",
        r#"[1,2]"#,
        RejectReason::MalformedJson,
        "JSON object",
    ),
    (
        "unknown type",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":1,"type":"tool_dance"}"#,
        RejectReason::UnknownType,
        "tool_dance",
    ),
    (
        "no type",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":1}"#,
        RejectReason::MissingField,
        "`type`",
    ),
    (
        "unknown kind",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":1,"type":"tool_result","call_id":"c","tool":"t","kind":"MAYBE"}"#,
        RejectReason::UnknownKind,
        "MAYBE",
    ),
    (
        "missing call_id",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":1,"type":"tool_call","tool":"t","args":{}}"#,
        RejectReason::MissingField,
        "`call_id`",
    ),
    (
        "missing args",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":1,"type":"tool_call","call_id":"c","tool":"t"}"#,
        RejectReason::MissingField,
        "args",
    ),
    (
        "ledger_resolve without a resolution",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":1,"type":"ledger_resolve","op_key":"k"}"#,
        RejectReason::MissingField,
        "`resolution`",
    ),
    (
        "ledger_resolve with an unknown resolution",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":1,"type":"ledger_resolve","op_key":"k","resolution":"forgotten"}"#,
        RejectReason::InvalidField,
        "forgotten",
    ),
    (
        "ledger_resolve released with an output",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":1,"type":"ledger_resolve","op_key":"k","resolution":"released","output":{}}"#,
        RejectReason::InvalidField,
        "completed",
    ),
    (
        "ledger_resolve without an op_key",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":1,"type":"ledger_resolve","resolution":"released"}"#,
        RejectReason::MissingField,
        "`op_key`",
    ),
    (
        "missing ts_ms",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","type":"tick"}"#,
        RejectReason::MissingField,
        "`ts_ms`",
    ),
    (
        "bad tenant",
        r#"{"v":1,"id":"e","tenant":"a.b","run":"r","ts_ms":1,"type":"tick"}"#,
        RejectReason::InvalidField,
        "`tenant`",
    ),
    (
        "bad run",
        r#"{"v":1,"id":"e","tenant":"a","run":"r r","ts_ms":1,"type":"tick"}"#,
        RejectReason::InvalidField,
        "`run`",
    ),
    (
        "seq of wrong type",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","seq":"7","ts_ms":1,"type":"tick"}"#,
        RejectReason::InvalidField,
        "`seq`",
    ),
    (
        "negative ts",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":-1,"type":"tick"}"#,
        RejectReason::InvalidField,
        "`ts_ms`",
    ),
    (
        "tools not a list",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":1,"type":"run_started","tools":"search"}"#,
        RejectReason::InvalidField,
        "`tools`",
    ),
    (
        "usage of wrong type",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":1,"type":"model_turn","stop_reason":"end_turn","usage":{"input_tokens":"lots"}}"#,
        RejectReason::InvalidField,
        "usage.input_tokens",
    ),
    (
        "unknown policy key",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":1,"type":"run_started","policy":{"same_cal_limit":2}}"#,
        RejectReason::InvalidField,
        "same_cal_limit",
    ),
    (
        "policy key of wrong type",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":1,"type":"run_started","policy":{"max_steps":"many"}}"#,
        RejectReason::InvalidField,
        "max_steps",
    ),
    (
        "bad effect",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":1,"type":"tool_call","call_id":"c","tool":"t","args":{},"effect":"delete"}"#,
        RejectReason::InvalidField,
        "`effect`",
    ),
    (
        "wrong version",
        r#"{"v":2,"id":"e","tenant":"a","run":"r","ts_ms":1,"type":"tick"}"#,
        RejectReason::UnsupportedVersion,
        "version 2",
    ),
    (
        "seq zero",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","seq":0,"ts_ms":1,"type":"tick"}"#,
        RejectReason::InvalidField,
        "`seq`",
    ),
    (
        "negative cost",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":1,"type":"model_turn","stop_reason":"x","cost_usd":-1.0}"#,
        RejectReason::InvalidField,
        "cost_usd",
    ),
    (
        "negative model call estimate",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":1,"type":"model_call","estimate_usd":-0.5}"#,
        RejectReason::InvalidField,
        "estimate_usd",
    ),
    (
        "model call estimate of wrong type",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":1,"type":"model_call","estimate_tokens":"many"}"#,
        RejectReason::InvalidField,
        "`estimate_tokens`",
    ),
    (
        "fractional model call estimate",
        r#"{"v":1,"id":"e","tenant":"a","run":"r","ts_ms":1,"type":"model_call","estimate_tokens":1.5}"#,
        RejectReason::InvalidField,
        "`estimate_tokens`",
    ),
];

#[test]
fn an_over_long_id_is_refused() {
    let line = format!(
        r#"{{"v":1,"id":"{}","tenant":"a","run":"r","ts_ms":1,"type":"tick"}}"#,
        "x".repeat(300)
    );
    let err = parse_event(line.as_bytes()).expect_err("too long");
    assert_eq!(err.reason, RejectReason::InvalidField);
    assert!(err.to_string().contains("`id` is 300 bytes long"));
}

#[test]
fn every_bad_input_kind_has_its_reason_and_a_clear_message() {
    assert!(parse_event(GOOD.as_bytes()).is_ok());
    let mut failures = Vec::new();
    for (what, line, reason, phrase) in CASES {
        match parse_event(line.as_bytes()) {
            Ok(_) => failures.push(format!("{what}: accepted")),
            Err(err) => {
                let text = err.to_string();
                if err.reason != *reason || !text.contains(phrase) {
                    failures.push(format!(
                        "{what}: got {text:?}, expected {} containing {phrase:?}",
                        reason.as_str()
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn an_event_over_the_size_bound_is_refused_before_parsing() {
    let err = parse_event_bounded(GOOD.as_bytes(), 64).expect_err("too large");
    assert_eq!(err.reason, RejectReason::TooLarge);
    assert!(err.to_string().contains("maximum of 64"));
}

#[test]
fn the_error_names_the_event_id_when_it_can() {
    let line = r#"{"v":1,"id":"evt-42","tenant":"a","run":"r","ts_ms":1,"type":"tool_result","call_id":"c","tool":"t","kind":"MAYBE"}"#;
    let err = parse_event(line.as_bytes()).expect_err("bad kind");
    assert_eq!(err.event_id.as_deref(), Some("evt-42"));
}

fn event(id: &str, seq: u64) -> fusebox_core::Event {
    let line = format!(
        r#"{{"v":1,"id":"{id}","tenant":"a","run":"r","seq":{seq},"ts_ms":{seq},"type":"tick"}}"#
    );
    parse_event(line.as_bytes()).expect("valid")
}

#[test]
fn seq_going_backwards_is_refused_and_duplicates_are_dropped() {
    let mut sequencer = Sequencer::default();
    assert!(matches!(sequencer.admit(event("a", 1)), Ok(Admission::Ready(v)) if v.len() == 1));
    assert!(matches!(
        sequencer.admit(event("a", 1)),
        Ok(Admission::Duplicate)
    ));
    assert!(matches!(
        sequencer.admit(event("b", 2)),
        Ok(Admission::Ready(_))
    ));
    let err = sequencer.admit(event("c", 1)).expect_err("backwards");
    assert_eq!(err.reason, RejectReason::SeqRegression);
    assert!(err.to_string().contains("goes backwards"));
}

#[test]
fn events_ahead_of_their_seq_wait_for_the_gap() {
    let mut sequencer = Sequencer::default();
    assert!(matches!(
        sequencer.admit(event("e3", 3)),
        Ok(Admission::Held { waiting_for: 1 })
    ));
    assert!(matches!(
        sequencer.admit(event("e2", 2)),
        Ok(Admission::Held { waiting_for: 1 })
    ));
    match sequencer.admit(event("e1", 1)) {
        Ok(Admission::Ready(ready)) => {
            let seqs: Vec<_> = ready.iter().map(|e| e.seq).collect();
            assert_eq!(seqs, vec![Some(1), Some(2), Some(3)]);
        }
        other => panic!("expected the whole run released, got {other:?}"),
    }
    // A gap that never fills can be given up on: the held events come out in order.
    assert!(matches!(
        sequencer.admit(event("e6", 6)),
        Ok(Admission::Held { waiting_for: 4 })
    ));
    assert!(matches!(
        sequencer.admit(event("e5", 5)),
        Ok(Admission::Held { .. })
    ));
    let released: Vec<_> = sequencer
        .release_gap("a", "r")
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(released, vec![Some(5), Some(6)]);
    assert_eq!(
        sequencer.admit(event("e4", 4)).expect_err("skipped").reason,
        RejectReason::SeqRegression
    );
}

/// Run-id reuse (issue 25 §3): a `run_started` with a new id for a run past its first
/// `seq` is another process starting the same run over; it is refused as `run_exists`,
/// naming the run. A re-sent one (the same id) stays a duplicate, and a late
/// `run_started` without `seq` is still applied.
#[test]
fn a_second_run_started_for_a_run_is_refused_naming_it() {
    let started = |id: &str, seq: Option<u64>| {
        let seq = seq.map(|s| format!(r#","seq":{s}"#)).unwrap_or_default();
        let line = format!(
            r#"{{"v":1,"id":"{id}","tenant":"a","run":"r"{seq},"ts_ms":1,"type":"run_started"}}"#
        );
        parse_event(line.as_bytes()).expect("valid")
    };
    let mut sequencer = Sequencer::default();
    assert!(matches!(
        sequencer.admit(started("r-1", Some(1))),
        Ok(Admission::Ready(_))
    ));
    assert!(matches!(
        sequencer.admit(event("r-2", 2)),
        Ok(Admission::Ready(_))
    ));
    assert!(matches!(
        sequencer.admit(started("r-1", Some(1))),
        Ok(Admission::Duplicate)
    ));
    let err = sequencer
        .admit(started("r-1.b7", Some(1)))
        .expect_err("a second process");
    assert_eq!(err.reason, RejectReason::RunExists);
    assert_eq!(err.reason.as_str(), "run_exists");
    assert!(err.to_string().contains("run a/r already exists"), "{err}");
    assert!(matches!(
        sequencer.admit(started("late", None)),
        Ok(Admission::Ready(_))
    ));
}
