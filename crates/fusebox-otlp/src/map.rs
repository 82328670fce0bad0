//! OTLP spans → fusebox passive events. Pure: no I/O, no clock; the same request always
//! maps to the same events with the same ids.
//!
//! Two conventions are understood; the tables in `docs/otel.md` are the contract:
//!
//! - the OpenTelemetry GenAI semantic conventions (Development status) as Pydantic AI
//!   2.66 emits them (instrumentation format 5, the default), classified by
//!   `gen_ai.operation.name`: `execute_tool` → a `tool_call` at the span's start and a
//!   `tool_result` at its end; `chat`, `text_completion`, `generate_content` → a
//!   `model_turn` at its end (usage from `gen_ai.usage.*`); `invoke_agent`,
//!   `create_agent`, `invoke_workflow`, `embeddings` → nothing to map (structure, not
//!   steps): counted as skipped;
//! - OpenInference (`openinference-semantic-conventions` 0.1.42, as
//!   `openinference-instrumentation-openai-agents` 2.6.0 emits it), classified by
//!   `openinference.span.kind` when the span has no `gen_ai.operation.name`: `TOOL` →
//!   call and result (`tool.name`, `input.value`, `output.value`), `LLM` → a model turn
//!   (`llm.token_count.*`, `llm.finish_reason`), `AGENT`, `CHAIN` and the other kinds
//!   of structure → skipped.
//!
//! Anything else, or a span with neither attribute, is rejected with a reason, for the
//! dead-letter subject and the OTLP `partial_success` answer: nothing vanishes silently.
//!
//! A run nested in another run's span (a sub-agent called from a tool) starts with a
//! `run_started` naming that run as its parent when the request holds the spans between
//! them ([`nesting`]); otherwise it is a root, as every run was before.

use std::collections::{BTreeMap, HashMap};

use fusebox_core::event::{
    Args, ModelTurn, Output, ResultKind, RunStarted, ToolCall, ToolResult, Usage,
};
use fusebox_core::parse::{MAX_ID_LEN, MAX_RUN_LEN};
use fusebox_core::{check_event, Event, EventBody};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::{status::StatusCode, Span};

use crate::attrs::{count_of, find, hex, json_text_or_value, str_of};

/// Why a span was not mapped. Stable strings: metrics labels and dead letters use them.
pub mod reason {
    /// The span has neither `gen_ai.operation.name` nor `openinference.span.kind`: not
    /// a GenAI or OpenInference span.
    pub const NO_OPERATION: &str = "no_operation";
    /// A `gen_ai.operation.name` or `openinference.span.kind` this mapping does not know.
    pub const UNKNOWN_OPERATION: &str = "unknown_operation";
    /// A tool span (`execute_tool`, `TOOL`) without its tool's name.
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
                let index = self.reserve(&run);
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

    /// Gives `run` its place in the publishing order, if it has none yet.
    pub(crate) fn reserve(&mut self, run: &str) -> usize {
        self.runs.iter().position(|r| r == run).unwrap_or_else(|| {
            self.runs.push(run.to_owned());
            self.runs.len() - 1
        })
    }

    /// A run's `run_started`, first of its run's events; dropped for a run with no
    /// events in this request (it may have had some before: too late to start it), or
    /// one the guard would refuse.
    pub(crate) fn start(&mut self, event: Event) {
        let Some(index) = self.runs.iter().position(|r| *r == event.run) else {
            return;
        };
        if !self.staged.iter().any(|(i, ..)| *i == index)
            || check_event(&event, self.max_event_bytes).is_err()
        {
            return;
        }
        self.staged.push((index, 0, 0, event));
    }

    pub(crate) fn finish(mut self) -> Mapped {
        // Exporters send spans in the order they *ended*: a tool span ends after the
        // calls it made began. The guard reads a run in time order (a call before its
        // result), so each run's events are put in time order; the id breaks ties
        // deterministically.
        self.staged
            .sort_by(|a, b| (a.0, a.1, a.2, &a.3.id).cmp(&(b.0, b.1, b.2, &b.3.id)));
        // One event per id and run: a mapping may open a run with each record of it
        // (Claude Code's sub-agents: no record says one started), and the daemon would
        // drop every copy after the first anyway.
        // Borrowed keys: the receiver's hot path copies no id to find the copies.
        let mut events: Vec<Event> = self.staged.into_iter().map(|(_, _, _, e)| e).collect();
        let keep: Vec<bool> = {
            let mut seen = std::collections::HashSet::with_capacity(events.len());
            events
                .iter()
                .map(|e| seen.insert((e.run.as_str(), e.id.as_str())))
                .collect()
        };
        let mut keep = keep.into_iter();
        events.retain(|_| keep.next().unwrap_or(true));
        self.mapped.events = events;
        self.mapped
    }
}

