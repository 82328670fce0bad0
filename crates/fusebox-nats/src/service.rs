//! Wiring: the subscriptions, the consumer, the applier thread and the dispatcher, and
//! the order they are stopped in so that nothing received is lost on shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::{jetstream, Client};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::applier::{Applier, ApplierOptions, Input};
use crate::backlog::watch_backlog;
use crate::gap_probe::answer_probes;
use crate::inbound::{serve_subscription, stopped, Inbound};
use crate::observer::Observer;
use crate::setup::{self, Placement, SetupError};
use crate::stall::{stalled, Busy};
use crate::store::{GuardStore, StoreError};
use crate::subjects::Scope;
use crate::{control, dispatch, gate, ingest, subjects};

#[derive(Debug, Clone)]
pub struct ServiceOptions {
    /// Queue group of the gate and control subscriptions.
    pub queue_group: String,
    pub max_event_bytes: usize,
    /// Most events in one group commit.
    pub max_batch: usize,
    /// How long a run's missing `seq` is waited for before its held events are applied.
    pub gap_timeout: Duration,
    /// How often gaps, idle-run deadlines and gauges are checked.
    pub timer_interval: Duration,
    /// Messages per JetStream pull request.
    pub pull_batch: usize,
    /// Unacked stream messages the consumer allows (in flight + held for gaps).
    pub max_ack_pending: i64,
    /// Notable decisions kept per run for `status`.
    pub recent_decisions: usize,
    /// Inputs queued for the applier before the inbound paths wait (backpressure).
    pub queue_capacity: usize,
    /// All runs, or one partition of them (cluster mode).
    pub scope: Scope,
    /// Replicas of the streams and consumer this service creates.
    pub replicas: usize,
    /// One batch taking longer than this means the log is stuck (see `stall.rs`): the
    /// service fails so the daemon exits instead of hanging while looking alive.
    pub stall_limit: Duration,
    /// Cloud providers whose instances the daemon's watchdog watches (`ec2`); an
    /// `instance_launched` for any other (or any, when empty) is refused
    /// (`unwatched_provider`).
    pub instance_providers: Vec<String>,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        ServiceOptions {
            queue_group: "fuseboxd".to_owned(),
            max_event_bytes: fusebox_core::parse::DEFAULT_MAX_EVENT_BYTES,
            max_batch: 1024,
            gap_timeout: Duration::from_secs(5),
            timer_interval: Duration::from_millis(250),
            pull_batch: 512,
            max_ack_pending: 20_000,
            recent_decisions: 20,
            queue_capacity: 8192,
            scope: Scope::All,
            replicas: 1,
            stall_limit: Duration::from_secs(60),
            instance_providers: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error("subscribing to {subject} failed: {detail}")]
    Subscribe { subject: String, detail: String },
    #[error("the event log failed: {0}")]
    Store(StoreError),
    #[error("the applier thread panicked")]
    ApplierPanicked,
    #[error(
        "the event log made no progress for {secs} s (a commit is stuck in the storage \
         layer: a full, failing or hung disk?); stopping so the daemon can be restarted"
    )]
    Stalled { secs: u64 },
}

/// A running guard service.
pub struct Service {
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    applier_done: oneshot::Receiver<Result<(), StoreError>>,
    dispatcher: JoinHandle<()>,
    busy: Arc<Busy>,
    stall_limit: Duration,
}

