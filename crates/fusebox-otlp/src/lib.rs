//! OTLP in: passive watching of any agent instrumented with OpenTelemetry.
//!
//! [`map`] is pure: an OTLP `ExportTraceServiceRequest` in, fusebox events and the spans
//! it refused (with reasons) out; [`logs`] the same for `ExportLogsServiceRequest`, the
//! coding agents' own telemetry events, one module per agent. [`listener`] is the OTLP/HTTP endpoint fuseboxd
//! starts under `[otlp]`: it decodes with the OpenTelemetry project's own messages,
//! maps, and publishes the events to `FUSEBOX_EVENTS` as any passive producer does, so
//! they take the durable path (sequencer, engine, log) every passive event takes. It
//! decides nothing: the guard's decision is computed by the engine in fuseboxd.

mod attrs;
pub mod listener;
pub mod logs;
pub mod map;

pub use listener::{BindError, Credentials, OtlpCounter, OtlpListener, OtlpOptions};
pub use logs::map_logs;
pub use map::{map_request, Mapped, Rejected};
pub use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
pub use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
