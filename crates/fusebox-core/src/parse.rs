//! Wire bytes → validated [`Event`], with an error an operator can act on.
//!
//! The fast path deserialises straight into one flat struct (no intermediate
//! `serde_json::Value` for the envelope, no buffering of internally tagged enums) and
//! then checks what serde cannot: required fields per type, id character sets, lengths.
//! Only when serde itself refuses the bytes do we pay for a second, diagnostic pass
//! that names the offending field.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer};
use serde_json::Value;

use crate::event::*;
use crate::policy::Policy;

/// Ids longer than this are refused: they end up in subjects, keys and labels.
pub const MAX_ID_LEN: usize = 256;
pub const MAX_TENANT_LEN: usize = 64;
pub const MAX_RUN_LEN: usize = 128;
pub const MAX_OP_KEY_LEN: usize = 512;
/// The default bound on one event's size, in bytes.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 1 << 20;

/// Why an event was refused. The string form is the `reason` label of
/// `fusebox_events_rejected_total` and the prefix of every error message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    MalformedJson,
    TooLarge,
    UnsupportedVersion,
    UnknownType,
    UnknownKind,
    MissingField,
    InvalidField,
    TenantMismatch,
    SeqRegression,
    /// A `run_started` numbered as a run's first events for a run that has gone past
    /// them: another process (a restarted worker) reusing a run id. Refused, so it never
    /// gets the old process's decisions back from the deduplication.
    RunExists,
    /// An `instance_launched` for a cloud the daemon's watchdog has no driver for (or a
    /// daemon without a watchdog): accepted, the instance would silently go unwatched.
    UnwatchedProvider,
}

impl RejectReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::MalformedJson => "malformed_json",
            RejectReason::TooLarge => "too_large",
            RejectReason::UnsupportedVersion => "unsupported_version",
            RejectReason::UnknownType => "unknown_type",
            RejectReason::UnknownKind => "unknown_kind",
            RejectReason::MissingField => "missing_field",
            RejectReason::InvalidField => "invalid_field",
            RejectReason::TenantMismatch => "tenant_mismatch",
            RejectReason::SeqRegression => "seq_regression",
            RejectReason::RunExists => "run_exists",
            RejectReason::UnwatchedProvider => "unwatched_provider",
        }
    }

    pub const ALL: [RejectReason; 11] = [
        RejectReason::MalformedJson,
        RejectReason::TooLarge,
        RejectReason::UnsupportedVersion,
        RejectReason::UnknownType,
        RejectReason::UnknownKind,
        RejectReason::MissingField,
        RejectReason::InvalidField,
        RejectReason::TenantMismatch,
        RejectReason::SeqRegression,
        RejectReason::RunExists,
        RejectReason::UnwatchedProvider,
    ];
}

/// A refused event: the reason code, a sentence saying what is wrong, and the event's
/// id when it could be read (so a dead letter can be traced back to its producer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventError {
    pub reason: RejectReason,
    pub message: String,
    pub event_id: Option<String>,
}

impl EventError {
    pub fn new(reason: RejectReason, message: impl Into<String>) -> Self {
        EventError {
            reason,
            message: message.into(),
            event_id: None,
        }
    }

    fn with_id(mut self, id: Option<&str>) -> Self {
        self.event_id = id.map(str::to_owned);
        self
    }
}

impl fmt::Display for EventError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason.as_str(), self.message)?;
        if let Some(id) = &self.event_id {
            write!(f, " (event id {id:?})")?;
        }
        Ok(())
    }
}

impl std::error::Error for EventError {}

/// Parses one event (one JSONL line, one NATS message body) with the default size bound.
pub fn parse_event(bytes: &[u8]) -> Result<Event, EventError> {
    parse_event_bounded(bytes, DEFAULT_MAX_EVENT_BYTES)
}

/// Parses one event, refusing anything larger than `max_bytes`.
pub fn parse_event_bounded(bytes: &[u8], max_bytes: usize) -> Result<Event, EventError> {
    if bytes.len() > max_bytes {
        return Err(EventError::new(
            RejectReason::TooLarge,
            format!(
                "event is {} bytes, more than the configured maximum of {max_bytes}",
                bytes.len()
            ),
        ));
    }
    // One UTF-8 check of the whole line instead of one per string inside it (a tenth of
    // parsing, callgrind). Bytes that are not UTF-8 take serde's own path, which refuses
    // them with the error it always gave.
    let read = match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str::<WireEvent>(text),
        Err(_) => serde_json::from_slice::<WireEvent>(bytes),
    };
    match read {
        Ok(wire) => {
            // A pointer into `bytes`, not a copy, unless the id held an escape.
            let id = wire.id.as_ref().map(|id| id.0.clone());
            wire.validate()
                .map_err(|e| e.with_id(id.as_deref().filter(|id| id.len() <= MAX_ID_LEN)))
        }
        Err(err) => Err(diagnose(bytes, &err)),
    }
}

