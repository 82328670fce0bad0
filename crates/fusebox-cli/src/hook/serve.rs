//! `fusebox hook serve`: Claude Code's hooks over HTTP (`"type": "http"`), so no process
//! is spawned per tool call. The same mapping as `fusebox hook claude-code` (the
//! `fusebox_hook::claude_code` functions), over one long-lived NATS connection; the
//! daemon still decides everything.
//!
//! Closed on failure: Claude Code's `onFailure: "block"` (printed by
//! `--print-settings --http`) blocks the call on a refused request, a non-2xx answer, a
//! timeout or an endpoint that is down; a silent daemon is answered with a deny within
//! `--timeout`. A prompt is the exception: its hook is printed without `onFailure`, and
//! it is blocked only by a stopped run, never for want of an answer. On a loopback
//! address any local process may ask (as with the command hook); on any other address
//! every request needs a bearer token that names its tenant. What must outlive the
//! endpoint — a resumed session's run, its sub-agents' runs — is kept in the same state
//! files as the command's; a stopped session stays stopped in the daemon.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use fusebox_client::{ClientError, ClientOptions, FuseboxClient, Gate, GateOnError};
use fusebox_hook::claude_code::{HookEvent, Outcome, Payload};
use fusebox_hook::Operations;

use fusebox_hook_command::claude_code::{answer_for, plan, Planned};
use fusebox_hook_command::session_runs::SessionRuns;
use fusebox_hook_command::sub_agents::SubAgents;
use fusebox_hook_command::{
    continue_resumed, gate_in_order, now_ms, outcome_of, state_dir, transcript_len, GuardArgs,
    OnError,
};

/// The path Claude Code's hooks POST to.
pub const CLAUDE_CODE_PATH: &str = "/claude-code";

#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    guard: GuardArgs,
    /// Where to listen. A non-loopback address requires --tokens.
    #[arg(long, default_value = "127.0.0.1:7474")]
    listen: SocketAddr,
    /// Bearer tokens and the tenant each one stands for, one `TENANT TOKEN` per line
    /// (`#` starts a comment). With it, every request needs `Authorization: Bearer
    /// <token>`; its tenant replaces --tenant.
    #[arg(long, value_name = "FILE")]
    tokens: Option<PathBuf>,
}

struct Endpoint {
    client: FuseboxClient,
    /// token → tenant; `None`: loopback without tokens, every request is `--tenant`'s.
    tokens: Option<HashMap<String, String>>,
    tenant: String,
    agent: String,
    timeout: Duration,
    allowed: bool,
    runs: SessionRuns,
    sub_agents: SubAgents,
    operations: Operations,
}

pub fn run(args: &ServeArgs) -> Result<ExitCode, String> {
    let tokens = args.tokens.as_deref().map(read_tokens).transpose()?;
    if tokens.is_none() && !args.listen.ip().is_loopback() {
        return Err(format!(
            "{} is not a loopback address: give --tokens FILE (a bearer token per tenant), \
             or anyone who reaches it could speak for your agents",
            args.listen
        ));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(serve(args, tokens))
}

async fn serve(
    args: &ServeArgs,
    tokens: Option<HashMap<String, String>>,
) -> Result<ExitCode, String> {
    let guard = &args.guard;
    let options = ClientOptions {
        timeout: guard.timeout,
        gate_on_error: match guard.on_error {
            OnError::Deny => GateOnError::Deny,
            OnError::Allow => GateOnError::Allow,
        },
    };
    let client = guard
        .connection
        .connect_lasting(&guard.tenant, options)
        .await
        .map_err(|e| e.to_string())?;
    let endpoint = Arc::new(Endpoint {
        client,
        tokens,
        tenant: guard.tenant.clone(),
        agent: guard
            .agent
            .clone()
            .unwrap_or_else(|| "claude-code".to_owned()),
        timeout: guard.timeout,
        allowed: guard.on_error == OnError::Allow,
        runs: SessionRuns::new(state_dir::resolve(guard.state_dir.clone(), "claude-code")),
        sub_agents: SubAgents::new(state_dir::resolve(guard.state_dir.clone(), "claude-code")),
        operations: guard.operations.operations(),
    });
    let app = Router::new()
        .route(CLAUDE_CODE_PATH, post(claude_code_hook))
        .with_state(endpoint);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    eprintln!("fusebox hook serve: Claude Code hooks on http://{bound}{CLAUDE_CODE_PATH}");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| format!("serving {bound}: {e}"))?;
    Ok(ExitCode::SUCCESS)
}

fn read_tokens(path: &Path) -> Result<HashMap<String, String>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("--tokens {}: {e}", path.display()))?;
    let mut tokens = HashMap::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(tenant), Some(token), None) = (words.next(), words.next(), words.next()) else {
            return Err(format!(
                "--tokens {}:{}: expected `TENANT TOKEN`",
                path.display(),
                number + 1
            ));
        };
        if token.len() < 16 {
            return Err(format!(
                "--tokens {}:{}: a token of fewer than 16 characters is guessable",
                path.display(),
                number + 1
            ));
        }
        tokens.insert(token.to_owned(), tenant.to_owned());
    }
    if tokens.is_empty() {
        return Err(format!("--tokens {}: no token in it", path.display()));
    }
    Ok(tokens)
}

