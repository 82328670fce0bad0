//! Gate and report: the agent side.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, message::PublishMessage};
use async_nats::{Client, RequestErrorKind, ServerError};
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
    refusals: Refusals,
}

/// The server's latest permission refusal on this connection. A refused publish gets no
/// reply, only an asynchronous `-ERR 'Permissions Violation for Publish to …'`; kept
/// here, it turns the request's timeout into [`ClientError::PermissionDenied`], so a
/// user with the wrong rights is told so instead of "no answer".
#[derive(Clone, Default)]
struct Refusals(Arc<Mutex<Option<(Instant, String)>>>);

impl Refusals {
    fn record(&self, error: &ServerError) {
        if let ServerError::Other(text) = error {
            if text.to_ascii_lowercase().contains("permissions violation") {
                *self.0.lock().expect("not poisoned") = Some((Instant::now(), text.clone()));
            }
        }
    }

    /// A refusal that arrived after `since`.
    fn since(&self, since: Instant) -> Option<String> {
        let latest = self.0.lock().expect("not poisoned");
        latest
            .as_ref()
            .filter(|(at, _)| *at >= since)
            .map(|(_, text)| text.clone())
    }
}

impl FuseboxClient {
    /// Wraps a connection made elsewhere (permission refusals are then reported as
    /// timeouts: only [`FuseboxClient::connect_with`] listens for them).
    pub fn new(nats: Client, options: ClientOptions) -> Self {
        FuseboxClient::with_refusals(nats, options, Refusals::default())
    }

    fn with_refusals(nats: Client, options: ClientOptions, refusals: Refusals) -> Self {
        let js = jetstream::new(nats.clone());
        FuseboxClient {
            nats,
            js,
            options,
            refusals,
        }
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
        let refusals = Refusals::default();
        let recorder = refusals.clone();
        let nats = settings
            .connect_options(options.timeout)
            .await?
            .event_callback(move |event| {
                if let async_nats::Event::ServerError(error) = &event {
                    recorder.record(error);
                }
                async {}
            })
            .connect(servers)
            .await
            .map_err(|err| ClientError::Connect {
                url: settings.server_urls().join(", "),
                detail: err.to_string(),
            })?;
        Ok(FuseboxClient::with_refusals(nats, options, refusals))
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
        self.gate_in_tree(&event.run, event).await
    }

    /// [`FuseboxClient::gate`] for an event of a run of the tree rooted at `root`: on the
    /// subject that names the root ([`subjects::tree_gate`]), where a cluster serves the
    /// whole tree.
    pub async fn gate_in_tree(&self, root: &str, event: &Event) -> Gate {
        let payload = serde_json::to_vec(event).expect("events serialise");
        self.gate_on(
            subjects::tree_gate(&event.tenant, root, &event.run),
            payload,
        )
        .await
    }

    /// [`FuseboxClient::gate`] for an event already encoded as JSON.
    pub async fn gate_bytes(&self, tenant: &str, run: &str, payload: Vec<u8>) -> Gate {
        self.gate_on(subjects::gate(tenant, run), payload).await
    }

    async fn gate_on(&self, subject: String, payload: Vec<u8>) -> Gate {
        match self.request(subject, payload).await {
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
        self.report_on(subjects::events(tenant, run), tenant, run, id, payload)
            .await
    }

    /// [`FuseboxClient::report_bytes`] on a given subject of the run (its tree's form,
    /// [`subjects::tree_events`]).
    pub(crate) async fn report_on(
        &self,
        subject: String,
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
            .send_publish(subject, publish)
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
        let reply = self.raw_request(&subject, payload).await?;
        if let Ok(refused) = serde_json::from_slice::<ErrorReply>(&reply.payload) {
            return Err(ClientError::Refused(refused.error));
        }
        serde_json::from_slice(&reply.payload).map_err(|err| ClientError::BadAnswer {
            subject,
            detail: err.to_string(),
        })
    }

    /// One request/reply with the configured timeout, the reply as it came; a timeout
    /// after the server refused the request is [`ClientError::PermissionDenied`].
    pub(crate) async fn raw_request(
        &self,
        subject: &str,
        payload: Vec<u8>,
    ) -> Result<async_nats::Message, ClientError> {
        let started = Instant::now();
        let request = async_nats::Request::new()
            .payload(payload.into())
            .timeout(Some(self.options.timeout));
        self.nats
            .send_request(subject.to_owned(), request)
            .await
            .map_err(|err| match err.kind() {
                RequestErrorKind::TimedOut => self.unanswered(subject, started),
                RequestErrorKind::NoResponders => ClientError::NoResponders {
                    subject: subject.to_owned(),
                },
                _ => ClientError::Request {
                    subject: subject.to_owned(),
                    detail: err.to_string(),
                },
            })
    }

    /// Why a request sent at `started` got no answer: refused by the server, or a
    /// timeout.
    pub(crate) fn unanswered(&self, subject: &str, started: Instant) -> ClientError {
        match self.refusals.since(started) {
            Some(detail) => ClientError::PermissionDenied {
                subject: subject.to_owned(),
                detail,
            },
            None => ClientError::Timeout {
                subject: subject.to_owned(),
                timeout_ms: self.options.timeout.as_millis() as u64,
            },
        }
    }

    /// Subscribes to `subject` and makes sure the server took the subscription (see
    /// [`FuseboxClient::confirm_subscribed`]).
    pub(crate) async fn subscribe_confirmed(
        &self,
        subject: &str,
    ) -> Result<async_nats::Subscriber, ClientError> {
        let started = Instant::now();
        let subscriber = self
            .nats
            .subscribe(subject.to_owned())
            .await
            .map_err(|err| ClientError::Request {
                subject: subject.to_owned(),
                detail: err.to_string(),
            })?;
        self.confirm_subscribed(subject, started).await?;
        Ok(subscriber)
    }

    /// Makes sure the server has the subscriptions made since `started` (a flush) and
    /// did not refuse one: a refused subscription would otherwise just stay silent.
    /// The refusal comes before the flush's answer but reaches us through the
    /// connection's event task, so it is given a moment to land.
    pub(crate) async fn confirm_subscribed(
        &self,
        subject: &str,
        started: Instant,
    ) -> Result<(), ClientError> {
        let failed = |detail: String| ClientError::Request {
            subject: subject.to_owned(),
            detail,
        };
        self.nats.flush().await.map_err(|e| failed(e.to_string()))?;
        for attempt in 0..12 {
            if let Some(detail) = self.refusals.since(started) {
                return Err(ClientError::PermissionDenied {
                    subject: subject.to_owned(),
                    detail,
                });
            }
            if attempt < 10 {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        Ok(())
    }
}
