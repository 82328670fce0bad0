//! The replicated truth of a partition: stream `FUSEBOX_APPLIED`, one message per
//! committed batch on `fusebox.applied.<p>`, holding what the batch applied in order
//! (the adopted ledger entries, then the events). It is written before the local log
//! (see `Guard::submit_batch_then`), so it always holds at least what any daemon's log
//! holds for the partition, and it is fenced: each publish expects the subject's last
//! sequence to be the one this owner wrote, so a daemon that lost its lease without
//! noticing cannot append after the new owner.
//!
//! A daemon that takes a partition replays the batches its own log lacks
//! ([`catch_up`]), so the runs continue exactly where the last owner left them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_nats::header::{HeaderMap, NATS_EXPECTED_LAST_SUBJECT_SEQUENCE};
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::stream::{self, LastRawMessageErrorKind, RetentionPolicy, StorageType};
use async_nats::jetstream::{self, consumer::pull::OrderedConfig, consumer::DeliverPolicy};
use fusebox_core::{parse_event, Action, Decision, Event, EventBody};
use fusebox_log::AdoptedOp;
use fusebox_nats::{GuardStore, Submitted};
use futures_util::StreamExt;
use tokio::runtime::Handle;

use super::shared_ledger::Touch;
use super::store::{CallKey, PartitionStore};
use super::{refused_by_revision_check, ClusterError, Fence, ATTEMPTS, RETRY_PAUSE};
use crate::watchdog::FeedStore;

pub const STREAM: &str = "FUSEBOX_APPLIED";

pub fn subject(partition: u32) -> String {
    format!("fusebox.applied.{partition}")
}

/// `run_retention` is the logs' retention of closed runs: batches are kept twice as
/// long, so a batch leaves the stream only well after every run it touched could have
/// been pruned from the logs anyway (`None`: kept for good).
pub fn stream_config(replicas: usize, run_retention: Option<Duration>) -> stream::Config {
    stream::Config {
        name: STREAM.to_owned(),
        subjects: vec!["fusebox.applied.>".to_owned()],
        storage: StorageType::File,
        retention: RetentionPolicy::Limits,
        max_age: run_retention.map_or(Duration::ZERO, |kept| kept * 2),
        num_replicas: replicas,
        ..Default::default()
    }
}

/// A batch as stored: the adopted entries as one JSON line, then one event per line
/// in the wire format (JSON strings escape new lines, so a line is one event).
pub fn encode(adopted: &[AdoptedOp], events: &[Event]) -> Vec<u8> {
    let mut out = serde_json::to_vec(adopted).expect("adopted entries serialise");
    for event in events {
        out.push(b'\n');
        serde_json::to_writer(&mut out, event).expect("events serialise");
    }
    out
}

pub fn decode(bytes: &[u8]) -> Result<(Vec<AdoptedOp>, Vec<Event>), String> {
    let mut lines = bytes.split(|b| *b == b'\n');
    let adopted = serde_json::from_slice(lines.next().unwrap_or_default())
        .map_err(|e| format!("adopted entries: {e}"))?;
    let events = lines
        .map(|line| parse_event(line).map_err(|e| format!("event: {e}")))
        .collect::<Result<_, _>>()?;
    Ok((adopted, events))
}

#[derive(Debug, thiserror::Error)]
pub enum ReplicateError {
    /// Someone else appended to the partition: this daemon no longer owns it.
    #[error("partition {0} was written by another daemon: this one no longer owns it")]
    Fenced(u32),
    #[error("replicating partition {partition} failed: {detail}")]
    Unavailable { partition: u32, detail: String },
    /// The lease's fence passed with the batch unanswered: this daemon no longer serves
    /// the partition (the batch may still have been stored; the next owner catches it
    /// up).
    #[error("replicating partition {0} not answered before the lease's fence; the partition is no longer served")]
    PastFence(u32),
}

/// Appends a partition's committed batches, fenced on the last sequence it wrote.
pub struct Replicator {
    js: jetstream::Context,
    partition: u32,
    subject: String,
    last: u64,
    runtime: Handle,
    /// No attempt goes on past it.
    fence: Fence,
}

impl Replicator {
    pub fn new(
        js: jetstream::Context,
        partition: u32,
        last: u64,
        runtime: Handle,
        fence: Fence,
    ) -> Self {
        Replicator {
            js,
            partition,
            subject: subject(partition),
            last,
            runtime,
            fence,
        }
    }

