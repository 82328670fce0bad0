//! The OTLP/HTTP endpoint: `POST /v1/traces` (GenAI spans) and `POST /v1/logs` (the
//! coding agents' telemetry events), binary protobuf or JSON, with the answers the OTLP
//! specification gives a receiver (1.5.0, "OTLP/HTTP"): 200 with `partial_success`
//! naming the spans or records it refused, 400 for a body that does not decode,
//! 401 for a missing or unknown credential, 413 past the size bound (sent or
//! decompressed), 415 for another content type or an encoding other than gzip, 503 when the events could not be
//! stored (the exporter retries; the ids make the retry safe).
//!
//! It maps and forwards: each event is published to `fusebox.events.<tenant>.<run>` and
//! its JetStream ack awaited before the answer, as `FuseboxClient::report` does, so a
//! 200 means every mapped event is in the durable stream. Refused spans and records go
//! to `fusebox.dlq.<tenant>` with their reason.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage};
use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use fusebox_nats::subjects;
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::logs::map_logs;
use crate::map::{map_request, Mapped, Rejected};

/// Who may send, and as which tenant.
#[derive(Debug, Clone)]
pub enum Credentials {
    /// Every request is this tenant's (a loopback listener: whoever can reach it is on
    /// this machine).
    Fixed(String),
    /// `Authorization: Bearer <token>` → tenant; no other request is accepted.
    Tokens(HashMap<String, String>),
}

#[derive(Debug, Clone)]
pub struct OtlpOptions {
    pub listen: SocketAddr,
    pub credentials: Credentials,
    /// The largest request body read (after which: 413).
    pub max_body_bytes: usize,
    /// The daemon's `max_event_bytes`: a span whose event would pass it is refused here.
    pub max_event_bytes: usize,
}

/// Where the receiver counts what it did (fuseboxd: its Prometheus registry).
pub trait OtlpCounter: Send + Sync {
    /// One span, by outcome: `mapped`, `skipped`, or the reason it was rejected.
    fn span(&self, outcome: &str);
    /// One log record, by outcome, as for spans.
    fn log_record(&self, outcome: &str);
    /// One dead letter published.
    fn dead_letter(&self);
}

struct Shared {
    js: jetstream::Context,
    nats: async_nats::Client,
    options: OtlpOptions,
    counter: Arc<dyn OtlpCounter>,
}

pub struct OtlpListener {
    listener: tokio::net::TcpListener,
    router: Router,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot listen for OTLP on {addr}: {source}")]
pub struct BindError {
    addr: SocketAddr,
    source: std::io::Error,
}

impl OtlpListener {
    pub async fn bind(
        options: OtlpOptions,
        nats: async_nats::Client,
        counter: Arc<dyn OtlpCounter>,
    ) -> Result<Self, BindError> {
        let addr = options.listen;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| BindError { addr, source })?;
        let shared = Arc::new(Shared {
            js: jetstream::new(nats.clone()),
            nats,
            options,
            counter,
        });
        let router = Router::new()
            .route("/v1/traces", post(export::<ExportTraceServiceRequest>))
            .route("/v1/logs", post(export::<ExportLogsServiceRequest>))
            .with_state(shared);
        Ok(OtlpListener { listener, router })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await
    }
}

/// The two encodings OTLP/HTTP defines.
#[derive(Clone, Copy, PartialEq)]
enum Encoding {
    Protobuf,
    Json,
}

/// `google.rpc.Status`, the body OTLP/HTTP gives every 4xx/5xx answer. Declared with
/// prost's derive (the message is three fields; the OpenTelemetry crate does not ship it).
#[derive(Clone, PartialEq, prost::Message, Serialize)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

fn error(status: StatusCode, encoding: Encoding, message: String) -> Response {
    // gRPC codes by the HTTP status they stand for (INVALID_ARGUMENT, UNAUTHENTICATED,
    // RESOURCE_EXHAUSTED, UNAVAILABLE …), for clients that read the body.
    let code = match status {
        StatusCode::BAD_REQUEST | StatusCode::UNSUPPORTED_MEDIA_TYPE => 3,
        StatusCode::UNAUTHORIZED => 16,
        StatusCode::PAYLOAD_TOO_LARGE => 8,
        _ => 14,
    };
    let body = RpcStatus { code, message };
    encoded(status, encoding, body.encode_to_vec(), &body)
}