/// Whether the daemon accepts `event`, which a producer built rather than parsed: the
/// checks of [`parse_event_bounded`], made on its wire form. An adapter translating
/// another protocol (a hook payload, an MCP call) calls it to report a clear error of
/// its own instead of sending what the daemon will refuse.
pub fn check_event(event: &Event, max_bytes: usize) -> Result<(), EventError> {
    let wire = serde_json::to_vec(event).expect("an event serialises");
    parse_event_bounded(&wire, max_bytes).map(drop)
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        WireEvent::deserialize(deserializer)?
            .validate()
            .map_err(serde::de::Error::custom)
    }
}

/// Text borrowed from the input when it holds no escape, else unescaped into a copy. For
/// the words that only select something (`type`, `kind`, `effect`, `resolution`) and
/// the id, which an error names: no allocation per event for either. (Serde borrows a
/// `Cow` field only when it is not inside an `Option`, hence the newtype.)
#[derive(serde::Deserialize)]
#[serde(transparent)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// Every field any event type may carry, all optional: the shape serde reads in one pass.
#[derive(serde::Deserialize)]
struct WireEvent<'a> {
    v: Option<u32>,
    #[serde(borrow)]
    id: Option<Text<'a>>,
    tenant: Option<String>,
    run: Option<String>,
    seq: Option<u64>,
    ts_ms: Option<u64>,
    #[serde(rename = "type", borrow)]
    event_type: Option<Text<'a>>,
    agent: Option<String>,
    tools: Option<Vec<String>>,
    policy: Option<Value>,
    parent: Option<String>,
    call_id: Option<String>,
    tool: Option<String>,
    #[serde(default, deserialize_with = "present")]
    args: Option<Value>,
    args_hash: Option<String>,
    op_key: Option<String>,
    #[serde(borrow)]
    effect: Option<Text<'a>>,
    #[serde(borrow)]
    kind: Option<Text<'a>>,
    code: Option<String>,
    retry_after_ms: Option<u64>,
    terminal: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    output: Option<Value>,
    output_hash: Option<String>,
    progress: Option<u64>,
    version: Option<u64>,
    note: Option<String>,
    stop_reason: Option<String>,
    usage: Option<Usage>,
    cost_usd: Option<f64>,
    valid: Option<bool>,
    estimate_tokens: Option<u64>,
    estimate_usd: Option<f64>,
    by: Option<String>,
    reason: Option<String>,
    evidence: Option<Value>,
    status: Option<String>,
    provider: Option<String>,
    region: Option<String>,
    instance_id: Option<String>,
    max_lifetime_s: Option<u64>,
    #[serde(borrow)]
    resolution: Option<Text<'a>>,
}

/// A field that is there, even as `null`: `args` and `output` are "any JSON", and `null`
/// is one (a tool without arguments, a tool that answered nothing), not the field's
/// absence. Serde's `Option` would read `null` as absent, so an event with `"args": null`
/// was refused and `"output": null` lost, and a producer's event did not round-trip.
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

fn missing(field: &str, event_type: &str) -> EventError {
    EventError::new(
        RejectReason::MissingField,
        format!("`{field}` is required for a {event_type} event"),
    )
}

fn invalid(message: String) -> EventError {
    EventError::new(RejectReason::InvalidField, message)
}

fn require<T>(value: Option<T>, field: &str, event_type: &str) -> Result<T, EventError> {
    value.ok_or_else(|| missing(field, event_type))
}

/// `[A-Za-z0-9_-]{1,max}`: the id character set that makes tenant and run safe as NATS
/// subject tokens and sled key parts.
fn check_token(field: &str, value: &str, max: usize) -> Result<(), EventError> {
    let ok = !value.is_empty()
        && value.len() <= max
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "`{field}` must match [A-Za-z0-9_-]{{1,{max}}}, got {:?}",
            truncate(value, 80)
        )))
    }
}

fn check_op_key(op_key: &str) -> Result<(), EventError> {
    if op_key.is_empty() || op_key.len() > MAX_OP_KEY_LEN {
        return Err(invalid(format!(
            "`op_key` must be 1 to {MAX_OP_KEY_LEN} bytes"
        )));
    }
    Ok(())
}

