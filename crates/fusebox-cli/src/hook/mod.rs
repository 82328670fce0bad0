//! `fusebox hook <agent>`: the command hooks (`fusebox_hook_command`, also built as the
//! lean `fusebox-hook` binary the printed settings install) and `fusebox hook serve`,
//! Claude Code's hooks over HTTP.

mod serve;

use std::process::ExitCode;

use clap::Subcommand;

#[derive(clap::Args)]
pub struct HookArgs {
    #[command(subcommand)]
    command: HookCommand,
}

#[derive(Subcommand)]
enum HookCommand {
    #[command(flatten)]
    Agent(fusebox_hook_command::Agent),
    /// Claude Code's hooks over HTTP: no process per tool call, one NATS connection.
    ///
    /// Setup: run `fusebox hook serve` (as a service), then paste the block of
    /// `fusebox hook claude-code --print-settings --http http://127.0.0.1:7474/claude-code`:
    /// every HTTP entry has `onFailure: "block"`, so an endpoint that is down or refuses a
    /// request blocks the call (SessionStart stays a command: Claude Code does not send it
    /// over HTTP). A non-loopback --listen needs --tokens (bearer token per
    /// tenant); print the settings with --token-env VAR. See docs/agents/claude-code.md.
    #[command(verbatim_doc_comment)]
    Serve(serve::ServeArgs),
}

pub fn run(args: HookArgs) -> Result<ExitCode, String> {
    match &args.command {
        HookCommand::Agent(agent) => fusebox_hook_command::run(agent),
        HookCommand::Serve(serve) => serve::run(serve),
    }
}
