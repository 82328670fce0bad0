//! How long the operator's page takes on the server with a big fleet: the runs page with
//! `--runs` runs known to the daemon (default 100 000), and one run's page for a run of
//! `--events` events (default 10 000). Goal: p50 ≤ 200 ms each.
//!
//! Against a running fuseboxd (its runs are added to what it holds, under tenant
//! `bench-<pid>`), with `fusebox ui` started by the bench from `--fusebox`:
//!
//! ```text
//! cargo run --release -p fusebox-ui --example ui_bench -- \
//!     --nats-url nats://127.0.0.1:4222 --fusebox target/release/fusebox
//! ```
//!
//! Printed beside a floor measured in the same run: the page's own 404 (HTTP and
//! rendering, no question to the daemon) and a `status` request (one control-API
//! round trip).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use fusebox_client::{ClientOptions, FuseboxClient, NatsArgs};
use fusebox_nats::wire::RunsQuery;
use futures_util::{stream, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    nats: NatsArgs,
    /// The `fusebox` binary (its `ui` command is what is measured).
    #[arg(long, default_value = "target/release/fusebox")]
    fusebox: PathBuf,
    #[arg(long, default_value_t = 100_000)]
    runs: u64,
    #[arg(long, default_value_t = 10_000)]
    events: u64,
    /// Requests per page measured.
    #[arg(long, default_value_t = 30)]
    samples: usize,
}

/// One GET over a fresh connection (as a browser's first request), to the end of the body.
async fn get(origin: &str, path: &str) -> Result<(Duration, usize, u16), String> {
    let host = origin.trim_start_matches("http://").trim_end_matches('/');
    let started = Instant::now();
    let mut stream = tokio::net::TcpStream::connect(host)
        .await
        .map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut body = Vec::new();
    stream
        .read_to_end(&mut body)
        .await
        .map_err(|e| e.to_string())?;
    let status = std::str::from_utf8(&body[..body.len().min(12)])
        .ok()
        .and_then(|s| s.get(9..12))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((started.elapsed(), body.len(), status))
}