const OP: &str = "gen_ai.operation.name";
const CONVERSATION: &str = "gen_ai.conversation.id";
const SESSION: &str = "session.id";

const MODEL_OPERATIONS: [&str; 3] = ["chat", "text_completion", "generate_content"];
const STRUCTURAL_OPERATIONS: [&str; 4] = [
    "invoke_agent",
    "create_agent",
    "invoke_workflow",
    "embeddings",
];

/// OpenInference's span kind (`openinference.span.kind`), read when a span has no
/// `gen_ai.operation.name`.
const OI_KIND: &str = "openinference.span.kind";
/// OpenInference kinds that are structure, not steps: an agent, a chain of steps, a
/// retrieval, an embedding, a reranking, a guardrail's or evaluator's check, a prompt
/// template, a routing decision. `UNKNOWN` is not among them: the instrumentation could
/// not tell, so neither can the receiver.
const OI_STRUCTURAL: [&str; 9] = [
    "AGENT",
    "CHAIN",
    "RETRIEVER",
    "EMBEDDING",
    "RERANKER",
    "GUARDRAIL",
    "EVALUATOR",
    "PROMPT",
    "DECISION",
];

/// Where a convention keeps what the mapping reads.
struct Names {
    /// The attribute that classified the span, for the messages.
    classified_by: &'static str,
    tool_name: &'static str,
    /// The call's id, first present wins (else the span id).
    call_ids: &'static [&'static str],
    args: &'static str,
    result: &'static str,
    input_tokens: &'static str,
    output_tokens: &'static str,
    cache_read: &'static str,
    cache_creation: &'static str,
    /// A list (GenAI) or one string (OpenInference).
    finish_reason: &'static str,
}

const GEN_AI: Names = Names {
    classified_by: OP,
    tool_name: "gen_ai.tool.name",
    call_ids: &["gen_ai.tool.call.id"],
    args: "gen_ai.tool.call.arguments",
    result: "gen_ai.tool.call.result",
    input_tokens: "gen_ai.usage.input_tokens",
    output_tokens: "gen_ai.usage.output_tokens",
    cache_read: "gen_ai.usage.cache_read.input_tokens",
    cache_creation: "gen_ai.usage.cache_creation.input_tokens",
    finish_reason: "gen_ai.response.finish_reasons",
};

/// OpenInference: a `TOOL` span's arguments are its `input.value` (`tool.parameters` is
/// the tool's JSON schema, its definition, not the call's arguments), its result its
/// `output.value`; `tool_call.id` (else `tool.id`, "the id of the result of the tool
/// call") names the call when the instrumentation records it (openai-agents 2.6.0 does
/// not: the span id then).
const OPEN_INFERENCE: Names = Names {
    classified_by: OI_KIND,
    tool_name: "tool.name",
    call_ids: &["tool_call.id", "tool.id"],
    args: "input.value",
    result: "output.value",
    input_tokens: "llm.token_count.prompt",
    output_tokens: "llm.token_count.completion",
    cache_read: "llm.token_count.prompt_details.cache_read",
    cache_creation: "llm.token_count.prompt_details.cache_write",
    finish_reason: "llm.finish_reason",
};

/// What a span is, whichever convention said so.
enum Shape<'a> {
    Tool,
    Model,
    Structure,
    Unknown(&'a str),
}

/// The span's convention and shape: `gen_ai.operation.name` first, then
/// `openinference.span.kind` (upper case in the conventions; read in any case).
fn classify(span: &Span) -> Option<(&'static Names, Shape<'_>)> {
    if let Some(op) = str_attr(span, OP) {
        let shape = match op {
            "execute_tool" => Shape::Tool,
            op if MODEL_OPERATIONS.contains(&op) => Shape::Model,
            op if STRUCTURAL_OPERATIONS.contains(&op) => Shape::Structure,
            other => Shape::Unknown(other),
        };
        return Some((&GEN_AI, shape));
    }
    let kind = str_attr(span, OI_KIND)?;
    let shape = match kind.to_ascii_uppercase().as_str() {
        "TOOL" => Shape::Tool,
        "LLM" => Shape::Model,
        upper if OI_STRUCTURAL.contains(&upper) => Shape::Structure,
        _ => Shape::Unknown(kind),
    };
    Some((&OPEN_INFERENCE, shape))
}

