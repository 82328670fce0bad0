use std::io;

/// Why the registry could not be built or rendered.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("prometheus registry: {0}")]
    Prometheus(#[from] prometheus::Error),
    #[error("metrics exposition is not UTF-8")]
    NotUtf8,
}

/// Why the HTTP endpoint could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("binding the metrics endpoint on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: io::Error,
    },
    #[error("serving the metrics endpoint: {0}")]
    Serve(io::Error),
}