/// The tenant the request speaks for, or why it is refused.
fn tenant_of(endpoint: &Endpoint, headers: &HeaderMap) -> Result<String, &'static str> {
    let Some(tokens) = &endpoint.tokens else {
        return Ok(endpoint.tenant.clone());
    };
    let offered = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or("a bearer token is required")?;
    tokens
        .iter()
        .find(|(token, _)| same_secret(token.as_bytes(), offered.as_bytes()))
        .map(|(_, tenant)| tenant.clone())
        .ok_or("the bearer token is not known")
}

/// Equality whose time does not depend on where the bytes differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One hook event. A request it cannot read or authorise gets a 4xx, which Claude Code
/// turns into a blocked call (`onFailure: "block"`); everything else a 200 with the
/// answer a command hook would print.
async fn claude_code_hook(
    State(endpoint): State<Arc<Endpoint>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let tenant = match tenant_of(&endpoint, &headers) {
        Ok(tenant) => tenant,
        Err(why) => return (StatusCode::UNAUTHORIZED, format!("fusebox: {why}")).into_response(),
    };
    let payload = match Payload::parse(&body) {
        Ok(payload) => payload,
        Err(why) => return (StatusCode::BAD_REQUEST, format!("fusebox: {why}")).into_response(),
    };
    // Claude Code runs on this machine for a loopback endpoint; elsewhere the transcript
    // is not readable and a compaction is named by its trigger alone.
    let transcript_len = transcript_len(payload.transcript_path.as_deref());
    let session_run = endpoint.runs.current(&tenant, &payload.session_id);
    let planned = plan(
        &payload,
        &endpoint.operations,
        &endpoint.sub_agents,
        &tenant,
        &session_run,
        &endpoint.agent,
        transcript_len,
        now_ms(),
    );
    let Planned {
        mut route,
        mut events,
    } = match planned {
        Ok(planned) if planned.events.is_empty() => return json_response(&serde_json::json!({})),
        Ok(planned) => planned,
        // Neither a prompt nor a sub-agent's end is blocked for the hook's own trouble (a
        // blocked SubagentStop would make the sub-agent go on).
        Err(why)
            if matches!(
                payload.event(),
                HookEvent::UserPromptSubmit | HookEvent::SubagentStop
            ) =>
        {
            eprintln!("fusebox: {why}");
            return json_response(&serde_json::json!({}));
        }
        Err(why) => return (StatusCode::BAD_REQUEST, format!("fusebox: {why}")).into_response(),
    };
    let mut gates = Vec::new();
    let asked = async {
        if payload.resumes() {
            continue_resumed(
                &endpoint.client,
                &endpoint.runs,
                &mut events[0],
                &payload.session_id,
            )
            .await;
        }
        // A resumed session's events are its own (its start), never a sub-agent's.
        let tree_root = (!payload.resumes()).then_some(route.session_run.as_str());
        gate_in_order(&endpoint.client, &events, tree_root, &mut gates).await;
    };
    if tokio::time::timeout(endpoint.timeout, asked).await.is_err() {
        gates.push(Gate::Unanswered {
            error: ClientError::Timeout {
                subject: format!("fusebox.gate.{tenant}.{}", route.run),
                timeout_ms: endpoint.timeout.as_millis() as u64,
            },
            allowed: endpoint.allowed,
        });
    }
    route.settle(&endpoint.sub_agents, &tenant, &events, &gates);
    let last = gates.len() - 1;
    let outcome = outcome_of(&gates[last], endpoint.allowed);
    if let Outcome::Failed { why, .. } = &outcome {
        eprintln!(
            "fusebox: {} {}: {why}",
            payload.hook_event_name, events[last].id
        );
    }
    json_response(&answer_for(
        &payload,
        &outcome,
        &endpoint.sub_agents,
        &tenant,
        &session_run,
    ))
}

fn json_response(answer: &serde_json::Value) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(answer).expect("JSON values serialise"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abcdefgh", b"abcdefgh"));
        assert!(!same_secret(b"abcdefgh", b"abcdefgX"));
        assert!(!same_secret(b"abcdefgh", b"abcdefg"));
    }

    #[test]
    fn token_files_name_a_tenant_per_token() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(&file, "# tenants\nacme 0123456789abcdef0123\n\n").unwrap();
        let tokens = read_tokens(&file).unwrap();
        assert_eq!(tokens["0123456789abcdef0123"], "acme");
        std::fs::write(&file, "acme short\n").unwrap();
        assert!(read_tokens(&file).unwrap_err().contains("guessable"));
        std::fs::write(&file, "acme\n").unwrap();
        assert!(read_tokens(&file).unwrap_err().contains("TENANT TOKEN"));
    }
}
