//! The gate benchmark (`fusebox bench gate`): serial round-trip latency, throughput with
//! many requests in flight, and JetStream ingest into the durable log — each beside the
//! raw NATS figure measured in the same run (a trivial echo responder; a plain stream
//! with no consumer), so the guard's own cost is visible. Given a directory on the
//! daemon's disk, the disk's own floors too: one 4 KiB append + `fdatasync`, and with
//! requests in flight a responder that group-commits them to that disk before it
//! answers (`durable_echo.rs`), which is what any durable gate must pay.

mod acked_consumer;
mod durable_echo;
mod tree;

use std::future::IntoFuture;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream;
use fusebox_nats::wire::RunsQuery;
use futures_util::StreamExt;

use crate::client::{FuseboxClient, Gate};
use crate::error::ClientError;
use crate::settings::NatsSettings;

const ECHO_SUBJECT: &str = "fusebox.bench.echo";
const RAW_STREAM: &str = "FUSEBOX_BENCH";
const RAW_SUBJECT: &str = "fusebox.bench.ingest";
/// Tool calls per benchmark run: runs are spread so no single run's budget decides.
const CALLS_PER_RUN: usize = 200;

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub tenant: String,
    /// Requests of the serial (one in flight) measurement.
    pub serial: usize,
    /// Requests of the parallel measurement.
    pub parallel: usize,
    /// Requests in flight in the parallel measurement.
    pub in_flight: usize,
    /// Events published for the ingest measurement.
    pub ingest: usize,
    /// A directory on the daemon's disk (its data dir's filesystem), where the disk's
    /// floor is measured in the same run: 4 KiB appends each followed by `fdatasync`.
    pub disk_floor_dir: Option<std::path::PathBuf>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            tenant: "bench".to_owned(),
            serial: 5_000,
            parallel: 100_000,
            in_flight: 64,
            ingest: 100_000,
            disk_floor_dir: None,
        }
    }
}

/// One measurement.
#[derive(Debug, Clone)]
pub struct Figure {
    pub count: usize,
    pub elapsed: Duration,
    /// Round-trip percentiles (zero for ingest, which is measured as a whole).
    pub p50: Duration,
    pub p99: Duration,
}

impl Figure {
    pub fn per_second(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64()
    }

    /// A measurement timed as a whole (no per-request samples).
    fn whole(count: usize, elapsed: Duration) -> Figure {
        Figure {
            count,
            elapsed,
            p50: Duration::ZERO,
            p99: Duration::ZERO,
        }
    }

    /// Several measurements of one thing as one: their counts and times added (the
    /// percentiles are the worst of theirs).
    fn sum(figures: &[Figure]) -> Figure {
        Figure {
            count: figures.iter().map(|f| f.count).sum(),
            elapsed: figures.iter().map(|f| f.elapsed).sum(),
            p50: figures.iter().map(|f| f.p50).max().unwrap_or_default(),
            p99: figures.iter().map(|f| f.p99).max().unwrap_or_default(),
        }
    }

    fn from_samples(mut samples: Vec<Duration>, elapsed: Duration) -> Figure {
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
        Figure {
            count: samples.len(),
            elapsed,
            p50: at(0.50),
            p99: at(0.99),
        }
    }
}

#[derive(Debug, Clone)]
pub struct BenchReport {
    pub serial_gate: Figure,
    pub serial_echo: Figure,
    pub parallel_gate: Figure,
    pub parallel_echo: Figure,
    pub ingest: Figure,
    pub ingest_raw: Figure,
    /// The same publishes into a stream a pull consumer acks, one by one, as they come.
    pub ingest_consumed: Figure,
    /// 4 KiB append + `fdatasync`, when a directory was given.
    pub disk_floor: Option<Figure>,
    /// Requests in flight to a responder that makes them durable on that directory's
    /// disk (one `fdatasync` for all it has) before answering, when a directory was given.
    pub parallel_durable_echo: Option<Figure>,
    /// Gate calls in flight spread over 64 children of one root, and over 64 unrelated
    /// runs: what the tree's bookkeeping costs.
    pub tree_gate: Figure,
    pub flat_gate: Figure,
}

impl BenchReport {
    /// The serial gate's p50 over its floor: one raw round trip, plus one `fdatasync`
    /// when the disk was measured.
    pub fn serial_ratio(&self) -> f64 {
        let floor =
            self.serial_echo.p50 + self.disk_floor.as_ref().map_or(Duration::ZERO, |f| f.p50);
        self.serial_gate.p50.as_secs_f64() / floor.as_secs_f64()
    }
}

