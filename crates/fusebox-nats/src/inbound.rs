//! Checks every wire event passes before it may reach the log: it parses (within the size
//! bound), it came on its own run's subject, it is not something only the daemon (or an
//! operator) writes, and an instance it reports would be watched.

use fusebox_core::{parse_event_bounded, Event, EventBody, EventError, RejectReason};

use crate::subjects;

/// Parses an event that arrived on `fusebox.<kind>.<tenant>.<run>` and checks it against
/// that subject.
pub(crate) fn parse_on(
    subject: &str,
    kind: &str,
    payload: &[u8],
    accept: &Accept,
) -> Result<Event, EventError> {
    let max_bytes = accept.max_event_bytes;
    let Some((tenant, run)) = subjects::run_of(subject, kind) else {
        return Err(EventError::new(
            RejectReason::InvalidField,
            format!("subject {subject:?} is not fusebox.{kind}.<tenant>.<run>"),
        ));
    };
    let event = parse_event_bounded(payload, max_bytes)?;
    let refuse = |reason, message: String| {
        let mut err = EventError::new(reason, message);
        err.event_id = Some(event.id.clone());
        Err(err)
    };
    if event.tenant != tenant {
        return refuse(
            RejectReason::TenantMismatch,
            format!(
                "tenant {:?} differs from the subject's tenant {tenant:?}",
                event.tenant
            ),
        );
    }
    if event.run != run {
        return refuse(
            RejectReason::InvalidField,
            format!("run {:?} differs from the subject's run {run:?}", event.run),
        );
    }
    if matches!(event.body, EventBody::Tick(_)) {
        return refuse(
            RejectReason::InvalidField,
            "tick events are written by the daemon only".to_owned(),
        );
    }
    // Releasing a key lets an operation run again: an operator's call, made on the
    // control subjects (which tenants' users may not publish to), never an agent's.
    if matches!(event.body, EventBody::LedgerResolve(_)) {
        return refuse(
            RejectReason::InvalidField,
            "ledger_resolve events come from operators only (fusebox.control.<tenant>.<run>.resolve)"
                .to_owned(),
        );
    }
    if let Err(mut err) = check_watched(&event, &accept.instance_providers) {
        err.event_id = Some(event.id.clone());
        return Err(err);
    }
    Ok(event)
}

/// The clouds `fusebox-watchdog` has drivers for (its `Provider::name`s, `ec2.rs`): what
/// a daemon running its watchdog accepts in `instance_launched`, and what `fusebox replay`
/// checks a stream against.
pub const WATCHDOG_DRIVERS: &[&str] = &["ec2"];

/// An instance reported for a cloud nobody watches would bill on while its operator
/// believes the watchdog has it: refused, so the producer's error reply (or replay's
/// `file:line`), the dead letter and `fusebox_events_rejected_total{reason=
/// "unwatched_provider"}` say so. `providers`: what the watchdog watches (empty: none).
pub fn check_watched(event: &Event, providers: &[String]) -> Result<(), EventError> {
    let EventBody::InstanceLaunched(launched) = &event.body else {
        return Ok(());
    };
    if providers.contains(&launched.provider) {
        return Ok(());
    }
    let drivers = if providers.is_empty() {
        "this daemon runs no cloud watchdog ([watchdog] enabled = false)".to_owned()
    } else {
        format!(
            "this daemon's watchdog has drivers for {} only",
            providers.join(", ")
        )
    };
    let mut err = EventError::new(
        RejectReason::UnwatchedProvider,
        format!(
            "instance {} of provider {:?} would not be watched: {drivers}; nothing would terminate it",
            launched.instance_id,
            launched.provider.chars().take(40).collect::<String>()
        ),
    );
    err.event_id = Some(event.id.clone());
    Err(err)
}

/// What the inbound paths accept, beyond a valid event on its own subject.
#[derive(Debug, Clone, Default)]
pub(crate) struct Accept {
    pub max_event_bytes: usize,
    /// Cloud providers whose instances this daemon's watchdog watches (empty: none).
    pub instance_providers: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept() -> Accept {
        Accept {
            max_event_bytes: 1 << 20,
            instance_providers: vec!["ec2".to_owned()],
        }
    }

    #[test]
    fn an_instance_nobody_would_watch_is_refused_with_its_reason() {
        let launched = |provider: &str| {
            format!(
                r#"{{"v":1,"id":"e1","tenant":"acme","run":"r1","ts_ms":1,"type":"instance_launched","provider":"{provider}","region":"r","instance_id":"i-1"}}"#
            )
        };
        let subject = "fusebox.events.acme.r1";
        assert!(parse_on(subject, "events", launched("ec2").as_bytes(), &accept()).is_ok());
        let err = parse_on(subject, "events", launched("gcp").as_bytes(), &accept()).unwrap_err();
        assert_eq!(err.reason, RejectReason::UnwatchedProvider);
        assert!(
            err.message.contains("\"gcp\"") && err.message.contains("ec2 only"),
            "{}",
            err.message
        );
        assert_eq!(err.event_id.as_deref(), Some("e1"));
        let none = Accept {
            instance_providers: Vec::new(),
            ..accept()
        };
        let err = parse_on(subject, "events", launched("ec2").as_bytes(), &none).unwrap_err();
        assert!(err.message.contains("no cloud watchdog"), "{}", err.message);
    }

