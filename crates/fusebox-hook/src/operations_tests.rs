//! Keyed calls, per agent: each agent's recorded call and result payloads
//! (tests/fixtures/<agent>-hooks/payloads) with the call's tool named as an operation, a
//! result of a given size in; the op_key, the form the result travels in and the answer to
//! a repeat out. The same table for every agent: what differs is only the protocol.

use fusebox_core::event::{hex_sha256, Output, ToolCall, ToolResult, INLINE_LIMIT};
use fusebox_core::{Decision, Event, EventBody};
use serde_json::{json, Value};

use crate::common::Operations;
use crate::{claude_code, codex, gemini_cli};

const KIB: usize = 1024;

#[derive(Clone, Copy, Debug)]
enum Agent {
    ClaudeCode,
    Codex,
    GeminiCli,
}

const AGENTS: [Agent; 3] = [Agent::ClaudeCode, Agent::Codex, Agent::GeminiCli];

impl Agent {
    /// The recorded payloads of one call and its result, placeholders filled.
    fn payloads(self) -> (Value, Value) {
        let (call, result) = match self {
            Agent::ClaudeCode => (
                include_str!("../../../tests/fixtures/claude-code-hooks/payloads/PreToolUse.json"),
                include_str!("../../../tests/fixtures/claude-code-hooks/payloads/PostToolUse.json"),
            ),
            Agent::Codex => (
                include_str!("../../../tests/fixtures/codex-hooks/payloads/PreToolUse.json"),
                include_str!("../../../tests/fixtures/codex-hooks/payloads/PostToolUse.json"),
            ),
            Agent::GeminiCli => (
                include_str!("../../../tests/fixtures/gemini-cli-hooks/payloads/BeforeTool.json"),
                include_str!("../../../tests/fixtures/gemini-cli-hooks/payloads/AfterTool.json"),
            ),
        };
        let fill = |text: &str| -> Value {
            let text = text
                .replace("SESSION", "s1")
                .replace("TOOL_USE_ID", "toolu_1")
                .replace("TURN_ID", "turn-1")
                .replace("TIMESTAMP", "2026-12-01T19:22:00.000Z");
            serde_json::from_str(&text).expect("payload fixtures are JSON")
        };
        (fill(call), fill(result))
    }

    /// The result payload with a tool answer of `text`, as this agent reports it.
    fn with_answer(self, mut payload: Value, text: &str) -> Value {
        payload["tool_response"] = match self {
            Agent::ClaudeCode => json!({"stdout": text, "stderr": "", "interrupted": false}),
            Agent::Codex => json!(text),
            Agent::GeminiCli => json!({"llmContent": text, "returnDisplay": text}),
        };
        payload
    }

    fn event(self, payload: &Value, operations: &Operations) -> Result<Event, String> {
        let bytes = payload.to_string().into_bytes();
        let made = match self {
            Agent::ClaudeCode => claude_code::event_for(
                &claude_code::Payload::parse(&bytes)?,
                operations,
                "t",
                "r",
                "a",
                None,
                1,
            ),
            Agent::Codex => codex::event_for(
                &codex::Payload::parse(&bytes)?,
                operations,
                "t",
                "r",
                "a",
                None,
                1,
            ),
            Agent::GeminiCli => gemini_cli::event_for(
                &gemini_cli::Payload::parse(&bytes)?,
                operations,
                "t",
                "r",
                "a",
                Some("g1"),
                1,
            ),
        };
        Ok(made?.expect("a call and its result are events"))
    }

    /// The reason this agent's answer refuses a call with.
    fn denied_with(self, decision: &Decision) -> String {
        let outcome = claude_code::Outcome::Decided(decision);
        let (answer, reason) = match self {
            Agent::ClaudeCode => (
                claude_code::answer(claude_code::HookEvent::PreToolUse, &outcome),
                "/hookSpecificOutput/permissionDecisionReason",
            ),
            Agent::Codex => (
                codex::answer(codex::HookEvent::PreToolUse, &outcome),
                "/hookSpecificOutput/permissionDecisionReason",
            ),
            Agent::GeminiCli => (
                gemini_cli::answer(gemini_cli::HookEvent::BeforeTool, &outcome, None),
                "/reason",
            ),
        };
        answer
            .pointer(reason)
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("{self:?}: not a deny: {answer}"))
            .to_owned()
    }
}

