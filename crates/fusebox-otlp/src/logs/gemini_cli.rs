//! Gemini CLI's own telemetry (`telemetry.enabled`, `otlpProtocol: "http"`), as 0.61.0
//! exports it: one OTLP log record per event, named by its `event.name` attribute
//! (`gemini_cli.tool_call` …), the session in `session.id` (on every record and on the
//! resource). The table in `docs/otel.md` ("Gemini CLI's telemetry") is the contract.
//!
//! - **The run is the session**, named as `fusebox-hook gemini-cli` and `fusebox whatif
//!   --from gemini-cli` name it ([`run_id`]), so the three paths judge one session as one
//!   run, under the built-in `gemini-cli` profile: `gemini_cli.config` (once per process,
//!   at startup) is the run's `run_started`, with the hook's own event id, so a session
//!   watched by both is started once.
//! - **A tool call is one record, written when the call has ended**: `function_name`,
//!   `function_args` (the arguments as JSON text; only with `logPrompts`, the default),
//!   `success`, `error`, `duration_ms`. It becomes the hook's two events
//!   ([`Step::Call`], [`Step::Result`] of the protocol all hooks share): the call at the
//!   record's time less `duration_ms`, its result at the record's time, a failure a
//!   RETRYABLE `tool_error` as the hook says it. The record carries **no output** (only
//!   `content_length`), so the result has none: a call repeated with the same arguments
//!   is a repeat whatever it answered.
//! - **A model response** (`gemini_cli.api_response`) is a `model_turn` with its usage.
//! - `gemini_cli.user_prompt` is the session's next task (`prompt`), as the hook's
//!   BeforeAgent; `gemini_cli.chat_compression` that shrank the history a `compaction`.
//!
//! Every other `gemini_cli.*` event, and the `gen_ai.client.inference.operation.details`
//! records Gemini CLI writes beside each API request and response, is skipped: it says
//! nothing the guard judges. A record of a mapped event without what its mapping needs
//! (no session, no tool name, no `success`) is refused with the field named.

use fusebox_core::event::{Args, Compaction, ModelTurn, Prompt, RunStarted, Usage};
use fusebox_core::EventBody;
use fusebox_hook::gemini_cli::{run_id, Operations, PROTOCOL};
use fusebox_hook::protocol::Step;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use serde_json::Value;

use super::Record;
use crate::map::Outcome;

/// The runs' agent name: the hook's default, so the same built-in profile and
/// `[agents.gemini-cli.policy]` apply.
const AGENT: &str = "gemini-cli";

/// Why a Gemini CLI record was not mapped.
pub mod reason {
    /// A mapped event without `session.id`: no run to put it in.
    pub const NO_SESSION: &str = "no_session";
    /// A `gemini_cli.tool_call` without `function_name`.
    pub const NO_TOOL_NAME: &str = "no_tool_name";
    /// A `gemini_cli.tool_call` without `success`: neither a success nor a failure.
    pub const NO_OUTCOME: &str = "no_outcome";
}

/// Whether `record` comes from Gemini CLI (its resource's `service.name`): the
/// `gen_ai.*` records it writes beside its own are its, and skipped here.
pub(crate) fn emitted_by_gemini_cli(record: &Record<'_>) -> bool {
    record.str("service.name") == Some("gemini-cli")
}

