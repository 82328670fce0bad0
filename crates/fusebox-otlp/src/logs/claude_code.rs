//! Claude Code's own telemetry (`CLAUDE_CODE_ENABLE_TELEMETRY=1`, `OTEL_LOGS_EXPORTER=otlp`)
//! as 2.1.327 exports it: one log record per event, its body the whole event name
//! (`claude_code.tool_result`), every record carrying the session's `session.id`, a
//! sub-agent's its `agent_id`. The table in `docs/otel.md` ("Claude Code's telemetry") is
//! the contract.
//!
//! A record becomes what Claude Code's hook sends for the same moment, made by the hook's
//! own mapping ([`fusebox_hook::protocol::Protocol::event`]) under the hook's run ids and
//! event ids: the session's run is [`run_id`] of its session id, a sub-agent's
//! [`sub_agent_run`] of it, and a call is `cc-<tool_use_id>-call`. So the hook, the
//! telemetry and `fusebox whatif --from claude-code` name one run and one call alike, and
//! a session watched by its hook *and* its telemetry counts each call once (the daemon
//! drops an id it has applied).
//!
//! - `tool_result` (written after the tool ran) → the `tool_call`, at the record's time
//!   less its `duration_ms`, with the arguments of `tool_input` (only with
//!   `OTEL_LOG_TOOL_DETAILS=1`; without it a hash unique to the call, as
//!   [`crate::map`] does for spans without arguments), and its `tool_result`: SUCCESS, or
//!   RETRYABLE `tool_error` when `success` is false, as the hook's PostToolUseFailure. The
//!   tool's output is never exported: the result carries none (the error's text on a
//!   failure, when exported).
//! - `api_request` → a `model_turn` with its tokens and `cost_usd`.
//! - `user_prompt` → the session's `run_started` (agent `claude-code`: its built-in tool
//!   knowledge and `[agents.claude-code.policy]` apply as for the hook's runs) and its
//!   `prompt` (the next task), unless the prompt is a background task's completion notice.
//! - `compaction` (a successful one) → a `compaction`.
//! - `subagent_completed` → the sub-agent's `run_finished`.
//! - every other `claude_code.*` event (`tool_decision`, `assistant_response`,
//!   `api_error`, `plugin_loaded` …) → skipped: nothing the guard counts.

use fusebox_core::event::{Args, ModelTurn, Output, ResultKind, ToolCall, ToolResult, Usage};
use fusebox_core::{Event, EventBody};
use fusebox_hook::claude_code::{run_id, Operations, PROTOCOL};
use fusebox_hook::protocol::Step;
use fusebox_hook::{sub_agent_finished, sub_agent_run, sub_agent_started};
use serde_json::Value;

use super::Record;
use crate::attrs::json_text_or_value;
use crate::map::Outcome;

/// Why a Claude Code record was not mapped. Stable strings (metrics labels, dead
/// letters), shared with the other agents' mappings where they mean the same.
pub mod reason {
    /// A record that would map, without `session.id`: it belongs to no run.
    pub const NO_SESSION: &str = "no_session";
    /// A `tool_result` without `tool_name`.
    pub const NO_TOOL_NAME: &str = "no_tool_name";
    /// A `tool_result` without `tool_use_id`: its call could not be named.
    pub const NO_CALL_ID: &str = "no_call_id";
    /// A `tool_result` without `success` (or with neither `true` nor `false`).
    pub const NO_OUTCOME: &str = "no_outcome";
    /// A `user_prompt` without `prompt.id`: its task could not be named.
    pub const NO_PROMPT_ID: &str = "no_prompt_id";
    /// A `subagent_completed` without `agent_id`: no sub-agent's run to finish.
    pub const NO_AGENT_ID: &str = "no_agent_id";
}

/// The runs' agent name, as the hook's and the transcript import's.
const AGENT: &str = "claude-code";

/// How a background task's completion notice begins (2.1.327 submits it as a prompt of
/// its own; the hook does not make it a task either).
const TASK_NOTIFICATION: &str = "<task-notification>";

