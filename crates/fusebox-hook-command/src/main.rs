//! `fusebox-hook <agent>`: the command hook a coding agent runs around every tool call
//! (the same as `fusebox hook <agent>`, without the rest of the CLI to load).

use std::process::ExitCode;

use clap::Parser;
use fusebox_hook_command::Agent;

/// Guard a coding agent's tool calls through its hook commands. Print the block to
/// install with `fusebox-hook <agent> --print-settings` (Codex: `--print-config`).
#[derive(Parser)]
#[command(name = "fusebox-hook", version)]
struct Cli {
    #[command(subcommand)]
    agent: Agent,
}

fn main() -> ExitCode {
    match fusebox_hook_command::run(&Cli::parse().agent) {
        Ok(code) => code,
        Err(why) => {
            eprintln!("fusebox-hook: {why}");
            ExitCode::from(2)
        }
    }
}