fn encoded<T: Serialize>(
    status: StatusCode,
    encoding: Encoding,
    protobuf: Vec<u8>,
    value: &T,
) -> Response {
    let (content_type, bytes) = match encoding {
        Encoding::Protobuf => ("application/x-protobuf", protobuf),
        Encoding::Json => {
            let mut json = serde_json::to_value(value).expect("OTLP answers serialise");
            // An absent field is left out in OTLP/JSON (proto3's JSON mapping), not null:
            // a full success is `{}`.
            if let serde_json::Value::Object(fields) = &mut json {
                fields.retain(|_, v| !v.is_null());
            }
            ("application/json", json.to_string().into_bytes())
        }
    };
    let mut response = (status, Body::from(bytes)).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn tenant_of(credentials: &Credentials, headers: &HeaderMap) -> Option<String> {
    match credentials {
        Credentials::Fixed(tenant) => Some(tenant.clone()),
        Credentials::Tokens(tokens) => {
            let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
            // `OTEL_EXPORTER_OTLP_HEADERS` is percent-encoded by the specification, and
            // some SDKs send it without decoding it (OpenTelemetry JS 0.208, in Claude
            // Code 2.1.327): `Bearer%20<token>` arrives as written. Both forms are the
            // same credential, so one line of set-up works for every exporter.
            let token = value
                .strip_prefix("Bearer ")
                .or_else(|| value.strip_prefix("Bearer%20"))?
                .trim();
            tokens.get(token).cloned()
        }
    }
}

/// What differs between the signals: the request message, its mapping, its answer.
trait Signal: Message + Default + DeserializeOwned + 'static {
    /// The request message's name, for the 400 answer.
    const MESSAGE: &'static str;
    /// Where dead letters say the item came in.
    const PATH: &'static str;
    fn map(&self, tenant: &str, max_event_bytes: usize) -> Mapped;
    fn count(counter: &dyn OtlpCounter, outcome: &str);
    /// The 200 answer: `partial_success` naming what was refused, if anything was.
    fn answer(encoding: Encoding, rejected: &[Rejected]) -> Response;
}

impl Signal for ExportTraceServiceRequest {
    const MESSAGE: &'static str = "ExportTraceServiceRequest";
    const PATH: &'static str = "otlp:/v1/traces";
    fn map(&self, tenant: &str, max_event_bytes: usize) -> Mapped {
        map_request(self, tenant, max_event_bytes)
    }
    fn count(counter: &dyn OtlpCounter, outcome: &str) {
        counter.span(outcome);
    }
    fn answer(encoding: Encoding, rejected: &[Rejected]) -> Response {
        let partial_success = (!rejected.is_empty()).then(|| ExportTracePartialSuccess {
            rejected_spans: rejected.len() as i64,
            error_message: summary(rejected, "span(s)"),
        });
        let answer = ExportTraceServiceResponse { partial_success };
        encoded(StatusCode::OK, encoding, answer.encode_to_vec(), &answer)
    }
}

impl Signal for ExportLogsServiceRequest {
    const MESSAGE: &'static str = "ExportLogsServiceRequest";
    const PATH: &'static str = "otlp:/v1/logs";
    fn map(&self, tenant: &str, max_event_bytes: usize) -> Mapped {
        map_logs(self, tenant, max_event_bytes)
    }
    fn count(counter: &dyn OtlpCounter, outcome: &str) {
        counter.log_record(outcome);
    }
    fn answer(encoding: Encoding, rejected: &[Rejected]) -> Response {
        let partial_success = (!rejected.is_empty()).then(|| ExportLogsPartialSuccess {
            rejected_log_records: rejected.len() as i64,
            error_message: summary(rejected, "log record(s)"),
        });
        let answer = ExportLogsServiceResponse { partial_success };
        encoded(StatusCode::OK, encoding, answer.encode_to_vec(), &answer)
    }
}

