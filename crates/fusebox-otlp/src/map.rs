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
use opentelemetry_proto::tonic::trace::v1::{status::StatusCode, Span};

use crate::attrs::{count_of, find, hex, json_text_or_value, str_of};

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

/// A span or log record that was not mapped, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    pub reason: &'static str,
    pub detail: String,
    /// The span's name (a log record's event name), trace id and span id (hex; empty
    /// for a log record outside any span), for the dead letter.
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
    /// Spans (log records) turned into events.
    pub mapped_spans: usize,
    /// Known shapes with nothing to map (`invoke_agent`, a user prompt event …).
    pub skipped_spans: usize,
    pub rejected: Vec<Rejected>,
}

/// What one span or log record maps to.
pub(crate) enum Outcome {
    /// The run and its events as (ts in ns, rank, event): the rank orders a call before
    /// its result when both carry the same time.
    Events(String, Vec<(u64, u8, Event)>),
    Skipped,
    Rejected(Rejected),
}

/// Collects outcomes and gives the events in the order to publish them.
pub(crate) struct Staging {
    max_event_bytes: usize,
    mapped: Mapped,
    // (run's first appearance, ts, rank, event): sorted in `finish`.
    staged: Vec<(usize, u64, u8, Event)>,
    runs: Vec<String>,
}

impl Staging {
    pub(crate) fn new(max_event_bytes: usize) -> Self {
        Staging {
            max_event_bytes,
            mapped: Mapped::default(),
            staged: Vec::new(),
            runs: Vec::new(),
        }
    }

    /// Takes one outcome; `rejected` builds the refusal of an event that fails the
    /// guard's own validation, naming its span or record.
    pub(crate) fn add(
        &mut self,
        outcome: Outcome,
        rejected: impl FnOnce(&'static str, String, Option<String>) -> Rejected,
    ) {
        match outcome {
            Outcome::Events(run, events) => {
                let bad = events
                    .iter()
                    .find_map(|(_, _, e)| check_event(e, self.max_event_bytes).err());
                if let Some(err) = bad {
                    self.mapped.rejected.push(rejected(
                        reason::INVALID_EVENT,
                        err.to_string(),
                        Some(run),
                    ));
                    return;
                }
                let index = self.runs.iter().position(|r| *r == run).unwrap_or_else(|| {
                    self.runs.push(run);
                    self.runs.len() - 1
                });
                self.mapped.mapped_spans += 1;
                self.staged.extend(
                    events
                        .into_iter()
                        .map(|(ts, rank, event)| (index, ts, rank, event)),
                );
            }
            Outcome::Skipped => self.mapped.skipped_spans += 1,
            Outcome::Rejected(r) => self.mapped.rejected.push(r),
        }
    }

    pub(crate) fn finish(mut self) -> Mapped {
        // Exporters send spans in the order they *ended*: a tool span ends after the
        // calls it made began. The guard reads a run in time order (a call before its
        // result), so each run's events are put in time order; the id breaks ties
        // deterministically.
        self.staged
            .sort_by(|a, b| (a.0, a.1, a.2, &a.3.id).cmp(&(b.0, b.1, b.2, &b.3.id)));
        self.mapped.events = self.staged.into_iter().map(|(_, _, _, e)| e).collect();
        self.mapped
    }
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
    let mut staging = Staging::new(max_event_bytes);
    for resource_spans in &request.resource_spans {
        for scope_spans in &resource_spans.scope_spans {
            for span in &scope_spans.spans {
                staging.add(map_span(span, tenant), |reason, detail, run| {
                    rejected(span, reason, detail, run)
                });
            }
        }
    }
    staging.finish()
}

fn map_span(span: &Span, tenant: &str) -> Outcome {
    if span.trace_id.len() != 16 || span.span_id.len() != 8 {
        return Outcome::Rejected(rejected(
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
        return Outcome::Rejected(rejected(
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
                return Outcome::Rejected(rejected(
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
            Outcome::Events(
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
            Outcome::Events(
                run.clone(),
                vec![(
                    span.end_time_unix_nano,
                    1,
                    envelope("t", span.end_time_unix_nano, EventBody::ModelTurn(turn)),
                )],
            )
        }
        op if STRUCTURAL_OPERATIONS.contains(&op) => Outcome::Skipped,
        other => Outcome::Rejected(rejected(
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

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Any> {
    find(&span.attributes, key)
}

fn str_attr<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    str_of(attr(span, key))
}

fn int_attr(span: &Span, key: &str) -> Option<u64> {
    count_of(attr(span, key))
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
