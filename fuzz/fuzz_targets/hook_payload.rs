//! The Claude Code hook (`fusebox hook claude-code`), as it reads its stdin: any bytes
//! are refused as a payload, or map to no event, to an error of the hook's own, or to an
//! event the daemon accepts that round-trips through the wire form unchanged. The run id
//! made from any session id is a valid run token, and the hook's answer to any decision
//! is a JSON object (what Claude Code parses).
#![no_main]

use fusebox_core::{parse_event, Decision};
use fusebox_hook::claude_code::{answer, event_for, run_id, Outcome, Payload};
use fusebox_hook::Operations;
use libfuzzer_sys::fuzz_target;
use serde_json::json;

const ACTIONS: [&str; 5] = ["execute", "warn", "block", "use_completed_result", "stop"];

fuzz_target!(|data: &[u8]| {
    let Ok(payload) = Payload::parse(data) else {
        return;
    };
    let run = run_id(&payload.session_id);
    assert!(
        !run.is_empty()
            && run.len() <= 128
            && run.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
        "run id {run:?} from session {:?}",
        payload.session_id
    );
    let transcript_len = Some(data.len() as u64);
    // Every tool a business operation named by `id`: the keyed path is fuzzed too.
    let operations = Operations {
        op_key_args: payload
            .tool_name
            .iter()
            .map(|tool| (tool.clone(), "id".to_owned()))
            .collect(),
        ..Operations::default()
    };
    if let Ok(Some(event)) = event_for(&payload, &operations, "tenant", &run, "claude-code", transcript_len, 1) {
        let wire = serde_json::to_vec(&event).expect("an event serialises");
        let parsed = parse_event(&wire).unwrap_or_else(|err| {
            panic!("the daemon refuses what the hook sends: {err}\n{}", String::from_utf8_lossy(&wire))
        });
        assert_eq!(parsed, event, "{}", String::from_utf8_lossy(&wire));
    }
    for action in ACTIONS {
        let decision: Decision = serde_json::from_value(json!({
            "v": 1, "tenant": "tenant", "run": run, "event_id": "e", "call_id": "c",
            "action": action, "message": "why",
        }))
        .expect("a decision of the contract");
        let answered = answer(payload.event(), &Outcome::Decided(&decision));
        assert!(answered.is_object(), "{answered}");
    }
    for allowed in [true, false] {
        let why = "the guard did not answer".to_owned();
        assert!(answer(payload.event(), &Outcome::Failed { why, allowed }).is_object());
    }
});
