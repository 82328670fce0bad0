//! The coding-agent hook commands: the guard for coding agents whose code nobody
//! changes, through the hook commands they run before and after every tool call. Built
//! as the lean `fusebox-hook` binary (what `--print-settings` / `--print-config`
//! install: a hook process starts per tool call, so its start-up is on every call's
//! path) and run by `fusebox hook <agent>` too — one implementation.
//!
//! One invocation is one hook event: read the payload on stdin, ask fuseboxd (through
//! fusebox-client, within a deadline shorter than the agent's hook timeout), print the
//! agent's answer on stdout. Nothing is decided here. Closed on failure (`reply.rs`):
//! whatever goes wrong, the agent gets an answer that refuses the call, in time, unless
//! `--on-error allow` says otherwise. What outlives one process is kept in the state
//! directory (`state_dir.rs`): a resumed session's run, its sub-agents' runs
//! (`sub_agents.rs`, routed by `routes.rs`), Codex's kept stops, Gemini CLI's call
//! numbering.

mod call_books;
pub mod claude_code;
mod codex;
pub mod connection;
mod copilot_cli;
mod gemini_cli;
mod kept_stops;
mod lineages;
mod opencode;
pub mod operations;
mod reply;
pub mod routes;
pub mod session_runs;
pub mod settings;
pub mod state_dir;
pub mod sub_agents;

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Subcommand, ValueEnum};
use fusebox_client::{parse_duration, ClientError, ClientOptions, Gate, GateOnError};
use fusebox_hook::claude_code::{Outcome, PROTOCOL as CLAUDE_CODE};
use fusebox_hook::codex::PROTOCOL as CODEX;
use fusebox_hook::copilot_cli::PROTOCOL as COPILOT_CLI;
use fusebox_hook::gemini_cli::PROTOCOL as GEMINI_CLI;
use fusebox_hook::opencode::PROTOCOL as OPENCODE;
use fusebox_hook::{with_result_hashed, Operations};

use connection::Connection;
use operations::OperationArgs;
use session_runs::SessionRuns;
use sub_agents::SubAgents;

/// The lean binary's name: what the printed settings run.
pub const HOOK_BINARY: &str = "fusebox-hook";

/// The command hooks, one per agent protocol (`fusebox-hook <agent>`, `fusebox hook
/// <agent>`).
#[derive(Subcommand)]
pub enum Agent {
    /// Claude Code's hook protocol (SessionStart, UserPromptSubmit, PreToolUse,
    /// PostToolUse, PostToolUseFailure, PreCompact, SubagentStart, SubagentStop,
    /// SessionEnd).
    ///
    /// Setup: `fusebox hook claude-code --print-settings` prints the block for
    /// ~/.claude/settings.json (or a project's .claude/settings.json); merge its "hooks"
    /// into yours. Each tool call is then asked of fuseboxd first: a block or stop denies
    /// it with the guard's message as the reason, a warn reaches the model as context, a
    /// stop also ends the session, and a stopped session's next prompt is blocked. One
    /// session is one run (tenant from --tenant), each prompt a task of it, each
    /// sub-agent a child run of it (a stop of the sub-agent's run ends the sub-agent
    /// alone).
    /// See docs/agents/claude-code.md.
    #[command(verbatim_doc_comment)]
    ClaudeCode(ClaudeCodeArgs),
    /// OpenAI Codex CLI's hook protocol (SessionStart, UserPromptSubmit, PreToolUse,
    /// PostToolUse, PreCompact, SubagentStart, SubagentStop, SessionEnd).
    ///
    /// Setup: `fusebox hook codex --print-config` prints the block for
    /// ~/.codex/config.toml; trust the hooks once (Codex skips untrusted hooks silently).
    /// A block or stop denies the call with the guard's message as the reason, a warn
    /// reaches the model as context. No hook answer can end a Codex turn, so after a stop
    /// every later call of the session is denied, and its prompts blocked, with the stop
    /// report. Each sub-agent is a child run of the session's run.
    /// See docs/agents/codex.md.
    #[command(verbatim_doc_comment)]
    Codex(CodexArgs),
    /// Gemini CLI's hook protocol (SessionStart, BeforeAgent, BeforeTool, AfterTool,
    /// SessionEnd).
    ///
    /// Setup: `fusebox hook gemini-cli --print-settings` prints the block for
    /// ~/.gemini/settings.json (user level: project hooks are skipped in untrusted
    /// folders). A block denies the call, a stop ends the agent (and a stopped session's
    /// next prompt), a warn reaches the model with the call's result.
    /// See docs/agents/gemini-cli.md.
    #[command(verbatim_doc_comment)]
    GeminiCli(GeminiCliArgs),
    /// OpenCode's plugin hooks (session.created, chat.message, tool.execute.before,
    /// tool.execute.after, session.idle, session.deleted), as the fusebox plugin sends
    /// them.
    ///
    /// Setup: `fusebox hook opencode --print-plugin > ~/.config/opencode/plugin/fusebox.js`
    /// (OpenCode loads every plugin there). The plugin runs this command for each hook
    /// and does what fuseboxd answered: a block or stop fails the call with the guard's
    /// message as the tool's error, a stop also aborts the session, a warn reaches the
    /// model with the call's result. One session is one run, each sub-agent's child
    /// session a child run of it.
    /// See docs/agents/opencode.md.
    #[command(verbatim_doc_comment)]
    Opencode(OpencodeArgs),
    /// GitHub Copilot CLI's hooks (sessionStart, userPromptSubmitted, preToolUse,
    /// postToolUse, subagentStart, subagentStop, sessionEnd), each run with
    /// `--event <name>`.
    ///
    /// Setup: `fusebox hook copilot-cli --print-config > .github/hooks/fusebox.json` in a
    /// repository (or merge its "hooks" into ~/.copilot/settings.json). A block or stop
    /// denies the call with the guard's message as the reason. No hook answer ends
    /// Copilot CLI's turn, so after a stop every later call of the session is denied
    /// with the stop report. Each sub-agent (`task`) is a child run of the session's run
    /// (of its parent sub-agent's, for a sub-agent's own).
    /// See docs/agents/copilot-cli.md.
    #[command(verbatim_doc_comment)]
    CopilotCli(CopilotCliArgs),
}

