//! The events the guard consumes (guard contract §2), as typed Rust values.
//!
//! Parsing and validation live in [`crate::parse`]; this file only says what a valid
//! event is. An `Event` serialises back to the wire format, so the log and the
//! `export` command can write exactly what `replay` reads.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One validated event: the common envelope plus the type-specific body.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    pub v: u32,
    pub id: String,
    pub tenant: String,
    pub run: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    pub ts_ms: u64,
    #[serde(flatten)]
    pub body: EventBody,
}

impl Event {
    /// The wire name of this event's type (`tool_call`, …), also the metrics label.
    pub fn type_name(&self) -> &'static str {
        self.body.type_name()
    }

    /// Where this event sits in its run, for reports: `seq-N`, or the event id when the
    /// producer sends no sequence numbers.
    pub fn position(&self) -> String {
        match self.seq {
            Some(seq) => format!("seq-{seq}"),
            None => format!("id-{}", self.id),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventBody {
    RunStarted(RunStarted),
    ToolCall(ToolCall),
    ToolResult(ToolResult),
    Progress(ProgressUpdate),
    ModelTurn(ModelTurn),
    Compaction(Compaction),
    Cancel(Cancel),
    Resume(Resume),
    RunFinished(RunFinished),
    InstanceLaunched(InstanceLaunched),
    Tick(Tick),
    LedgerResolve(LedgerResolve),
    Prompt(Prompt),
    ModelCall(ModelCall),
}

impl EventBody {
    pub fn type_name(&self) -> &'static str {
        match self {
            EventBody::RunStarted(_) => "run_started",
            EventBody::ToolCall(_) => "tool_call",
            EventBody::ToolResult(_) => "tool_result",
            EventBody::Progress(_) => "progress",
            EventBody::ModelTurn(_) => "model_turn",
            EventBody::Compaction(_) => "compaction",
            EventBody::Cancel(_) => "cancel",
            EventBody::Resume(_) => "resume",
            EventBody::RunFinished(_) => "run_finished",
            EventBody::InstanceLaunched(_) => "instance_launched",
            EventBody::Tick(_) => "tick",
            EventBody::LedgerResolve(_) => "ledger_resolve",
            EventBody::Prompt(_) => "prompt",
            EventBody::ModelCall(_) => "model_call",
        }
    }
}

/// Every type name the contract knows, in the order of guard.md §2 (then `model_call`,
/// which the contract does not name yet).
pub const EVENT_TYPES: [&str; 14] = [
    "run_started",
    "tool_call",
    "tool_result",
    "progress",
    "model_turn",
    "compaction",
    "cancel",
    "resume",
    "run_finished",
    "instance_launched",
    "tick",
    "ledger_resolve",
    "prompt",
    "model_call",
];

#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct RunStarted {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Per-run policy overrides, merged field by field over the agent's policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<Value>,
    /// The run of the same tenant that started this one: this run is its sub-agent
    /// (guard contract §6).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

/// How a call's arguments are known: in full, or only by the producer's hash.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Args {
    #[serde(rename = "args")]
    Json(Value),
    #[serde(rename = "args_hash")]
    Hash(String),
}

/// Above this many bytes of JSON, an adapter that builds events from someone else's
/// protocol (a hook, the MCP gateway) sends a value's SHA-256 instead of the value: a file
/// written or read whole would otherwise push the event past the daemon's
/// `max_event_bytes` and the call would be refused. Loop detection works on hashes alike
/// (the same value always has the same hash).
pub const INLINE_LIMIT: usize = 32 * 1024;

/// Up to this many bytes of JSON, an adapter sends the result of a call with an `op_key`
/// whole, so the ledger can answer a repeat with it (the MCP gateway's and the hooks'
/// `max_stored_result_bytes`; past it, the hash, and a repeat is told the operation
/// completed and where). Half of fuseboxd's default `max_event_bytes` and of
/// nats-server's default `max_payload` (both 1 MiB): room for the envelope and escaping.
pub const DEFAULT_MAX_STORED_RESULT_BYTES: usize = 512 * 1024;

