//! Reading OTLP attribute lists: spans, log records and resources carry the same
//! `KeyValue`s, and every mapping reads them the same way.

use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use serde_json::{Map, Value};

pub(crate) fn find<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Any> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

pub(crate) fn str_of(value: Option<&Any>) -> Option<&str> {
    match value {
        Some(Any::StringValue(s)) => Some(s),
        _ => None,
    }
}

/// A count: an int, or a whole non-negative double or numeric string (some SDKs send
/// numbers as text: Claude Code's `input_tokens`, for one).
pub(crate) fn count_of(value: Option<&Any>) -> Option<u64> {
    match value? {
        Any::IntValue(n) => u64::try_from(*n).ok(),
        Any::DoubleValue(d) if *d >= 0.0 && d.fract() == 0.0 => Some(*d as u64),
        Any::StringValue(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A number: an int, a double, or numeric text.
pub(crate) fn number_of(value: Option<&Any>) -> Option<f64> {
    match value? {
        Any::IntValue(n) => Some(*n as f64),
        Any::DoubleValue(d) => Some(*d),
        Any::StringValue(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A flag: a bool, or the text `true` / `false`.
pub(crate) fn bool_of(value: Option<&Any>) -> Option<bool> {
    match value? {
        Any::BoolValue(b) => Some(*b),
        Any::StringValue(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Arguments and results travel as JSON text (Pydantic AI, the coding agents) or as
/// structured values: text that parses as JSON is that JSON, other text a string.
pub(crate) fn json_text_or_value(value: &Any) -> Value {
    match value {
        Any::StringValue(s) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
        other => any_to_json(other),
    }
}

pub(crate) fn any_to_json(value: &Any) -> Value {
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

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
