//! Codex CLI's own telemetry: the log records codex-cli 0.171.0 exports with
//! `[otel] exporter = { otlp-http = … }` in its config.toml (seen with the real binary;
//! the table in `docs/otel.md` is the contract). Every record names its event in the
//! `event.name` attribute and its session in `conversation.id`; numbers and flags
//! mostly travel as text (`duration_ms = "52"`, `success = "true"`).
//!
//! A session is the same run on every path: the hook's, the rollout import's
//! (`fusebox whatif --from codex`) and this one all name it after the session id with
//! [`run_id`], and a call is the hook's call: the events are made by the hooks' one
//! shape ([`PROTOCOL`]), with the hook's ids (`cx-<call id>-call`), the hook's name and
//! arguments for a shell command (`Bash` with `{"command": …}`, where the telemetry, as
//! the rollout, says `exec_command` with `{"cmd": …}`) and the hook's form of its output
//! (the command's own lines, in one order). So the arguments hash as the hook's do (a
//! repeat is recognised), and a call both the hook and the telemetry send is applied
//! once (the daemon's dedup drops the second copy). Not the prompt: the record names no
//! turn, so its `prompt` has an id of its own and would start the task a second time
//! (docs/otel.md: send one of the two for a session).
//!
//! - `codex.conversation_starts` → `run_started` (`agent = "codex"`: Codex's tool
//!   knowledge and `[agents.codex.policy]` apply), the hook's SessionStart;
//! - `codex.user_prompt` → `prompt` (the next task; never its words);
//! - `codex.tool_result` → `tool_call` (at the record's time less `duration_ms`) and
//!   `tool_result`: SUCCESS, or RETRYABLE `tool_error` when `success` is false;
//! - `codex.sse_event` of a `response.completed` with token counts → `model_turn`;
//! - every other `codex.*` event (`tool_decision`, `api_request`, `startup_phase` …):
//!   nothing to map, skipped.
//!
//! A record without `conversation.id`, or a tool result without its call id, tool name
//! or arguments, is refused with its reason.

use fusebox_core::event::{ModelTurn, Prompt, Usage};
use fusebox_core::{Event, EventBody};
use fusebox_hook::codex::{
    as_hooks_name_it, command_output, run_id, tool_output, Operations, PROTOCOL,
};
use fusebox_hook::protocol::Step;
use serde_json::Value;

use super::Record;
use crate::attrs::json_text_or_value;
use crate::map::Outcome;

/// Why a Codex record was not mapped. Stable strings: metrics labels and dead letters.
pub mod reason {
    /// A `codex.*` record without `conversation.id`: no run to give it to.
    pub const NO_CONVERSATION_ID: &str = "no_conversation_id";
    /// A `codex.tool_result` without `call_id` or `tool_name`.
    pub const NO_CALL: &str = "no_call";
    /// A `codex.tool_result` without `arguments`: the call could not be told from a
    /// repeat of another.
    pub const NO_ARGUMENTS: &str = "no_arguments";
}

/// The runs' agent name, as the hook's (`fusebox hook codex`).
const AGENT: &str = "codex";

const CONVERSATION: &str = "conversation.id";

pub(super) fn map_record(record: &Record<'_>) -> Outcome {
    let name = record.name.unwrap_or("");
    let Some(conversation) = record.str(CONVERSATION) else {
        return Outcome::Rejected(record.rejected(
            reason::NO_CONVERSATION_ID,
            format!("{name} record without `{CONVERSATION}`: no session to give it to"),
            None,
        ));
    };
    let run = run_id(conversation);
    let ts_ns = record.ts_ns();
    let step = |step: Step<'_>, ts_ns: u64| {
        PROTOCOL.event(
            step,
            &Operations::default(),
            record.tenant,
            &run,
            AGENT,
            ts_ns / 1_000_000,
        )
    };
    let events: Vec<(u64, u8, Event)> = match name {
        "codex.conversation_starts" => vec![(ts_ns, 0, step(Step::SessionStart, ts_ns))],
        // No id names the turn here (the hook's is its `turn_id`): the record's own.
        "codex.user_prompt" => vec![(
            ts_ns,
            0,
            record.event(&run, "p", ts_ns, EventBody::Prompt(Prompt {})),
        )],
        "codex.tool_result" => return tool_result(record, run.clone(), ts_ns, step),
        "codex.sse_event" => match model_turn(record) {
            Some(turn) => vec![(
                ts_ns,
                2,
                record.event(&run, "t", ts_ns, EventBody::ModelTurn(turn)),
            )],
            None => return Outcome::Skipped,
        },
        // Approvals (`tool_decision`: the call comes with its result), API requests,
        // stream events without usage, start-up phases, timings: nothing the guard uses.
        _ => return Outcome::Skipped,
    };
    Outcome::Events(run, events)
}

