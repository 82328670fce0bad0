//! `fuseboxd --config config/fusebox.toml`: the fusebox guard daemon.

mod cluster;
mod config;
mod connect;
mod daemon;
mod history;
mod observer;
mod signals;
mod store;
mod watchdog;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Every event allocates and frees a few small strings and maps (parse, engine, log
/// records); mimalloc's thread-local free lists make that markedly cheaper than glibc's
/// malloc (the log's replay ran 2.2x faster with it).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc asks for transparent huge pages on its arenas, and gives memory it has not
/// used for a while back to the kernel; the daemon's state keeps growing while batch
/// buffers come and go, so the same ranges were faulted in again and again, each fault
/// a 2 MiB page zeroed (sometimes compacted for) on the thread that touched it — the
/// applier, between a batch's decisions and its commit. Measured under the gate
/// benchmark: thousands of 2 MiB faults a run, and the kernel zeroing pages the largest
/// single cost of the applier thread. Without huge pages a fault costs one 4 KiB page,
/// and the daemon used ~13 % less CPU for the same work (docs/benchmarks.md). The flag
/// is the process's (every thread, later mappings), set before the runtime starts.
fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    if let Err(err) = rustix::thread::disable_transparent_huge_pages(true) {
        // Only a cost: the daemon works the same with huge pages.
        eprintln!("fuseboxd: could not turn transparent huge pages off ({err}); continuing");
    }
}

/// The fusebox guard daemon: gates tool calls over NATS, logs every event durably, and
/// publishes decisions and stop reports.
#[derive(Debug, Parser)]
#[command(name = "fuseboxd", version)]
struct Args {
    /// The config file (`[guard]`, `[policy]`, `[agents.*]`, `[nats]`, `[storage]`,
    /// `[daemon]`, `[metrics]`, `[watchdog]`).
    #[arg(long, env = "FUSEBOX_CONFIG")]
    config: PathBuf,
    /// NATS server URL(s), comma-separated; overrides `[nats].urls`.
    #[arg(long, env = "FUSEBOX_NATS_URL")]
    nats_url: Option<String>,
    /// Directory of the durable log; overrides `[storage].data_dir`.
    #[arg(long, env = "FUSEBOX_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Address of /metrics, /healthz, /readyz; overrides `[metrics].listen`.
    #[arg(long, env = "FUSEBOX_METRICS_LISTEN")]
    metrics_listen: Option<String>,
    /// This daemon's name in a cluster; overrides `[cluster].node_id`.
    #[arg(long, env = "FUSEBOX_NODE_ID")]
    node_id: Option<String>,
}

fn main() -> ExitCode {
    disable_transparent_huge_pages();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // aws_config warns on every call its credential chain cannot serve; the
                // watchdog's own error carries the chain's reason, logged when a region
                // starts failing and hourly after.
                .unwrap_or_else(|_| "info,async_nats=warn,aws_config=error".into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: journald, files and log shippers get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    let config = match config::load(
        &args.config,
        config::Overrides {
            nats_url: args.nats_url,
            data_dir: args.data_dir,
            metrics_listen: args.metrics_listen,
            node_id: args.node_id,
        },
    ) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("fuseboxd: bad config: {err}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("fuseboxd: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(daemon::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("fuseboxd: {err}");
            ExitCode::FAILURE
        }
    }
}
