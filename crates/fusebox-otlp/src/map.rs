//! OTLP spans → fusebox passive events. Pure: no I/O, no clock; the same request always
//! maps to the same events with the same ids.
//!
//! The shapes understood are the OpenTelemetry GenAI semantic conventions (Development
//! status) as Pydantic AI 2.66 emits them (instrumentation format 5, the default); the
//! table in `docs/otel.md` is the contract. A span is classified by
//! `gen_ai.operation.name`:
//!
//! - `execute_tool` → a `tool_call` at the span's start and a `tool_result` at its end;
//! - `chat`, `text_completion`, `generate_content` → a `model_turn` at its end (usage
//!   from `gen_ai.usage.*`);
//! - `invoke_agent`, `create_agent`, `invoke_workflow`, `embeddings` → nothing to map
//!   (structure, not steps): counted as skipped;
//! - anything else, or a span without the attribute → rejected with a reason, for the
//!   dead-letter subject and the OTLP `partial_success` answer: nothing vanishes silently.

use fusebox_core::event::{Args, ModelTurn, Output, ResultKind, ToolCall, ToolResult, Usage};
use fusebox_core::parse::{MAX_ID_LEN, MAX_RUN_LEN};
use fusebox_core::{check_event, Event, EventBody};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{status::StatusCode, Span};
use serde_json::{Map, Value};

/// Why a span was not mapped. Stable strings: metrics labels and dead letters use them.
pub mod reason {
    /// The span has no `gen_ai.operation.name`: not a GenAI span.
    pub const NO_OPERATION: &str = "no_operation";
    /// A `gen_ai.operation.name` this mapping does not know.
    pub const UNKNOWN_OPERATION: &str = "unknown_operation";
    /// An `execute_tool` span without `gen_ai.tool.name`.
    pub const NO_TOOL_NAME: &str = "no_tool_name";
    /// A span without a valid trace id or span id (ids are what dedup rests on).
    pub const BAD_IDS: &str = "bad_ids";
    /// The mapped event fails the guard's own validation (e.g. over `max_event_bytes`).
    pub const INVALID_EVENT: &str = "invalid_event";
}

/// A span that was not mapped, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    pub reason: &'static str,
    pub detail: String,
    /// The span's name, trace id and span id (hex), for the dead letter.
    pub span_name: String,
    pub trace_id: String,
    pub span_id: String,
    /// The run the span would have belonged to, when known.
    pub run: Option<String>,
}

/// What one request maps to.
#[derive(Debug, Default)]
pub struct Mapped {
    /// The events, grouped by run in the order the runs first appear, each run's in time
    /// order: the order to publish them in.
    pub events: Vec<Event>,
    /// Spans turned into events.
    pub mapped_spans: usize,
    /// Known GenAI spans with nothing to map (`invoke_agent` …).
    pub skipped_spans: usize,
    pub rejected: Vec<Rejected>,
}

const OP: &str = "gen_ai.operation.name";
const TOOL_NAME: &str = "gen_ai.tool.name";
const TOOL_CALL_ID: &str = "gen_ai.tool.call.id";
const TOOL_ARGS: &str = "gen_ai.tool.call.arguments";
const TOOL_RESULT: &str = "gen_ai.tool.call.result";
const CONVERSATION: &str = "gen_ai.conversation.id";
const SESSION: &str = "session.id";
const INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
const OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
const CACHE_READ: &str = "gen_ai.usage.cache_read.input_tokens";
const CACHE_CREATION: &str = "gen_ai.usage.cache_creation.input_tokens";
const FINISH_REASONS: &str = "gen_ai.response.finish_reasons";

const MODEL_OPERATIONS: [&str; 3] = ["chat", "text_completion", "generate_content"];
const STRUCTURAL_OPERATIONS: [&str; 4] = [
    "invoke_agent",
    "create_agent",
    "invoke_workflow",
    "embeddings",
];

