//! `fusebox hook <agent>`: the guard for coding agents whose code nobody changes, through
//! the hook commands they run before and after every tool call.
//!
//! One invocation is one hook event: read the payload on stdin, ask fuseboxd (through
//! fusebox-client, within a deadline shorter than the agent's hook timeout), print the
//! agent's answer on stdout. Nothing is decided here and nothing is kept between
//! invocations; the event ids come from the payload, so a re-run hook is deduplicated
//! by the daemon.

mod session_runs;
mod settings;

use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Subcommand, ValueEnum};
use fusebox_client::{ClientOptions, Gate, GateOnError};

use crate::connection::Connection;
use fusebox_hook::claude_code::{self, Outcome, Payload};
use session_runs::SessionRuns;

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
    /// Where a session continued after its end (`claude --resume`) records its current
    /// run [default: $XDG_STATE_HOME/fusebox/claude-code, else ~/.local/state/…].
    #[arg(long, env = "FUSEBOX_STATE_DIR", value_name = "DIR")]
    state_dir: Option<PathBuf>,
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
        if let Some(dir) = &self.state_dir {
            flags.extend(["--state-dir".to_owned(), dir.display().to_string()]);
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
    let runs = SessionRuns::new(args.state_dir.clone());
    let run = runs.current(&args.tenant, &payload.session_id);
    let event = claude_code::event_for(
        &payload,
        &args.tenant,
        &run,
        &args.agent,
        transcript_len,
        now_ms(),
    );
    let mut event = match event {
        Ok(Some(event)) => event,
        Ok(None) => return print_answer(&serde_json::json!({})),
        Err(why) => {
            eprintln!("fusebox: {why}");
            return ExitCode::from(2);
        }
    };
    let resumed = payload
        .resumes()
        .then_some((&runs, payload.session_id.as_str()));
    let gate = ask(args, &mut event, resumed);
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

/// Connect and ask, the two together within `--timeout`. For a resumed session, first
/// whether its run was closed by its end; then the session goes on in its next run.
fn ask(
    args: &ClaudeCodeArgs,
    event: &mut fusebox_core::Event,
    resumed: Option<(&SessionRuns, &str)>,
) -> Gate {
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
            let client = match args.connection.connect(&args.tenant, options).await {
                Ok(client) => client,
                Err(error) => return unanswered(error),
            };
            if let Some((runs, session)) = resumed {
                let status = client.run_status(&event.tenant, &event.run).await;
                let ended = status.is_ok_and(|s| {
                    !s.summary.open && s.summary.terminal_state.as_deref() == Some("COMPLETED")
                });
                if ended {
                    match runs.advance(&event.tenant, session) {
                        Ok(next) => event.run = next,
                        Err(e) => eprintln!("fusebox: cannot record the session's next run: {e}"),
                    }
                }
            }
            client.gate(event).await
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
