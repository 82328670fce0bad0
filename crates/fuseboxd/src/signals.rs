//! SIGTERM (systemd, Kubernetes) and SIGINT (a terminal) both mean: drain and exit.

pub async fn terminated() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM received; draining"),
                    _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received; draining"),
                }
            }
            Err(err) => {
                tracing::warn!(%err, "cannot watch SIGTERM; only SIGINT stops the daemon");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("interrupt received; draining");
    }
}
