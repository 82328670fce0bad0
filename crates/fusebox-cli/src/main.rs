//! `fusebox`: the operator's and the scripts' command line.

mod config;
mod generate;
mod history;
mod hook;
mod ledger;
mod log_commands;
mod operate;
mod replay;
mod run_view;
mod tune;
mod watchdog_forward;
mod whatif;

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

/// Replay allocates and frees a few small strings and maps per event; mimalloc's
/// thread-local free lists make that markedly cheaper than glibc's malloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use fusebox_client::parse_duration;
use fusebox_core::Preset;

#[derive(Parser)]
#[command(
    name = "fusebox",
    after_help = "Commands that talk to a running fuseboxd (runs, run, cancel, resume, tail, bench, ui) \
                  connect as fuseboxd does: --config FILE ($FUSEBOX_CONFIG) reads its [nats] section \
                  (urls, user/password, token, nkey_seed_file, creds_file, tls_*, inbox_prefix), and \
                  --nats-url, --nats-user, --nats-password, --nats-token, --nats-nkey-seed-file, \
                  --nats-creds-file, --nats-tls-* (each also as $FUSEBOX_NATS_…) override it. \
                  Default: nats://127.0.0.1:4222 without credentials.",
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

/// How operator commands reach fuseboxd: the NATS connection settings fuseboxd itself
/// takes (a config file's [nats], flags, environment), as the `operator` user of
/// deploy/nats/accounts.conf or any user with its permissions.
#[derive(clap::Args)]
struct Remote {
    #[command(flatten)]
    nats: fusebox_client::NatsArgs,
    /// How long to wait for fuseboxd's answer.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    timeout: Duration,
    /// Print JSON (one object per line) instead of a table. Without it the table is
    /// printed, to a terminal or a pipe alike.
    #[arg(long)]
    json: bool,
}

/// `fusebox watchdog status|resume`: the daemon's watchdog, through
/// `fusebox.control.watchdog`. `resume` ends a halt of `on_blast_radius = "halt"`, which
/// otherwise holds (across restarts) whatever the overdue count does.
#[derive(Parser)]
struct WatchdogControl {
    #[command(flatten)]
    remote: Remote,
    /// Who resumes the watchdog (journaled with the resume); default $USER.
    #[arg(long)]
    by: Option<String>,
}