impl Service {
    /// Creates or checks the JetStream objects, subscribes, and starts serving. Errors
    /// here are start-up errors: nothing has been consumed yet.
    pub async fn start<S: GuardStore>(
        client: Client,
        store: S,
        options: ServiceOptions,
        observer: Arc<dyn Observer>,
    ) -> Result<Service, ServiceError> {
        let js = jetstream::new(client.clone());
        let placement = Placement {
            scope: options.scope,
            replicas: options.replicas,
            max_ack_pending: options.max_ack_pending,
        };
        setup::ensure(&js, &placement).await?;
        let subscribe = |subject: String, group: Option<String>| {
            let client = client.clone();
            async move {
                let subscribed = match group {
                    Some(group) => client.queue_subscribe(subject.clone(), group).await,
                    None => client.subscribe(subject.clone()).await,
                };
                subscribed.map_err(|e| ServiceError::Subscribe {
                    subject,
                    detail: e.to_string(),
                })
            }
        };
        let group = Some(options.queue_group.clone());
        let mut gate_subs = Vec::new();
        for filter in options.scope.gate_filters() {
            gate_subs.push(subscribe(filter, group.clone()).await?);
        }
        let control_sub = subscribe(options.scope.control_filter(), group).await?;
        // In a cluster every partition answers the runs listing with its own runs, so
        // it is a plain subscription: the asker gathers the answers.
        // The same for the ledger listing.
        let mut runs_sub = Vec::new();
        if let Scope::Partition { .. } = options.scope {
            runs_sub.push(subscribe(subjects::CONTROL_RUNS.to_owned(), None).await?);
            runs_sub.push(subscribe(subjects::CONTROL_LEDGER.to_owned(), None).await?);
        }

        let (tx, rx) = mpsc::channel(options.queue_capacity);
        let (out, out_rx) = mpsc::unbounded_channel();
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (probes, probe_rx) = mpsc::unbounded_channel();
        let busy = Arc::new(Busy::default());
        let dispatcher = tokio::spawn(dispatch::dispatch(
            client.clone(),
            js.clone(),
            out_rx,
            observer.clone(),
        ));
        let applier = Applier::new(
            store,
            Some(probes),
            out.clone(),
            observer.clone(),
            ApplierOptions {
                max_batch: options.max_batch,
                gap_timeout: options.gap_timeout,
                recent_decisions: options.recent_decisions,
            },
            busy.clone(),
        );
        let (done_tx, applier_done) = oneshot::channel();
        std::thread::Builder::new()
            .name("fusebox-applier".to_owned())
            .spawn(move || {
                let _ = done_tx.send(applier.run(rx));
            })
            .expect("spawning the applier thread");

        let inbound = Inbound {
            tx: tx.clone(),
            out,
            observer,
            accept: crate::inbound::Accept {
                max_event_bytes: options.max_event_bytes,
                instance_providers: options.instance_providers.clone(),
            },
            scope: options.scope,
        };
        let mut tasks = Vec::new();
        for gate_sub in gate_subs {
            let gate_in = inbound.clone();
            tasks.push(tokio::spawn(serve_subscription(
                gate_sub,
                shutdown_rx.clone(),
                move |message| {
                    let inbound = gate_in.clone();
                    async move { gate::handle(&inbound, message).await }
                },
            )));
        }
        for sub in std::iter::once(control_sub).chain(runs_sub) {
            let control_in = inbound.clone();
            tasks.push(tokio::spawn(serve_subscription(
                sub,
                shutdown_rx.clone(),
                move |message| {
                    let inbound = control_in.clone();
                    async move { control::handle(&inbound, message).await }
                },
            )));
        }
        tasks.push(tokio::spawn(answer_probes(
            js.clone(),
            options.scope,
            inbound.accept.clone(),
            probe_rx,
            tx.clone(),
            shutdown_rx.clone(),
        )));
        tasks.push(tokio::spawn(watch_backlog(
            js.clone(),
            options.scope,
            inbound.observer.clone(),
            options.timer_interval,
            shutdown_rx.clone(),
        )));
        tasks.push(tokio::spawn(ingest::run(
            js,
            options.scope,
            inbound,
            options.pull_batch,
            shutdown_rx.clone(),
        )));
        tasks.push(tokio::spawn(timer(tx, options.timer_interval, shutdown_rx)));
        Ok(Service {
            shutdown,
            tasks,
            applier_done,
            dispatcher,
            busy,
            stall_limit: options.stall_limit,
        })
    }

    /// Serves until `signal` completes (then drains) or the log fails.
    pub async fn run_until<F: Future<Output = ()>>(
        mut self,
        signal: F,
    ) -> Result<(), ServiceError> {
        let busy = self.busy.clone();
        let failed = tokio::select! {
            _ = signal => None,
            result = &mut self.applier_done => Some(applier_result(result)),
            taken = stalled(&busy, self.stall_limit) => return Err(self.abandon(taken)),
        };
        if let Some(Err(err)) = &failed {
            tracing::error!(%err, "guard service failed; stopping");
        }
        self.stop(failed).await
    }

    /// Stops taking input, lets the applier commit and answer everything already
    /// received, publishes and acks it, and returns.
    pub async fn shutdown(self) -> Result<(), ServiceError> {
        self.stop(None).await
    }

    async fn stop(mut self, failed: Option<Result<(), ServiceError>>) -> Result<(), ServiceError> {
        let _ = self.shutdown.send(true);
        let busy = self.busy.clone();
        // The drain waits for the applier, so a log that gets stuck now (or already
        // was, when the signal came) is given up on like one that got stuck before.
        let drain = async {
            for task in &mut self.tasks {
                if let Err(err) = task.await {
                    tracing::error!(%err, "inbound task failed");
                }
            }
            // Every sender is gone now: the applier drains its queue and returns.
            let result = match failed {
                Some(result) => result,
                None => applier_result((&mut self.applier_done).await),
            };
            if let Err(err) = (&mut self.dispatcher).await {
                tracing::error!(%err, "dispatcher failed");
            }
            result
        };
        tokio::select! {
            result = drain => result,
            taken = stalled(&busy, self.stall_limit) => Err(self.abandon(taken)),
        }
    }

    /// Gives up on a stuck applier: it cannot be waited for, nor can what waits on it
    /// (inbound paths blocked on its full queue, the dispatcher it feeds).
    fn abandon(self, taken: Duration) -> ServiceError {
        let err = ServiceError::Stalled {
            secs: taken.as_secs(),
        };
        tracing::error!(%err, "guard service stuck; stopping without it");
        for task in self.tasks {
            task.abort();
        }
        self.dispatcher.abort();
        err
    }
}

fn applier_result(
    result: Result<Result<(), StoreError>, oneshot::error::RecvError>,
) -> Result<(), ServiceError> {
    match result {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err)) => Err(ServiceError::Store(err)),
        Err(_) => Err(ServiceError::ApplierPanicked),
    }
}

async fn timer(tx: mpsc::Sender<Input>, every: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stopped(&mut shutdown) => return,
            _ = interval.tick() => {
                if tx.send(Input::Timer).await.is_err() {
                    return;
                }
            }
        }
    }
}
