//! Checks every wire event passes before it may reach the log: it parses (within the size
//! bound), it came on its own run's subject, and it is not something only the daemon
//! writes.

use fusebox_core::{parse_event_bounded, Event, EventBody, EventError, RejectReason};

use crate::subjects;

/// Parses an event that arrived on `fusebox.<kind>.<tenant>.<run>` and checks it against
/// that subject.
pub(crate) fn parse_on(
    subject: &str,
    kind: &str,
    payload: &[u8],
    max_bytes: usize,
) -> Result<Event, EventError> {
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
    Ok(event)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVENT: &[u8] =
        br#"{"v":1,"id":"e1","tenant":"acme","run":"r1","ts_ms":1,"type":"progress","version":1}"#;

    #[test]
    fn an_event_on_its_own_subject_passes() {
        let event = parse_on("fusebox.gate.acme.r1", "gate", EVENT, 1 << 20).unwrap();
        assert_eq!(event.id, "e1");
    }

    #[test]
    fn another_tenants_subject_is_refused() {
        let err = parse_on("fusebox.gate.evil.r1", "gate", EVENT, 1 << 20).unwrap_err();
        assert_eq!(err.reason, RejectReason::TenantMismatch);
        assert_eq!(err.event_id.as_deref(), Some("e1"));
    }

    #[test]
    fn another_runs_subject_and_producer_ticks_are_refused() {
        let err = parse_on("fusebox.events.acme.r2", "events", EVENT, 1 << 20).unwrap_err();
        assert_eq!(err.reason, RejectReason::InvalidField);
        let tick = br#"{"v":1,"id":"t","tenant":"acme","run":"r1","ts_ms":1,"type":"tick"}"#;
        let err = parse_on("fusebox.events.acme.r1", "events", tick, 1 << 20).unwrap_err();
        assert_eq!(err.reason, RejectReason::InvalidField);
    }

    #[test]
    fn oversized_and_malformed_input_is_refused() {
        let err = parse_on("fusebox.gate.acme.r1", "gate", EVENT, 10).unwrap_err();
        assert_eq!(err.reason, RejectReason::TooLarge);
        let err = parse_on("fusebox.gate.acme.r1", "gate", b"{nope", 1 << 20).unwrap_err();
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
    pub max_event_bytes: usize,
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