#[derive(Subcommand)]
enum LedgerSub {
    /// List the keys (of one TENANT, or all): state, holder, when a lease ends.
    List {
        tenant: Option<String>,
        /// Only keys in flight.
        #[arg(long)]
        in_flight: bool,
        /// At most this many entries per daemon (default 1000).
        #[arg(long)]
        limit: Option<usize>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Show one key: who holds it since when, or its stored result.
    Show {
        tenant: String,
        op_key: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Say what became of an operation: it happened (--completed RESULT_JSON: later
    /// calls with the key get that result) or it did not (--release: the next call
    /// runs). An event in the log of the run holding the key, with who did it.
    ///
    /// Example: fusebox ledger resolve acme q3-report --completed '{"sent":true}' --reason "in the mail log"
    #[command(verbatim_doc_comment)]
    Resolve {
        tenant: String,
        op_key: String,
        /// The operation happened; this JSON is its result.
        #[arg(
            long,
            value_name = "RESULT_JSON",
            conflicts_with = "release",
            required_unless_present = "release"
        )]
        completed: Option<String>,
        /// The operation did not happen, or must happen again.
        #[arg(long)]
        release: bool,
        /// The run to send it to (default: the run holding the key; needed for a key
        /// nobody holds).
        #[arg(long)]
        run: Option<String>,
        /// Who resolves it, for the audit trail (default: $USER).
        #[arg(long)]
        by: Option<String>,
        /// Why, for the audit trail.
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
}

#[derive(Subcommand)]
enum LogSub {
    /// Counts, sizes on disk, space amplification.
    Stats,
    /// Checks every record, re-derives every decision by replay, checks snapshots.
    /// Exit status 1 when the log has problems.
    Verify,
    /// Writes the applied events as JSONL that `fusebox replay` accepts: replaying the
    /// export reproduces the recorded decisions byte for byte.
    Export {
        /// Output file (default: stdout).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum BenchSub {
    /// Load-generate against fuseboxd's gate: serial round trips, N in flight, and
    /// JetStream ingest, each beside raw NATS request/reply measured in the same run.
    Gate {
        #[command(flatten)]
        remote: Remote,
        /// Serial (one in flight) gate requests.
        #[arg(long, default_value_t = 5_000)]
        serial: usize,
        /// Gate requests of the parallel measurement.
        #[arg(long, default_value_t = 100_000)]
        parallel: usize,
        /// Requests in flight in the parallel measurement.
        #[arg(long, default_value_t = 64)]
        in_flight: usize,
        /// Events published to JetStream for the ingest measurement.
        #[arg(long, default_value_t = 100_000)]
        ingest: usize,
        /// A directory on the daemon's disk (beside its data dir) where the disk's floors
        /// are measured in the same run: a 4 KiB append + fdatasync, for the serial ratio,
        /// and requests in flight to a responder that group-commits them there before
        /// answering (a durable echo), for the in-flight one.
        #[arg(long, value_name = "DIR")]
        disk_floor_dir: Option<PathBuf>,
    },
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
    /// Example: fusebox replay --preset strict crates/fusebox-core/tests/fixtures/*.jsonl
    ///          fusebox replay --from claude-code ~/.claude/projects
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
        #[command(flatten)]
        from: history::FromArgs,
        /// JSONL files, in order; "-" reads stdin. With --from: the agent's session
        /// files or directories (default: where the agent keeps them).
        #[arg(value_name = "FILE")]
        files: Vec<String>,
    },
    /// Write a deterministic mixed trace (JSONL) for benchmarks and soak tests.
    ///
    /// The workload the log's benchmarks and crash tests use (fusebox_log::workload):
    /// runs interleave; each is a mixed worker or one of the shapes agents really take
    /// (pagination, an advancing poll, batch writes, side effects with op_keys, a
    /// runaway repeat, a ping-pong, a flaky tool). The same seed gives the same bytes.
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
    /// List the runs fuseboxd knows: open or closed, outcome, events, steps.
    Runs {
        #[command(flatten)]
        remote: Remote,
    },
    /// Show one run: counters, progress, stop report, its latest decisions, and its tree
    /// of runs (the root, each sub-agent under its parent, what each subtree spent, and
    /// whose stop closed a run stopped with its ancestor).
    Run {
        /// TENANT/RUN
        run: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Cancel a run: its next tool call is refused and a stop goes out on its kill switch.
    /// Every open run below it (its sub-agents, theirs …) is stopped with it, each on its
    /// own kill switch.
    Cancel {
        /// TENANT/RUN
        run: String,
        /// Why, for the stop report.
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Ask to resume a stopped run. Accepted only on evidence of a changed precondition:
    /// a progress_version above the report's, or a new approval_id / credential_scope.
    ///
    /// Example: fusebox resume acme/r1 --evidence '{"approval_id":"CHG-1234"}'
    #[command(verbatim_doc_comment)]
    Resume {
        /// TENANT/RUN
        run: String,
        /// A JSON object naming what changed.
        #[arg(long)]
        evidence: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// The op_key ledger: operations in flight and completed, and an operator's word on
    /// one whose outcome is unknown.
    Ledger {
        #[command(subcommand)]
        command: LedgerSub,
    },
    /// Follow decisions live (all runs, a TENANT, or TENANT/RUN).
    Tail {
        run: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Inspect the durable log of a stopped fuseboxd.
    Log {
        /// fuseboxd's data directory ([storage] data_dir).
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
        #[command(subcommand)]
        command: LogSub,
    },
    /// Benchmarks against a running fuseboxd.
    Bench {
        #[command(subcommand)]
        command: BenchSub,
    },
    /// Guard a coding agent through its hook commands (see `fusebox hook claude-code --help`).
    Hook(hook::HookArgs),
    /// What a candidate policy would have done to recorded runs, run by run.
    ///
    /// Replays a data dir (live or stopped: it is copied, never opened in place), a
    /// `fusebox log export` or trace files under the baseline and the candidate, and
    /// reports runs newly stopped (completed ones first), no longer stopped, stops that
    /// move, reason changes, warnings and blocks. Exit status: 0, 1 when a run that
    /// completed would be stopped, 2 on bad input.
    ///
    /// Example: fusebox whatif --preset strict --baseline config/fusebox.toml export.jsonl
    #[command(verbatim_doc_comment)]
    Whatif(whatif::Args),
    /// Calibrate thresholds on recorded runs: per key the strictest value that stops
    /// none of the runs that completed (or at most -k of them), as a fusebox.toml
    /// fragment with a comment per key, then the whatif report of that proposal.
    ///
    /// Example: fusebox tune --baseline config/fusebox.toml export.jsonl > proposal.toml
    #[command(verbatim_doc_comment)]
    Tune(tune::Args),
    /// The cloud cost watchdog: `status` and `resume [--by NAME]` (a halt of
    /// on_blast_radius = "halt" holds until resumed) ask the running fuseboxd; list,
    /// sweep, check run the fusebox-watchdog binary.
    #[command(disable_help_flag = true)]
    Watchdog {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// MCP gateway: wraps an MCP server so every tools/call is gated by fuseboxd
    /// (`fusebox mcp --help` shows the mcpServers entry to paste).
    Mcp(fusebox_mcp::McpArgs),
    /// The operator's page: every run, live; one run's timeline and stop report; cancel,
    /// resume and ledger resolve with confirmation. Prints its URL at start.
    ///
    /// Example: fusebox ui --config /etc/fusebox/fusebox.toml --listen 127.0.0.1:8080
    #[command(verbatim_doc_comment)]
    Ui(fusebox_ui::UiArgs),
}

fn operate(remote: Remote, op: operate::Op) -> Result<ExitCode, String> {
    let target = operate::Target {
        nats: remote.nats.settings().map_err(|e| e.to_string())?,
        timeout: remote.timeout,
        json: remote.json,
    };
    operate::run(&target, op).map(|()| ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Replay {
            policy,
            preset,
            quiet,
            from,
            files,
        } => config::load(policy.as_deref(), preset.map(Preset::from)).and_then(|config| {
            let input = from.input(&files)?;
            replay::run(&config, &input, quiet)
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
        Command::Runs { remote } => operate(remote, operate::Op::Runs),
        Command::Run { run, remote } => operate(remote, operate::Op::Run { run }),
        Command::Cancel {
            run,
            reason,
            remote,
        } => operate(remote, operate::Op::Cancel { run, reason }),
        Command::Resume {
            run,
            evidence,
            remote,
        } => operate(remote, operate::Op::Resume { run, evidence }),
        Command::Tail { run, remote } => operate(remote, operate::Op::Tail { run }),
        Command::Ledger { command } => {
            let (remote, op) = match command {
                LedgerSub::List {
                    tenant,
                    in_flight,
                    limit,
                    remote,
                } => (
                    remote,
                    ledger::LedgerOp::List {
                        tenant,
                        in_flight_only: in_flight,
                        limit,
                    },
                ),
                LedgerSub::Show {
                    tenant,
                    op_key,
                    remote,
                } => (remote, ledger::LedgerOp::Show { tenant, op_key }),
                LedgerSub::Resolve {
                    tenant,
                    op_key,
                    completed,
                    release: _,
                    run,
                    by,
                    reason,
                    remote,
                } => (
                    remote,
                    ledger::LedgerOp::Resolve {
                        tenant,
                        op_key,
                        completed,
                        run,
                        by,
                        reason,
                    },
                ),
            };
            operate(remote, operate::Op::Ledger(op))
        }
        Command::Bench {
            command:
                BenchSub::Gate {
                    remote,
                    serial,
                    parallel,
                    in_flight,
                    ingest,
                    disk_floor_dir,
                },
        } => {
            let options = fusebox_client::bench::BenchOptions {
                serial,
                parallel,
                in_flight,
                ingest,
                disk_floor_dir,
                ..Default::default()
            };
            operate(remote, operate::Op::BenchGate { options })
        }
        Command::Log { data_dir, command } => {
            let command = match command {
                LogSub::Stats => log_commands::LogCommand::Stats,
                LogSub::Verify => log_commands::LogCommand::Verify,
                LogSub::Export { out } => log_commands::LogCommand::Export { out },
            };
            log_commands::run(&data_dir, command).map(|sound| {
                if sound {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                }
            })
        }
        Command::Watchdog { args } => match args.first().map(String::as_str) {
            // Status and resume talk to the daemon's watchdog; the rest is the binary's.
            Some(verb @ ("status" | "resume")) => {
                match WatchdogControl::try_parse_from(
                    [format!("fusebox watchdog {verb}")]
                        .into_iter()
                        .chain(args[1..].iter().cloned()),
                ) {
                    Ok(control) if verb == "status" => {
                        operate(control.remote, operate::Op::WatchdogStatus)
                    }
                    Ok(control) => match control.by.or_else(|| std::env::var("USER").ok()) {
                        Some(by) => operate(control.remote, operate::Op::WatchdogResume { by }),
                        None => Err("say who resumes the watchdog: --by <name>".to_owned()),
                    },
                    Err(err) => err.exit(),
                }
            }
            _ => watchdog_forward::run(&args),
        },
        Command::Mcp(args) => Ok(fusebox_mcp::main(args)),
        Command::Ui(args) => Ok(fusebox_ui::main(args)),
        Command::Hook(args) => hook::run(args),
        Command::Whatif(args) => whatif::main(args),
        Command::Tune(args) => tune::main(args),
    };
    result.unwrap_or_else(|message| {
        eprintln!("fusebox: {message}");
        ExitCode::from(2)
    })
}
