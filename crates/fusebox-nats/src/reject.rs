//! Refused input: an error reply to whoever asked, a dead letter with the error text on
//! `fusebox.dlq.<tenant>`, a counter — and the valid events around it go on.

use std::time::Instant;

use async_nats::Subject;
use bytes::Bytes;
use fusebox_core::EventError;

use crate::dispatch::{Outbox, Output};
use crate::observer::Observer;
use crate::subjects;
use crate::wire::{DeadLetter, ErrorReply, WireError};

/// Where an input came from, and so how it is answered once its batch is durable.
/// The messages are boxed: an input is moved several times on its way (the channel,
/// the batch, the waiters, the outbox), and a JetStream message is 408 bytes. Unboxed,
/// an input was 656 bytes and `memmove` 13 % of the daemon's samples under ingest
/// (perf); boxed, 9 %.
pub(crate) enum Origin {
    /// A gate request (`fusebox.gate.<t>.<r>`): reply with the decision.
    Gate {
        message: Box<async_nats::Message>,
        received: Instant,
    },
    /// A JetStream message: acknowledge it.
    Stream(Box<async_nats::jetstream::Message>),
    /// An operator command: reply with the decision.
    Control { reply: Subject },
    /// Written by the daemon itself (ticks): nobody to answer.
    Internal,
}

impl Origin {
    /// The subject and bytes the input arrived as, for a dead letter.
    fn input(&self) -> Option<(&str, &[u8])> {
        match self {
            Origin::Gate { message, .. } => Some((message.subject.as_str(), &message.payload)),
            Origin::Stream(message) => Some((message.subject.as_str(), &message.payload)),
            Origin::Control { .. } | Origin::Internal => None,
        }
    }

    /// The answer to this input, `body` being a decision or an error reply.
    pub(crate) fn answer(self, body: &Bytes) -> Option<Output> {
        match self {
            Origin::Gate { message, received } => message.reply.map(|to| Output::Reply {
                to,
                body: body.clone(),
                gate_received: Some(received),
            }),
            Origin::Stream(message) => Some(Output::Ack(message)),
            Origin::Control { reply } => Some(Output::Reply {
                to: reply,
                body: body.clone(),
                gate_received: None,
            }),
            Origin::Internal => None,
        }
    }
}

/// Refuses one input: dead letter (when it came from the wire), counter, and the error
/// as its answer (a stream message is terminated instead: redelivering cannot fix it).
pub(crate) fn reject(
    outbox: &mut Outbox,
    observer: &dyn Observer,
    origin: Origin,
    err: &EventError,
) {
    observer.rejected(err.reason.as_str());
    let error = WireError::from(err);
    tracing::debug!(%err, "input refused");
    if let Some((subject, payload)) = origin.input() {
        let letter = DeadLetter {
            subject: subject.to_owned(),
            error: error.clone(),
            payload: String::from_utf8_lossy(payload).into_owned(),
        };
        let tenant = subjects::tenant_of(subject).unwrap_or("_");
        let body = serde_json::to_vec(&letter).expect("dead letters serialise");
        outbox.publishes.push(Output::Publish {
            subject: subjects::dlq(tenant),
            body: body.into(),
        });
        observer.dead_letter();
    }
    let reply = serde_json::to_vec(&ErrorReply { error }).expect("error replies serialise");
    let answer = match origin {
        Origin::Stream(message) => Some(Output::Terminate(message)),
        other => other.answer(&reply.into()),
    };
    outbox.answers.extend(answer);
}
