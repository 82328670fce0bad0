//! `fusebox-watchdog`: the operator's view of the cloud cost watchdog.
//! `fusebox watchdog …` forwards here, so the AWS SDK never slows the main CLI's build.

mod cli;
mod table;

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use fusebox_watchdog::{Ec2Provider, MemorySink, PermissionStatus, SystemClock, Watchdog};

use cli::{Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // As fuseboxd: the credential chain's warning on every call is noise
                // beside the watchdog's own error.
                .unwrap_or_else(|_| "warn,aws_config=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fusebox-watchdog: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let cfg = cli.config()?;
    let provider = Ec2Provider::from_env(&cfg).await;
    let sink = Arc::new(MemorySink::default());
    let wd = Watchdog::new(cfg, provider, Arc::new(SystemClock), sink.clone())?;
    match cli.command {
        Command::List => {
            let inv = wd.inventory().await;
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&inv)?);
            } else {
                print!("{}", table::inventory(&inv));
            }
            Ok(exit_for(inv.region_errors.is_empty()))
        }
        Command::Sweep { .. } => {
            let report = wd.sweep().await;
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", table::sweep(&report, &sink.snapshot()));
            }
            Ok(exit_for(report.region_errors.is_empty()))
        }
        Command::Check => {
            let checks = wd.check_permissions().await;
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&checks)?);
            } else {
                for c in &checks {
                    println!("{}", c.describe());
                }
            }
            Ok(exit_for(
                checks.iter().all(|c| c.status == PermissionStatus::Granted),
            ))
        }
    }
}

/// 0 when everything could be done, 1 when some region or permission failed.
fn exit_for(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
