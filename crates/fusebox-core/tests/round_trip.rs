//! Events that must survive the wire: parsed, serialised and parsed again, they are the
//! same event, and serialising that writes the same bytes (what the log's export, replay
//! and every producer built on fusebox-core rely on). Each line is a case the fuzz
//! targets found (fuzz/) or one beside it.

use fusebox_core::event::{Args, Output};
use fusebox_core::{check_event, parse_event, EventBody};

const EVENTS: &[&str] = &[
    // hook_payload: a PostToolUse without tool_response is an output of null, which
    // parsed as no output at all.
    r#"{"v":1,"id":"cc-t1-result","tenant":"t","run":"s","ts_ms":1,"type":"tool_result","call_id":"t1","tool":"Bash","kind":"SUCCESS","output":null}"#,
    // The same for arguments: `"args": null` was refused as "needs args or args_hash".
    r#"{"v":1,"id":"e1","tenant":"t","run":"r","seq":1,"ts_ms":1,"type":"tool_call","call_id":"c1","tool":"ping","args":null}"#,
    // A completed ledger key whose stored result is null.
    r#"{"v":1,"id":"e2","tenant":"t","run":"r","ts_ms":1,"type":"ledger_resolve","op_key":"k","resolution":"completed","output":null}"#,
    r#"{"v":1,"id":"e3","tenant":"t","run":"r","seq":2,"ts_ms":2,"type":"tool_result","call_id":"c1","tool":"ping","kind":"SUCCESS","output":{"n":1.5e300,"s":"x"}}"#,
];

#[test]
fn events_round_trip_through_the_wire_form() {
    for line in EVENTS {
        let event = parse_event(line.as_bytes()).unwrap_or_else(|e| panic!("{line}: {e}"));
        let wire = serde_json::to_vec(&event).unwrap();
        let again = parse_event(&wire).unwrap();
        assert_eq!(again, event, "{line}");
        assert_eq!(serde_json::to_vec(&again).unwrap(), wire, "{line}");
        check_event(&event, usize::MAX).unwrap();
    }
}

#[test]
fn null_is_a_value_of_args_and_output_not_their_absence() {
    let call = parse_event(EVENTS[1].as_bytes()).unwrap();
    assert!(
        matches!(call.body, EventBody::ToolCall(c) if c.args == Args::Json(serde_json::Value::Null))
    );
    let result = parse_event(EVENTS[0].as_bytes()).unwrap();
    assert!(matches!(result.body, EventBody::ToolResult(r)
        if r.output == Some(Output::Json(serde_json::Value::Null))));
    let absent = EVENTS[0].replace(r#","output":null"#, "");
    let result = parse_event(absent.as_bytes()).unwrap();
    assert!(matches!(result.body, EventBody::ToolResult(r) if r.output.is_none()));
}