/// What every agent's hook takes.
#[derive(clap::Args)]
pub struct GuardArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// The tenant the sessions' runs belong to.
    #[arg(long, env = "FUSEBOX_TENANT", default_value = DEFAULT_TENANT)]
    pub tenant: String,
    /// The agent name of the sessions' runs: `[agents.<name>.policy]` in fusebox.toml
    /// applies to them [default: claude-code, codex or gemini-cli].
    #[arg(long, env = "FUSEBOX_AGENT")]
    pub agent: Option<String>,
    /// How long to wait for fuseboxd (connect + answer) before --on-error applies. Keep it
    /// below the hook's own timeout in the agent's settings, which the printed block sets.
    #[arg(long, env = "FUSEBOX_HOOK_TIMEOUT", default_value = "3s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// What a tool call does when fuseboxd cannot be asked: deny it, or let it run unguarded.
    #[arg(long, env = "FUSEBOX_ON_ERROR", value_enum, default_value_t = OnError::Deny)]
    pub on_error: OnError,
    /// Where the hook keeps what outlives one hook process: a resumed session's run,
    /// Codex's kept stops, Gemini CLI's call numbering
    /// [default: $XDG_STATE_HOME/fusebox/<agent>, else ~/.local/state/fusebox/<agent>].
    #[arg(long, env = "FUSEBOX_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    #[command(flatten)]
    pub operations: OperationArgs,
}

#[derive(clap::Args)]
pub struct ClaudeCodeArgs {
    #[command(flatten)]
    guard: GuardArgs,
    /// Print the settings.json block that installs this hook, and exit.
    #[arg(long)]
    print_settings: bool,
    /// With --print-settings: HTTP hooks to this `fusebox hook serve` URL instead of the
    /// command (e.g. http://127.0.0.1:7474/claude-code).
    #[arg(long, value_name = "URL", requires = "print_settings")]
    http: Option<String>,
    /// With --http: the environment variable holding the bearer token Claude Code sends
    /// (an endpoint on a non-loopback address requires one).
    #[arg(long, value_name = "VAR", requires = "http")]
    token_env: Option<String>,
}

