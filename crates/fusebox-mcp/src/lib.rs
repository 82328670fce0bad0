//! # fusebox-mcp
//!
//! `fusebox mcp`: an MCP gateway that puts the fusebox guard in front of any MCP server,
//! for agents whose code nobody can change (Claude Code, Claude Desktop, Cursor …). It is
//! an MCP server to the agent and an MCP client to one upstream server, and forwards
//! everything untouched except `tools/call`, which it gates through fuseboxd first.
//!
//! * [`mapping`]: the pure rules — effect from annotations, op_key from an argument, the
//!   daemon's decision → what happens to the call, the upstream's answer → `tool_result`.
//! * [`run`]: one MCP session = one fusebox run (identity, events, latch, kill switch).
//! * [`order`]: the session's events in their run's order, so a result is reported
//!   without waiting for its commit and still applied before the next call is decided.
//! * [`proxy`]: the two SDK sides and the forwarding between them.
//! * [`config`]: the gateway's TOML (per-tool op_key argument and effect).
//!
//! The gateway decides nothing: every refusal it gives is the daemon's decision, or the
//! configured answer for a daemon that did not answer.

pub mod config;
pub mod mapping;
pub mod order;
pub mod proxy;
pub mod run;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use fusebox_client::{parse_duration, ClientOptions, FuseboxClient, GateOnError};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt;

use crate::config::GatewayConfig;
use crate::proxy::{Gateway, Settings, Upstream};

const SETUP_HELP: &str = "\
Setup: wrap an existing MCP server's entry. In Claude Desktop's claude_desktop_config.json,
Cursor's .cursor/mcp.json or Claude Code's .mcp.json, an entry

    \"files\": {\"command\": \"npx\", \"args\": [\"-y\", \"@modelcontextprotocol/server-filesystem\", \"/repo\"]}

becomes

    \"files\": {\"command\": \"fusebox\",
              \"args\": [\"mcp\", \"--tenant\", \"me\", \"--\", \"npx\", \"-y\", \"@modelcontextprotocol/server-filesystem\", \"/repo\"],
              \"env\": {\"FUSEBOX_NATS_URL\": \"nats://127.0.0.1:4222\"}}

(Claude Code, same thing from the shell:
    claude mcp add files -- fusebox mcp --tenant me -- npx -y @modelcontextprotocol/server-filesystem /repo)

A remote (Streamable HTTP) server: `fusebox mcp --upstream-url https://host/mcp` instead of
the command. Remote agents: `fusebox mcp --listen 127.0.0.1:8931 -- CMD…` serves
http://127.0.0.1:8931/mcp, one run per MCP session.

Each session is one fusebox run: `fusebox run TENANT/RUN` shows it, `fusebox cancel
TENANT/RUN` ends it (the run id is logged on stderr at the session's start). stdout is
the MCP protocol; logs go to stderr (RUST_LOG=fusebox_mcp=debug for every gate).";

/// `fusebox mcp`: gate an MCP server's tool calls through fuseboxd.
#[derive(clap::Args, Debug)]
#[command(after_long_help = SETUP_HELP)]
pub struct McpArgs {
    /// NATS server fuseboxd listens on.
    #[arg(
        long,
        env = "FUSEBOX_NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    pub nats_url: String,
    /// Tenant of every run this gateway opens.
    #[arg(long, env = "FUSEBOX_TENANT", default_value = "default")]
    pub tenant: String,
    /// Run id for the session (default: a fresh `mcp-…` id per session, closed with it).
    #[arg(long, env = "FUSEBOX_RUN")]
    pub run: Option<String>,
    /// Agent name: selects the daemon's `[agents.NAME.policy]`.
    #[arg(long, env = "FUSEBOX_AGENT")]
    pub agent: Option<String>,
    /// The guarded run of the agent that started this gateway: each session's run is a
    /// child of it (its budgets count the session's calls, its stop ends the session).
    #[arg(long, env = "FUSEBOX_PARENT_RUN")]
    pub parent_run: Option<String>,
    /// The root of the parent's tree, when the parent run is itself a sub-agent (default:
    /// the parent run). The session's events name it, so a cluster serves the session
    /// with the rest of its tree.
    #[arg(long, env = "FUSEBOX_TREE_ROOT", requires = "parent_run")]
    pub tree_root: Option<String>,
    /// Gateway config (TOML): `[tools.NAME] op_key_arg = "ARG"`, `effect = "read"|"write"`,
    /// top-level `error_kind`.
    #[arg(long, env = "FUSEBOX_MCP_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The op_key of TOOL's calls comes from its argument ARG (repeatable; over --config).
    #[arg(long = "op-key", value_name = "TOOL=ARG")]
    pub op_keys: Vec<String>,
    /// When fuseboxd cannot be asked: `deny` (the call is not run; an error result says
    /// why) or `allow` (the call runs unguarded, and the result says so).
    #[arg(long, value_enum, default_value = "deny")]
    pub on_guard_error: OnGuardError,
    /// How long to wait for fuseboxd's answer to one gate request.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub gate_timeout: Duration,
    /// How long one upstream request may go without an answer or progress (its start-up
    /// and `initialize` get at least 60s).
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    pub upstream_timeout: Duration,
    /// The upstream is a Streamable HTTP MCP server at this URL (instead of a command).
    #[arg(long, value_name = "URL", conflicts_with = "command")]
    pub upstream_url: Option<String>,
    /// Serve agents over Streamable HTTP at http://ADDR/mcp instead of stdio.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// The upstream MCP server's command line (after `--`).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnGuardError {
    Deny,
    Allow,
}

/// Runs the gateway until the agent goes away (stdio) or the process is stopped (HTTP).
pub fn main(args: McpArgs) -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "fusebox_mcp=info,rmcp=error".into()),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("fusebox mcp: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("fusebox mcp: {message}");
            ExitCode::from(2)
        }
    }
}