/// A call and its result from one `codex.tool_result` record: the record is written
/// when the call has ended, `duration_ms` after it began.
fn tool_result(
    record: &Record<'_>,
    run: String,
    ts_ns: u64,
    step: impl Fn(Step<'_>, u64) -> Event,
) -> Outcome {
    let (call_id, name, arguments) = match (
        record.str("call_id"),
        record.str("tool_name"),
        record.attr("arguments"),
    ) {
        (Some(call_id), Some(name), Some(arguments)) => {
            (call_id, name, json_text_or_value(arguments))
        }
        (call_id, name, _) => {
            let (reason, what) = match (call_id, name) {
                (None, _) => (reason::NO_CALL, "call_id"),
                (_, None) => (reason::NO_CALL, "tool_name"),
                _ => (reason::NO_ARGUMENTS, "arguments"),
            };
            return Outcome::Rejected(record.rejected(
                reason,
                format!("codex.tool_result without `{what}`"),
                Some(run),
            ));
        }
    };
    let (tool, input) = as_hooks_name_it(name, arguments);
    let output = record
        .str("output")
        .map(|text| Value::String(command_output(text).to_owned()));
    // `success` is Codex's own verdict on the call (arguments it could not parse, a tool
    // it does not have, a command it could not start); a command that ran and failed is
    // a success whose output says so, as the hook sees it.
    let failed = record.flag("success") == Some(false);
    let began_ns = ts_ns.saturating_sub(
        record
            .count("duration_ms")
            .unwrap_or(0)
            .saturating_mul(1_000_000),
    );
    let call = step(
        Step::Call {
            id: call_id,
            tool: &tool,
            input: Some(&input),
        },
        began_ns,
    );
    let result = step(
        Step::Result {
            id: call_id,
            tool: &tool,
            input: Some(&input),
            failure: failed.then_some("tool_error"),
            output: tool_output(&tool, output.as_ref()),
        },
        ts_ns,
    );
    Outcome::Events(run, vec![(began_ns, 0, call), (ts_ns, 1, result)])
}

/// The turn a `response.completed` stream event with token counts reports (Codex sends
/// one such record per model response, beside a timing record of the same kind without
/// counts). OpenAI counts cached tokens and cache writes inside `input_token_count`;
/// the contract sums input, cache reads and cache writes, so each token is counted
/// once. Nothing in the record says how the response ended.
fn model_turn(record: &Record<'_>) -> Option<ModelTurn> {
    if record.str("event.kind") != Some("response.completed") {
        return None;
    }
    let input = record.count("input_token_count");
    let output = record.count("output_token_count");
    if input.is_none() && output.is_none() {
        return None;
    }
    let cached = record.count("cached_token_count");
    let written = record.count("cache_write_token_count");
    let uncached = input.map(|n| {
        n.saturating_sub(cached.unwrap_or(0))
            .saturating_sub(written.unwrap_or(0))
    });
    Some(ModelTurn {
        stop_reason: "unspecified".to_owned(),
        usage: Some(Usage {
            input_tokens: uncached,
            output_tokens: output,
            cache_creation_input_tokens: written,
            cache_read_input_tokens: cached,
        }),
        cost_usd: None,
        valid: None,
    })
}

#[cfg(test)]
mod tests {
    use fusebox_hook::codex::{event_for, Payload};
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
    use opentelemetry_proto::tonic::logs::v1::LogRecord;
    use serde_json::json;

    use super::*;

    fn record_of(attributes: &[(&str, &str)], observed_ns: u64) -> LogRecord {
        LogRecord {
            // As Codex's `tracing` bridge sets it: the call site, not the event's name.
            event_name: "event otel/src/tool_result.rs:54".to_owned(),
            observed_time_unix_nano: observed_ns,
            attributes: attributes
                .iter()
                .map(|(key, value)| KeyValue {
                    key: (*key).to_owned(),
                    value: Some(AnyValue {
                        value: Some(Any::StringValue((*value).to_owned())),
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn hook(payload: serde_json::Value, ts_ms: u64) -> Event {
        let payload: Payload = serde_json::from_value(payload).unwrap();
        event_for(
            &payload,
            &Operations::default(),
            "acme",
            "01a2436d-7dae-7451-a392-3d304c8f55ab",
            "codex",
            None,
            ts_ms,
        )
        .unwrap()
        .unwrap()
    }

    #[test]
    fn a_tool_result_is_the_call_and_result_the_hook_sends() {
        // Recorded (0.171.0, `[otel] exporter = { otlp-http … }`), trimmed.
        let log = record_of(
            &[
                ("event.name", "codex.tool_result"),
                ("conversation.id", "01a2436d-7dae-7451-a392-3d304c8f55ab"),
                ("tool_name", "exec_command"),
                ("call_id", "call_2"),
                ("duration_ms", "46"),
                ("success", "true"),
                ("arguments", r#"{"cmd": "cat status.txt || echo running"}"#),
                (
                    "output",
                    "Chunk ID: c6dead\nWall time: 0.0000 seconds\nProcess exited with code 0\n\
                     Original token count: 11\nOutput:\ncat: status.txt: No such file or directory\nrunning\n",
                ),
            ],
            1_796_427_579_040_607_703,
        );
        let record = Record::new(&log, &[], "acme");
        assert_eq!(record.name, Some("codex.tool_result"));
        let Outcome::Events(run, events) = map_record(&record) else {
            panic!("not mapped");
        };
        assert_eq!(run, "01a2436d-7dae-7451-a392-3d304c8f55ab");
        let [(_, _, call), (_, _, result)] = &events[..] else {
            panic!("{events:?}");
        };
        // What `fusebox hook codex` sends for the same call: the same ids, name,
        // arguments (so the same hash) and output (the hook's `tool_response` is the
        // command's own lines, in either order).
        let session = "01a2436d-7dae-7451-a392-3d304c8f55ab";
        let input = json!({"command": "cat status.txt || echo running"});
        assert_eq!(
            call,
            &hook(
                json!({"session_id": session, "hook_event_name": "PreToolUse",
                    "tool_name": "Bash", "tool_use_id": "call_2", "tool_input": input}),
                1_796_427_578_994
            )
        );
        assert_eq!(
            result,
            &hook(
                json!({"session_id": session, "hook_event_name": "PostToolUse",
                    "tool_name": "Bash", "tool_use_id": "call_2", "tool_input": input,
                    "tool_response": "running\ncat: status.txt: No such file or directory\n"}),
                1_796_427_579_040
            )
        );
    }

    #[test]
    fn a_call_codex_itself_failed_is_a_tool_error() {
        let log = record_of(
            &[
                ("event.name", "codex.tool_result"),
                ("conversation.id", "s"),
                ("tool_name", "no_such_tool"),
                ("call_id", "call_3"),
                ("duration_ms", "0"),
                ("success", "false"),
                ("arguments", r#"{"a": 1}"#),
                ("output", "unsupported call: no_such_tool"),
            ],
            5_000_000,
        );
        let Outcome::Events(_, events) = map_record(&Record::new(&log, &[], "acme")) else {
            panic!("not mapped");
        };
        let EventBody::ToolResult(result) = &events[1].2.body else {
            panic!("{events:?}");
        };
        assert_eq!(
            (result.kind, result.code.as_deref()),
            (
                fusebox_core::event::ResultKind::Retryable,
                Some("tool_error")
            )
        );
    }
}