#[derive(clap::Args)]
pub struct CodexArgs {
    #[command(flatten)]
    guard: GuardArgs,
    /// Print the config.toml block that installs this hook, and exit.
    #[arg(long)]
    print_config: bool,
}

#[derive(clap::Args)]
pub struct GeminiCliArgs {
    #[command(flatten)]
    guard: GuardArgs,
    /// Print the settings.json block that installs this hook, and exit.
    #[arg(long)]
    print_settings: bool,
}

#[derive(clap::Args)]
pub struct CopilotCliArgs {
    #[command(flatten)]
    guard: GuardArgs,
    /// Print the hooks file that installs this hook, and exit.
    #[arg(long)]
    print_config: bool,
    /// The hook event this process answers (the printed hooks pass it: Copilot CLI's
    /// payloads do not name their event).
    #[arg(long, value_name = "NAME", required_unless_present = "print_config")]
    event: Option<String>,
}

#[derive(clap::Args)]
pub struct OpencodeArgs {
    #[command(flatten)]
    guard: GuardArgs,
    /// Print the OpenCode plugin that runs this hook (with these flags), and exit.
    #[arg(long)]
    print_plugin: bool,
}

const DEFAULT_TENANT: &str = "default";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);
/// After `--timeout`, how long the process may still take before its fallback answer is
/// printed regardless (the agent's own timeout, as printed, is 5 s beyond `--timeout`).
const DEADLINE_MARGIN: Duration = Duration::from_millis(1500);

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnError {
    Deny,
    Allow,
}

/// Prints the settings block asked for, or answers one hook event.
pub fn run(agent: &Agent) -> Result<ExitCode, String> {
    let printed = match agent {
        Agent::ClaudeCode(a) if a.print_settings && a.http.is_some() => {
            Some(settings::claude_code_http(
                a.http.as_deref().unwrap_or_default(),
                a.token_env.as_deref(),
                &settings::command_line(&a.guard.flags(CLAUDE_CODE.agent))?,
                a.guard.timeout,
            )?)
        }
        Agent::ClaudeCode(a) if a.print_settings => Some(settings::claude_code(
            &settings::command_line(&a.guard.flags(CLAUDE_CODE.agent))?,
            a.guard.timeout,
        )),
        Agent::Codex(a) if a.print_config => Some(settings::codex(
            &settings::command_line(&a.guard.flags(CODEX.agent))?,
            a.guard.timeout,
        )),
        Agent::GeminiCli(a) if a.print_settings => Some(settings::gemini_cli(
            &settings::command_line(&a.guard.flags(GEMINI_CLI.agent))?,
            a.guard.timeout,
        )),
        Agent::CopilotCli(a) if a.print_config => Some(settings::copilot_cli(
            &settings::command_line(&a.guard.flags(COPILOT_CLI.agent))?,
            a.guard.timeout,
        )),
        Agent::Opencode(a) if a.print_plugin => Some(opencode::plugin(
            &settings::command_args(&a.guard.flags(OPENCODE.agent))?,
            a.guard.on_error == OnError::Allow,
        )),
        _ => None,
    };
    if let Some(block) = printed {
        println!("{block}");
        return Ok(ExitCode::SUCCESS);
    }
    Ok(match agent {
        Agent::ClaudeCode(a) => claude_code::hook(&Hook::new(&a.guard, CLAUDE_CODE.agent)),
        Agent::Codex(a) => codex::hook(&Hook::new(&a.guard, CODEX.agent)),
        Agent::GeminiCli(a) => gemini_cli::hook(&Hook::new(&a.guard, GEMINI_CLI.agent)),
        Agent::Opencode(a) => opencode::hook(&Hook::new(&a.guard, OPENCODE.agent)),
        Agent::CopilotCli(a) => copilot_cli::hook(
            &Hook::new(&a.guard, COPILOT_CLI.agent),
            a.event.as_deref().unwrap_or_default(),
        ),
    })
}

impl GuardArgs {
    /// The flags that reproduce these settings where they differ from the defaults.
    pub fn flags(&self, protocol: &str) -> Vec<String> {
        let mut flags = vec![protocol.to_owned()];
        flags.extend(self.connection.flags());
        if self.tenant != DEFAULT_TENANT {
            flags.extend(["--tenant".to_owned(), self.tenant.clone()]);
        }
        if let Some(agent) = self.agent.as_ref().filter(|a| *a != protocol) {
            flags.extend(["--agent".to_owned(), agent.clone()]);
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
        flags.extend(self.operations.flags());
        flags
    }
}

/// One hook process's settings, resolved.
struct Hook<'a> {
    args: &'a GuardArgs,
    agent: String,
    state_dir: Option<PathBuf>,
    operations: Operations,
}