/// Maps every span of `request` for `tenant`. `max_event_bytes` is the daemon's bound:
/// an event past it is rejected here, with its span named, rather than dead-lettered
/// later without one.
pub fn map_request(
    request: &ExportTraceServiceRequest,
    tenant: &str,
    max_event_bytes: usize,
) -> Mapped {
    let spans = || {
        request
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
    };
    let starts = nesting(spans());
    let mut staging = Staging::new(max_event_bytes);
    for span in spans() {
        let outcome = map_span(span, tenant);
        if let Outcome::Events(run, _) = &outcome {
            // A parent's events are published before its child's start: the guard must
            // know the parent when the child names it.
            reserve_tree(&mut staging, run, &starts, 0);
        }
        staging.add(outcome, |reason, detail, run| {
            rejected(span, reason, detail, run)
        });
    }
    for (run, start) in &starts {
        staging.start(run_started(tenant, run, start));
    }
    staging.finish()
}

/// Gives `run` its place in the publishing order after its ancestors'.
fn reserve_tree(staging: &mut Staging, run: &str, starts: &BTreeMap<String, Start>, depth: u8) {
    // The nesting is acyclic by construction only within one request's spans; the
    // bound keeps a malformed request (spans naming each other as parents) finite.
    if depth > 32 {
        return;
    }
    if let Some(start) = starts.get(run) {
        reserve_tree(staging, &start.parent, starts, depth + 1);
    }
    staging.reserve(run);
}

/// A run found nested in another run's span.
#[derive(Debug, Clone, PartialEq)]
struct Start {
    /// The run whose span encloses this run's outermost span.
    parent: String,
    /// This run's outermost span in the parent's (the id of the `run_started`).
    span_id: String,
    /// The time the `run_started` carries: that span's start.
    start_ns: u64,
}

/// A span in a request: its trace id and span id.
type SpanKey<'a> = (&'a [u8], &'a [u8]);

/// What a run's outermost spans say about where it runs.
enum Evidence {
    /// Inside a span of another run.
    Nested(String, String, u64),
    /// At the top of its trace (no parent span, or only spans of no run above it).
    Root,
}

/// The runs of this request nested in another run's span: a span whose run is named
/// (`gen_ai.conversation.id` or `session.id`, not the trace fallback) and whose parent
/// span, or the nearest ancestor with a named run, belongs to another run. Read from
/// this request's spans only: exporters send a span when it *ends*, so the spans that
/// enclose a sub-agent (its own agent span, the parent's tool span) reach the receiver
/// after the sub-agent's steps unless the same batch carries them all. A run is given
/// a parent only when every one of its outermost spans seen here says the same parent
/// and none says it is at the top of its trace; a chain broken by a span not in the
/// request says nothing. Never a guess from the trace alone: two runs of one trace may
/// be siblings.
fn nesting<'a>(spans: impl Iterator<Item = &'a Span>) -> BTreeMap<String, Start> {
    // (trace id, span id) → (the span's named run, its parent span id).
    let mut index: HashMap<SpanKey<'_>, (Option<String>, &[u8])> = HashMap::new();
    let mut named = Vec::new();
    for span in spans {
        if span.trace_id.len() != 16 || span.span_id.len() != 8 {
            continue;
        }
        let run = named_run(span);
        if let Some(run) = &run {
            named.push((span, run.clone()));
        }
        index.insert(
            (&span.trace_id, &span.span_id),
            (run, span.parent_span_id.as_slice()),
        );
    }
    let mut evidence: BTreeMap<String, Vec<Evidence>> = BTreeMap::new();
    for (span, run) in named {
        let mut parent = span.parent_span_id.as_slice();
        let mut steps = 0;
        let found = loop {
            if parent.is_empty() || parent.iter().all(|b| *b == 0) {
                break Some(Evidence::Root);
            }
            steps += 1;
            let Some((above, grand)) = index.get(&(span.trace_id.as_slice(), parent)) else {
                break None; // not in this request: says nothing
            };
            match above {
                Some(above) if *above == run => break None, // inside its own run
                Some(above) => {
                    break Some(Evidence::Nested(
                        above.clone(),
                        hex(&span.span_id),
                        span.start_time_unix_nano,
                    ))
                }
                None if steps < 64 => parent = grand,
                None => break None,
            }
        };
        if let Some(found) = found {
            evidence.entry(run).or_default().push(found);
        }
    }
    let mut starts = BTreeMap::new();
    for (run, said) in evidence {
        let mut start: Option<Start> = None;
        let mut sound = true;
        for e in said {
            match e {
                Evidence::Root => sound = false,
                Evidence::Nested(parent, span_id, start_ns) => match &mut start {
                    Some(s) if s.parent != parent => sound = false,
                    Some(s) => {
                        if (start_ns, &span_id) < (s.start_ns, &s.span_id) {
                            s.span_id = span_id;
                            s.start_ns = start_ns;
                        }
                    }
                    None => {
                        start = Some(Start {
                            parent,
                            span_id,
                            start_ns,
                        })
                    }
                },
            }
        }
        if let (true, Some(start)) = (sound, start) {
            starts.insert(run, start);
        }
    }
    starts
}