/// The `op_key` of a call whose argument `value` names its business operation:
/// `<tool>:<value>` (a string as it is, any other JSON as its text); `None` for a null.
/// Past the contract's bound (a document as the key) it is the key's SHA-256, so the same
/// operation still has the same key and the call is not refused.
pub fn op_key_from_arg(tool: &str, value: &Value) -> Option<String> {
    let named = match value {
        Value::String(text) => text.clone(),
        Value::Null => return None,
        other => other.to_string(),
    };
    let key = format!("{tool}:{named}");
    if key.len() > crate::parse::MAX_OP_KEY_LEN {
        return Some(format!("sha256:{}", hex_sha256(key.as_bytes())));
    }
    Some(key)
}

/// The hash a value travels as (lowercase hex SHA-256 of its compact JSON) when that
/// JSON is longer than `limit`; `None` when it travels inline.
fn hash_if_larger(value: &Value, limit: usize) -> Option<String> {
    let bytes = serde_json::to_vec(value).expect("a JSON value serialises");
    (bytes.len() > limit).then(|| hex_sha256(&bytes))
}

fn hash_if_large(value: &Value) -> Option<String> {
    hash_if_larger(value, INLINE_LIMIT)
}

/// Lowercase hex SHA-256.
pub fn hex_sha256(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Args {
    /// `args` inline, or `args_hash` above [`INLINE_LIMIT`].
    pub fn inline_or_hash(value: Value) -> Args {
        hash_if_large(&value).map_or(Args::Json(value), Args::Hash)
    }
}

impl Output {
    /// `output` inline, or `output_hash` above [`INLINE_LIMIT`].
    pub fn inline_or_hash(value: Value) -> Output {
        hash_if_large(&value).map_or(Output::Json(value), Output::Hash)
    }

    /// `output` inline up to `limit` bytes of JSON, else `output_hash`: for the result of
    /// a call with an `op_key`, which the ledger stores for a repeat (the event must still
    /// fit the daemon's `max_event_bytes` and NATS's `max_payload`).
    pub fn inline_up_to(value: Value, limit: usize) -> Output {
        hash_if_larger(&value, limit).map_or(Output::Json(value), Output::Hash)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCall {
    pub call_id: String,
    pub tool: String,
    #[serde(flatten)]
    pub args: Args,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effect: Option<Effect>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    Read,
    Write,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ResultKind {
    Success,
    Pending,
    Retryable,
    Precondition,
    Fatal,
}

impl ResultKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ResultKind::Success => "SUCCESS",
            ResultKind::Pending => "PENDING",
            ResultKind::Retryable => "RETRYABLE",
            ResultKind::Precondition => "PRECONDITION",
            ResultKind::Fatal => "FATAL",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "SUCCESS" => ResultKind::Success,
            "PENDING" => ResultKind::Pending,
            "RETRYABLE" => ResultKind::Retryable,
            "PRECONDITION" => ResultKind::Precondition,
            "FATAL" => ResultKind::Fatal,
            _ => return None,
        })
    }

    /// RETRYABLE, PRECONDITION and FATAL count against `max_tool_errors` and are never
    /// progress.
    pub fn is_error(self) -> bool {
        matches!(
            self,
            ResultKind::Retryable | ResultKind::Precondition | ResultKind::Fatal
        )
    }
}

/// A tool's answer as the producer shipped it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Output {
    #[serde(rename = "output")]
    Json(Value),
    #[serde(rename = "output_hash")]
    Hash(String),
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolResult {
    pub call_id: String,
    pub tool: String,
    pub kind: ResultKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub terminal: Option<bool>,
    #[serde(flatten)]
    pub output: Option<Output>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<u64>,
}