    /// The partition's fence (the shared ledger's requests for it stop there too).
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Sets the subject sequence the next append expects (the last one caught up to).
    pub fn continue_after(&mut self, last: u64) {
        self.last = last;
    }

    /// The stream sequence of the last batch appended (or caught up to).
    pub fn last(&self) -> u64 {
        self.last
    }

    /// Blocks (on the applier thread) until the batch is stored on a quorum, or the
    /// lease's fence passes (`PastFence`). A retry after a lost answer may find its own
    /// earlier copy stored and report `Fenced`: the partition is then reopened and
    /// caught up, which reads that copy back.
    pub fn publish(
        &mut self,
        adopted: &[AdoptedOp],
        events: &[Event],
    ) -> Result<(), ReplicateError> {
        if adopted.is_empty() && events.is_empty() {
            return Ok(());
        }
        let body = bytes::Bytes::from(encode(adopted, events));
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut headers = HeaderMap::new();
            headers.insert(NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, self.last.to_string());
            let sent = self.fence.block_on(&self.runtime, async {
                self.js
                    .publish_with_headers(self.subject.clone(), headers, body.clone())
                    .await?
                    .await
            });
            let Some(sent) = sent else {
                return Err(ReplicateError::PastFence(self.partition));
            };
            match sent {
                Ok(ack) => {
                    self.last = ack.sequence;
                    return Ok(());
                }
                Err(err) if failed_sequence_check(&err) => {
                    return Err(ReplicateError::Fenced(self.partition));
                }
                Err(err) if attempt < ATTEMPTS => {
                    tracing::warn!(partition = self.partition, %err, attempt, "replicating a batch failed; retrying");
                    std::thread::sleep(RETRY_PAUSE);
                }
                Err(err) => {
                    return Err(ReplicateError::Unavailable {
                        partition: self.partition,
                        detail: err.to_string(),
                    })
                }
            }
        }
    }
}

/// Whether a publish was refused by its expected-sequence check: JetStream's 10071,
/// which async-nats names `WrongLastSequence`, or 10164 (`wrong last sequence: N`, the
/// form nats-server 2.15 answers some header checks with), which it leaves as `Other`.
/// Either means another daemon wrote to the partition: it is fenced, not unavailable
/// (retrying would only refuse again, 20 times).
fn failed_sequence_check(err: &PublishError) -> bool {
    err.kind() == PublishErrorKind::WrongLastSequence || refused_by_revision_check(err)
}

/// What catching up found: the sequence the new owner continues from, and the stop
/// decisions of runs it closed (their kill switch may never have been published if
/// the last owner died between replicating and publishing).
pub struct CaughtUp {
    pub last: u64,
    /// Batches read from the stream (those after the log's mark).
    pub batches_read: usize,
    pub batches_applied: usize,
    pub stops: Vec<Decision>,
}

/// Batches handed to the log at once while catching up.
const CHUNK: usize = 256;

/// The partition's store while it catches up: through the watchdog's feed, so launches
/// and run ends the last owner applied reach this daemon's watchdog too.
pub type Catching = FeedStore<PartitionStore>;

