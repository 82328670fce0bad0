//! The MCP gateway's translation (`fusebox_mcp::mapping`), fed what crosses it: a
//! `tools/call` from the agent, the tool's annotations from the upstream's `tools/list`,
//! the gateway's per-tool config, and the upstream's `CallToolResult`. Whatever they
//! hold, the `tool_call` and `tool_result` the gateway builds are accepted by the daemon
//! and round-trip unchanged — unless the tool's name itself breaks the contract (empty,
//! or past its length), which the daemon refuses with an error the agent is shown — and
//! nothing panics turning results back into MCP.
#![no_main]

use fusebox_core::event::{EventBody, ResultKind};
use fusebox_core::parse::MAX_ID_LEN;
use fusebox_core::{check_event, parse_event, Event};
use fusebox_mcp::config::ToolConfig;
use fusebox_mcp::mapping;
use libfuzzer_sys::fuzz_target;
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject, ToolAnnotations};
use serde::Deserialize;

#[derive(Deserialize)]
struct Input {
    params: CallToolRequestParams,
    #[serde(default)]
    annotations: Option<ToolAnnotations>,
    #[serde(default)]
    config: Option<ToolConfig>,
    #[serde(default)]
    result: Option<CallToolResult>,
    #[serde(default)]
    output_schema: Option<JsonObject>,
}

fn envelope(body: EventBody) -> Event {
    Event {
        v: 1,
        id: "mcp-e1".to_owned(),
        tenant: "tenant".to_owned(),
        run: "run".to_owned(),
        seq: Some(1),
        ts_ms: 1,
        body,
    }
}

/// The daemon's verdict on an event the gateway built, and that it round-trips.
fn accepted(event: &Event) -> bool {
    let wire = serde_json::to_vec(event).expect("an event serialises");
    match parse_event(&wire) {
        Ok(parsed) => {
            assert_eq!(&parsed, event, "{}", String::from_utf8_lossy(&wire));
            true
        }
        Err(_) => {
            assert!(check_event(event, usize::MAX).is_err());
            false
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = serde_json::from_slice::<Input>(data) else {
        return;
    };
    let tool = input.params.name.to_string();
    let valid_name = !tool.is_empty() && tool.len() <= MAX_ID_LEN;
    let config = input.config.as_ref();
    let effect = mapping::effect_of(config, input.annotations.as_ref());
    let op_key = mapping::op_key_of(&tool, config, input.params.arguments.as_ref());
    let call = mapping::tool_call("c1", &tool, input.params.arguments.as_ref(), op_key, effect);
    assert_eq!(
        accepted(&envelope(EventBody::ToolCall(call))),
        valid_name,
        "tool {tool:?}"
    );
    let Some(result) = input.result else {
        return;
    };
    let reported = mapping::tool_result(
        "c1",
        &tool,
        &result,
        ResultKind::Retryable,
        fusebox_core::event::INLINE_LIMIT,
    );
    assert_eq!(accepted(&envelope(EventBody::ToolResult(reported))), valid_name);
    let failed = mapping::failed_result("c1", &tool, "upstream_error", &tool);
    assert_eq!(accepted(&envelope(EventBody::ToolResult(failed))), valid_name);
    // What a later call with the same op_key is answered from.
    let _ = mapping::result_from_output(&mapping::output_of(&result));
    let _ = mapping::with_note(result, Some("note".to_owned()), input.output_schema.as_ref());
});
