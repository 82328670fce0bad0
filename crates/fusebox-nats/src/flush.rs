//! Pipelined group commit: the flush thread.
//!
//! When the store lets the caller flush ([`GuardStore::defer_flushes`]), the applier
//! decides and writes a batch and hands its outputs here instead of to the dispatcher,
//! and goes on with the next batch while this thread makes the last one durable. So the
//! disk's sync and the deciding overlap, and under load one sync covers every batch
//! decided during the previous one. An outbox still leaves only after a flush that
//! started after its batch was written has returned: nothing about a batch reaches
//! anyone before it is durable, as without the pipeline.
//!
//! A failed flush ends it: the outboxes waiting (and any handed over later) send only
//! their stream messages back for redelivery, never an answer; the store is poisoned,
//! and the applier stops at its next input with the error.
//!
//! [`GuardStore::defer_flushes`]: crate::store::GuardStore::defer_flushes

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::mpsc::UnboundedSender;

use crate::dispatch::{Outbox, Output};
use crate::stall::{Busy, Stage};
use crate::store::{Flush, StoreError};

/// One handled batch's outputs, and whether the batch wrote anything to flush.
struct Handed {
    outbox: Outbox,
    wrote: bool,
}

pub(crate) struct FlushThread {
    tx: Option<Sender<Handed>>,
    failed: Arc<Mutex<Option<String>>>,
    thread: Option<JoinHandle<()>>,
}

impl FlushThread {
    pub(crate) fn spawn(flush: Flush, out: UnboundedSender<Outbox>, busy: Arc<Busy>) -> Self {
        let (tx, rx) = channel();
        let failed = Arc::new(Mutex::new(None));
        let thread = std::thread::Builder::new()
            .name("fusebox-flush".to_owned())
            .spawn({
                let failed = failed.clone();
                move || flush_loop(flush, rx, &out, &busy, &failed)
            })
            .expect("spawning the flush thread");
        FlushThread {
            tx: Some(tx),
            failed,
            thread: Some(thread),
        }
    }

    /// Hands a batch's outputs over; they leave once a flush after this has returned.
    pub(crate) fn hand_over(&self, outbox: Outbox, wrote: bool) {
        if outbox.answers.is_empty() && outbox.publishes.is_empty() && !wrote {
            return;
        }
        if let Some(tx) = &self.tx {
            // The thread ends only after this sender is dropped (`finish`).
            let _ = tx.send(Handed { outbox, wrote });
        }
    }

    /// The error of a failed flush, once one has failed.
    pub(crate) fn failed(&self) -> Option<StoreError> {
        lock(&self.failed).clone().map(StoreError::from)
    }
}

impl Drop for FlushThread {
    /// Flushes and sends what was handed over, and waits for the thread to end.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the flush thread panicked");
            }
        }
    }
}

fn lock(failed: &Mutex<Option<String>>) -> std::sync::MutexGuard<'_, Option<String>> {
    failed
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn flush_loop(
    flush: Flush,
    rx: Receiver<Handed>,
    out: &UnboundedSender<Outbox>,
    busy: &Busy,
    failed: &Mutex<Option<String>>,
) {
    while let Ok(first) = rx.recv() {
        let mut group = vec![first];
        group.extend(rx.try_iter());
        let durable = if lock(failed).is_some() {
            false
        } else if group.iter().any(|handed| handed.wrote) {
            busy.start(Stage::Flush);
            let flushed = flush();
            busy.done(Stage::Flush);
            match flushed {
                Ok(()) => true,
                Err(err) => {
                    tracing::error!(%err, "flushing the log failed; nothing more is answered");
                    *lock(failed) = Some(err.to_string());
                    false
                }
            }
        } else {
            true
        };
        for handed in group {
            if durable {
                handed.outbox.send(out);
            } else {
                hand_back(handed.outbox).send(out);
            }
        }
    }
}

/// What may still leave of an outbox whose batch is not durable: its stream messages,
/// handed back for redelivery (to whoever serves next).
fn hand_back(outbox: Outbox) -> Outbox {
    let answers = outbox
        .answers
        .into_iter()
        .chain(outbox.publishes)
        .filter_map(|output| match output {
            Output::Ack(message) | Output::Terminate(message) | Output::Nak(message) => {
                Some(Output::Nak(message))
            }
            _ => None,
        })
        .collect();
    Outbox {
        answers,
        publishes: Vec::new(),
    }
}