/// Brings the partition's local log up to the replicated stream: every batch after
/// the log's mark whose last event the log does not know is applied, in stream order.
pub async fn catch_up(
    js: &jetstream::Context,
    partition: u32,
    mut store: Catching,
) -> Result<(Catching, CaughtUp), ClusterError> {
    let stream = js
        .get_stream(STREAM)
        .await
        .map_err(|e| ClusterError::nats("binding FUSEBOX_APPLIED", e))?;
    let subject = subject(partition);
    let last = match stream.get_last_raw_message_by_subject(&subject).await {
        Ok(message) => message.sequence,
        Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => {
            let none = CaughtUp {
                last: 0,
                batches_read: 0,
                batches_applied: 0,
                stops: Vec::new(),
            };
            return Ok((store, none));
        }
        Err(err) => return Err(ClusterError::nats("reading FUSEBOX_APPLIED", err)),
    };
    // A mark beyond the stream's end means the stream was recreated since: the mark
    // says nothing about it then.
    let from = match store.inner().mark.read(store.inner().guard.position()) {
        holds if holds <= last => holds + 1,
        _ => 1,
    };
    let mut replay = Replay::default();
    if from <= last {
        let consumer = stream
            .create_consumer(OrderedConfig {
                filter_subject: subject.clone(),
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: from,
                },
                ..Default::default()
            })
            .await
            .map_err(|e| ClusterError::nats("reading FUSEBOX_APPLIED", e))?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| ClusterError::nats("reading FUSEBOX_APPLIED", e))?;
        let mut reached = 0;
        while reached < last {
            let mut chunk = Vec::with_capacity(CHUNK);
            while chunk.len() < CHUNK && reached < last {
                let message = messages
                    .next()
                    .await
                    .ok_or_else(|| ClusterError::Nats {
                        what: "reading FUSEBOX_APPLIED",
                        detail: "the stream ended early".to_owned(),
                    })?
                    .map_err(|e| ClusterError::nats("reading FUSEBOX_APPLIED", e))?;
                reached = message
                    .info()
                    .map_err(|e| ClusterError::nats("reading FUSEBOX_APPLIED", e))?
                    .stream_sequence;
                let batch = decode(&message.payload).map_err(|detail| ClusterError::Corrupt {
                    partition,
                    sequence: reached,
                    detail,
                })?;
                chunk.push(batch);
                replay.batches_read += 1;
            }
            let last_chunk = reached >= last;
            let (back, done) = tokio::task::spawn_blocking(move || {
                let done = replay.apply(&mut store, chunk, last_chunk);
                (store, done.map(|()| replay))
            })
            .await
            .expect("catch-up task");
            store = back;
            replay = done?;
        }
    }
    // Only runs still closed keep their stop on the kill switch.
    let stops = replay
        .stops
        .into_values()
        .filter(|d: &Decision| {
            store
                .engine()
                .run(&d.tenant, &d.run)
                .is_some_and(|run| !run.is_open())
        })
        .collect();
    // Before the mark moves past them: outcomes the last owner committed but could not
    // write back (a held mark brings their batches back into the next catch-up).
    let (calls, op_calls) = (replay.calls, replay.op_calls);
    let mut store = tokio::task::spawn_blocking(move || {
        store.inner_mut().write_back(&calls, op_calls);
        store
    })
    .await
    .expect("write-back task");
    let position = store.inner().guard.position();
    store.inner_mut().mark.write(last, position);
    Ok((
        store,
        CaughtUp {
            last,
            batches_read: replay.batches_read,
            batches_applied: replay.batches_applied,
            stops,
        },
    ))
}

/// What a catch-up carries from one chunk of batches to the next.
#[derive(Default)]
struct Replay {
    /// The stop that closed each run the catch-up closed.
    stops: BTreeMap<(String, String), Decision>,
    /// Batches of adopted entries only (their events were all held or duplicates),
    /// waiting to learn whether the log has them: it does when it has a later batch
    /// (the log holds a prefix of the stream).
    adopt_only: Vec<Vec<AdoptedOp>>,
    /// Every call and result of the batches read, and the calls that named an op_key:
    /// their outcomes are written back to the shared ledger after the catch-up.
    calls: BTreeSet<CallKey>,
    op_calls: Vec<Touch>,
    batches_read: usize,
    batches_applied: usize,
}

impl Replay {
    /// Applies the batches of `chunk` the log does not have yet, in order; at the end
    /// of the stream also the adopt-only batches still waiting (re-applying the last
    /// records of a log changes nothing, so they are right either way).
    fn apply(
        &mut self,
        store: &mut Catching,
        chunk: Vec<(Vec<AdoptedOp>, Vec<Event>)>,
        end_of_stream: bool,
    ) -> Result<(), ClusterError> {
        for (adopted, events) in chunk {
            self.note_calls(&events);
            let Some(last) = events.last() else {
                self.adopt_only.push(adopted);
                continue;
            };
            let known = store
                .inner()
                .guard
                .state()
                .applied
                .recorded_at(&last.tenant, &last.run, &last.id)
                .is_some();
            if known {
                self.adopt_only.clear();
                continue;
            }
            self.flush_adopt_only(store)?;
            self.apply_batch(store, adopted, events)?;
        }
        if end_of_stream {
            self.flush_adopt_only(store)?;
        }
        Ok(())
    }

