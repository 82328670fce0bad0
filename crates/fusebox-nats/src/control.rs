//! `fusebox.control.…`: operator commands by request/reply.
//!
//! `cancel` and `resume` become `cancel` / `resume` events written through the same log
//! path as any other event, with ids derived from the request (its `id`, else a hash of
//! its body), so a retried command is applied once and answered with the same decision.
//! Their `ts_ms` is the wall clock here; the applier restamps a known run's command
//! with that run's last event time. `status` and `fusebox.control.runs` are read-only
//! queries.

use std::time::{SystemTime, UNIX_EPOCH};

use fusebox_core::event::{Cancel, Resume};
use fusebox_core::{Event, EventBody, EventError, RejectReason};

use crate::applier::Input;
use crate::inbound::Inbound;
use crate::query::Query;
use crate::reject::Origin;
use crate::subjects::{parse_control, Control, ControlVerb};
use crate::wire::{CancelRequest, ResumeRequest};

pub(crate) async fn handle(inbound: &Inbound, message: async_nats::Message) {
    let Some(reply) = message.reply.clone() else {
        tracing::debug!(subject = %message.subject, "control message without a reply subject ignored");
        return;
    };
    let control_reply = reply.clone();
    let input = match parse_control(message.subject.as_str()) {
        Some(Control::Runs) => Ok(Input::Query {
            query: Query::Runs {
                scope: inbound.scope,
            },
            reply,
        }),
        Some(Control::Run {
            tenant,
            run,
            verb: ControlVerb::Status,
        }) => Ok(Input::Query {
            query: Query::Status {
                tenant: tenant.to_owned(),
                run: run.to_owned(),
            },
            reply,
        }),
        Some(Control::Run { tenant, run, verb }) => {
            let resume = verb == ControlVerb::Resume;
            command(tenant, run, resume, &message.payload).map(|event| Input::Event {
                event,
                origin: Origin::Control { reply },
            })
        }
        None => Err(EventError::new(
            RejectReason::InvalidField,
            format!(
                "unknown control subject {:?}; expected fusebox.control.runs or fusebox.control.<tenant>.<run>.(cancel|resume|status)",
                message.subject.as_str()
            ),
        )),
    };
    match input {
        Ok(input) => inbound.queue(input).await,
        Err(err) => inbound.reject(
            Origin::Control {
                reply: control_reply,
            },
            &err,
        ),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The `cancel` (or, with `resume`, the `resume`) event an operator request stands for.
fn command(tenant: &str, run: &str, resume: bool, payload: &[u8]) -> Result<Event, EventError> {
    let invalid = |what: String| EventError::new(RejectReason::InvalidField, what);
    let raw = if payload.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        payload
    };
    let (verb, id, body) = if !resume {
        let request: CancelRequest =
            serde_json::from_slice(raw).map_err(|err| invalid(format!("cancel request: {err}")))?;
        let body = EventBody::Cancel(Cancel {
            by: request.by,
            reason: request.reason,
        });
        ("cancel", request.id, body)
    } else {
        let request: ResumeRequest =
            serde_json::from_slice(raw).map_err(|err| invalid(format!("resume request: {err}")))?;
        if !request.evidence.is_object() {
            return Err(invalid("resume evidence must be a JSON object".to_owned()));
        }
        let body = EventBody::Resume(Resume {
            by: request.by,
            evidence: request.evidence,
        });
        ("resume", request.id, body)
    };
    let id = match id {
        Some(id) if !id.is_empty() && id.len() <= fusebox_core::parse::MAX_ID_LEN => id,
        Some(_) => return Err(invalid("request id must be 1 to 256 characters".to_owned())),
        None => format!("{verb}-{:016x}", fusebox_core::fixed_hash::fnv1a(raw)),
    };
    Ok(Event {
        v: 1,
        id,
        tenant: tenant.to_owned(),
        run: run.to_owned(),
        seq: None,
        ts_ms: now_ms(),
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retried_command_gets_the_same_id() {
        let a = command("t", "r", false, br#"{"by":"ops"}"#).unwrap();
        let b = command("t", "r", false, br#"{"by":"ops"}"#).unwrap();
        assert_eq!(a.id, b.id);
        let c = command("t", "r", false, br#"{"id":"x1"}"#).unwrap();
        assert_eq!(c.id, "x1");
        assert_eq!(command("t", "r", false, b"").unwrap().type_name(), "cancel");
    }

    #[test]
    fn resume_needs_evidence() {
        assert!(command("t", "r", true, br#"{"by":"ops"}"#).is_err());
        let ok = command("t", "r", true, br#"{"evidence":{"progress_version":5}}"#);
        assert_eq!(ok.unwrap().type_name(), "resume");
    }
}