/// Every fixture's call is `cat status.txt` with its agent's shell tool.
fn keyed(agent: Agent, bound: usize) -> Operations {
    let (call, _) = agent.payloads();
    let tool = call["tool_name"].as_str().unwrap().to_owned();
    Operations {
        op_key_args: [(tool, "command".to_owned())].into(),
        max_stored_result_bytes: bound,
    }
}

fn output_of(event: &Event) -> &Output {
    match &event.body {
        EventBody::ToolResult(ToolResult {
            output: Some(output),
            ..
        }) => output,
        other => panic!("not a result with output: {other:?}"),
    }
}

#[test]
fn a_keyed_call_names_its_operation_and_others_name_none() {
    for agent in AGENTS {
        let (call, _) = agent.payloads();
        let tool = call["tool_name"].as_str().unwrap();
        let op_key = |operations: &Operations| match agent.event(&call, operations).unwrap().body {
            EventBody::ToolCall(ToolCall { op_key, .. }) => op_key,
            other => panic!("{other:?}"),
        };
        let expected = format!("{tool}:cat status.txt");
        assert_eq!(op_key(&keyed(agent, KIB)), Some(expected), "{agent:?}");
        assert_eq!(op_key(&Operations::default()), None, "{agent:?}");
        let other_arg = Operations {
            op_key_args: [(tool.to_owned(), "path".to_owned())].into(),
            ..Operations::default()
        };
        assert_eq!(op_key(&other_arg), None, "{agent:?}: no such argument");
    }
}

/// A result below the 32 KiB every result may travel whole in.
const SMALL: usize = 16 * KIB;
const _: () = assert!(SMALL < INLINE_LIMIT);

/// (answer size, keyed, bound) → whole (`true`) or as its hash.
const RESULTS: [(usize, bool, usize, bool); 6] = [
    (100 * KIB, true, 512 * KIB, true),
    (100 * KIB, false, 512 * KIB, false),
    (600 * KIB, true, 512 * KIB, false),
    (100 * KIB, true, 64 * KIB, false),
    (SMALL, false, 512 * KIB, true),
    // Past the event's own bound (1 MiB): as its hash, still an event the daemon takes,
    // so the key does not stay in flight.
    (1100 * KIB, true, 4096 * KIB, false),
];

#[test]
fn a_keyed_result_travels_whole_up_to_the_bound_and_as_its_hash_past_it() {
    for agent in AGENTS {
        let (_, result) = agent.payloads();
        for (size, is_keyed, bound, whole) in RESULTS {
            let at = format!(
                "{agent:?}: {} KiB, keyed {is_keyed}, bound {bound}",
                size / KIB
            );
            let payload = agent.with_answer(result.clone(), &"x".repeat(size));
            let operations = if is_keyed {
                keyed(agent, bound)
            } else {
                Operations::default()
            };
            let event = agent.event(&payload, &operations).unwrap();
            match output_of(&event) {
                Output::Json(value) if whole => {
                    let text = value.to_string();
                    assert!(text.contains(&"x".repeat(size)), "{at}: the answer whole");
                }
                Output::Hash(hash) if !whole => assert_eq!(hash.len(), 64, "{at}"),
                other => panic!("{at}: {}", serde_json::to_string(other).unwrap()),
            }
        }
    }
}

#[test]
fn a_repeat_gets_the_stored_result_or_where_it_is() {
    let decided = |result: Value, message: &str| -> Decision {
        serde_json::from_value(json!({"v": 1, "tenant": "t", "run": "r", "event_id": "e",
            "action": "use_completed_result",
            "message": message, "result": result}))
        .unwrap()
    };
    let stored = decided(
        json!({"stdout": "42 rows"}),
        "operation k already completed",
    );
    let elsewhere = json!({"fusebox_result_not_stored": {"output_hash": hex_sha256(b"x"),
        "run": "r0", "call_id": "c0", "completed_at_ms": 1}});
    let not_stored = decided(
        elsewhere,
        "operation k already completed (run r0, call c0), but its result was too large to store",
    );
    for agent in AGENTS {
        assert_eq!(
            agent.denied_with(&stored),
            "fusebox: operation k already completed\nStored result: {\"stdout\":\"42 rows\"}",
            "{agent:?}"
        );
        let said = agent.denied_with(&not_stored);
        assert_eq!(
            said,
            "fusebox: operation k already completed (run r0, call c0), but its result was too large to store",
            "{agent:?}: the message alone, never the hash as the result"
        );
    }
}
