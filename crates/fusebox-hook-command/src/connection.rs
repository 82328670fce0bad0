//! How a short-lived command reaches fuseboxd: the NATS URL and credentials, from flags
//! or the environment, and one bounded connect. One place, so every command that talks
//! to the daemon connects the same way.

use std::path::PathBuf;

use fusebox_client::{ClientError, ClientOptions, FuseboxClient};

#[derive(clap::Args, Debug, Clone)]
pub struct Connection {
    /// NATS server fuseboxd listens on (user:password@ in the URL works too).
    #[arg(
        long,
        env = "FUSEBOX_NATS_URL",
        default_value = DEFAULT_NATS_URL
    )]
    pub nats_url: String,
    /// A NATS credentials file (JWT + nkey seed), for servers with accounts.
    #[arg(long, env = "FUSEBOX_NATS_CREDS", value_name = "FILE")]
    pub creds: Option<PathBuf>,
}

pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

impl Connection {
    /// Connects within `options.timeout`. Replies come to `_INBOX.<tenant>.…`, which the
    /// per-tenant accounts of deploy/nats/ require and a plain server does not mind.
    pub async fn connect(
        &self,
        tenant: &str,
        options: ClientOptions,
    ) -> Result<FuseboxClient, ClientError> {
        let nats = self
            .options(tenant, options.timeout)
            .await?
            // The first attempt at once: without a server picked here, async-nats sleeps
            // its reconnect delay (zero, which tokio's timer rounds up to a whole
            // millisecond) before the first connect — a fifth of a hook's budget.
            .reconnect_to_server_callback(|servers, _info| async move {
                servers.iter().find(|s| s.failed_attempts == 0).map(|s| {
                    async_nats::ReconnectToServer {
                        addr: s.addr.clone(),
                        delay: Some(std::time::Duration::ZERO),
                    }
                })
            })
            .connect(&self.nats_url)
            .await
            .map_err(|e| self.failed(e.to_string()))?;
        Ok(FuseboxClient::new(nats, options))
    }

    /// For a long-lived server: returns at once, connects (and reconnects) in the
    /// background; meanwhile a request waits for its own timeout, then fails.
    pub async fn connect_lasting(
        &self,
        tenant: &str,
        options: ClientOptions,
    ) -> Result<FuseboxClient, ClientError> {
        let nats = self
            .options(tenant, options.timeout)
            .await?
            .retry_on_initial_connect()
            // Back within a second of NATS returning, not after a growing backoff.
            .reconnect_delay_callback(|attempts| {
                std::time::Duration::from_millis((attempts as u64 * 100).min(1000))
            })
            .connect(&self.nats_url)
            .await
            .map_err(|e| self.failed(e.to_string()))?;
        Ok(FuseboxClient::new(nats, options))
    }

    async fn options(
        &self,
        tenant: &str,
        timeout: std::time::Duration,
    ) -> Result<async_nats::ConnectOptions, ClientError> {
        let mut connect = async_nats::ConnectOptions::new();
        if let Some(creds) = &self.creds {
            connect = connect
                .credentials_file(creds)
                .await
                .map_err(|e| self.failed(format!("{}: {e}", creds.display())))?;
        }
        Ok(connect
            .connection_timeout(timeout)
            .custom_inbox_prefix(format!("_INBOX.{tenant}")))
    }

    fn failed(&self, detail: String) -> ClientError {
        ClientError::Connect {
            url: self.nats_url.clone(),
            detail,
        }
    }

    /// The flags that reproduce this connection where it differs from the defaults.
    pub fn flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        if self.nats_url != DEFAULT_NATS_URL {
            flags.extend(["--nats-url".to_owned(), self.nats_url.clone()]);
        }
        if let Some(creds) = &self.creds {
            flags.extend(["--creds".to_owned(), creds.display().to_string()]);
        }
        flags
    }
}