/// The `run_started` of a run found nested in its parent's span.
fn run_started(tenant: &str, run: &str, start: &Start) -> Event {
    Event {
        v: 1,
        id: format!("otlp-{}-s", start.span_id),
        tenant: tenant.to_owned(),
        run: run.to_owned(),
        seq: None,
        ts_ms: start.start_ns / 1_000_000,
        body: EventBody::RunStarted(RunStarted {
            parent: Some(start.parent.clone()),
            ..RunStarted::default()
        }),
    }
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
    // Gemini CLI's own spans (`llm_call`, `tool_call`, `schedule_tool_calls` …, sent to
    // the same endpoint as its log records): the records carry the same calls and turns
    // and are mapped (`logs::gemini_cli`); mapping these too would count each twice.
    if str_attr(span, "gen_ai.agent.name") == Some("gemini-cli") {
        return Outcome::Skipped;
    }
    let run = run_of(span);
    let Some((names, shape)) = classify(span) else {
        return Outcome::Rejected(rejected(
            span,
            reason::NO_OPERATION,
            format!(
                "span {:?} has no `{OP}` and no `{OI_KIND}`: not a GenAI or OpenInference span",
                span.name
            ),
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
    match shape {
        Shape::Tool => {
            let Some(tool) = str_attr(span, names.tool_name).filter(|t| !t.is_empty()) else {
                return Outcome::Rejected(rejected(
                    span,
                    reason::NO_TOOL_NAME,
                    format!("tool span {:?} has no `{}`", span.name, names.tool_name),
                    Some(run),
                ));
            };
            let call_id = names
                .call_ids
                .iter()
                .find_map(|key| {
                    str_attr(span, key).filter(|id| !id.is_empty() && id.len() <= MAX_ID_LEN)
                })
                .map_or_else(|| span_id.clone(), str::to_owned);
            let args = match attr(span, names.args) {
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
                output: attr(span, names.result)
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
        Shape::Model => {
            let usage = Usage {
                input_tokens: int_attr(span, names.input_tokens),
                output_tokens: int_attr(span, names.output_tokens),
                cache_creation_input_tokens: int_attr(span, names.cache_creation),
                cache_read_input_tokens: int_attr(span, names.cache_read),
            };
            let turn = ModelTurn {
                stop_reason: stop_reason(span, names.finish_reason),
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
        Shape::Structure => Outcome::Skipped,
        Shape::Unknown(other) => Outcome::Rejected(rejected(
            span,
            reason::UNKNOWN_OPERATION,
            format!(
                "span {:?}: `{}` = {other:?} is not a shape this receiver maps",
                span.name, names.classified_by
            ),
            Some(run),
        )),
    }
}

/// The run a span belongs to: its named run ([`named_run`]), else its trace.
fn run_of(span: &Span) -> String {
    named_run(span).unwrap_or_else(|| format!("otlp-{}", hex(&span.trace_id)))
}

/// The run a span names: its `gen_ai.conversation.id` (one per agent run in Pydantic
/// AI; a session's when the application sets it), else the general conventions' and
/// OpenInference's `session.id` (what instrumentations without the GenAI attribute set;
/// OpenInference's `using_session`).
fn named_run(span: &Span) -> Option<String> {
    [CONVERSATION, SESSION]
        .iter()
        .find_map(|key| str_attr(span, key).filter(|id| !id.is_empty()))
        .map(run_token)
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
fn stop_reason(span: &Span, key: &str) -> String {
    let first = match attr(span, key) {
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