/// Maps every span of `request` for `tenant`. `max_event_bytes` is the daemon's bound:
/// an event past it is rejected here, with its span named, rather than dead-lettered
/// later without one.
pub fn map_request(
    request: &ExportTraceServiceRequest,
    tenant: &str,
    max_event_bytes: usize,
) -> Mapped {
    let mut mapped = Mapped::default();
    // (run's first appearance, ts, rank within the span, event): sorted below.
    let mut staged: Vec<(usize, u64, u8, Event)> = Vec::new();
    let mut runs: Vec<String> = Vec::new();
    for resource_spans in &request.resource_spans {
        for scope_spans in &resource_spans.scope_spans {
            for span in &scope_spans.spans {
                match map_span(span, tenant) {
                    SpanOutcome::Events(run, events) => {
                        let bad = events
                            .iter()
                            .find_map(|(_, _, e)| check_event(e, max_event_bytes).err());
                        if let Some(err) = bad {
                            mapped.rejected.push(rejected(
                                span,
                                reason::INVALID_EVENT,
                                err.to_string(),
                                Some(run),
                            ));
                            continue;
                        }
                        let index = runs.iter().position(|r| *r == run).unwrap_or_else(|| {
                            runs.push(run);
                            runs.len() - 1
                        });
                        mapped.mapped_spans += 1;
                        staged.extend(
                            events
                                .into_iter()
                                .map(|(ts, rank, event)| (index, ts, rank, event)),
                        );
                    }
                    SpanOutcome::Skipped => mapped.skipped_spans += 1,
                    SpanOutcome::Rejected(r) => mapped.rejected.push(r),
                }
            }
        }
    }
    // Exporters send spans in the order they *ended*: a tool span ends after the calls
    // it made began. The guard reads a run in time order (a call before its result), so
    // each run's events are put in time order; the id breaks ties deterministically.
    staged.sort_by(|a, b| (a.0, a.1, a.2, &a.3.id).cmp(&(b.0, b.1, b.2, &b.3.id)));
    mapped.events = staged.into_iter().map(|(_, _, _, e)| e).collect();
    mapped
}

enum SpanOutcome {
    /// The run and its events as (ts in ns, rank, event).
    Events(String, Vec<(u64, u8, Event)>),
    Skipped,
    Rejected(Rejected),
}