pub(crate) fn map_record(record: &Record<'_>) -> Outcome {
    let name = record.name.unwrap_or("");
    let mapped = matches!(
        name,
        "gemini_cli.config"
            | "gemini_cli.user_prompt"
            | "gemini_cli.tool_call"
            | "gemini_cli.api_response"
            | "gemini_cli.chat_compression"
    );
    if !mapped {
        return Outcome::Skipped;
    }
    let Some(session) = record.str("session.id") else {
        return refused(
            record,
            reason::NO_SESSION,
            format!("{name} without `session.id`"),
            None,
        );
    };
    let run = run_id(session);
    let ts = record.ts_ns();
    let event = |suffix: &str, ts_ns: u64, body: EventBody| record.event(&run, suffix, ts_ns, body);
    match name {
        "gemini_cli.config" => {
            Outcome::Events(run.clone(), vec![(ts, 0, session_start(record, &run, ts))])
        }
        // A prompt opens the session too: `gemini_cli.config` is written once per process,
        // so a session begun in it later (`/clear`) has none, nor has one whose start
        // went unseen. The copies of the start are dropped (one id).
        "gemini_cli.user_prompt" => Outcome::Events(
            run.clone(),
            vec![
                (ts, 0, session_start(record, &run, ts)),
                (ts, 1, event("p", ts, EventBody::Prompt(Prompt {}))),
            ],
        ),
        "gemini_cli.tool_call" => tool_call(record, &run, ts),
        "gemini_cli.api_response" => Outcome::Events(
            run.clone(),
            vec![(
                ts,
                0,
                event("t", ts, EventBody::ModelTurn(model_turn(record))),
            )],
        ),
        "gemini_cli.chat_compression" => {
            let (before, after) = (record.count("tokens_before"), record.count("tokens_after"));
            // Logged also when the compression failed or would have grown the history
            // (then not applied): only a smaller history is a compaction.
            match (before, after) {
                (Some(before), Some(after)) if after < before => Outcome::Events(
                    run.clone(),
                    vec![(
                        ts,
                        0,
                        event(
                            "k",
                            ts,
                            EventBody::Compaction(Compaction {
                                reason: Some(format!("{AGENT}: chat compression")),
                            }),
                        ),
                    )],
                ),
                _ => Outcome::Skipped,
            }
        }
        _ => Outcome::Skipped,
    }
}

/// The session's `run_started`, with the hook's id for it (`gm-session-start`): a session
/// watched by both, or opened by several records, is started once.
fn session_start(record: &Record<'_>, run: &str, ts: u64) -> fusebox_core::Event {
    let mut start = record.event(
        run,
        "s",
        ts,
        EventBody::RunStarted(RunStarted {
            agent: Some(AGENT.to_owned()),
            tools: None,
            policy: None,
            parent: None,
        }),
    );
    start.id = format!("{}-session-start", PROTOCOL.prefix);
    start
}

/// What Gemini CLI says of a call a BeforeTool hook denied: it never ran, and the hook
/// that denied it reported it.
const BLOCKED: &str = "Tool execution blocked";

fn tool_call(record: &Record<'_>, run: &str, ts: u64) -> Outcome {
    let Some(tool) = record.str("function_name") else {
        return refused(
            record,
            reason::NO_TOOL_NAME,
            "gemini_cli.tool_call without `function_name`".to_owned(),
            Some(run.to_owned()),
        );
    };
    let Some(success) = record.flag("success") else {
        return refused(
            record,
            reason::NO_OUTCOME,
            format!("gemini_cli.tool_call of {tool:?} without `success`"),
            Some(run.to_owned()),
        );
    };
    let error = record.str("error");
    // The user said no (`decision: reject`), or a hook denied it: it did not run.
    if record.str("decision") == Some("reject") || error.is_some_and(|e| e.starts_with(BLOCKED)) {
        return Outcome::Skipped;
    }
    // `function_args` is the arguments object as JSON text (indented); absent when
    // `logPrompts` is off.
    let input: Option<Value> = record
        .attr("function_args")
        .map(crate::attrs::json_text_or_value);
    let operations = Operations::default();
    let duration_ns = record.count("duration_ms").unwrap_or(0) * 1_000_000;
    let call_ts = ts.saturating_sub(duration_ns);
    let hook_event = |step: Step<'_>, at: u64| {
        PROTOCOL
            .event(step, &operations, record.tenant, run, AGENT, at / 1_000_000)
            .body
    };
    let mut call = record.event(
        run,
        "c",
        call_ts,
        hook_event(
            Step::Call {
                id: "",
                tool,
                input: input.as_ref(),
            },
            call_ts,
        ),
    );
    // No id names the call in the record: its events' id does (the record's digest).
    let call_id = call.id.strip_suffix("-c").unwrap_or(&call.id).to_owned();
    if let EventBody::ToolCall(c) = &mut call.body {
        c.call_id.clone_from(&call_id);
        if input.is_none() {
            // Arguments not recorded: counted, never taken for a repeat of another call.
            c.args = Args::Hash(format!("{call_id}-unrecorded"));
        }
    }
    let mut result = record.event(
        run,
        "r",
        ts,
        hook_event(
            Step::Result {
                id: "",
                tool,
                input: input.as_ref(),
                failure: (!success).then_some("tool_error"),
                output: Value::Null,
            },
            ts,
        ),
    );
    if let EventBody::ToolResult(r) = &mut result.body {
        r.call_id = call_id;
        // The record says how long the output was, not what it said.
        r.output = None;
    }
    Outcome::Events(run.to_owned(), vec![(call_ts, 0, call), (ts, 1, result)])
}

