//! Gate and report: the agent side.

use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage};
use async_nats::{Client, RequestErrorKind};
use fusebox_core::{Decision, Event};
use fusebox_nats::subjects;
use fusebox_nats::wire::{ErrorReply, WireError};
use serde::de::DeserializeOwned;

use crate::error::ClientError;
use crate::settings::NatsSettings;

/// What the agent does when the gate cannot be asked (timeout, no daemon, NATS down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GateOnError {
    /// The tool does not run: an unguarded agent is the failure fusebox exists for.
    #[default]
    Deny,
    /// The tool runs unguarded (for agents where availability beats the guard).
    Allow,
}

#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// How long a gate (or operator) request may take before it counts as unanswered.
    pub timeout: Duration,
    pub gate_on_error: GateOnError,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeout: Duration::from_secs(2),
            gate_on_error: GateOnError::Deny,
        }
    }
}

/// The gate's answer as the agent should act on it.
#[derive(Debug)]
pub enum Gate {
    /// The guard decided; run the tool only if `decision.action.lets_tool_run()`.
    Decided(Decision),
    /// The daemon refused the event itself (malformed, wrong tenant …): do not run.
    Refused(WireError),
    /// No answer; `allowed` is the configured [`GateOnError`] policy.
    Unanswered { error: ClientError, allowed: bool },
}

impl Gate {
    /// May the tool run?
    pub fn may_run(&self) -> bool {
        match self {
            Gate::Decided(decision) => decision.action.lets_tool_run(),
            Gate::Refused(_) => false,
            Gate::Unanswered { allowed, .. } => *allowed,
        }
    }

    pub fn decision(&self) -> Option<&Decision> {
        match self {
            Gate::Decided(decision) => Some(decision),
            _ => None,
        }
    }
}

#[derive(Clone)]
pub struct FuseboxClient {
    pub(crate) nats: Client,
    pub(crate) js: jetstream::Context,
    pub(crate) options: ClientOptions,
}

impl FuseboxClient {
    pub fn new(nats: Client, options: ClientOptions) -> Self {
        let js = jetstream::new(nats.clone());
        FuseboxClient { nats, js, options }
    }

    /// Connects to NATS at `url` with no credentials (loopback, tests); see
    /// [`FuseboxClient::connect_with`] for everything else.
    pub async fn connect(url: &str, options: ClientOptions) -> Result<Self, ClientError> {
        FuseboxClient::connect_with(&NatsSettings::url(url), options).await
    }

    /// Connects with `settings` (credentials, TLS, inbox prefix). Under the per-tenant
    /// accounts of `deploy/nats/`, a tenant's agents set
    /// `inbox_prefix = "_INBOX.<tenant>"`: a tenant may only receive replies on its own
    /// inboxes. The first connect fails at once with the server's reason (bad
    /// credentials, unreachable) instead of retrying; once connected, the client
    /// reconnects on its own.
    pub async fn connect_with(
        settings: &NatsSettings,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        let servers = settings.servers()?;
        let nats = settings
            .connect_options(options.timeout)
            .await?
            .connect(servers)
            .await
            .map_err(|err| ClientError::Connect {
                url: settings.server_urls().join(", "),
                detail: err.to_string(),
            })?;
        Ok(FuseboxClient::new(nats, options))
    }

    pub fn options(&self) -> &ClientOptions {
        &self.options
    }

    pub fn nats(&self) -> &Client {
        &self.nats
    }

    /// Asks the guard about `event` (normally a `tool_call`; any event type is answered).
    /// Asking again with the same event id returns the same decision.
    pub async fn gate(&self, event: &Event) -> Gate {
        let payload = serde_json::to_vec(event).expect("events serialise");
        self.gate_bytes(&event.tenant, &event.run, payload).await
    }

    /// [`FuseboxClient::gate`] for an event already encoded as JSON.
    pub async fn gate_bytes(&self, tenant: &str, run: &str, payload: Vec<u8>) -> Gate {
        match self.request(subjects::gate(tenant, run), payload).await {
            Ok(decision) => Gate::Decided(decision),
            Err(ClientError::Refused(error)) => Gate::Refused(error),
            Err(error) => Gate::Unanswered {
                error,
                allowed: self.options.gate_on_error == GateOnError::Allow,
            },
        }
    }

    /// Publishes `event` to `FUSEBOX_EVENTS` and waits for JetStream to store it. The
    /// `Nats-Msg-Id` is `<tenant>.<run>.<id>`, so a re-sent event is stored once.
    pub async fn report(&self, event: &Event) -> Result<(), ClientError> {
        let payload = serde_json::to_vec(event).expect("events serialise");
        self.report_bytes(&event.tenant, &event.run, &event.id, payload)
            .await
    }

    /// [`FuseboxClient::report`] for an event already encoded as JSON.
    pub async fn report_bytes(
        &self,
        tenant: &str,
        run: &str,
        id: &str,
        payload: Vec<u8>,
    ) -> Result<(), ClientError> {
        let publish = PublishMessage::build()
            .payload(payload.into())
            .message_id(format!("{tenant}.{run}.{id}"));
        let ack = self
            .js
            .send_publish(subjects::events(tenant, run), publish)
            .await
            .map_err(|err| ClientError::JetStream {
                what: "publish".to_owned(),
                detail: err.to_string(),
            })?;
        ack.await.map_err(|err| ClientError::JetStream {
            what: "publish ack".to_owned(),
            detail: err.to_string(),
        })?;
        Ok(())
    }

    /// One request/reply with the configured timeout; an `{"error":…}` answer becomes
    /// [`ClientError::Refused`].
    pub(crate) async fn request<T: DeserializeOwned>(
        &self,
        subject: String,
        payload: Vec<u8>,
    ) -> Result<T, ClientError> {
        let request = async_nats::Request::new()
            .payload(payload.into())
            .timeout(Some(self.options.timeout));
        let reply = self
            .nats
            .send_request(subject.clone(), request)
            .await
            .map_err(|err| match err.kind() {
                RequestErrorKind::TimedOut => ClientError::Timeout {
                    subject: subject.clone(),
                    timeout_ms: self.options.timeout.as_millis() as u64,
                },
                RequestErrorKind::NoResponders => ClientError::NoResponders {
                    subject: subject.clone(),
                },
                _ => ClientError::Request {
                    subject: subject.clone(),
                    detail: err.to_string(),
                },
            })?;
        if let Ok(refused) = serde_json::from_slice::<ErrorReply>(&reply.payload) {
            return Err(ClientError::Refused(refused.error));
        }
        serde_json::from_slice(&reply.payload).map_err(|err| ClientError::BadAnswer {
            subject,
            detail: err.to_string(),
        })
    }
}
