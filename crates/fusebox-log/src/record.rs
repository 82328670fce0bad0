//! What one position of the log holds: an applied event, or an operation on the guard
//! state that replay must repeat at the same point (a policy change, a retention prune).
//!
//! Both live in the `events` tree so that one tree is the single commit point of a
//! batch and its keys are contiguous. An event record is the event's wire JSON (it
//! starts with `{"v":`); an operation record is `{"op":…}`, which no event can be.

use fusebox_core::{parse_event, Event, PolicySet};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum LogOp {
    /// From here on, new runs get these policies (runs already started keep theirs).
    SetPolicies { policies: PolicySet },
    /// Retention: these closed runs are forgotten (their ledger entries stay).
    Prune { runs: Vec<RunRef> },
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunRef {
    pub tenant: String,
    pub run: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    Event(Box<Event>),
    Op(LogOp),
}

const OP_PREFIX: &[u8] = b"{\"op\":";

/// Whether stored bytes are an operation record (without decoding them).
pub fn is_op(bytes: &[u8]) -> bool {
    bytes.starts_with(OP_PREFIX)
}

/// Decodes a stored record; the error is a sentence for a corruption report.
pub fn decode(bytes: &[u8]) -> Result<Record, String> {
    if is_op(bytes) {
        serde_json::from_slice(bytes)
            .map(Record::Op)
            .map_err(|e| format!("operation record does not decode: {e}"))
    } else {
        parse_event(bytes)
            .map(|event| Record::Event(Box::new(event)))
            .map_err(|e| format!("event record does not parse: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_and_events_are_told_apart() {
        let op = LogOp::Prune {
            runs: vec![RunRef {
                tenant: "acme".into(),
                run: "r1".into(),
            }],
        };
        let bytes = serde_json::to_vec(&op).unwrap();
        assert!(bytes.starts_with(OP_PREFIX));
        assert_eq!(decode(&bytes), Ok(Record::Op(op)));

        let event = br#"{"v":1,"id":"e1","tenant":"acme","run":"r1","ts_ms":5,"type":"tick"}"#;
        assert!(matches!(decode(event), Ok(Record::Event(e)) if e.id == "e1"));
        assert!(decode(b"{\"op\":\"nope\"}").is_err());
        assert!(decode(b"garbage").is_err());
    }
}
