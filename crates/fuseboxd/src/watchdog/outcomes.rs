//! The watchdog's outcomes, out of its task and into the world.
//!
//! [`ChannelSink`] is the watchdog's sink: it only puts each record on an unbounded
//! channel, so a pass never waits for the disk or NATS. [`publish`] drains the channel:
//! journal (fsync) first, so what was announced is on disk, then
//! `fusebox.watchdog.<tenant>.terminated`, then the metrics. In a cluster a halt is also
//! written to the cluster's halt key (`halt_key.rs`), so no other daemon that takes the
//! role over terminates anything either.

use std::sync::Arc;

use fusebox_metrics::Metrics;
use fusebox_watchdog::{
    BlastRadiusAlert, Fact, Halted, Outcome, ProtectedInstance, Termination, WatchdogSink,
};
use tokio::sync::{mpsc, oneshot};

use super::halt_key::HaltKey;
use super::journal::{Entry, Journal};
use super::query::Recent;

/// How long a halt's write to the cluster's key is retried (JetStream electing) before
/// it is left to the next holder's start (`adopt_halt`, from this daemon's journal) or
/// its own pass.
const HALT_WRITE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

pub enum Record {
    Termination(Termination),
    Protected(ProtectedInstance),
    BlastRadius(BlastRadiusAlert),
    /// Journaled as a fact: read back at start, so the watchdog starts halted.
    Halted(Fact),
}

pub struct ChannelSink(pub mpsc::UnboundedSender<Record>);

impl ChannelSink {
    fn send(&self, record: Record) {
        // The receiver lives until the watchdog task has finished, so this only fails
        // during a shutdown that is already past caring.
        if self.0.send(record).is_err() {
            tracing::warn!("watchdog outcome dropped: the publisher has stopped");
        }
    }
}

impl WatchdogSink for ChannelSink {
    fn termination(&self, t: &Termination) {
        self.send(Record::Termination(t.clone()));
    }
    fn protected(&self, p: &ProtectedInstance) {
        self.send(Record::Protected(p.clone()));
    }
    fn blast_radius(&self, a: &BlastRadiusAlert) {
        self.send(Record::BlastRadius(a.clone()));
    }
    fn halted(&self, h: &Halted) {
        self.send(Record::Halted(Fact::Halted(h.clone())));
    }
}

/// Journals, publishes and counts records until `stop`, then drains what is left.
pub async fn publish(
    mut records: mpsc::UnboundedReceiver<Record>,
    mut stop: oneshot::Receiver<()>,
    journal: Arc<Journal>,
    client: async_nats::Client,
    metrics: Arc<Metrics>,
    recent: Recent,
    halt: Option<Arc<HaltKey>>,
) {
    let out = Out {
        journal,
        client,
        metrics,
        recent,
        halt,
    };
    loop {
        tokio::select! {
            biased;
            Some(record) = records.recv() => handle(record, &out).await,
            _ = &mut stop => break,
        }
    }
    while let Ok(record) = records.try_recv() {
        handle(record, &out).await;
    }
}

/// Where records go.
struct Out {
    journal: Arc<Journal>,
    client: async_nats::Client,
    metrics: Arc<Metrics>,
    recent: Recent,
    halt: Option<Arc<HaltKey>>,
}

/// Writes a halt to the cluster's key, retried while JetStream does not answer.
async fn share_halt(halt: &HaltKey, fact: &Fact) {
    let started = std::time::Instant::now();
    loop {
        match halt.halt(fact).await {
            Ok(()) => {
                tracing::info!("the halt is the cluster's (FUSEBOX_WATCHDOG/halt)");
                return;
            }
            Err(err) if started.elapsed() < HALT_WRITE_PATIENCE => {
                tracing::warn!(%err, "cannot write the cluster's halt yet; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(err) => {
                tracing::error!(%err, "cannot write the cluster's halt; this daemon stays halted, and writes it when it takes the role again");
                return;
            }
        }
    }
}

async fn handle(record: Record, out: &Out) {
    let (client, metrics, recent) = (&out.client, &*out.metrics, &out.recent);
    let journal = out.journal.clone();
    let (record, written) = tokio::task::spawn_blocking(move || {
        let entry = match &record {
            Record::Termination(termination) => Entry::Termination { termination },
            Record::Protected(protected) => Entry::Protected { protected },
            Record::BlastRadius(alert) => Entry::BlastRadius { alert },
            Record::Halted(fact) => Entry::Fact { fact },
        };
        let written = journal.append(&[entry]);
        (record, written)
    })
    .await
    .expect("journal append task");
    if let Err(err) = written {
        tracing::error!(%err, "cannot write the watchdog journal; publishing anyway");
    }
    match record {
        Record::Termination(t) => {
            tracing::warn!(
                tenant = t.tenant.as_deref().unwrap_or("-"),
                run = t.run.as_deref().unwrap_or("-"),
                region = %t.region,
                instance = %t.instance_id,
                reason = %t.reason,
                outcome = ?t.outcome,
                dry_run = t.dry_run,
                "watchdog termination"
            );
            if t.outcome == Outcome::Terminated {
                metrics.watchdog_termination(t.reason.as_str(), &t.region);
            }
            recent.record(&t);
            match serde_json::to_vec(&t) {
                Ok(payload) => {
                    if let Err(err) = client.publish(t.subject(), payload.into()).await {
                        tracing::warn!(%err, subject = %t.subject(), "cannot publish a watchdog termination");
                    }
                }
                Err(err) => tracing::error!(%err, "cannot encode a watchdog termination"),
            }
        }
        Record::Protected(p) => tracing::warn!(
            region = %p.region,
            instance = %p.instance_id,
            reason = %p.reason,
            "overdue instance kept alive by fusebox:protect (journaled)"
        ),
        Record::Halted(fact) => {
            tracing::error!(
                ?fact,
                "watchdog halted (journaled): it terminates nothing until `fusebox watchdog resume`"
            );
            if let Some(halt) = &out.halt {
                share_halt(halt, &fact).await;
            }
        }
        Record::BlastRadius(a) => {
            metrics.watchdog_blast_radius_limited();
            tracing::error!(
                overdue = a.overdue,
                allowed = a.allowed,
                managed = a.managed,
                why = %a.why,
                "watchdog blast-radius limit reached (journaled)"
            );
        }
    }
}