/// Gemini's usage in the guard's terms, so that it sums to `total_token_count`:
/// `input_token_count` (the prompt, cached part included) and `tool_token_count` are
/// input, less `cached_content_token_count` (a cache read); `output_token_count` and
/// `thoughts_token_count` (billed as output) are output.
fn model_turn(record: &Record<'_>) -> ModelTurn {
    let cached = record.count("cached_content_token_count");
    let input = match (
        record.count("input_token_count"),
        record.count("tool_token_count"),
    ) {
        (None, None) => None,
        (a, b) => Some((a.unwrap_or(0) + b.unwrap_or(0)).saturating_sub(cached.unwrap_or(0))),
    };
    let output = match (
        record.count("output_token_count"),
        record.count("thoughts_token_count"),
    ) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    };
    let usage = Usage {
        input_tokens: input,
        output_tokens: output,
        cache_creation_input_tokens: None,
        cache_read_input_tokens: cached.filter(|c| *c > 0),
    };
    let finish = match record.attr("finish_reasons") {
        Some(Any::ArrayValue(array)) => array.values.first().and_then(|v| match &v.value {
            Some(Any::StringValue(s)) => Some(s.to_ascii_lowercase()),
            _ => None,
        }),
        Some(Any::StringValue(s)) => Some(s.to_ascii_lowercase()),
        _ => None,
    };
    // Gemini's finish reasons (lowercased by Gemini CLI) in the guard's vocabulary: a
    // function call also finishes with `stop`.
    let stop_reason = match finish.as_deref() {
        Some("stop") => "end_turn".to_owned(),
        Some("max_tokens") => "max_tokens".to_owned(),
        Some(
            "safety" | "recitation" | "blocklist" | "prohibited_content" | "spii" | "image_safety",
        ) => "refusal".to_owned(),
        Some(other) => other.to_owned(),
        None => "unspecified".to_owned(),
    };
    ModelTurn {
        valid: (finish.as_deref() == Some("malformed_function_call")).then_some(false),
        stop_reason,
        usage: (usage != Usage::default()).then_some(usage),
        cost_usd: None,
    }
}