impl std::fmt::Display for BenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        writeln!(
            f,
            "{:<34} {:>10} {:>10} {:>12}",
            "", "p50 µs", "p99 µs", "per second"
        )?;
        for (name, fig) in [
            ("gate, serial (durable)", &self.serial_gate),
            ("raw NATS request/reply, serial", &self.serial_echo),
            ("gate, in flight (durable)", &self.parallel_gate),
            ("raw NATS request/reply, in flight", &self.parallel_echo),
            ("gate, 64 children of one root", &self.tree_gate),
            ("gate, 64 unrelated runs", &self.flat_gate),
        ]
        .into_iter()
        .chain(
            self.parallel_durable_echo
                .as_ref()
                .map(|fig| ("durable echo, in flight (disk)", fig)),
        ) {
            writeln!(
                f,
                "{name:<34} {:>10.0} {:>10.0} {:>12.0}",
                us(fig.p50),
                us(fig.p99),
                fig.per_second()
            )?;
        }
        writeln!(
            f,
            "{:<34} {:>10} {:>10} {:>12.0}",
            "JetStream ingest → durable log",
            "",
            "",
            self.ingest.per_second()
        )?;
        for (name, fig) in [
            ("raw JetStream publish (acked)", &self.ingest_raw),
            ("raw publish + consumer acking", &self.ingest_consumed),
        ] {
            writeln!(
                f,
                "{name:<34} {:>10} {:>10} {:>12.0}",
                "",
                "",
                fig.per_second()
            )?;
        }
        let floor = match &self.disk_floor {
            Some(disk) => {
                writeln!(
                    f,
                    "{:<34} {:>10.0} {:>10.0} {:>12.0}",
                    "4 KiB append + fdatasync (disk)",
                    us(disk.p50),
                    us(disk.p99),
                    disk.per_second()
                )?;
                "raw NATS + fdatasync"
            }
            None => "raw NATS; no --disk-floor-dir",
        };
        writeln!(
            f,
            "ratios: serial p50 {:.2}x its floor ({floor}), in flight {:.2}x raw{}, ingest {:.2}x raw ({:.2}x the acked consumer)",
            self.serial_ratio(),
            self.parallel_gate.per_second() / self.parallel_echo.per_second(),
            match &self.parallel_durable_echo {
                Some(durable) => format!(
                    " ({:.2}x the durable echo)",
                    self.parallel_gate.per_second() / durable.per_second()
                ),
                None => String::new(),
            },
            self.ingest.per_second() / self.ingest_raw.per_second(),
            self.ingest.per_second() / self.ingest_consumed.per_second()
        )?;
        writeln!(
            f,
            "tree: 64 children of one root {:.3}x 64 unrelated runs",
            self.tree_gate.per_second() / self.flat_gate.per_second()
        )
    }
}

fn nonce() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:x}")
}

/// The `i`-th tool call of the benchmark: distinct arguments, so the guard does real
/// work (fingerprints, detectors) and never short-circuits on a latched run.
fn tool_call(tenant: &str, prefix: &str, i: usize) -> (String, Vec<u8>) {
    let run = format!("{prefix}-{}", i / CALLS_PER_RUN);
    let body = format!(
        r#"{{"v":1,"id":"{prefix}-{i}","tenant":"{tenant}","run":"{run}","ts_ms":{},"type":"tool_call","call_id":"c{i}","tool":"search","args":{{"q":"query {i}"}}}}"#,
        1_700_000_000_000u64 + i as u64
    );
    (run, body.into_bytes())
}

pub(crate) fn check(gate: Gate) -> Result<(), ClientError> {
    match gate {
        Gate::Decided(_) => Ok(()),
        Gate::Refused(error) => Err(ClientError::Refused(error)),
        Gate::Unanswered { error, .. } => Err(error),
    }
}

async fn echo_request(
    client: &FuseboxClient,
    subject: &'static str,
    payload: Vec<u8>,
) -> Result<(), ClientError> {
    client
        .nats
        .request(subject, payload.into())
        .await
        .map(drop)
        .map_err(|err| ClientError::Request {
            subject: subject.to_owned(),
            detail: err.to_string(),
        })
}

/// `total` requests, `in_flight` at a time; each `request(i)` is timed.
pub(crate) async fn measure<F, Fut>(
    total: usize,
    in_flight: usize,
    request: F,
) -> Result<Figure, ClientError>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), ClientError>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let request = Arc::new(request);
    let started = Instant::now();
    let workers: Vec<_> = (0..in_flight.max(1))
        .map(|_| {
            let (next, request) = (next.clone(), request.clone());
            tokio::spawn(async move {
                let mut samples = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return Ok::<_, ClientError>(samples);
                    }
                    let sent = Instant::now();
                    request(i).await?;
                    samples.push(sent.elapsed());
                }
            })
        })
        .collect();
    let mut samples = Vec::with_capacity(total);
    for worker in workers {
        samples.extend(worker.await.expect("bench worker")?);
    }
    Ok(Figure::from_samples(samples, started.elapsed()))
}