impl<'a> Hook<'a> {
    fn new(args: &'a GuardArgs, protocol: &str) -> Hook<'a> {
        Hook {
            args,
            agent: args.agent.clone().unwrap_or_else(|| protocol.to_owned()),
            state_dir: state_dir::resolve(args.state_dir.clone(), protocol),
            operations: args.operations.operations(),
        }
    }

    fn tenant(&self) -> &str {
        &self.args.tenant
    }

    fn allowed(&self) -> bool {
        self.args.on_error == OnError::Allow
    }

    /// When the fallback answer is printed whatever is still going on.
    fn deadline(&self) -> Duration {
        self.args.timeout + DEADLINE_MARGIN
    }

    fn runs(&self) -> SessionRuns {
        SessionRuns::new(self.state_dir.clone())
    }

    /// What the daemon's answer (or its absence) means for the call.
    fn outcome<'g>(&self, gate: &'g Gate) -> Outcome<'g> {
        outcome_of(gate, self.allowed())
    }

    fn sub_agents(&self) -> SubAgents {
        SubAgents::new(self.state_dir.clone())
    }

    /// Connect and ask, the two together within `--timeout`. For a resumed session,
    /// first whether its run was closed by its end; then the session goes on in its next
    /// run (`session` names it).
    fn ask(&self, event: &mut fusebox_core::Event, resumed: Option<&str>) -> Gate {
        let mut events = vec![event.clone()];
        let gate = self.ask_in_order(&mut events, resumed, None).pop();
        *event = events.pop().expect("one event");
        gate.expect("one gate at least")
    }

    /// [`Hook::ask`] for an event of a run of a tree whose root run is `root` (a
    /// sub-agent's, when the agent says which tree it is in): asked on the tree's
    /// subject ([`gate_in_order`]). `None`: a root's event, as [`Hook::ask`].
    fn ask_in_tree(&self, event: &mut fusebox_core::Event, root: Option<&str>) -> Gate {
        let mut events = vec![event.clone()];
        let gate = self.ask_in_order(&mut events, None, root).pop();
        *event = events.pop().expect("one event");
        gate.expect("one gate at least")
    }

    /// [`Hook::ask`] for several events of one hook, in order (a sub-agent's start, then
    /// its call): each is sent once the one before was decided, all within `--timeout`.
    /// Their gates as far as they went, never none: the last is what the hook answers.
    /// `resumed` applies to the first event; `session_run`: the session's run, the root of
    /// its sub-agents' tree ([`gate_in_order`]).
    fn ask_in_order(
        &self,
        events: &mut [fusebox_core::Event],
        resumed: Option<&str>,
        session_run: Option<&str>,
    ) -> Vec<Gate> {
        let args = self.args;
        let unanswered = |error| Gate::Unanswered {
            error,
            allowed: self.allowed(),
        };
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => return vec![unanswered(ClientError::Usage(e.to_string()))],
        };
        let options = ClientOptions {
            timeout: args.timeout,
            gate_on_error: match args.on_error {
                OnError::Deny => GateOnError::Deny,
                OnError::Allow => GateOnError::Allow,
            },
        };
        let runs = self.runs();
        let mut gates = Vec::new();
        runtime.block_on(async {
            let asked = async {
                let client = match args.connection.connect(&args.tenant, options).await {
                    Ok(client) => client,
                    Err(error) => return gates.push(unanswered(error)),
                };
                if let (Some(session), Some(first)) = (resumed, events.first_mut()) {
                    continue_resumed(&client, &runs, first, session).await;
                }
                // A resumed session's events are its own (its start), never a sub-agent's.
                let tree_root = session_run.filter(|_| resumed.is_none());
                gate_in_order(&client, events, tree_root, &mut gates).await;
            };
            if tokio::time::timeout(args.timeout, asked).await.is_err() {
                gates.push(unanswered(ClientError::Timeout {
                    subject: format!("{} (connect + answer)", args.connection.nats_url),
                    timeout_ms: args.timeout.as_millis() as u64,
                }));
            }
        });
        if gates.is_empty() {
            // Nothing to ask: the hook has nothing to say either.
            gates.push(unanswered(ClientError::Usage(
                "no event to send".to_owned(),
            )));
        }
        gates
    }
}