fn check_text(field: &str, value: &str) -> Result<(), EventError> {
    if value.is_empty() {
        Err(invalid(format!("`{field}` must not be empty")))
    } else if value.len() > MAX_ID_LEN {
        Err(invalid(format!(
            "`{field}` is {} bytes long, more than {MAX_ID_LEN}",
            value.len()
        )))
    } else {
        Ok(())
    }
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl WireEvent<'_> {
    fn validate(self) -> Result<Event, EventError> {
        let event_type = self.event_type.as_ref().map_or("", |t| &*t.0);
        if self.event_type.is_none() {
            return Err(missing("type", "any"));
        }
        let v = require(self.v, "v", event_type)?;
        if v != 1 {
            return Err(EventError::new(
                RejectReason::UnsupportedVersion,
                format!("schema version {v} is not supported (this guard speaks v1)"),
            ));
        }
        let id = require(self.id, "id", event_type)?.0.into_owned();
        check_text("id", &id)?;
        let tenant = require(self.tenant, "tenant", event_type)?;
        check_token("tenant", &tenant, MAX_TENANT_LEN)?;
        let run = require(self.run, "run", event_type)?;
        check_token("run", &run, MAX_RUN_LEN)?;
        if self.seq == Some(0) {
            return Err(invalid("`seq` starts at 1".to_owned()));
        }
        let ts_ms = require(self.ts_ms, "ts_ms", event_type)?;

        let body = match event_type {
            "run_started" => {
                if let Some(parent) = &self.parent {
                    check_token("parent", parent, MAX_RUN_LEN)?;
                    if *parent == run {
                        return Err(invalid(format!("run {run:?} names itself as its `parent`")));
                    }
                }
                EventBody::RunStarted(RunStarted {
                    agent: self.agent,
                    tools: self.tools,
                    policy: match self.policy {
                        Some(Value::Null) | None => None,
                        Some(patch) => Some(check_run_policy(patch)?),
                    },
                    parent: self.parent,
                })
            }
            "tool_call" => {
                let call_id = require(self.call_id, "call_id", event_type)?;
                check_text("call_id", &call_id)?;
                let tool = require(self.tool, "tool", event_type)?;
                check_text("tool", &tool)?;
                let args = match (self.args, self.args_hash) {
                    (Some(args), _) => Args::Json(args),
                    (None, Some(hash)) => Args::Hash(hash),
                    (None, None) => {
                        return Err(EventError::new(
                            RejectReason::MissingField,
                            "a tool_call event needs `args` or `args_hash`",
                        ))
                    }
                };
                if let Some(op_key) = &self.op_key {
                    check_op_key(op_key)?;
                }
                let effect = match self.effect.as_ref().map(|e| &*e.0) {
                    None => None,
                    Some("read") => Some(Effect::Read),
                    Some("write") => Some(Effect::Write),
                    Some(other) => {
                        return Err(invalid(format!(
                            "`effect` must be \"read\" or \"write\", got {:?}",
                            truncate(other, 40)
                        )))
                    }
                };
                EventBody::ToolCall(ToolCall {
                    call_id,
                    tool,
                    args,
                    op_key: self.op_key,
                    effect,
                })
            }
            "tool_result" => {
                let call_id = require(self.call_id, "call_id", event_type)?;
                check_text("call_id", &call_id)?;
                let tool = require(self.tool, "tool", event_type)?;
                check_text("tool", &tool)?;
                let kind_text = require(self.kind, "kind", event_type)?.0;
                let kind = ResultKind::parse(&kind_text).ok_or_else(|| {
                    EventError::new(
                        RejectReason::UnknownKind,
                        format!(
                            "unknown result kind {:?}; expected SUCCESS, PENDING, RETRYABLE, \
                             PRECONDITION or FATAL",
                            truncate(&kind_text, 40)
                        ),
                    )
                })?;
                let output = match (self.output, self.output_hash) {
                    (Some(output), _) => Some(Output::Json(output)),
                    (None, Some(hash)) => Some(Output::Hash(hash)),
                    (None, None) => None,
                };
                EventBody::ToolResult(ToolResult {
                    call_id,
                    tool,
                    kind,
                    code: self.code,
                    retry_after_ms: self.retry_after_ms,
                    terminal: self.terminal,
                    output,
                    progress: self.progress,
                })
            }
            "progress" => EventBody::Progress(ProgressUpdate {
                version: require(self.version, "version", event_type)?,
                note: self.note,
            }),
            "model_turn" => {
                if let Some(cost) = self.cost_usd {
                    if !(cost.is_finite() && cost >= 0.0) {
                        return Err(invalid(format!(
                            "`cost_usd` must be a finite, non-negative number, got {cost}"
                        )));
                    }
                }
                EventBody::ModelTurn(ModelTurn {
                    stop_reason: require(self.stop_reason, "stop_reason", event_type)?,
                    usage: self.usage,
                    cost_usd: self.cost_usd,
                    valid: self.valid,
                })
            }
            "model_call" => {
                if let Some(usd) = self.estimate_usd {
                    if !(usd.is_finite() && usd >= 0.0) {
                        return Err(invalid(format!(
                            "`estimate_usd` must be a finite, non-negative number, got {usd}"
                        )));
                    }
                }
                EventBody::ModelCall(ModelCall {
                    estimate_tokens: self.estimate_tokens,
                    estimate_usd: self.estimate_usd,
                })
            }
            "compaction" => EventBody::Compaction(Compaction {
                reason: self.reason,
            }),
            "cancel" => EventBody::Cancel(Cancel {
                by: self.by,
                reason: self.reason,
            }),
            "resume" => EventBody::Resume(Resume {
                by: self.by,
                evidence: match require(self.evidence, "evidence", event_type)? {
                    e @ Value::Object(_) => e,
                    _ => return Err(invalid("`evidence` must be an object".to_owned())),
                },
            }),
            "run_finished" => EventBody::RunFinished(RunFinished {
                status: self.status,
            }),
            "instance_launched" => EventBody::InstanceLaunched(InstanceLaunched {
                provider: require(self.provider, "provider", event_type)?,
                region: require(self.region, "region", event_type)?,
                instance_id: require(self.instance_id, "instance_id", event_type)?,
                max_lifetime_s: self.max_lifetime_s,
            }),
            "tick" => EventBody::Tick(Tick {}),
            "prompt" => EventBody::Prompt(Prompt {}),
            "ledger_resolve" => {
                let op_key = require(self.op_key, "op_key", event_type)?;
                check_op_key(&op_key)?;
                let resolution = match &*require(self.resolution, "resolution", event_type)?.0 {
                    "completed" => Resolution::Completed,
                    "released" => Resolution::Released,
                    other => {
                        return Err(invalid(format!(
                            "`resolution` must be \"completed\" or \"released\", got {:?}",
                            truncate(other, 40)
                        )))
                    }
                };
                if resolution == Resolution::Released && self.output.is_some() {
                    return Err(invalid(
                        "`output` goes with resolution \"completed\" only".to_owned(),
                    ));
                }
                EventBody::LedgerResolve(LedgerResolve {
                    op_key,
                    resolution,
                    output: self.output,
                    by: self.by,
                    reason: self.reason,
                })
            }
            other => {
                return Err(EventError::new(
                    RejectReason::UnknownType,
                    format!(
                        "unknown event type {:?}; expected one of {}",
                        truncate(other, 40),
                        EVENT_TYPES.join(", ")
                    ),
                ))
            }
        };
        Ok(Event {
            v,
            id,
            tenant,
            run,
            seq: self.seq,
            ts_ms,
            body,
        })
    }
}