impl ToolResult {
    /// Replaces an inline output by its hash, for a daemon that refused the result as
    /// too large (its `max_event_bytes` below the sender's bound): the hash still
    /// completes or releases the call's op_key, which must not stay in flight for want
    /// of the result's bytes. `false` when there was no inline output to replace.
    pub fn hash_output(&mut self) -> bool {
        let Some(Output::Json(value)) = &mut self.output else {
            return false;
        };
        let value = std::mem::take(value);
        self.output = Some(Output::inline_up_to(value, 0));
        true
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProgressUpdate {
    pub version: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_creation_input_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<u64>,
}

impl Usage {
    /// Everything the provider bills as tokens: input, output, cache creation and cache
    /// reads (a cache read is cheaper, but a loop re-reading a huge context still burns).
    pub fn total(&self) -> u64 {
        [
            self.input_tokens,
            self.output_tokens,
            self.cache_creation_input_tokens,
            self.cache_read_input_tokens,
        ]
        .iter()
        .map(|n| n.unwrap_or(0))
        .fold(0u64, u64::saturating_add)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelTurn {
    pub stop_reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub valid: Option<bool>,
}

/// The agent is about to call its model: asked inline, like a tool call, so a model call
/// that would pass a token, cost or model-turn budget (its run's, or an ancestor's over
/// its subtree) is refused before it runs. Its reservation is the estimate when given,
/// else the run's mean per model turn so far; the run's next `model_turn` releases it
/// and counts what was actually spent.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ModelCall {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimate_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimate_usd: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Compaction {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Cancel {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Resume {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    pub evidence: Value,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct RunFinished {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceLaunched {
    pub provider: String,
    pub region: String,
    pub instance_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_lifetime_s: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Tick {}

/// The user submitted a prompt: an interactive session (a coding agent's) begins a new
/// task, with its own step, turn, error and active-time budgets; the session keeps its
/// token and cost budgets. No text travels: the guard needs the moment, not the words.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Prompt {}

/// An operator's word on an `op_key` (`fusebox ledger resolve`): it did happen, with
/// this result, or it did not and may run again. An event like `cancel`, so the log
/// keeps who said it and a replay repeats it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LedgerResolve {
    pub op_key: String,
    pub resolution: Resolution,
    /// The operation's result (completed only): what later calls with the key get.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolution {
    /// The operation happened: the key is completed with the given result.
    Completed,
    /// The operation did not happen (or must happen again): the key is freed.
    Released,
}

impl Resolution {
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Completed => "completed",
            Resolution::Released => "released",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_past_the_inline_limit_travel_as_their_hash() {
        let big = json!({"content": "x".repeat(INLINE_LIMIT)});
        let Args::Hash(hash) = Args::inline_or_hash(big.clone()) else {
            panic!("a value past the limit travels as its hash");
        };
        assert_eq!(hash, hex_sha256(&serde_json::to_vec(&big).unwrap()));
        assert_eq!(Output::inline_or_hash(big), Output::Hash(hash));
        let small = json!({"command": "ls"});
        assert_eq!(Args::inline_or_hash(small.clone()), Args::Json(small));
    }

    #[test]
    fn a_refused_result_goes_again_as_its_hash_once() {
        let output = json!({"rows": ["a", "b"]});
        let mut result = ToolResult {
            call_id: "c1".to_owned(),
            tool: "export".to_owned(),
            kind: ResultKind::Success,
            code: None,
            retry_after_ms: None,
            terminal: None,
            output: Some(Output::Json(output.clone())),
            progress: None,
        };
        assert!(result.hash_output());
        let hash = hex_sha256(&serde_json::to_vec(&output).unwrap());
        assert_eq!(result.output, Some(Output::Hash(hash.clone())));
        assert!(!result.hash_output(), "a hash is not hashed again");
        assert_eq!(result.output, Some(Output::Hash(hash)));
        result.output = None;
        assert!(!result.hash_output());
    }

    #[test]
    fn an_argument_names_an_operation_within_the_contracts_bound() {
        let key = |value: Value| op_key_from_arg("charge", &value);
        assert_eq!(key(json!("order-7")).as_deref(), Some("charge:order-7"));
        assert_eq!(key(json!(7)).as_deref(), Some("charge:7"));
        assert_eq!(key(json!({"id": 7})).as_deref(), Some(r#"charge:{"id":7}"#));
        assert_eq!(key(Value::Null), None);
        let long = key(json!("x".repeat(crate::parse::MAX_OP_KEY_LEN))).unwrap();
        assert!(long.starts_with("sha256:") && long.len() <= crate::parse::MAX_OP_KEY_LEN);
        assert_eq!(
            long,
            key(json!("x".repeat(crate::parse::MAX_OP_KEY_LEN))).unwrap()
        );
    }
}