fn map_span(span: &Span, tenant: &str) -> SpanOutcome {
    if span.trace_id.len() != 16 || span.span_id.len() != 8 {
        return SpanOutcome::Rejected(rejected(
            span,
            reason::BAD_IDS,
            format!(
                "trace id of {} bytes and span id of {} bytes (OTLP: 16 and 8)",
                span.trace_id.len(),
                span.span_id.len()
            ),
            None,
        ));
    }
    let run = run_of(span);
    let Some(operation) = str_attr(span, OP) else {
        return SpanOutcome::Rejected(rejected(
            span,
            reason::NO_OPERATION,
            format!("span {:?} has no `{OP}`: not a GenAI span", span.name),
            Some(run),
        ));
    };
    let span_id = hex(&span.span_id);
    let envelope = |suffix: &str, ts_ns: u64, body: EventBody| Event {
        v: 1,
        // Ids from the span id: a batch the exporter re-sends maps to the same ids, and
        // JetStream's `Nats-Msg-Id` dedup and the sequencer drop the copies.
        id: format!("otlp-{span_id}-{suffix}"),
        tenant: tenant.to_owned(),
        run: run.clone(),
        // No `seq`: OTLP has no per-run order to give, so the events are applied in the
        // order they arrive (the passive path without `seq`), as with any producer that
        // sends none.
        seq: None,
        ts_ms: ts_ns / 1_000_000,
        body,
    };
    match operation {
        "execute_tool" => {
            let Some(tool) = str_attr(span, TOOL_NAME).filter(|t| !t.is_empty()) else {
                return SpanOutcome::Rejected(rejected(
                    span,
                    reason::NO_TOOL_NAME,
                    format!("execute_tool span {:?} has no `{TOOL_NAME}`", span.name),
                    Some(run),
                ));
            };
            let call_id = str_attr(span, TOOL_CALL_ID)
                .filter(|id| !id.is_empty() && id.len() <= MAX_ID_LEN)
                .map_or_else(|| span_id.clone(), str::to_owned);
            let args = match attr(span, TOOL_ARGS) {
                Some(value) => Args::inline_or_hash(json_text_or_value(value)),
                // Content capture off: no arguments travel. A hash unique to the span
                // keeps the call countable (steps, budgets, errors) without making every
                // call of the tool look like a repeat of the last.
                None => Args::Hash(format!("otlp-unrecorded-{span_id}")),
            };
            let call = ToolCall {
                call_id: call_id.clone(),
                tool: tool.to_owned(),
                args,
                op_key: None,
                effect: None,
            };
            let (kind, code) =
                if span.status.as_ref().map(|s| s.code) == Some(StatusCode::Error as i32) {
                    // A tool that raised: the framework hands the error to the model, which
                    // may try again, so RETRYABLE (counted against `max_tool_errors`), with
                    // the exception's type as the code. Not FATAL: a span status cannot say
                    // "needs a human", and FATAL would close the run on one exception.
                    (ResultKind::Retryable, Some(exception_type(span)))
                } else {
                    (ResultKind::Success, None)
                };
            let result = ToolResult {
                call_id,
                tool: tool.to_owned(),
                kind,
                code,
                retry_after_ms: None,
                terminal: None,
                output: attr(span, TOOL_RESULT)
                    .map(|v| Output::inline_or_hash(json_text_or_value(v))),
                progress: None,
            };
            SpanOutcome::Events(
                run.clone(),
                vec![
                    (
                        span.start_time_unix_nano,
                        0,
                        envelope("c", span.start_time_unix_nano, EventBody::ToolCall(call)),
                    ),
                    (
                        span.end_time_unix_nano,
                        1,
                        envelope("r", span.end_time_unix_nano, EventBody::ToolResult(result)),
                    ),
                ],
            )
        }
        op if MODEL_OPERATIONS.contains(&op) => {
            let usage = Usage {
                input_tokens: int_attr(span, INPUT_TOKENS),
                output_tokens: int_attr(span, OUTPUT_TOKENS),
                cache_creation_input_tokens: int_attr(span, CACHE_CREATION),
                cache_read_input_tokens: int_attr(span, CACHE_READ),
            };
            let turn = ModelTurn {
                stop_reason: stop_reason(span),
                usage: (usage != Usage::default()).then_some(usage),
                cost_usd: None,
                valid: None,
            };
            SpanOutcome::Events(
                run.clone(),
                vec![(
                    span.end_time_unix_nano,
                    1,
                    envelope("t", span.end_time_unix_nano, EventBody::ModelTurn(turn)),
                )],
            )
        }
        op if STRUCTURAL_OPERATIONS.contains(&op) => SpanOutcome::Skipped,
        other => SpanOutcome::Rejected(rejected(
            span,
            reason::UNKNOWN_OPERATION,
            format!(
                "span {:?}: `{OP}` = {other:?} is not a shape this receiver maps",
                span.name
            ),
            Some(run),
        )),
    }
}

/// The run a span belongs to: its `gen_ai.conversation.id` (one per agent run in
/// Pydantic AI; a session's when the application sets it), else the general
/// conventions' `session.id` (what instrumentations without the GenAI attribute set),
/// else its trace.
fn run_of(span: &Span) -> String {
    [CONVERSATION, SESSION]
        .iter()
        .find_map(|key| str_attr(span, key).filter(|id| !id.is_empty()))
        .map_or_else(|| format!("otlp-{}", hex(&span.trace_id)), run_token)
}