/// A run's policy overrides are refused here, at the door, when a key is unknown or of
/// the wrong type: validity does not depend on the base they are layered on, and an
/// event the engine has accepted must never fail later.
fn check_run_policy(patch: Value) -> Result<Value, EventError> {
    match Policy::default().layered(&patch, "run_started.policy") {
        Ok(_) => Ok(patch),
        Err(err) => Err(invalid(err.to_string())),
    }
}

/// JSON shapes a field may have, for the diagnostic pass.
#[derive(Clone, Copy)]
enum Shape {
    UInt,
    Number,
    Bool,
    Text,
    TextList,
    Object,
}

impl Shape {
    fn matches(self, value: &Value) -> bool {
        match self {
            Shape::UInt => value.as_u64().is_some(),
            Shape::Number => value.is_number(),
            Shape::Bool => value.is_boolean(),
            Shape::Text => value.is_string(),
            Shape::TextList => value
                .as_array()
                .is_some_and(|items| items.iter().all(Value::is_string)),
            Shape::Object => value.is_object(),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Shape::UInt => "a non-negative integer",
            Shape::Number => "a number",
            Shape::Bool => "true or false",
            Shape::Text => "a string",
            Shape::TextList => "a list of strings",
            Shape::Object => "an object",
        }
    }
}