async fn export<S: Signal>(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let headers = request.headers().clone();
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    let encoding = match content_type.as_str() {
        "application/x-protobuf" => Encoding::Protobuf,
        "application/json" => Encoding::Json,
        other => {
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                Encoding::Protobuf,
                format!("content type {other:?}: send application/x-protobuf or application/json"),
            )
        }
    };
    let gzip = match headers.get(header::CONTENT_ENCODING) {
        None => false,
        Some(coding) => {
            let coding = coding.to_str().unwrap_or("?").trim();
            if coding.eq_ignore_ascii_case("gzip") {
                true
            } else if coding.eq_ignore_ascii_case("identity") {
                false
            } else {
                // OTLP/HTTP names gzip only: say so instead of failing to decode the bytes.
                return error(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    encoding,
                    format!("content encoding {coding:?}: send gzip or uncompressed"),
                );
            }
        }
    };
    let Some(tenant) = tenant_of(&shared.options.credentials, &headers) else {
        return error(
            StatusCode::UNAUTHORIZED,
            encoding,
            "no known bearer token: set OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20<token>"
                .to_owned(),
        );
    };
    let limit = shared.options.max_body_bytes;
    let body = match to_bytes(request.into_body(), limit).await {
        Ok(body) => body,
        Err(_) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                encoding,
                format!("request body over {limit} bytes: export smaller batches (OTEL_BSP_MAX_EXPORT_BATCH_SIZE)"),
            )
        }
    };
    let body = if gzip {
        match gunzip(&body, limit) {
            Ok(Some(body)) => body.into(),
            Ok(None) => {
                return error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    encoding,
                    format!(
                        "request body over {limit} bytes once decompressed: export smaller batches"
                    ),
                )
            }
            Err(err) => {
                S::count(shared.counter.as_ref(), "undecodable_batch");
                return error(
                    StatusCode::BAD_REQUEST,
                    encoding,
                    format!("Content-Encoding gzip, but the body is not gzip: {err}"),
                );
            }
        }
    } else {
        body
    };
    let decoded = match encoding {
        Encoding::Protobuf => S::decode(body.as_ref()).map_err(|e| e.to_string()),
        Encoding::Json => serde_json::from_slice::<S>(&body).map_err(|e| e.to_string()),
    };
    let request = match decoded {
        Ok(request) => request,
        Err(detail) => {
            S::count(shared.counter.as_ref(), "undecodable_batch");
            return error(
                StatusCode::BAD_REQUEST,
                encoding,
                format!("not an OTLP {}: {detail}", S::MESSAGE),
            );
        }
    };
    let mapped = request.map(&tenant, shared.options.max_event_bytes);
    if let Err(detail) = publish(&shared.js, &mapped.events).await {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            encoding,
            format!("events not stored, retry: {detail}"),
        );
    }
    let counter = shared.counter.as_ref();
    for _ in 0..mapped.mapped_spans {
        S::count(counter, "mapped");
    }
    for _ in 0..mapped.skipped_spans {
        S::count(counter, "skipped");
    }
    for rejected in &mapped.rejected {
        S::count(counter, rejected.reason);
        dead_letter(&shared, &tenant, S::PATH, rejected).await;
    }
    S::answer(encoding, &mapped.rejected)
}

/// The decompressed body, `None` past `limit` bytes: the bound holds for what is
/// decoded, not only for what was sent (a small gzip body can expand a thousandfold).
fn gunzip(body: &[u8], limit: usize) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)?;
    Ok((out.len() <= limit).then_some(out))
}

/// Publishes every event, then awaits every ack: pipelined, and in order per run (one
/// connection keeps the publish order). The `Nats-Msg-Id` is `<tenant>.<run>.<id>`,
/// as `FuseboxClient::report` sets it, so a re-sent batch is stored once.
async fn publish(js: &jetstream::Context, events: &[fusebox_core::Event]) -> Result<(), String> {
    let mut acks: Vec<PublishAckFuture> = Vec::with_capacity(events.len());
    for event in events {
        let payload = serde_json::to_vec(event).expect("events serialise");
        let message = PublishMessage::build()
            .payload(payload.into())
            .message_id(format!("{}.{}.{}", event.tenant, event.run, event.id));
        let ack = js
            .send_publish(subjects::events(&event.tenant, &event.run), message)
            .await
            .map_err(|e| e.to_string())?;
        acks.push(ack);
    }
    for ack in acks {
        ack.await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// A refused span or record on `fusebox.dlq.<tenant>`, in the daemon's dead-letter form
/// (where it came in, the error, what was refused).
async fn dead_letter(shared: &Shared, tenant: &str, path: &str, rejected: &Rejected) {
    let span = serde_json::json!({
        "name": rejected.span_name,
        "trace_id": rejected.trace_id,
        "span_id": rejected.span_id,
        "run": rejected.run,
    });
    let letter = fusebox_nats::wire::DeadLetter {
        subject: path.to_owned(),
        error: fusebox_nats::wire::WireError {
            reason: rejected.reason.to_owned(),
            message: rejected.detail.clone(),
            event_id: None,
        },
        payload: span.to_string(),
    };
    let body = serde_json::to_vec(&letter).expect("dead letters serialise");
    match shared
        .nats
        .publish(subjects::dlq(tenant), body.into())
        .await
    {
        Ok(()) => shared.counter.dead_letter(),
        Err(err) => tracing::warn!(%err, "OTLP dead letter not published"),
    }
}

/// The partial-success message: each reason with its count and a first example.
fn summary(rejected: &[Rejected], items: &str) -> String {
    let mut by_reason: Vec<(&str, usize, &str)> = Vec::new();
    for r in rejected {
        match by_reason
            .iter_mut()
            .find(|(reason, _, _)| *reason == r.reason)
        {
            Some(entry) => entry.1 += 1,
            None => by_reason.push((r.reason, 1, &r.detail)),
        }
    }
    by_reason
        .iter()
        .map(|(reason, n, example)| format!("{n} {items} {reason} (e.g. {example})"))
        .collect::<Vec<_>>()
        .join("; ")
}