fn p50(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

async fn measure(origin: &str, path: &str, n: usize) -> Result<(Duration, usize), String> {
    let mut times = Vec::with_capacity(n);
    let mut bytes = 0;
    get(origin, path).await?;
    for _ in 0..n {
        let (took, size, status) = get(origin, path).await?;
        if status != 200 && status != 404 {
            return Err(format!("GET {path}: status {status}"));
        }
        times.push(took);
        bytes = size;
    }
    Ok((p50(times), bytes))
}

async fn load(client: &FuseboxClient, tenant: &str, args: &Args) -> Result<(), String> {
    let started = Instant::now();
    let runs = (0..args.runs).map(|i| {
        let run = format!("r{i}");
        let json = format!(
            r#"{{"v":1,"id":"{run}-1","tenant":"{tenant}","run":"{run}","seq":1,"ts_ms":{},"type":"run_started","agent":"agent-{}"}}"#,
            1_700_000_000_000 + i,
            i % 7
        );
        (run, json)
    });
    let long = (1..=args.events).map(|seq| {
        let json = if seq == 1 {
            format!(r#"{{"v":1,"id":"long-1","tenant":"{tenant}","run":"long","seq":1,"ts_ms":1800000000000,"type":"run_started","agent":"long"}}"#)
        } else if seq % 2 == 0 {
            format!(r#"{{"v":1,"id":"long-{seq}","tenant":"{tenant}","run":"long","seq":{seq},"ts_ms":{},"type":"tool_call","call_id":"c{seq}","tool":"list_issues","args":{{"page":{seq}}}}}"#, 1_800_000_000_000 + seq)
        } else {
            let call = seq - 1;
            format!(r#"{{"v":1,"id":"long-{seq}","tenant":"{tenant}","run":"long","seq":{seq},"ts_ms":{},"type":"tool_result","call_id":"c{call}","tool":"list_issues","kind":"SUCCESS","output":{{"issues":["ISSUE-{call}"]}},"progress":{seq}}}"#, 1_800_000_000_000 + seq)
        };
        ("long".to_owned(), json)
    });
    // The many short runs concurrently; the long run's events one after another, in
    // `seq` order: sent concurrently they arrive out of order, and the daemon holds each
    // gap for its gap timeout.
    send(client, tenant, runs, 512).await?;
    send(client, tenant, long, 1).await?;
    // Wait until the daemon applied them all. The long run's counters stop at its step
    // budget (the guard stops it), its `last_seq` does not.
    let want = args.runs + 1;
    loop {
        let query = RunsQuery {
            tenant: Some(tenant.to_owned()),
            limit: Some(1),
            ..RunsQuery::default()
        };
        let view = client.runs_page(&query).await.map_err(|e| e.to_string())?;
        let status = client.run_status(tenant, "long").await.ok();
        let long_seq = status.and_then(|s| s.summary.last_seq).unwrap_or(0);
        if view.page.matched >= want && long_seq >= args.events {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "loaded {} runs and a run of {} events in {:.1} s",
        args.runs,
        args.events,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Reports `events` (run, JSON) with up to `concurrency` in flight.
async fn send(
    client: &FuseboxClient,
    tenant: &str,
    events: impl Iterator<Item = (String, String)>,
    concurrency: usize,
) -> Result<(), String> {
    let sent: Vec<Result<(), String>> = stream::iter(events)
        .map(|(run, json)| async move {
            let id = serde_json::from_str::<serde_json::Value>(&json).map_err(|e| e.to_string())?
                ["id"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            client
                .report_bytes(tenant, &run, &id, json.into_bytes())
                .await
                .map_err(|e| e.to_string())
        })
        .buffered(concurrency)
        .collect()
        .await;
    sent.into_iter().collect::<Result<Vec<()>, String>>()?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let args = Args::parse();
    let settings = args.nats.settings().map_err(|e| e.to_string())?;
    let options = ClientOptions {
        timeout: Duration::from_secs(30),
        ..ClientOptions::default()
    };
    let client = FuseboxClient::connect_with(&settings, options)
        .await
        .map_err(|e| e.to_string())?;
    let tenant = format!("bench-{}", std::process::id());
    load(&client, &tenant, &args).await?;

    let urls = settings.server_urls().join(",");
    let mut ui = Command::new(&args.fusebox)
        .args([
            "ui",
            "--nats-url",
            &urls,
            "--listen",
            "127.0.0.1:0",
            "--timeout-ms",
            "30000",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", args.fusebox.display()))?;
    let mut line = String::new();
    BufReader::new(ui.stdout.take().expect("piped"))
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let origin = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .ok_or_else(|| format!("fusebox ui printed {line:?}"))?
        .trim_end_matches('/')
        .to_owned();

    let n = args.samples;
    let floor = measure(&origin, "/no-such-page", n).await?;
    let mut status_times = Vec::new();
    for _ in 0..n {
        let started = Instant::now();
        client
            .run_status(&tenant, "long")
            .await
            .map_err(|e| e.to_string())?;
        status_times.push(started.elapsed());
    }
    let status = p50(status_times);
    let runs = measure(&origin, "/", n).await?;
    let filtered = measure(&origin, &format!("/?tenant={tenant}&agent=agent-3"), n).await?;
    let long = measure(&origin, &format!("/runs/{tenant}/long"), n).await?;
    let _ = ui.kill();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "floor: 404 page p50 {:.2} ms; status request p50 {:.2} ms",
        ms(floor.0),
        ms(status)
    );
    for (what, (p50, bytes)) in [
        (format!("runs page, {} runs", args.runs), runs),
        (
            "runs page, filtered by tenant and agent".to_owned(),
            filtered,
        ),
        (
            format!("run page, {} events (first 1000 shown)", args.events),
            long,
        ),
    ] {
        println!(
            "{what}: p50 {:.1} ms ({} bytes) = {:.1}x the 404 floor, {:.1}x a status request; goal <= 200 ms: {}",
            ms(p50),
            bytes,
            ms(p50) / ms(floor.0).max(0.001),
            ms(p50) / ms(status).max(0.001),
            if ms(p50) <= 200.0 { "met" } else { "NOT met" }
        );
    }
    Ok(())
}