async fn serve(args: McpArgs) -> Result<(), String> {
    let upstream = match (&args.upstream_url, args.command.is_empty()) {
        (Some(url), _) => Upstream::Url(url.clone()),
        (None, false) => Upstream::Command(args.command.clone()),
        (None, true) => {
            return Err(
                "name the upstream MCP server: `fusebox mcp -- COMMAND ARGS…` or \
                        `--upstream-url URL` (see --help)"
                    .to_owned(),
            )
        }
    };
    let mut config = match &args.config {
        Some(path) => GatewayConfig::load(path)?,
        None => GatewayConfig::default(),
    };
    for flag in &args.op_keys {
        config.add_op_key_flag(flag)?;
    }
    let guard = connect_guard(&args).await?;
    let settings = Arc::new(Settings {
        upstream,
        config,
        guard,
        tenant: args.tenant.clone(),
        run: args.run.clone(),
        agent: args.agent.clone(),
        parent_run: args.parent_run.clone(),
        tree_root: args.tree_root.clone(),
        upstream_timeout: args.upstream_timeout,
    });
    match args.listen {
        None => serve_stdio(settings).await,
        Some(addr) => serve_http(settings, addr).await,
    }
}

/// The guard's NATS connection. It is made in the background (and remade after a
/// loss), so a daemon or NATS that is down gives each call a clear refusal after the
/// gate timeout instead of a gateway that does not start.
async fn connect_guard(args: &McpArgs) -> Result<FuseboxClient, String> {
    let nats = async_nats::ConnectOptions::new()
        .connection_timeout(args.gate_timeout)
        .retry_on_initial_connect()
        // A tenant user may only receive replies on its own inboxes (deploy/nats).
        .custom_inbox_prefix(format!("_INBOX.{}", args.tenant))
        .connect(args.nats_url.as_str())
        .await
        .map_err(|e| format!("bad NATS address {:?}: {e}", args.nats_url))?;
    Ok(FuseboxClient::new(
        nats,
        ClientOptions {
            timeout: args.gate_timeout,
            gate_on_error: match args.on_guard_error {
                OnGuardError::Deny => GateOnError::Deny,
                OnGuardError::Allow => GateOnError::Allow,
            },
        },
    ))
}

async fn serve_stdio(settings: Arc<Settings>) -> Result<(), String> {
    let gateway = Gateway::new(settings);
    let session = gateway.handle();
    let service = gateway
        .serve(agent_stdio())
        .await
        .map_err(|e| format!("the MCP session did not start: {e}"))?;
    // An agent ends a stdio server with SIGINT or SIGTERM as often as by closing stdin
    // (Claude Code sends SIGINT): both close the run the session made.
    tokio::select! {
        reason = service.waiting() => tracing::info!(?reason, "session ended"),
        () = shutdown_signal() => tracing::info!("session ended by a signal"),
    }
    session.close().await;
    Ok(())
}

type AgentReader = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
type AgentWriter = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// The agent's stdin and stdout. Pipes (as MCP clients start a stdio server) are read and
/// written through the runtime's reactor: tokio's `stdin()` and `stdout()` hand every
/// read and write to a blocking thread, a thread hop each way for every message.
/// Anything else (a terminal, a file) gets those.
fn agent_stdio() -> (AgentReader, AgentWriter) {
    use std::os::fd::AsFd;
    use tokio::net::unix::pipe;
    let own = |fd: std::os::fd::BorrowedFd<'_>| fd.try_clone_to_owned().ok();
    let read: AgentReader =
        match own(std::io::stdin().as_fd()).and_then(|fd| pipe::Receiver::from_owned_fd(fd).ok()) {
            Some(pipe) => Box::new(pipe),
            None => Box::new(tokio::io::stdin()),
        };
    let write: AgentWriter =
        match own(std::io::stdout().as_fd()).and_then(|fd| pipe::Sender::from_owned_fd(fd).ok()) {
            Some(pipe) => Box::new(pipe),
            None => Box::new(tokio::io::stdout()),
        };
    (read, write)
}

async fn shutdown_signal() {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(terminate) => terminate,
            Err(_) => return std::future::pending().await,
        };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}

async fn serve_http(settings: Arc<Settings>, addr: SocketAddr) -> Result<(), String> {
    let service = StreamableHttpService::new(
        move || Ok(Gateway::new(settings.clone())),
        LocalSessionManager::default().into(),
        StreamableHttpServerConfig::default(),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!("serving MCP agents at http://{bound}/mcp");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(|e| format!("HTTP server failed: {e}"))
}
