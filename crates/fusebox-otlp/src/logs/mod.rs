//! OTLP log records → fusebox passive events: the coding agents' own telemetry.
//!
//! Claude Code, Codex CLI and Gemini CLI export OpenTelemetry *log records* (events), not
//! GenAI spans, when their telemetry is switched on: one record per tool call, API
//! request, prompt. Each agent names its events with its own prefix (`claude_code.`,
//! `codex.`, `gemini_cli.`), and each has its own module here that maps its records; the
//! tables in `docs/otel.md` are the contract, pinned to the versions tested. Pure, as
//! [`crate::map`]: the same request always maps to the same events with the same ids.
//!
//! A record whose event name no module claims is refused as `unknown_event` (a log
//! pipeline that sends application logs here sees them counted and dead-lettered, not
//! silently dropped).

use fusebox_core::{Event, EventBody};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use prost::Message;

use crate::attrs::{bool_of, count_of, find, hex, number_of, str_of};
use crate::map::{Mapped, Outcome, Rejected, Staging};

mod claude_code;
mod codex;
mod gemini_cli;

/// Why a log record was not mapped (beside [`crate::map::reason`]'s shared ones).
pub mod reason {
    /// The record names no event (no `event_name`, no `event.name`, no text body).
    pub const NO_EVENT_NAME: &str = "no_event_name";
    /// An event name no agent mapping here knows.
    pub const UNKNOWN_EVENT: &str = "unknown_event";
}

/// Maps every log record of `request` for `tenant`; as [`crate::map::map_request`].
pub fn map_logs(
    request: &ExportLogsServiceRequest,
    tenant: &str,
    max_event_bytes: usize,
) -> Mapped {
    let mut staging = Staging::new(max_event_bytes);
    for resource_logs in &request.resource_logs {
        let resource = resource_logs
            .resource
            .as_ref()
            .map_or(&[][..], |r| &r.attributes[..]);
        for scope_logs in &resource_logs.scope_logs {
            for log in &scope_logs.log_records {
                let record = Record::new(log, resource, tenant);
                staging.add(map_record(&record), |reason, detail, run| {
                    record.rejected(reason, detail, run)
                });
            }
        }
    }
    staging.finish()
}

fn map_record(record: &Record<'_>) -> Outcome {
    let Some(name) = record.name else {
        return Outcome::Rejected(
            record.rejected(
                reason::NO_EVENT_NAME,
                "a log record with no event name (`event_name`, `event.name` or a text body)"
                    .to_owned(),
                None,
            ),
        );
    };
    let agent = name.split_once('.').map_or("", |(prefix, _)| prefix);
    match agent {
        "claude_code" => claude_code::map_record(record),
        "codex" => codex::map_record(record),
        "gemini_cli" => gemini_cli::map_record(record),
        "gen_ai" if gemini_cli::emitted_by_gemini_cli(record) => gemini_cli::map_record(record),
        _ => Outcome::Rejected(record.rejected(
            reason::UNKNOWN_EVENT,
            format!("event {name:?} is not one this receiver maps"),
            None,
        )),
    }
}

/// One log record with what its mapping needs: its event name, its attributes and its
/// resource's, the tenant, and an id for the events made from it.
pub(crate) struct Record<'a> {
    /// `event_name` (OTLP 1.5), else the `event.name` attribute, else a text body: the
    /// three places exporters have put it.
    pub(crate) name: Option<&'a str>,
    pub(crate) log: &'a LogRecord,
    resource: &'a [KeyValue],
    pub(crate) tenant: &'a str,
    /// A hash of the record's bytes: a batch the exporter re-sends maps to the same ids
    /// (log records carry no id of their own), and JetStream's `Nats-Msg-Id` dedup and
    /// the sequencer drop the copies.
    digest: String,
}

impl<'a> Record<'a> {
    fn new(log: &'a LogRecord, resource: &'a [KeyValue], tenant: &'a str) -> Self {
        let body = match log.body.as_ref().and_then(|b| b.value.as_ref()) {
            Some(Any::StringValue(s)) if !s.is_empty() && !s.contains(' ') => Some(s.as_str()),
            _ => None,
        };
        let name = Some(log.event_name.as_str())
            // Not a name with a space: Rust's `tracing` bridge sets `event_name` to the
            // call site (`event otel/src/tool_result.rs:54`, Codex CLI 0.171) and the
            // name itself in the `event.name` attribute.
            .filter(|n| !n.is_empty() && !n.contains(' '))
            .or_else(|| str_of(find(&log.attributes, "event.name")))
            // Claude Code's `event.name` is the bare name (`tool_result`) and its body the
            // whole one (`claude_code.tool_result`): the body, which names the agent.
            .map(|name| match body {
                Some(whole) if !name.contains('.') && whole.ends_with(&format!(".{name}")) => whole,
                _ => name,
            })
            .or(body);
        let digest = fusebox_core::event::hex_sha256(&log.encode_to_vec());
        Record {
            name,
            log,
            resource,
            tenant,
            digest: digest[..32].to_owned(),
        }
    }

    /// The record's attribute `key`, else its resource's (agents put the session id on
    /// either).
    pub(crate) fn attr(&self, key: &str) -> Option<&'a Any> {
        find(&self.log.attributes, key).or_else(|| find(self.resource, key))
    }

    pub(crate) fn str(&self, key: &str) -> Option<&'a str> {
        str_of(self.attr(key)).filter(|s| !s.is_empty())
    }

    pub(crate) fn count(&self, key: &str) -> Option<u64> {
        count_of(self.attr(key))
    }

    pub(crate) fn number(&self, key: &str) -> Option<f64> {
        number_of(self.attr(key))
    }

    pub(crate) fn flag(&self, key: &str) -> Option<bool> {
        bool_of(self.attr(key))
    }

    /// When it happened: the record's time, else when the SDK observed it.
    pub(crate) fn ts_ns(&self) -> u64 {
        if self.log.time_unix_nano != 0 {
            self.log.time_unix_nano
        } else {
            self.log.observed_time_unix_nano
        }
    }

    /// An event of `run` made from this record; `suffix` tells the record's events
    /// apart (`c` for the call, `r` for its result …).
    pub(crate) fn event(&self, run: &str, suffix: &str, ts_ns: u64, body: EventBody) -> Event {
        Event {
            v: 1,
            id: format!("otlp-{}-{suffix}", self.digest),
            tenant: self.tenant.to_owned(),
            run: run.to_owned(),
            // No `seq`: as for spans, the events are applied in the order they arrive.
            seq: None,
            ts_ms: ts_ns / 1_000_000,
            body,
        }
    }

    pub(crate) fn rejected(
        &self,
        reason: &'static str,
        detail: String,
        run: Option<String>,
    ) -> Rejected {
        Rejected {
            reason,
            detail,
            span_name: self.name.unwrap_or("").to_owned(),
            trace_id: hex(&self.log.trace_id),
            span_id: hex(&self.log.span_id),
            run,
        }
    }
}
