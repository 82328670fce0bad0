//! Whether the events stream holds a run's missing `seq`, asked of the stream itself.
//!
//! A run's events come by two paths; when a later `seq` arrives and an earlier one has
//! not, the applier waits (`gap_timeout`) and then asks here. The stream is the truth
//! of what JetStream acknowledged to a producer: an agent publishes its events in
//! order, each after the last was acknowledged, so by the time a later `seq` has waited
//! out the gap timeout, an acknowledged missing one is in the stream. If it is, it is
//! applied from the stream's copy (the consumer's own delivery, whenever it comes, is
//! then a duplicate and acked); if the stream's leader says it is not there, no path
//! will ever bring it, and the held events go on without it.
//!
//! Asked of the stream, not of the consumer: the consumer's counts (undelivered,
//! unacked) were the earlier test, and a consumer can be wrong about them — seen after
//! a network split healed: a durable consumer reporting nothing pending, and delivering
//! nothing, for a minute while the stream held the partition's new events. Trusting it
//! applied a run's later events without the earlier acknowledged ones: a loss.
//!
//! The applier never waits on NATS: it sends a [`Probe`] here and gets the answer back
//! as an input ([`crate::applier::Input::Probed`]).

use async_nats::jetstream::stream::RawMessageErrorKind;
use async_nats::jetstream::{self, Context};
use fusebox_core::Event;
use tokio::sync::mpsc::{Sender, UnboundedReceiver};
use tokio::sync::watch;

use crate::applier::Input;
use crate::inbound::{parse_on, stopped, Accept};
use crate::subjects::{self, Scope};

/// The applier's question: does the stream hold `seq` of this run?
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Probe {
    pub tenant: String,
    pub run: String,
    pub seq: u64,
}

/// The stream's answer.
#[derive(Debug)]
pub(crate) enum Answer {
    /// The missing event, as the stream holds it.
    Holds(Box<Event>),
    /// The stream's leader holds no event of the run with that `seq`.
    Absent,
    /// No answer (JetStream unreachable, electing a leader): ask again later.
    Unanswered(String),
}

/// Answers the applier's probes, one at a time, until shutdown.
pub(crate) async fn answer_probes(
    js: Context,
    scope: Scope,
    accept: Accept,
    mut probes: UnboundedReceiver<Probe>,
    applier: Sender<Input>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let probe = tokio::select! {
            biased;
            _ = stopped(&mut shutdown) => return,
            probe = probes.recv() => match probe {
                Some(probe) => probe,
                None => return,
            },
        };
        let answer = tokio::select! {
            biased;
            _ = stopped(&mut shutdown) => return,
            answer = find(&js, scope, &accept, &probe) => answer,
        };
        if applier.send(Input::Probed { probe, answer }).await.is_err() {
            return;
        }
    }
}

async fn find(js: &Context, scope: Scope, accept: &Accept, probe: &Probe) -> Answer {
    let stream = match js.get_stream_no_info(subjects::EVENTS_STREAM).await {
        Ok(stream) => stream,
        Err(err) => return Answer::Unanswered(err.to_string()),
    };
    for subject in scope.run_events_subjects(&probe.tenant, &probe.run) {
        match find_on(&stream, &subject, accept, probe.seq).await {
            Ok(Some(event)) => return Answer::Holds(Box::new(event)),
            Ok(None) => {}
            Err(err) => return Answer::Unanswered(err),
        }
    }
    Answer::Absent
}

/// Walks the run's messages on `subject` in stream order. A direct message get always
/// reaches the stream's leader, so "no message found" is the stream's word, not a
/// lagging replica's. A run's stream events are few (its history), and this runs only
/// for a gap that timed out.
async fn find_on(
    stream: &jetstream::stream::Stream<()>,
    subject: &str,
    accept: &Accept,
    seq: u64,
) -> Result<Option<Event>, String> {
    let mut from = 1;
    loop {
        let asked = stream
            .raw_message_builder()
            .sequence(from)
            .next_by_subject(subject)
            .send()
            .await;
        let message = match asked {
            Ok(message) => message,
            Err(err) if err.kind() == RawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(err) => return Err(err.to_string()),
        };
        from = message.sequence + 1;
        // What cannot be parsed was dead-lettered when it was delivered: not the event.
        if let Ok(event) = parse_on(message.subject.as_str(), "events", &message.payload, accept) {
            if event.seq == Some(seq) {
                return Ok(Some(event));
            }
        }
    }
}
