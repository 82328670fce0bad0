//! Prometheus metrics of fuseboxd and its `/metrics`, `/healthz`, `/readyz` endpoint.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use fusebox_metrics::{serve, Metrics, MetricsOptions, Readiness};
//!
//! let metrics = Arc::new(Metrics::new(env!("CARGO_PKG_VERSION"), MetricsOptions::default())?);
//! let readiness = Arc::new(Readiness::new());
//! metrics.event("acme", "tool_call");
//! metrics.decision("acme", "block", Some("same_call_repeat"));
//! serve("127.0.0.1:9464".parse()?, metrics, readiness, async { /* shutdown signal */ }).await?;
//! # Ok(()) }
//! ```
//!
//! See README.md for every metric, its labels and meaning.

pub mod catalogue;
mod error;
pub mod labels;
mod readiness;
mod record;
mod registry;
mod server;

pub use catalogue::{Kind, MetricDef, CATALOGUE};
pub use error::{MetricsError, ServeError};
pub use readiness::Readiness;
pub use registry::{Metrics, MetricsOptions, DEFAULT_MAX_TENANTS, TEXT_CONTENT_TYPE};
pub use server::{router, serve, MetricsServer};
