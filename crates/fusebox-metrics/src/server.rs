//! The HTTP endpoint: `/metrics`, `/healthz`, `/readyz`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use crate::error::ServeError;
use crate::readiness::Readiness;
use crate::registry::{Metrics, TEXT_CONTENT_TYPE};

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
}

/// The routes, for callers that mount them in their own server.
pub fn router(metrics: Arc<Metrics>, readiness: Arc<Readiness>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics, readiness })
}

/// A bound, not yet serving endpoint. Binding first lets the caller learn the port
/// (tests bind port 0) and fail start-up on a taken port before anything else runs.
pub struct MetricsServer {
    listener: TcpListener,
    router: Router,
}

impl MetricsServer {
    pub async fn bind(
        addr: SocketAddr,
        metrics: Arc<Metrics>,
        readiness: Arc<Readiness>,
    ) -> Result<Self, ServeError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Bind { addr, source })?;
        Ok(MetricsServer {
            listener,
            router: router(metrics, readiness),
        })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, ServeError> {
        self.listener.local_addr().map_err(ServeError::Serve)
    }

    /// Serves until `shutdown` completes, then finishes in-flight requests and returns.
    pub async fn run<F>(self, shutdown: F) -> Result<(), ServeError>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if let Ok(addr) = self.listener.local_addr() {
            tracing::info!(%addr, "metrics endpoint listening");
        }
        axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(ServeError::Serve)
    }
}

/// Binds `addr` and serves `/metrics`, `/healthz` and `/readyz` until `shutdown` completes.
pub async fn serve<F>(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    shutdown: F,
) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send + 'static,
{
    MetricsServer::bind(addr, metrics, readiness)
        .await?
        .run(shutdown)
        .await
}

async fn metrics_handler(State(state): State<AppState>) -> Response {
    match state.metrics.encode() {
        Ok(body) => ([(header::CONTENT_TYPE, TEXT_CONTENT_TYPE)], body).into_response(),
        Err(err) => {
            tracing::error!(%err, "encoding metrics");
            (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response()
        }
    }
}

/// The process answers, so it is alive; readiness is `/readyz`'s business.
async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<AppState>) -> Response {
    let missing = state.readiness.missing();
    if missing.is_empty() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        let body = format!("not ready: {} not set\n", missing.join(", "));
        (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    }
}
