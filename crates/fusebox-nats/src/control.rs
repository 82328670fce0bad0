//! `fusebox.control.…`: operator commands by request/reply.
//!
//! `cancel`, `resume` and `resolve` become `cancel` / `resume` / `ledger_resolve` events
//! written through the same log path as any other event, with ids derived from the request (its `id`, else a hash of
//! its body), so a retried command is applied once and answered with the same decision.
//! Their `ts_ms` is the wall clock here; the applier restamps a known run's command
//! with that run's last event time. `status`, `history`, `fusebox.control.runs` (a
//! whole list, or with a body one page) and `fusebox.control.ledger` are read-only
//! queries.

use std::time::{SystemTime, UNIX_EPOCH};

use fusebox_core::event::{Cancel, LedgerResolve, Resume};
use fusebox_core::{Event, EventBody, EventError, RejectReason};

use crate::applier::Input;
use crate::inbound::Inbound;
use crate::query::Query;
use crate::reject::Origin;
use crate::subjects::{parse_control, Control, ControlVerb};
use crate::wire::{
    CancelRequest, HistoryQuery, LedgerQuery, ResolveRequest, ResumeRequest, RunsQuery,
};

pub(crate) async fn handle(inbound: &Inbound, message: async_nats::Message) {
    let Some(reply) = message.reply.clone() else {
        tracing::debug!(subject = %message.subject, "control message without a reply subject ignored");
        return;
    };
    if message.subject.as_str() == crate::subjects::CONTROL_WATCHDOG {
        // The watchdog's own subscriber answers; an error from here would race it.
        return;
    }
    let control_reply = reply.clone();
    let input = match parse_control(message.subject.as_str()) {
        // The daemon's watchdog answers it on a subscription of its own.
        Some(Control::Watchdog) => return,
        // A body asks for one page (the operator's page); none, for the whole list.
        Some(Control::Runs) if !is_blank(&message.payload) => runs_query(&message.payload)
            .map(|query| Input::Query {
                query: Query::RunsPage {
                    query,
                    scope: inbound.scope,
                },
                reply,
            }),
        Some(Control::Runs) => Ok(Input::Query {
            query: Query::Runs {
                scope: inbound.scope,
            },
            reply,
        }),
        Some(Control::Run {
            tenant,
            run,
            verb: ControlVerb::History,
        }) => history_query(&message.payload).map(|query| Input::Query {
            query: Query::History {
                tenant: tenant.to_owned(),
                run: run.to_owned(),
                query,
            },
            reply,
        }),
        Some(Control::Ledger) => ledger_query(&message.payload).map(|filter| Input::Query {
            query: Query::Ledger {
                filter,
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
            command(tenant, run, verb, &message.payload).map(|event| Input::Event {
                event,
                origin: Origin::Control { reply },
            })
        }
        None => Err(EventError::new(
            RejectReason::InvalidField,
            format!(
                "unknown control subject {:?}; expected fusebox.control.runs, fusebox.control.ledger or fusebox.control.<tenant>.<run>.(cancel|resume|status|resolve|history)",
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

fn is_blank(payload: &[u8]) -> bool {
    payload.iter().all(u8::is_ascii_whitespace)
}

fn runs_query(payload: &[u8]) -> Result<RunsQuery, EventError> {
    serde_json::from_slice(payload)
        .map_err(|err| EventError::new(RejectReason::InvalidField, format!("runs query: {err}")))
}

fn history_query(payload: &[u8]) -> Result<HistoryQuery, EventError> {
    if is_blank(payload) {
        return Ok(HistoryQuery::default());
    }
    serde_json::from_slice(payload)
        .map_err(|err| EventError::new(RejectReason::InvalidField, format!("history query: {err}")))
}

fn ledger_query(payload: &[u8]) -> Result<LedgerQuery, EventError> {
    if is_blank(payload) {
        return Ok(LedgerQuery::default());
    }
    serde_json::from_slice(payload)
        .map_err(|err| EventError::new(RejectReason::InvalidField, format!("ledger query: {err}")))
}

/// The event an operator request stands for: `cancel`, `resume` or `ledger_resolve`
/// (`status` is a query and never comes here).
fn command(
    tenant: &str,
    run: &str,
    verb: ControlVerb,
    payload: &[u8],
) -> Result<Event, EventError> {
    let invalid = |what: String| EventError::new(RejectReason::InvalidField, what);
    let raw = if payload.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        payload
    };
    let (verb, id, body) = match verb {
        ControlVerb::Status | ControlVerb::History => {
            return Err(invalid(format!(
                "{} is a query, not a command",
                verb.as_str()
            )))
        }
        ControlVerb::Cancel => {
            let request: CancelRequest = serde_json::from_slice(raw)
                .map_err(|err| invalid(format!("cancel request: {err}")))?;
            let body = EventBody::Cancel(Cancel {
                by: request.by,
                reason: request.reason,
            });
            ("cancel", request.id, body)
        }
        ControlVerb::Resume => {
            let request: ResumeRequest = serde_json::from_slice(raw)
                .map_err(|err| invalid(format!("resume request: {err}")))?;
            if !request.evidence.is_object() {
                return Err(invalid("resume evidence must be a JSON object".to_owned()));
            }
            let body = EventBody::Resume(Resume {
                by: request.by,
                evidence: request.evidence,
            });
            ("resume", request.id, body)
        }
        ControlVerb::Resolve => {
            let request: ResolveRequest = serde_json::from_slice(raw)
                .map_err(|err| invalid(format!("resolve request: {err}")))?;
            let body = EventBody::LedgerResolve(LedgerResolve {
                op_key: request.op_key,
                resolution: request.resolution,
                output: request.output,
                by: request.by,
                reason: request.reason,
            });
            ("resolve", request.id, body)
        }
    };
    let id = match id {
        Some(id) if !id.is_empty() && id.len() <= fusebox_core::parse::MAX_ID_LEN => id,
        Some(_) => return Err(invalid("request id must be 1 to 256 characters".to_owned())),
        None => format!("{verb}-{:016x}", fusebox_core::fixed_hash::fnv1a(raw)),
    };
    let event = Event {
        v: 1,
        id,
        tenant: tenant.to_owned(),
        run: run.to_owned(),
        seq: None,
        ts_ms: now_ms(),
        body,
    };
    // Built here, not parsed: the parser's checks (op_key bounds, `output` only with
    // `completed`, token character sets) are applied by parsing its wire form once.
    let wire = serde_json::to_vec(&event).expect("events serialise");
    fusebox_core::parse_event(&wire)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retried_command_gets_the_same_id() {
        let cancel = ControlVerb::Cancel;
        let a = command("t", "r", cancel, br#"{"by":"ops"}"#).unwrap();
        let b = command("t", "r", cancel, br#"{"by":"ops"}"#).unwrap();
        assert_eq!(a.id, b.id);
        let c = command("t", "r", cancel, br#"{"id":"x1"}"#).unwrap();
        assert_eq!(c.id, "x1");
        assert_eq!(
            command("t", "r", cancel, b"").unwrap().type_name(),
            "cancel"
        );
    }

    #[test]
    fn resume_needs_evidence() {
        let resume = ControlVerb::Resume;
        assert!(command("t", "r", resume, br#"{"by":"ops"}"#).is_err());
        let ok = command("t", "r", resume, br#"{"evidence":{"progress_version":5}}"#);
        assert_eq!(ok.unwrap().type_name(), "resume");
    }

    #[test]
    fn resolve_is_checked_like_a_parsed_event() {
        let resolve = ControlVerb::Resolve;
        let ok = command(
            "t",
            "r",
            resolve,
            br#"{"op_key":"k","resolution":"completed","output":{"sent":true},"by":"ops"}"#,
        );
        assert_eq!(ok.unwrap().type_name(), "ledger_resolve");
        let err = command(
            "t",
            "r",
            resolve,
            br#"{"op_key":"k","resolution":"released","output":1}"#,
        )
        .unwrap_err();
        assert!(err.message.contains("completed"), "{}", err.message);
        assert!(command(
            "t",
            "r",
            resolve,
            br#"{"op_key":"","resolution":"released"}"#
        )
        .is_err());
        assert!(command("t", "r", resolve, br#"{"op_key":"k"}"#).is_err());
    }
}