pub(crate) fn map_record(record: &Record<'_>) -> Outcome {
    let name = record.name.unwrap_or("");
    let event = name.strip_prefix("claude_code.").unwrap_or(name);
    if !matches!(
        event,
        "tool_result" | "api_request" | "user_prompt" | "compaction" | "subagent_completed"
    ) {
        return Outcome::Skipped;
    }
    let Some(session) = record.str("session.id") else {
        return Outcome::Rejected(record.rejected(
            reason::NO_SESSION,
            format!("{name} without `session.id`: no run to put it in"),
            None,
        ));
    };
    let session_run = run_id(session);
    // A sub-agent's records carry its id; the main agent's none.
    let sub_agent = record.str("agent_id");
    let run = match sub_agent {
        Some(agent_id) => sub_agent_run(&session_run, agent_id),
        None => session_run.clone(),
    };
    let ts_ns = record.ts_ns();
    let ts_ms = ts_ns / 1_000_000;
    let mut events: Vec<(u64, u8, Event)> = Vec::new();
    let incomplete = |reason: &'static str, field: &str| {
        Outcome::Rejected(record.rejected(
            reason,
            format!("{name} without `{field}`"),
            Some(run.clone()),
        ))
    };
    let operations = Operations::default();
    let step = |step: Step, ts_ms: u64| {
        PROTOCOL.event(step, &operations, record.tenant, &run, AGENT, ts_ms)
    };
    match event {
        "tool_result" => {
            let Some(id) = record.str("tool_use_id") else {
                return incomplete(reason::NO_CALL_ID, "tool_use_id");
            };
            let Some(tool) = record.str("tool_name") else {
                return incomplete(reason::NO_TOOL_NAME, "tool_name");
            };
            let Some(success) = record.flag("success") else {
                return incomplete(reason::NO_OUTCOME, "success");
            };
            // The call began `duration_ms` before the record was written.
            let took_ns = record
                .count("duration_ms")
                .unwrap_or(0)
                .saturating_mul(1_000_000);
            let call_ns = ts_ns.saturating_sub(took_ns);
            let input = record.attr("tool_input").map(json_text_or_value);
            let mut call = step(
                Step::Call {
                    id,
                    tool,
                    input: input.as_ref(),
                },
                call_ns / 1_000_000,
            );
            if input.is_none() {
                // Arguments not exported: a hash unique to the call keeps it countable
                // without making every call of the tool look like a repeat of the last.
                if let EventBody::ToolCall(ToolCall { args, .. }) = &mut call.body {
                    *args = Args::Hash(format!("otlp-unrecorded-{id}"));
                }
            }
            let failure = (!success).then_some("tool_error");
            let mut result = step(
                Step::Result {
                    id,
                    tool,
                    input: input.as_ref(),
                    failure,
                    output: Value::Null,
                },
                ts_ms,
            );
            if let EventBody::ToolResult(ToolResult { kind, output, .. }) = &mut result.body {
                // The output is not exported; a failure's text is, with tool details.
                *output = match (*kind, record.str("error")) {
                    (ResultKind::Retryable, Some(error)) => {
                        Some(Output::inline_or_hash(Value::String(error.to_owned())))
                    }
                    _ => None,
                };
            }
            events.push((call_ns, 1, call));
            events.push((ts_ns, 2, result));
        }
        "api_request" => {
            let usage = Usage {
                input_tokens: record.count("input_tokens"),
                output_tokens: record.count("output_tokens"),
                cache_creation_input_tokens: record.count("cache_creation_tokens"),
                cache_read_input_tokens: record.count("cache_read_tokens"),
            };
            let turn = ModelTurn {
                // Not exported: the request's end says nothing of why the model stopped.
                stop_reason: "unspecified".to_owned(),
                usage: (usage != Usage::default()).then_some(usage),
                cost_usd: record
                    .number("cost_usd")
                    .filter(|c| c.is_finite() && *c >= 0.0),
                valid: None,
            };
            events.push((
                ts_ns,
                1,
                record.event(&run, "t", ts_ns, EventBody::ModelTurn(turn)),
            ));
        }
        "user_prompt" => {
            if sub_agent.is_some() {
                // A sub-agent's task is no prompt of the user's (the hook sends none).
                return Outcome::Skipped;
            }
            let Some(prompt_id) = record.str("prompt.id") else {
                return incomplete(reason::NO_PROMPT_ID, "prompt.id");
            };
            // The hook's SessionStart: one id per session, applied once.
            events.push((ts_ns, 0, step(Step::SessionStart, ts_ms)));
            // The words are exported only with OTEL_LOG_USER_PROMPTS=1: only then can a
            // completion notice be told from the user's prompt.
            let notice = record
                .str("prompt")
                .is_some_and(|text| text.starts_with(TASK_NOTIFICATION));
            if !notice {
                events.push((ts_ns, 1, step(Step::Prompt { id: prompt_id }, ts_ms)));
            }
        }
        "compaction" => {
            if record.flag("success") == Some(false) {
                return Outcome::Skipped;
            }
            let trigger = record.str("trigger");
            // No id names a compaction: the record's place in the session's events does.
            let moment = format!(
                "otlp:{}:{}:{session}",
                trigger.unwrap_or(""),
                record
                    .count("event.sequence")
                    .map_or_else(|| ts_ns.to_string(), |n| n.to_string())
            );
            events.push((ts_ns, 1, step(Step::Compaction { moment, trigger }, ts_ms)));
        }
        "subagent_completed" => {
            if sub_agent.is_none() {
                return incomplete(reason::NO_AGENT_ID, "agent_id");
            }
            let finished = sub_agent_finished(
                PROTOCOL.prefix,
                record.tenant,
                &run,
                "sub-agent ended",
                ts_ms,
            );
            events.push((ts_ns, 3, finished));
        }
        _ => unreachable!("filtered above"),
    }
    // No record says a sub-agent started: its run is opened before each of its records
    // that maps (one id per run: the daemon applies the first and drops the others).
    if sub_agent.is_some() && event != "subagent_completed" {
        let first_ns = events.iter().map(|(ns, _, _)| *ns).min().unwrap_or(ts_ns);
        let start = sub_agent_started(
            PROTOCOL.prefix,
            record.tenant,
            &run,
            &session_run,
            AGENT,
            first_ns / 1_000_000,
        );
        events.push((first_ns, 0, start));
    }
    Outcome::Events(run, events)
}