/// Runs every measurement against the daemon `client` talks to; the durable echo gets a
/// connection of its own with `settings` (those `client` was made with).
pub async fn run(
    client: &FuseboxClient,
    settings: &NatsSettings,
    options: &BenchOptions,
) -> Result<BenchReport, ClientError> {
    let mut echo = client.subscribe_confirmed(ECHO_SUBJECT).await?;
    let responder = client.nats.clone();
    let echo_task = tokio::spawn(async move {
        while let Some(message) = echo.next().await {
            if let Some(reply) = message.reply {
                let _ = responder.publish(reply, message.payload).await;
            }
        }
    });
    let id = nonce();
    let tenant = options.tenant.clone();

    let gate_fn = |prefix: String| {
        let (client, tenant) = (client.clone(), tenant.clone());
        move |i| {
            let (client, tenant, prefix) = (client.clone(), tenant.clone(), prefix.clone());
            async move {
                let (run, body) = tool_call(&tenant, &prefix, i);
                check(client.gate_bytes(&tenant, &run, body).await)
            }
        }
    };
    let echo_fn = |subject: &'static str| {
        let (client, tenant) = (client.clone(), tenant.clone());
        move |i| {
            let (client, tenant) = (client.clone(), tenant.clone());
            async move { echo_request(&client, subject, tool_call(&tenant, "echo", i).1).await }
        }
    };
    let serial_gate = measure(options.serial, 1, gate_fn(format!("s{id}"))).await?;
    let serial_echo = measure(options.serial, 1, echo_fn(ECHO_SUBJECT)).await?;
    let disk_floor = match options.disk_floor_dir.clone() {
        Some(dir) => Some(
            tokio::task::spawn_blocking(move || {
                disk_floor(&dir, DISK_FLOOR_SAMPLES).map_err(|err| {
                    ClientError::Usage(format!(
                        "measuring the disk floor in {}: {err}",
                        dir.display()
                    ))
                })
            })
            .await
            .expect("the disk floor task does not panic")?,
        ),
        None => None,
    };
    let parallel_gate = measure(
        options.parallel,
        options.in_flight,
        gate_fn(format!("p{id}")),
    )
    .await?;
    let parallel_echo = measure(options.parallel, options.in_flight, echo_fn(ECHO_SUBJECT)).await?;
    echo_task.abort();
    let parallel_durable_echo = match options.disk_floor_dir.clone() {
        Some(dir) => {
            let responder =
                durable_echo::DurableEcho::start(settings.clone(), client.options.clone(), dir)
                    .await?;
            let figure = measure(
                options.parallel,
                options.in_flight,
                echo_fn(durable_echo::SUBJECT),
            )
            .await;
            responder.stop()?;
            Some(figure?)
        }
        None => None,
    };

    let (tree_gate, flat_gate) = tree::measure_both(
        client,
        &tenant,
        &id,
        options.parallel / 2,
        options.in_flight,
    )
    .await?;
    let ingest = ingest(client, &tenant, &format!("i{id}"), options.ingest).await?;
    let ingest_raw = ingest_raw(client, &tenant, options.ingest).await?;
    let ingest_consumed =
        acked_consumer::measure(client, settings, &client.options, options.ingest, |i| {
            let (run, id, body) = ingest_event(&tenant, "c", i);
            (format!("{tenant}.{run}"), id, body)
        })
        .await?;
    Ok(BenchReport {
        serial_gate,
        serial_echo,
        parallel_gate,
        parallel_echo,
        ingest,
        ingest_raw,
        ingest_consumed,
        disk_floor,
        parallel_durable_echo,
        tree_gate,
        flat_gate,
    })
}

/// Appends in the disk floor measurement (as `log_bench`'s).
const DISK_FLOOR_SAMPLES: usize = 2_000;

/// `samples` 4 KiB appends to a new file in `dir`, each made durable with `fdatasync`:
/// what one durable write costs on that disk at the least.
fn disk_floor(dir: &std::path::Path, samples: usize) -> std::io::Result<Figure> {
    use std::os::unix::fs::FileExt;
    let path = dir.join(format!("fusebox-bench-disk-floor-{}", nonce()));
    let file = std::fs::File::create_new(&path)?;
    let block = [0x5a_u8; 4096];
    let started = Instant::now();
    let mut latencies = Vec::with_capacity(samples);
    let appended = (0..samples as u64).try_for_each(|i| {
        let sent = Instant::now();
        file.write_all_at(&block, i * block.len() as u64)?;
        file.sync_data()?;
        latencies.push(sent.elapsed());
        Ok::<_, std::io::Error>(())
    });
    let removed = std::fs::remove_file(&path);
    appended.and(removed)?;
    Ok(Figure::from_samples(latencies, started.elapsed()))
}