    const EVENT: &[u8] =
        br#"{"v":1,"id":"e1","tenant":"acme","run":"r1","ts_ms":1,"type":"progress","version":1}"#;

    #[test]
    fn an_event_on_its_own_subject_passes() {
        let event = parse_on("fusebox.gate.acme.r1", "gate", EVENT, &accept()).unwrap();
        assert_eq!(event.id, "e1");
    }

    #[test]
    fn an_agent_cannot_resolve_a_ledger_key() {
        let resolve = br#"{"v":1,"id":"e1","tenant":"acme","run":"r1","ts_ms":1,"type":"ledger_resolve","op_key":"k","resolution":"released"}"#;
        let err = parse_on("fusebox.events.acme.r1", "events", resolve, &accept()).unwrap_err();
        assert_eq!(err.reason, RejectReason::InvalidField);
        assert!(err.message.contains("operators only"), "{}", err.message);
    }

    #[test]
    fn another_tenants_subject_is_refused() {
        let err = parse_on("fusebox.gate.evil.r1", "gate", EVENT, &accept()).unwrap_err();
        assert_eq!(err.reason, RejectReason::TenantMismatch);
        assert_eq!(err.event_id.as_deref(), Some("e1"));
    }

    #[test]
    fn another_runs_subject_and_producer_ticks_are_refused() {
        let err = parse_on("fusebox.events.acme.r2", "events", EVENT, &accept()).unwrap_err();
        assert_eq!(err.reason, RejectReason::InvalidField);
        let tick = br#"{"v":1,"id":"t","tenant":"acme","run":"r1","ts_ms":1,"type":"tick"}"#;
        let err = parse_on("fusebox.events.acme.r1", "events", tick, &accept()).unwrap_err();
        assert_eq!(err.reason, RejectReason::InvalidField);
    }

    #[test]
    fn oversized_and_malformed_input_is_refused() {
        let err = parse_on(
            "fusebox.gate.acme.r1",
            "gate",
            EVENT,
            &Accept {
                max_event_bytes: 10,
                ..accept()
            },
        )
        .unwrap_err();
        assert_eq!(err.reason, RejectReason::TooLarge);
        let err = parse_on("fusebox.gate.acme.r1", "gate", b"{nope", &accept()).unwrap_err();
        assert_eq!(err.reason, RejectReason::MalformedJson);
    }
}

/// What every inbound path needs: the applier's queue, the dispatcher (for refusals)
/// and the observer.
#[derive(Clone)]
pub(crate) struct Inbound {
    pub tx: tokio::sync::mpsc::Sender<crate::applier::Input>,
    pub out: tokio::sync::mpsc::UnboundedSender<crate::dispatch::Outbox>,
    pub observer: std::sync::Arc<dyn crate::observer::Observer>,
    pub accept: Accept,
    /// Which runs this service serves; a partition's runs listing says which it is.
    pub scope: crate::subjects::Scope,
}

impl Inbound {
    /// Queues an input for the applier. Fails only when the applier is gone (it failed,
    /// or shutdown is past draining), in which case the input is left unanswered: a gate
    /// client times out and denies, a stream message is redelivered.
    pub(crate) async fn queue(&self, input: crate::applier::Input) {
        if self.tx.send(input).await.is_err() {
            tracing::warn!("applier gone; input left unanswered");
        }
    }

    pub(crate) fn reject(&self, origin: crate::reject::Origin, err: &EventError) {
        let mut outbox = crate::dispatch::Outbox::default();
        crate::reject::reject(&mut outbox, &*self.observer, origin, err);
        outbox.send(&self.out);
    }
}

/// Reads a subscription until shutdown, then unsubscribes and handles what was already
/// delivered, so a request that reached us before the signal still gets its answer.
pub(crate) async fn serve_subscription<F, Fut>(
    mut subscriber: async_nats::Subscriber,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    mut handle: F,
) where
    F: FnMut(async_nats::Message) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use futures_util::StreamExt;
    loop {
        tokio::select! {
            biased;
            _ = stopped(&mut shutdown) => break,
            message = subscriber.next() => match message {
                Some(message) => handle(message).await,
                None => return,
            },
        }
    }
    if let Err(err) = subscriber.unsubscribe().await {
        tracing::warn!(%err, "unsubscribe failed");
        return;
    }
    let grace = std::time::Duration::from_millis(200);
    while let Ok(Some(message)) = tokio::time::timeout(grace, subscriber.next()).await {
        handle(message).await;
    }
}

/// Resolves once shutdown is signalled (or its sender is gone).
pub(crate) async fn stopped(shutdown: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}