#[cfg(test)]
mod tests {
    use fusebox_core::event::{Args, ToolCall};
    use fusebox_core::EventBody;
    use fusebox_hook::claude_code::{event_for, Operations, Payload};
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
    use opentelemetry_proto::tonic::logs::v1::LogRecord;
    use serde_json::json;

    use super::super::Record;
    use crate::map::Outcome;

    fn kv(key: &str, value: &str) -> KeyValue {
        KeyValue {
            key: key.to_owned(),
            value: Some(AnyValue {
                value: Some(Any::StringValue(value.to_owned())),
            }),
            ..Default::default()
        }
    }

    /// A `claude_code.tool_result` record as 2.1.327 writes it (trimmed).
    fn tool_result(session: &str, input: Option<&str>) -> LogRecord {
        let mut attributes = vec![
            kv("session.id", session),
            kv("event.name", "tool_result"),
            kv("tool_name", "Bash"),
            kv("tool_use_id", "toolu_01"),
            kv("success", "true"),
            kv("duration_ms", "40"),
        ];
        attributes.extend(input.map(|input| kv("tool_input", input)));
        LogRecord {
            time_unix_nano: 1_796_427_566_627_000_000,
            body: Some(AnyValue {
                value: Some(Any::StringValue("claude_code.tool_result".to_owned())),
            }),
            attributes,
            ..Default::default()
        }
    }

    fn mapped(log: &LogRecord) -> (String, Vec<fusebox_core::Event>) {
        let record = Record::new(log, &[], "t");
        match super::map_record(&record) {
            Outcome::Events(run, events) => (run, events.into_iter().map(|(_, _, e)| e).collect()),
            _ => panic!("not mapped"),
        }
    }

    #[test]
    fn a_call_is_the_hooks_call_in_the_hooks_run() {
        let session = "418b4508-5f3f-48e9-adee-d7dbaac95e56";
        let input = json!({"command": "cat status.txt || echo running", "description": "Check"});
        let (run, events) = mapped(&tool_result(session, Some(&input.to_string())));
        let payload = json!({"session_id": session, "hook_event_name": "PreToolUse",
            "tool_name": "Bash", "tool_use_id": "toolu_01", "tool_input": input});
        let payload = Payload::parse(payload.to_string().as_bytes()).unwrap();
        let hooked = event_for(
            &payload,
            &Operations::default(),
            "t",
            session,
            "claude-code",
            None,
            events[0].ts_ms,
        )
        .unwrap()
        .unwrap();
        // The same run, id and body: repeats are recognised alike, and a session watched
        // both ways counts the call once.
        assert_eq!(run, session);
        assert_eq!(events[0], hooked);
        // It began `duration_ms` before the record.
        assert_eq!(events[1].ts_ms - events[0].ts_ms, 40);
    }

    #[test]
    fn without_tool_details_each_call_has_an_identity_of_its_own() {
        let (_, events) = mapped(&tool_result("s", None));
        assert!(matches!(&events[0].body,
            EventBody::ToolCall(ToolCall { args: Args::Hash(h), .. }) if h == "otlp-unrecorded-toolu_01"));
    }
}