/// A run id within the guard's character set and length: other characters become `_`,
/// and an id past the bound is cut and suffixed with a hash of the whole, so two long
/// ids that share a prefix stay two runs.
pub fn run_token(raw: &str) -> String {
    let safe: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.len() <= MAX_RUN_LEN {
        return safe;
    }
    let digest = fusebox_core::event::hex_sha256(raw.as_bytes());
    format!("{}-{}", &safe[..MAX_RUN_LEN - 17], &digest[..16])
}

/// OpenTelemetry's finish reasons in the guard's vocabulary (guard contract §2); others
/// pass through as they are (any string is allowed), an absent one is `unspecified`.
fn stop_reason(span: &Span) -> String {
    let first = match attr(span, FINISH_REASONS) {
        Some(Any::ArrayValue(array)) => array.values.first().and_then(|v| match &v.value {
            Some(Any::StringValue(s)) => Some(s.as_str()),
            _ => None,
        }),
        Some(Any::StringValue(s)) => Some(s.as_str()),
        _ => None,
    };
    match first {
        Some("stop") => "end_turn",
        Some("tool_call") | Some("tool_calls") => "tool_use",
        Some("length") => "max_tokens",
        Some("content_filter") => "refusal",
        Some(other) => other,
        None => "unspecified",
    }
    .to_owned()
}

/// The `exception.type` of the span's first `exception` event, else `error`.
fn exception_type(span: &Span) -> String {
    span.events
        .iter()
        .filter(|e| e.name == "exception")
        .find_map(|e| find(&e.attributes, "exception.type"))
        .and_then(|v| match v {
            Any::StringValue(s) if !s.is_empty() => Some(s.clone()),
            _ => None,
        })
        .unwrap_or_else(|| "error".to_owned())
}

fn find<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Any> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Any> {
    find(&span.attributes, key)
}

fn str_attr<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match attr(span, key) {
        Some(Any::StringValue(s)) => Some(s),
        _ => None,
    }
}

/// A count: an int, or a whole non-negative double or numeric string (some SDKs send
/// numbers as text).
fn int_attr(span: &Span, key: &str) -> Option<u64> {
    match attr(span, key)? {
        Any::IntValue(n) => u64::try_from(*n).ok(),
        Any::DoubleValue(d) if *d >= 0.0 && d.fract() == 0.0 => Some(*d as u64),
        Any::StringValue(s) => s.parse().ok(),
        _ => None,
    }
}

/// Arguments and results travel as JSON text (Pydantic AI) or as structured values:
/// text that parses as JSON is that JSON, other text a string.
fn json_text_or_value(value: &Any) -> Value {
    match value {
        Any::StringValue(s) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
        other => any_to_json(other),
    }
}

fn any_to_json(value: &Any) -> Value {
    match value {
        Any::StringValue(s) => Value::String(s.clone()),
        Any::BoolValue(b) => Value::Bool(*b),
        Any::IntValue(n) => Value::from(*n),
        Any::DoubleValue(d) => serde_json::Number::from_f64(*d).map_or(Value::Null, Value::Number),
        Any::ArrayValue(a) => Value::Array(a.values.iter().map(any_value_to_json).collect()),
        Any::KvlistValue(kv) => Value::Object(
            kv.values
                .iter()
                .map(|kv| {
                    (
                        kv.key.clone(),
                        kv.value.as_ref().map_or(Value::Null, any_value_to_json),
                    )
                })
                .collect::<Map<_, _>>(),
        ),
        Any::BytesValue(b) => Value::String(hex(b)),
        // OTLP 1.8's string table reference: meaningless without the dictionary.
        #[allow(unreachable_patterns)]
        _ => Value::Null,
    }
}

fn any_value_to_json(value: &AnyValue) -> Value {
    value.value.as_ref().map_or(Value::Null, any_to_json)
}

fn rejected(span: &Span, reason: &'static str, detail: String, run: Option<String>) -> Rejected {
    Rejected {
        reason,
        detail,
        span_name: span.name.clone(),
        trace_id: hex(&span.trace_id),
        span_id: hex(&span.span_id),
        run,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