fn js_error(what: &str) -> impl Fn(async_nats::Error) -> ClientError + '_ {
    move |err| ClientError::JetStream {
        what: what.to_owned(),
        detail: err.to_string(),
    }
}

/// Publishes `total` events with up to 4096 acks outstanding.
async fn publish_all(
    client: &FuseboxClient,
    total: usize,
    message: impl Fn(usize) -> (String, String, Vec<u8>),
) -> Result<(), ClientError> {
    let mut acks = futures_util::stream::FuturesUnordered::new();
    for i in 0..total {
        let (subject, id, body) = message(i);
        let publish = PublishMessage::build().payload(body.into()).message_id(id);
        let ack = client
            .js
            .send_publish(subject, publish)
            .await
            .map_err(|e| js_error("publish")(e.into()))?;
        acks.push(ack.into_future());
        if acks.len() >= 4096 {
            if let Some(result) = acks.next().await {
                result.map_err(|e| js_error("publish ack")(e.into()))?;
            }
        }
    }
    while let Some(result) = acks.next().await {
        result.map_err(|e| js_error("publish ack")(e.into()))?;
    }
    Ok(())
}

/// Runs the ingest's events are spread over.
const INGEST_RUNS: usize = 64;

/// The `i`-th ingest event: its run, id and body (a `progress` event, in `seq` order).
fn ingest_event(tenant: &str, prefix: &str, i: usize) -> (String, String, Vec<u8>) {
    let run = format!("{prefix}-{}", i % INGEST_RUNS);
    let seq = i / INGEST_RUNS + 1;
    let id = format!("{prefix}-{i}");
    let body = format!(
        r#"{{"v":1,"id":"{id}","tenant":"{tenant}","run":"{run}","seq":{seq},"ts_ms":{},"type":"progress","version":{seq}}}"#,
        1_700_000_000_000u64 + seq as u64
    );
    (run, id, body.into_bytes())
}

/// Events into `FUSEBOX_EVENTS` until the daemon has applied every one (durably: it
/// acks only after the commit, and reports only committed state).
async fn ingest(
    client: &FuseboxClient,
    tenant: &str,
    prefix: &str,
    total: usize,
) -> Result<Figure, ClientError> {
    let started = Instant::now();
    publish_all(client, total, |i| {
        let (run, id, body) = ingest_event(tenant, prefix, i);
        (
            fusebox_nats::subjects::events(tenant, &run),
            format!("{tenant}.{run}.{id}"),
            body,
        )
    })
    .await?;
    // One page holding just this measurement's runs, not the whole listing: queries
    // are answered on the applier thread, and listing every run the bench left behind
    // (~600 by now) every 20 ms took that thread's time from the ingest being measured.
    let query = RunsQuery {
        tenant: Some(tenant.to_owned()),
        run_contains: Some(prefix.to_owned()),
        limit: Some(INGEST_RUNS),
        ..RunsQuery::default()
    };
    loop {
        let applied: u64 = client
            .runs_page(&query)
            .await?
            .page
            .runs
            .iter()
            .map(|r| r.summary.events)
            .sum();
        if applied as usize >= total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(Figure::whole(total, started.elapsed()))
}

/// The same events into a plain stream nobody consumes: what JetStream alone costs.
async fn ingest_raw(
    client: &FuseboxClient,
    tenant: &str,
    total: usize,
) -> Result<Figure, ClientError> {
    fresh_stream(client, RAW_STREAM, RAW_SUBJECT).await?;
    let started = Instant::now();
    publish_all(client, total, |i| {
        let body = format!(
            r#"{{"v":1,"id":"raw-{i}","tenant":"{tenant}","run":"raw","seq":{i},"ts_ms":1,"type":"progress","version":{i}}}"#
        );
        (format!("{RAW_SUBJECT}.{tenant}.raw"), format!("raw-{i}"), body.into_bytes())
    })
    .await?;
    let figure = Figure::whole(total, started.elapsed());
    let _ = client.js.delete_stream(RAW_STREAM).await;
    Ok(figure)
}

/// A new, empty stream `name` on `{prefix}.>` (a leftover of an interrupted run deleted
/// first), with JetStream's defaults.
async fn fresh_stream(client: &FuseboxClient, name: &str, prefix: &str) -> Result<(), ClientError> {
    let _ = client.js.delete_stream(name).await;
    client
        .js
        .create_stream(stream::Config {
            name: name.to_owned(),
            subjects: vec![format!("{prefix}.>")],
            ..Default::default()
        })
        .await
        .map(drop)
        .map_err(|e| js_error("bench stream")(e.into()))
}