fn refused(
    record: &Record<'_>,
    reason: &'static str,
    detail: String,
    run: Option<String>,
) -> Outcome {
    Outcome::Rejected(record.rejected(reason, detail, run))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::Mapped;
    use fusebox_core::Event;
    use fusebox_hook::gemini_cli::{event_for, Payload};
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
    use opentelemetry_proto::tonic::logs::v1::LogRecord;
    use serde_json::json;

    fn kv(key: &str, value: Any) -> KeyValue {
        KeyValue {
            key: key.to_owned(),
            value: Some(AnyValue { value: Some(value) }),
            ..Default::default()
        }
    }

    fn text(s: &str) -> Any {
        Any::StringValue(s.to_owned())
    }

    /// One `gemini_cli.tool_call` record as 0.61.0 writes it, `more` attributes added.
    fn tool_call_record(args: &str, success: bool, more: Vec<KeyValue>) -> LogRecord {
        let mut attributes = vec![
            kv("session.id", text("d4462970-dfc5-42da-bc94-926ece840ba1")),
            kv("event.name", text("gemini_cli.tool_call")),
            kv("function_name", text("run_shell_command")),
            kv("duration_ms", Any::IntValue(186)),
            kv("success", Any::BoolValue(success)),
            kv("decision", text("accept")),
            kv("function_args", text(args)),
        ];
        attributes.extend(more);
        LogRecord {
            time_unix_nano: 1_796_427_780_594_000_000,
            attributes,
            ..Default::default()
        }
    }

    fn mapped(log: &LogRecord) -> Vec<Event> {
        let record = Record::new(log, &[], "acme");
        let mut staging = crate::map::Staging::new(1 << 20);
        staging.add(map_record(&record), |reason, detail, run| {
            record.rejected(reason, detail, run)
        });
        let Mapped { events, .. } = staging.finish();
        events
    }

    #[test]
    fn a_call_is_the_hooks_before_tool_event_for_the_same_input() {
        // Indented as Gemini CLI writes `function_args`: the hook reads the object.
        let log = tool_call_record("{\n  \"command\": \"echo hello\"\n}", true, vec![]);
        let events = mapped(&log);
        let payload = Payload::parse(
            json!({"session_id": "d4462970-dfc5-42da-bc94-926ece840ba1",
                "hook_event_name": "BeforeTool", "timestamp": "t",
                "tool_name": "run_shell_command", "tool_input": {"command": "echo hello"}})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        let hook = event_for(
            &payload,
            &Operations::default(),
            "acme",
            &run_id("d4462970-dfc5-42da-bc94-926ece840ba1"),
            AGENT,
            Some("g1"),
            0,
        )
        .unwrap()
        .unwrap();
        let (EventBody::ToolCall(ours), EventBody::ToolCall(theirs)) =
            (&events[0].body, &hook.body)
        else {
            panic!("{events:?} / {hook:?}");
        };
        assert_eq!((&ours.tool, &ours.args), (&theirs.tool, &theirs.args));
        assert_eq!(events[0].run, hook.run);
        assert_eq!(
            events[0].ts_ms, 1_796_427_780_408,
            "the call began duration_ms earlier"
        );
    }

    #[test]
    fn a_prompt_opens_its_session_as_the_hook_does() {
        // `/clear` begins a session with no `gemini_cli.config` record of its own.
        let log = LogRecord {
            time_unix_nano: 1_796_427_780_160_000_000,
            attributes: vec![
                kv("session.id", text("5c3e0a59-0000-4000-8000-000000000001")),
                kv("event.name", text("gemini_cli.user_prompt")),
                kv(
                    "prompt_id",
                    text("5c3e0a59-0000-4000-8000-000000000001########1"),
                ),
            ],
            ..Default::default()
        };
        let events = mapped(&log);
        let kinds: Vec<_> = events
            .iter()
            .map(|e| (e.id.split('-').next().unwrap_or(""), &e.body))
            .map(|(prefix, body)| match body {
                EventBody::RunStarted(start) => (prefix.to_owned(), start.agent.clone()),
                EventBody::Prompt(_) => (prefix.to_owned(), None),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("gm".to_owned(), Some(AGENT.to_owned())),
                ("otlp".to_owned(), None)
            ]
        );
        assert_eq!(events[0].id, "gm-session-start");
    }

    #[test]
    fn a_failed_call_is_a_retryable_tool_error_and_a_denied_one_is_not_a_call() {
        let failed = tool_call_record(
            "{}",
            false,
            vec![kv("error", text("File not found: /w/missing.txt"))],
        );
        let events = mapped(&failed);
        let EventBody::ToolResult(result) = &events[1].body else {
            panic!("{events:?}");
        };
        assert_eq!(result.kind, fusebox_core::event::ResultKind::Retryable);
        assert_eq!(result.code.as_deref(), Some("tool_error"));
        assert_eq!(result.output, None);

        let denied = tool_call_record(
            "{}",
            false,
            vec![kv(
                "error",
                text("Tool execution blocked: fusebox: refused"),
            )],
        );
        assert!(mapped(&denied).is_empty());
    }
}
