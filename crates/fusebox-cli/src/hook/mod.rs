//! `fusebox hook <agent>`: the guard for coding agents whose code nobody changes, through
//! the hook commands they run before and after every tool call.
//!
//! One invocation is one hook event: read the payload on stdin, ask fuseboxd (through
//! fusebox-client, within a deadline shorter than the agent's hook timeout), print the
//! agent's answer on stdout. Nothing is decided here and nothing is kept between
//! invocations; the event ids come from the payload, so a re-run hook is deduplicated
//! by the daemon.

mod claude_code;
mod settings;

use std::io::{self, Read, Write};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Subcommand, ValueEnum};
use fusebox_client::{ClientOptions, Gate, GateOnError};

use crate::connection::Connection;
use claude_code::{Outcome, Payload};

#[derive(clap::Args)]
pub struct HookArgs {
    #[command(subcommand)]
    agent: Agent,
}

#[derive(Subcommand)]
enum Agent {
    /// Claude Code's hook protocol (SessionStart, PreToolUse, PostToolUse,
    /// PostToolUseFailure, PreCompact, SessionEnd).
    ///
    /// Setup: `fusebox hook claude-code --print-settings` prints the block for
    /// ~/.claude/settings.json (or a project's .claude/settings.json); merge its "hooks"
    /// into yours. Each tool call is then asked of fuseboxd first: a block or stop denies
    /// it with the guard's message as the reason, a warn reaches the model as context, a
    /// stop also ends the session. One session is one run (tenant from --tenant).
    #[command(verbatim_doc_comment)]
    ClaudeCode(ClaudeCodeArgs),
}

#[derive(clap::Args)]
struct ClaudeCodeArgs {
    #[command(flatten)]
    connection: Connection,
    /// The tenant the sessions' runs belong to.
    #[arg(long, env = "FUSEBOX_TENANT", default_value = DEFAULT_TENANT)]
    tenant: String,
    /// The agent name of the sessions' runs: `[agents.<name>.policy]` in fusebox.toml
    /// applies to them.
    #[arg(long, env = "FUSEBOX_AGENT", default_value = DEFAULT_AGENT)]
    agent: String,
    /// How long to wait for fuseboxd (connect + answer) before --on-error applies. Keep it
    /// below the hook's own timeout in settings.json, which --print-settings sets.
    #[arg(long, env = "FUSEBOX_HOOK_TIMEOUT", default_value = "3s", value_parser = crate::parse_duration)]
    timeout: Duration,
    /// What a tool call does when fuseboxd cannot be asked: deny it, or let it run unguarded.
    #[arg(long, env = "FUSEBOX_ON_ERROR", value_enum, default_value_t = OnError::Deny)]
    on_error: OnError,
    /// Print the settings.json block that installs this hook, and exit.
    #[arg(long)]
    print_settings: bool,
}

const DEFAULT_TENANT: &str = "default";
const DEFAULT_AGENT: &str = "claude-code";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnError {
    Deny,
    Allow,
}

pub fn run(args: HookArgs) -> Result<ExitCode, String> {
    match args.agent {
        Agent::ClaudeCode(args) if args.print_settings => {
            let command = settings::command_line(&args.flags())?;
            println!("{}", settings::claude_code(&command, args.timeout));
            Ok(ExitCode::SUCCESS)
        }
        Agent::ClaudeCode(args) => Ok(claude_code_hook(&args)),
    }
}

impl ClaudeCodeArgs {
    /// The flags that reproduce these settings where they differ from the defaults.
    fn flags(&self) -> Vec<String> {
        let mut flags = vec!["hook".to_owned(), "claude-code".to_owned()];
        flags.extend(self.connection.flags());
        if self.tenant != DEFAULT_TENANT {
            flags.extend(["--tenant".to_owned(), self.tenant.clone()]);
        }
        if self.agent != DEFAULT_AGENT {
            flags.extend(["--agent".to_owned(), self.agent.clone()]);
        }
        if self.timeout != DEFAULT_TIMEOUT {
            flags.extend([
                "--timeout".to_owned(),
                format!("{}ms", self.timeout.as_millis()),
            ]);
        }
        if self.on_error == OnError::Allow {
            flags.extend(["--on-error".to_owned(), "allow".to_owned()]);
        }
        flags
    }
}

/// One hook event. The exit status is 0 with the answer on stdout, except for a payload
/// that cannot be read: exit 2, which Claude Code treats as a blocking error (the tool
/// call does not run) and shows our stderr to the model.
fn claude_code_hook(args: &ClaudeCodeArgs) -> ExitCode {
    let mut input = Vec::new();
    let payload = io::stdin()
        .read_to_end(&mut input)
        .map_err(|e| format!("cannot read the hook payload: {e}"))
        .and_then(|_| Payload::parse(&input));
    let payload = match payload {
        Ok(payload) => payload,
        Err(why) => {
            eprintln!("fusebox: {why}");
            return ExitCode::from(2);
        }
    };
    let transcript_len = payload
        .transcript_path
        .as_deref()
        .and_then(|path| std::fs::metadata(path).ok())
        .map(|meta| meta.len());
    let event = match claude_code::event_for(
        &payload,
        &args.tenant,
        &args.agent,
        transcript_len,
        now_ms(),
    ) {
        Ok(Some(event)) => event,
        Ok(None) => return print_answer(&serde_json::json!({})),
        Err(why) => {
            eprintln!("fusebox: {why}");
            return ExitCode::from(2);
        }
    };
    let gate = ask(args, &event);
    let allowed = args.on_error == OnError::Allow;
    let outcome = match &gate {
        Gate::Decided(decision) => Outcome::Decided(decision),
        Gate::Refused(error) => Outcome::Failed {
            why: format!("fuseboxd refused the event: {}", error.message),
            allowed: false,
        },
        Gate::Unanswered { error, .. } => Outcome::Failed {
            why: error.to_string(),
            allowed,
        },
    };
    if let Outcome::Failed { why, .. } = &outcome {
        eprintln!("fusebox: {} {}: {why}", payload.hook_event_name, event.id);
    }
    print_answer(&claude_code::answer(payload.event(), &outcome))
}

/// Connect and ask, the two together within `--timeout`.
fn ask(args: &ClaudeCodeArgs, event: &fusebox_core::Event) -> Gate {
    let unanswered = |error| Gate::Unanswered {
        error,
        allowed: args.on_error == OnError::Allow,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return unanswered(fusebox_client::ClientError::Usage(e.to_string())),
    };
    let options = ClientOptions {
        timeout: args.timeout,
        gate_on_error: match args.on_error {
            OnError::Deny => GateOnError::Deny,
            OnError::Allow => GateOnError::Allow,
        },
    };
    runtime.block_on(async {
        let asked = async {
            match args.connection.connect(&args.tenant, options).await {
                Ok(client) => client.gate(event).await,
                Err(error) => unanswered(error),
            }
        };
        tokio::time::timeout(args.timeout, asked)
            .await
            .unwrap_or_else(|_| {
                unanswered(fusebox_client::ClientError::Timeout {
                    subject: format!("{} (connect + answer)", args.connection.nats_url),
                    timeout_ms: args.timeout.as_millis() as u64,
                })
            })
    })
}

fn print_answer(answer: &serde_json::Value) -> ExitCode {
    let mut out = io::stdout().lock();
    let written = serde_json::to_writer(&mut out, answer)
        .map_err(io::Error::from)
        .and_then(|()| writeln!(out))
        .and_then(|()| out.flush());
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fusebox: cannot write the hook answer: {e}");
            ExitCode::from(1)
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
