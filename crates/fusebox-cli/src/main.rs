//! `fusebox`: the operator's and the scripts' command line.

mod config;
mod generate;
mod replay;

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use fusebox_core::Preset;

#[derive(Parser)]
#[command(
    name = "fusebox",
    version,
    about = "Guard fleets of AI agents against runaway tool loops and forgotten cloud instances.",
    long_about = "fusebox decides, at the tool-execution boundary, whether an agent's next tool call \
                  runs, is warned about, is answered from a completed operation, is blocked, or ends \
                  the run. This command replays event traces offline, generates benchmark traces, \
                  and (with a running fuseboxd) inspects and steers runs."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum PresetArg {
    Strict,
    Balanced,
    Lenient,
}

impl From<PresetArg> for Preset {
    fn from(arg: PresetArg) -> Self {
        match arg {
            PresetArg::Strict => Preset::Strict,
            PresetArg::Balanced => Preset::Balanced,
            PresetArg::Lenient => Preset::Lenient,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run JSONL event files through the guard engine, offline.
    ///
    /// Prints one decision JSON per line on stdout for every tool_call, every
    /// tool_result and every other event whose decision changes something, then one
    /// {"summary":…} line per run. A readable summary goes to stderr. Bad lines are
    /// reported as FILE:LINE: reason: message on stderr and skipped; the good ones still
    /// count. Exit status: 0 when every line was good, 2 when any was not.
    ///
    /// Example: fusebox replay --preset strict ../shared/fixtures/*.jsonl
    #[command(verbatim_doc_comment)]
    Replay {
        /// A fusebox.toml whose [guard] preset, [policy] and [agents.*.policy] apply.
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// Start from this preset instead of the file's (default: balanced).
        #[arg(long, value_enum)]
        preset: Option<PresetArg>,
        /// No summary on stderr (errors are still reported).
        #[arg(long, short)]
        quiet: bool,
        /// JSONL files, in order; "-" reads stdin.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<String>,
    },
    /// Write a deterministic mixed trace (JSONL) for benchmarks and soak tests.
    ///
    /// Runs interleave; each takes one of the shapes agents really take: pagination,
    /// an advancing poll, batch writes, side effects with op_keys, a runaway repeat,
    /// a ping-pong, a flaky tool. The same seed gives the same bytes.
    ///
    /// Example: fusebox generate --events 1000000 --out /tmp/trace.jsonl
    #[command(verbatim_doc_comment)]
    Generate {
        /// How many events to write.
        #[arg(long, default_value_t = 1_000_000)]
        events: u64,
        /// How many runs are interleaved at any moment.
        #[arg(long, default_value_t = 256)]
        concurrent_runs: u64,
        /// How many tenants the runs are spread over.
        #[arg(long, default_value_t = 8)]
        tenants: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output file (default: stdout).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Replay {
            policy,
            preset,
            quiet,
            files,
        } => config::load(policy.as_deref(), preset.map(Preset::from)).and_then(|config| {
            replay::run(&config, &files, quiet)
                .map_err(|e| e.to_string())
                .map(|all_good| {
                    if all_good {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(2)
                    }
                })
        }),
        Command::Generate {
            events,
            concurrent_runs,
            tenants,
            seed,
            out,
        } => {
            let options = generate::Options {
                events,
                concurrent_runs,
                seed,
                tenants,
            };
            let written = match out {
                Some(path) => File::create(&path)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
                    .and_then(|file| generate::generate(&options, &mut BufWriter::new(file))),
                None => generate::generate(&options, &mut BufWriter::new(io::stdout().lock())),
            };
            written
                .map(|()| ExitCode::SUCCESS)
                .map_err(|e| e.to_string())
        }
    };
    result.unwrap_or_else(|message| {
        eprintln!("fusebox: {message}");
        ExitCode::from(2)
    })
}