/// A session resumed after its end (its run COMPLETED) goes on in its next run.
pub async fn continue_resumed(
    client: &fusebox_client::FuseboxClient,
    runs: &SessionRuns,
    event: &mut fusebox_core::Event,
    session: &str,
) {
    let status = client.run_status(&event.tenant, &event.run).await;
    let ended = status
        .is_ok_and(|s| !s.summary.open && s.summary.terminal_state.as_deref() == Some("COMPLETED"));
    if ended {
        match runs.advance(&event.tenant, session) {
            Ok(next) => event.run = next,
            Err(e) => eprintln!("fusebox: cannot record the session's next run: {e}"),
        }
    }
}

/// Asks the daemon about `events` in order, each once the one before was decided (a
/// sub-agent's start before its call: a call of a run that was never started would make
/// it a root), pushing each gate onto `gates`; stops at the first not decided. An event
/// of another run than `session_run` is a sub-agent's: it is asked on its tree's
/// subject, naming the session's run as its root, so a cluster serves the session and
/// its sub-agents on one daemon and their budgets stay exact.
pub async fn gate_in_order(
    client: &fusebox_client::FuseboxClient,
    events: &[fusebox_core::Event],
    session_run: Option<&str>,
    gates: &mut Vec<Gate>,
) {
    for event in events {
        let root = session_run.unwrap_or(&event.run);
        let gate = gate_result_fitted(client, root, event).await;
        let decided = matches!(gate, Gate::Decided(_));
        gates.push(gate);
        if !decided {
            return;
        }
    }
}

/// Asks the daemon about `event`; a result it refuses as too large (its
/// `max_event_bytes` below `--max-stored-result-bytes`) is sent again as its hash, which
/// still completes or releases the call's op_key.
pub async fn gate_result_fitted(
    client: &fusebox_client::FuseboxClient,
    root: &str,
    event: &fusebox_core::Event,
) -> Gate {
    let gate = client.gate_in_tree(root, event).await;
    // The hashed copy is made only for a refusal: every result passes here.
    if let Gate::Refused(error) = &gate {
        if let Some(hashed) = (error.reason == "too_large")
            .then(|| with_result_hashed(event))
            .flatten()
        {
            eprintln!(
                "fusebox: {}: {}; sending the result's hash instead",
                event.id, error.message
            );
            return client.gate_in_tree(root, &hashed).await;
        }
    }
    gate
}

/// The payload on stdin, whole.
fn read_stdin() -> Result<Vec<u8>, String> {
    let mut input = Vec::new();
    std::io::stdin()
        .read_to_end(&mut input)
        .map_err(|e| format!("cannot read the hook payload: {e}"))?;
    Ok(input)
}

/// A line on stderr for the user's hook log when the guard gave no decision.
fn log_failure(event_name: &str, event_id: &str, outcome: &Outcome) {
    if let Outcome::Failed { why, .. } = outcome {
        eprintln!("fusebox: {event_name} {event_id}: {why}");
    }
}

/// The transcript's length in bytes, when its file is readable here: what tells one
/// compaction from the next (the hooks' compaction ids).
pub fn transcript_len(path: Option<&str>) -> Option<u64> {
    std::fs::metadata(path?).ok().map(|meta| meta.len())
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What the daemon's answer (or its absence) means for a call: its decision, or a
/// failure that lets the call run only when `allowed` (`--on-error allow`) and the
/// daemon did not refuse the event. The command hooks and `fusebox hook serve` share it.
pub fn outcome_of(gate: &Gate, allowed: bool) -> Outcome<'_> {
    match gate {
        Gate::Decided(decision) => Outcome::Decided(decision),
        Gate::Refused(error) => Outcome::Failed {
            why: format!("fuseboxd refused the event: {}", error.message),
            allowed: false,
        },
        Gate::Unanswered { error, .. } => Outcome::Failed {
            why: error.to_string(),
            allowed,
        },
    }
}
