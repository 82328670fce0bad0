//! # fusebox-ui
//!
//! The operator's page (`fusebox ui`): every run fuseboxd knows, live, with filters and
//! counts per state; one run's timeline, stop report, op_key ledger entries and tree of
//! runs; and the buttons to cancel (a run and its subtree), resume and resolve, each
//! confirmed and sent through the daemon's
//! control API with the operator recorded as `by`; the cloud watchdog's held instances
//! with their deadlines, and its recent terminations. Server-rendered HTML (maud, escaped
//! by construction) with one small inline script for live updates over SSE; no build
//! step. It only asks fuseboxd, over NATS with the operator's credentials exactly as
//! the CLI connects, and shows what it is told.

mod access;
mod actions_view;
mod app;
mod layout;
mod live;
mod run_view;
mod runs_view;
mod watchdog_view;

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use fusebox_client::{ClientOptions, FuseboxClient, NatsArgs};
use tokio::sync::broadcast;

pub use access::{Access, Caller, UiSection};
pub use app::{router, Shared, Ui};

/// `fusebox ui`: serve the operator's page.
#[derive(Debug, clap::Args)]
pub struct UiArgs {
    /// How to reach NATS: the same --config / --nats-* / FUSEBOX_NATS_* as every
    /// operator command (the `operator` user of deploy/nats/accounts.conf). The same
    /// config file's [ui] section holds `listen`, and the credentials a non-loopback
    /// listener requires (`user` + `password`, or `token`).
    #[command(flatten)]
    pub nats: NatsArgs,
    /// Where to serve the page (default: [ui] listen, else 127.0.0.1:8080). Any
    /// address but loopback requires [ui] credentials.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<String>,
    /// Who actions are recorded as (`by`) when the request names nobody (loopback, a
    /// bearer token); a basic-auth user is recorded by name. Default: $USER.
    #[arg(long)]
    pub by: Option<String>,
    /// How long to wait for fuseboxd's answer, in milliseconds.
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    pub timeout_ms: u64,
    /// How often a live page asks fuseboxd again when no decision arrived, in
    /// milliseconds (new runs and plain steps publish no decision).
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub refresh_ms: u64,
}

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// A fresh secret for the forms' CSRF token.
fn random_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 18];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

async fn serve(args: UiArgs) -> Result<(), String> {
    let section = match &args.nats.config {
        Some(path) => UiSection::from_config_file(path)?,
        None => UiSection::default(),
    };
    let listen = args
        .listen
        .clone()
        .or(section.listen.clone())
        .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
    let addr: SocketAddr = listen.parse().map_err(|e| {
        format!("--listen {listen:?}: {e} (expected ADDR:PORT, e.g. 127.0.0.1:8080)")
    })?;
    let access = Access::for_listener(addr, &section)?;
    let settings = args.nats.settings().map_err(|e| e.to_string())?;
    let options = ClientOptions {
        timeout: Duration::from_millis(args.timeout_ms),
        ..ClientOptions::default()
    };
    let client = FuseboxClient::connect_with(&settings, options)
        .await
        .map_err(|e| e.to_string())?;
    let (decisions, _) = broadcast::channel(1024);
    let mut tail = client.tail(None, None).await.map_err(|e| e.to_string())?;
    let feed = decisions.clone();
    tokio::spawn(async move {
        while let Some(decision) = tail.next().await {
            let _ = feed.send((decision.tenant, decision.run));
        }
    });
    let ui = Arc::new(Ui {
        client,
        access,
        default_by: args
            .by
            .clone()
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_else(|| "operator".to_owned()),
        csrf: random_token().map_err(|e| format!("/dev/urandom: {e}"))?,
        decisions,
        refresh: Duration::from_millis(args.refresh_ms.max(100)),
        csp: layout::content_security_policy(),
    });
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let describe = ui.access.describe();
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "fusebox ui: http://{bound}/ ({describe})");
        let _ = out.flush();
    }
    let app = router(ui);
    tokio::select! {
        served = std::future::IntoFuture::into_future(axum::serve(listener, app)) => served.map_err(|e| e.to_string()),
        _ = shutdown() => Ok(()),
    }
}

/// SIGINT or SIGTERM. Live pages hold their connections open, so the page ends at
/// once rather than waiting for them.
async fn shutdown() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

/// Runs `fusebox ui` to its end.
pub fn main(args: UiArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("fusebox ui: {err}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("fusebox ui: {message}");
            ExitCode::from(2)
        }
    }
}