const FIELD_SHAPES: &[(&str, Shape)] = &[
    ("v", Shape::UInt),
    ("id", Shape::Text),
    ("tenant", Shape::Text),
    ("run", Shape::Text),
    ("seq", Shape::UInt),
    ("ts_ms", Shape::UInt),
    ("type", Shape::Text),
    ("agent", Shape::Text),
    ("tools", Shape::TextList),
    ("parent", Shape::Text),
    ("call_id", Shape::Text),
    ("tool", Shape::Text),
    ("args_hash", Shape::Text),
    ("op_key", Shape::Text),
    ("effect", Shape::Text),
    ("kind", Shape::Text),
    ("code", Shape::Text),
    ("retry_after_ms", Shape::UInt),
    ("terminal", Shape::Bool),
    ("output_hash", Shape::Text),
    ("progress", Shape::UInt),
    ("version", Shape::UInt),
    ("note", Shape::Text),
    ("stop_reason", Shape::Text),
    ("usage", Shape::Object),
    ("cost_usd", Shape::Number),
    ("valid", Shape::Bool),
    ("estimate_tokens", Shape::UInt),
    ("estimate_usd", Shape::Number),
    ("by", Shape::Text),
    ("reason", Shape::Text),
    ("status", Shape::Text),
    ("provider", Shape::Text),
    ("region", Shape::Text),
    ("instance_id", Shape::Text),
    ("max_lifetime_s", Shape::UInt),
    ("resolution", Shape::Text),
];

/// The slow path: serde refused the bytes; say which field and why.
fn diagnose(bytes: &[u8], err: &serde_json::Error) -> EventError {
    use serde_json::error::Category;
    if matches!(
        err.classify(),
        Category::Syntax | Category::Eof | Category::Io
    ) {
        return EventError::new(
            RejectReason::MalformedJson,
            format!("not valid JSON: {err}"),
        );
    }
    let Ok(value) = serde_json::from_slice::<Value>(bytes) else {
        return EventError::new(
            RejectReason::MalformedJson,
            format!("not valid JSON: {err}"),
        );
    };
    let Some(object) = value.as_object() else {
        return EventError::new(
            RejectReason::MalformedJson,
            "an event must be a JSON object".to_owned(),
        );
    };
    let id = object
        .get("id")
        .and_then(Value::as_str)
        .filter(|id| id.len() <= MAX_ID_LEN);
    for (field, shape) in FIELD_SHAPES {
        if let Some(found) = object.get(*field) {
            if !found.is_null() && !shape.matches(found) {
                return invalid(format!(
                    "`{field}` must be {}, got {}",
                    shape.describe(),
                    truncate(&found.to_string(), 60)
                ))
                .with_id(id);
            }
        }
    }
    if let Some(usage) = object.get("usage").and_then(Value::as_object) {
        for (field, found) in usage {
            if !found.is_null() && found.as_u64().is_none() {
                return invalid(format!(
                    "`usage.{field}` must be a non-negative integer, got {}",
                    truncate(&found.to_string(), 60)
                ))
                .with_id(id);
            }
        }
    }
    invalid(err.to_string()).with_id(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The borrowed words read as their copies did when they hold escapes.
    #[test]
    fn escaped_words_parse_like_plain_ones() {
        let plain = br#"{"v":1,"id":"e/1","tenant":"t","run":"r","ts_ms":1,"type":"tool_result","call_id":"c","tool":"x","kind":"SUCCESS"}"#;
        let escaped = br#"{"v":1,"id":"e\/1","tenant":"t","run":"r","ts_ms":1,"type":"tool\u005fresult","call_id":"c","tool":"x","kind":"SUCC\u0045SS"}"#;
        assert_eq!(parse_event(plain), parse_event(escaped));
        let bad = br#"{"v":1,"id":"e\"1","tenant":"t","run":"r","ts_ms":1,"type":"tool_result","call_id":"c","tool":"x","kind":"SO\u0053O"}"#;
        let err = parse_event(bad).expect_err("an unknown kind");
        assert_eq!(err.reason, RejectReason::UnknownKind);
        assert_eq!(err.event_id.as_deref(), Some("e\"1"));
    }

    /// A line that is not UTF-8 is refused as malformed JSON, as serde refuses it.
    #[test]
    fn bytes_that_are_not_utf8_are_malformed_json() {
        let mut line =
            br#"{"v":1,"id":"e1","tenant":"t","run":"r","ts_ms":1,"type":"tick","note":"?"}"#
                .to_vec();
        let at = line.iter().position(|b| *b == b'?').expect("a placeholder");
        line[at] = 0xFF;
        let err = parse_event(&line).expect_err("not UTF-8");
        assert_eq!(err.reason, RejectReason::MalformedJson);
        assert!(
            err.message.contains("invalid unicode code point"),
            "{}",
            err.message
        );
    }
}
