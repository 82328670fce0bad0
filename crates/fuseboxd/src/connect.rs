//! The NATS connection from `[nats]`: servers, credentials, TLS, and connection events
//! wired to the `fusebox_nats_connected` gauge and `/readyz`. The client reconnects on
//! its own, forever; subscriptions are re-established by it and the JetStream consumer
//! is rebound by the ingest loop.

use std::sync::Arc;
use std::time::Duration;

use async_nats::{Client, ConnectOptions, Event, ServerAddr};
use fusebox_nats::Observer;

use crate::config::NatsConfig;

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("[nats] url {url:?}: {detail}")]
    BadUrl { url: String, detail: String },
    #[error("[nats] cannot read {what}: {detail}")]
    Credentials { what: String, detail: String },
    #[error("cannot connect to NATS at {urls}: {detail}")]
    Unreachable { urls: String, detail: String },
}

pub async fn connect(
    config: &NatsConfig,
    observer: Arc<dyn Observer>,
) -> Result<Client, ConnectError> {
    let servers = config
        .urls
        .iter()
        .map(|url| {
            url.parse::<ServerAddr>()
                .map_err(|err| ConnectError::BadUrl {
                    url: url.clone(),
                    detail: err.to_string(),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut options = ConnectOptions::new()
        .name(&config.name)
        .connection_timeout(Duration::from_millis(config.connect_timeout_ms))
        .require_tls(config.tls_required)
        .event_callback(move |event| {
            let observer = observer.clone();
            async move {
                match event {
                    Event::Connected => {
                        tracing::info!("connected to NATS");
                        observer.nats_connected(true);
                    }
                    Event::Disconnected => {
                        tracing::warn!("disconnected from NATS; reconnecting");
                        observer.nats_connected(false);
                        observer.consumer_bound(false);
                    }
                    other => tracing::info!(event = %other, "NATS connection event"),
                }
            }
        });
    if let (Some(user), Some(password)) = (&config.user, &config.password) {
        options = options.user_and_password(user.clone(), password.clone());
    }
    if let Some(token) = &config.token {
        options = options.token(token.clone());
    }
    if let Some(path) = &config.nkey_seed_file {
        let seed = std::fs::read_to_string(path).map_err(|err| ConnectError::Credentials {
            what: format!("nkey_seed_file {}", path.display()),
            detail: err.to_string(),
        })?;
        options = options.nkey(seed.trim().to_owned());
    }
    if let Some(path) = &config.creds_file {
        options =
            options
                .credentials_file(path)
                .await
                .map_err(|err| ConnectError::Credentials {
                    what: format!("creds_file {}", path.display()),
                    detail: err.to_string(),
                })?;
    }
    if let Some(ca) = &config.tls_ca_file {
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&config.tls_cert_file, &config.tls_key_file) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    let client = options
        .connect(servers)
        .await
        .map_err(|err| ConnectError::Unreachable {
            urls: config.urls.join(", "),
            detail: err.to_string(),
        })?;
    Ok(client)
}