    fn note_calls(&mut self, events: &[Event]) {
        for event in events {
            let call_id = match &event.body {
                EventBody::ToolCall(call) => {
                    if let Some(op_key) = &call.op_key {
                        self.op_calls.push((
                            event.tenant.clone(),
                            op_key.clone(),
                            event.run.clone(),
                            call.call_id.clone(),
                        ));
                    }
                    &call.call_id
                }
                EventBody::ToolResult(result) => &result.call_id,
                _ => continue,
            };
            self.calls
                .insert((event.tenant.clone(), event.run.clone(), call_id.clone()));
        }
    }

    fn flush_adopt_only(&mut self, store: &mut Catching) -> Result<(), ClusterError> {
        for adopted in std::mem::take(&mut self.adopt_only) {
            self.apply_batch(store, adopted, Vec::new())?;
        }
        Ok(())
    }

    /// Applies one batch the log does not have, as its owner did.
    fn apply_batch(
        &mut self,
        store: &mut Catching,
        adopted: Vec<AdoptedOp>,
        events: Vec<Event>,
    ) -> Result<(), ClusterError> {
        let runs: Vec<(String, String)> = events
            .iter()
            .map(|e| (e.tenant.clone(), e.run.clone()))
            .collect();
        // Runs open before this batch: the first stop such a run gets in it is the one
        // that closed it (later ones are latched repeats), and only that one belongs on
        // the kill switch.
        let mut open: BTreeSet<(String, String)> = runs
            .iter()
            .filter(|(t, r)| store.engine().run(t, r).is_none_or(|run| run.is_open()))
            .cloned()
            .collect();
        store.inner_mut().replaying = Some(adopted);
        let outcomes = store.submit_batch(events).map_err(ClusterError::Replay)?;
        let mut decisions = Vec::new();
        for (outcome, run) in outcomes.into_iter().zip(&runs) {
            match outcome {
                Submitted::Applied(d) => decisions.extend(d),
                // The last owner released this run's gap here: so does the replay.
                Submitted::Held { .. } => decisions.extend(
                    store
                        .release_gap(&run.0, &run.1)
                        .map_err(ClusterError::Replay)?,
                ),
                Submitted::Duplicate(_) | Submitted::Rejected(_) => {}
            }
        }
        for decision in decisions {
            let run = (decision.tenant.clone(), decision.run.clone());
            if decision.action == Action::Stop && open.remove(&run) {
                self.stops.insert(run, decision);
            }
        }
        self.batches_applied += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_core::LedgerEntry;

    #[test]
    fn both_forms_of_a_failed_sequence_check_fence_the_partition() {
        let answer = crate::cluster::jetstream_answer;
        let named = PublishError::with_source(PublishErrorKind::WrongLastSequence, answer(10071));
        let constant = PublishError::with_source(PublishErrorKind::Other, answer(10164));
        let other = PublishError::with_source(PublishErrorKind::Other, answer(10077));
        assert!(failed_sequence_check(&named));
        assert!(failed_sequence_check(&constant));
        assert!(!failed_sequence_check(&other));
        assert!(!failed_sequence_check(&PublishError::new(
            PublishErrorKind::TimedOut
        )));
    }

    #[test]
    fn a_batch_round_trips_through_its_stored_form() {
        let events: Vec<Event> = [
            r#"{"v":1,"id":"e1","tenant":"acme","run":"r1","seq":1,"ts_ms":5,"type":"tool_call","call_id":"c1","tool":"send","args":{"body":"two\nlines"},"op_key":"k"}"#,
            r#"{"v":1,"id":"e2","tenant":"acme","run":"r1","ts_ms":9,"type":"tick"}"#,
        ]
        .iter()
        .map(|json| parse_event(json.as_bytes()).unwrap())
        .collect();
        let adopted = vec![AdoptedOp {
            tenant: "acme".to_owned(),
            op_key: "k".to_owned(),
            entry: Some(LedgerEntry::InFlight {
                run: "r9".to_owned(),
                call_id: "c9".to_owned(),
                since_ms: 42,
            }),
        }];
        let (back_adopted, back_events) = decode(&encode(&adopted, &events)).unwrap();
        assert_eq!(back_adopted, adopted);
        assert_eq!(back_events, events);
        assert!(decode(b"[]\n{not json").is_err());
    }
}
