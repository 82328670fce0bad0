//! Command-line arguments.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use fusebox_watchdog::{ConfigError, WatchdogConfig};

/// Cloud cost watchdog: lists fusebox-managed cloud instances with their deadlines and
/// terminates the overdue ones.
///
/// Only instances tagged fusebox:managed=true are ever touched. Credentials come from the
/// standard AWS chain (AWS_PROFILE, AWS_ACCESS_KEY_ID, SSO, instance role, ...).
/// Log verbosity: RUST_LOG (default warn).
#[derive(Debug, Parser)]
#[command(name = "fusebox-watchdog", version)]
pub struct Cli {
    /// fusebox TOML config; its [watchdog] table is used (defaults when absent).
    #[arg(
        long,
        short,
        global = true,
        value_name = "FILE",
        env = "FUSEBOX_CONFIG"
    )]
    pub config: Option<PathBuf>,

    /// EC2 endpoint override, e.g. http://127.0.0.1:5000 for moto_server.
    #[arg(long, global = true, value_name = "URL")]
    pub endpoint_url: Option<String>,

    /// Region to watch instead of the configured ones (repeatable).
    #[arg(long, global = true, value_name = "REGION")]
    pub region: Vec<String>,

    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List managed instances: deadline, time left, state, protection.
    List,
    /// Run one sweep now: terminate every overdue managed instance.
    Sweep {
        /// Report what would be terminated without terminating anything.
        #[arg(long)]
        dry_run: bool,
    },
    /// Check IAM permissions with EC2's DryRun flag and say what is missing.
    Check,
}

impl Cli {
    /// The config file's [watchdog] table with the command-line overrides applied.
    pub fn config(&self) -> Result<WatchdogConfig, ConfigError> {
        let mut cfg = match &self.config {
            Some(path) => WatchdogConfig::from_file(path)?,
            None => WatchdogConfig::default(),
        };
        if let Some(url) = &self.endpoint_url {
            cfg.endpoint_url = Some(url.clone());
        }
        if !self.region.is_empty() {
            cfg.regions = self.region.clone();
        }
        if let Command::Sweep { dry_run: true } = self.command {
            cfg.dry_run = true;
        }
        cfg.validate()?;
        Ok(cfg)
    }
}
