//! `[watchdog]` configuration: every field has a default, so an empty table is valid.

use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Settings of the cloud cost watchdog. See `watchdog.example.toml` for a documented copy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WatchdogConfig {
    /// Whether `fuseboxd` runs the watchdog at all. The `fusebox-watchdog` CLI ignores it:
    /// an operator asking for a listing or a sweep means it.
    pub enabled: bool,
    /// Report "would terminate" instead of terminating.
    pub dry_run: bool,
    /// Regions to watch; each is listed on every sweep.
    pub regions: Vec<String>,
    /// Override of the EC2 endpoint (tests, private endpoints). `None`: the AWS default.
    pub endpoint_url: Option<String>,
    /// Lifetime of an instance that has neither a tag nor an event lifetime.
    pub default_max_lifetime_s: u64,
    /// Time after a run ends before its instances must be gone.
    pub grace_s: u64,
    /// `cron` crate syntax, with seconds (6 or 7 fields).
    pub sweep_cron: String,
    /// At most this many terminations in one pass.
    pub max_terminations_per_sweep: usize,
    /// At most this fraction (0..=1) of managed instances terminated in one pass (rounded up).
    pub max_termination_share: f64,
    /// What a pass does when more instances are overdue than the limit allows.
    pub on_blast_radius: BlastRadiusAction,
    /// Instance ids per TerminateInstances call.
    pub terminate_batch_size: usize,
    /// An instance younger than this that the cloud says does not exist is re-checked
    /// rather than forgotten (EC2 is eventually consistent right after a launch).
    pub not_found_grace_s: u64,
    /// Delay before re-checking an instance or run whose last check could not conclude.
    pub recheck_after_s: u64,
    pub retry: RetryConfig,
}

/// The operator's choice when a pass finds more overdue instances than the blast-radius
/// limit allows. Either way the held instances are counted and alerted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlastRadiusAction {
    /// Terminate up to the limit (earliest deadlines first), leave the rest for later
    /// passes: a fleet that is truly overdue drains at the limit's pace.
    CapPerPass,
    /// Terminate none of them and page: a pass that finds more than the limit overdue is
    /// taken as a sign the watchdog's view is wrong (bad tags, a wrong clock) until a human
    /// looks. Each later pass decides again, so it resumes by itself once the overdue
    /// count fits the limit.
    Halt,
}

/// Bounded exponential backoff for throttling, 5xx and transport errors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// Total attempts per API call, the first included.
    pub max_attempts: u32,
    pub initial_backoff_ms: u64,
    pub max_backoff_ms: u64,
}

impl Default for WatchdogConfig {
    fn default() -> Self {
        WatchdogConfig {
            enabled: true,
            dry_run: false,
            regions: vec!["us-east-1".to_owned()],
            endpoint_url: None,
            default_max_lifetime_s: 24 * 3600,
            grace_s: 300,
            sweep_cron: "0 * * * * *".to_owned(),
            max_terminations_per_sweep: 50,
            max_termination_share: 0.5,
            on_blast_radius: BlastRadiusAction::CapPerPass,
            terminate_batch_size: 100,
            not_found_grace_s: 60,
            recheck_after_s: 10,
            retry: RetryConfig::default(),
        }
    }
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: 5,
            initial_backoff_ms: 200,
            max_backoff_ms: 5_000,
        }
    }
}

impl RetryConfig {
    /// The wait before attempt `attempt + 1` (`attempt` counts from 1).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = 2u64.saturating_pow(attempt.saturating_sub(1));
        Duration::from_millis(
            self.initial_backoff_ms
                .saturating_mul(exp)
                .min(self.max_backoff_ms),
        )
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid TOML: {0}")]
    Toml(#[from] toml::de::Error),
    #[error("sweep_cron {cron:?}: {message}")]
    Cron { cron: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

impl WatchdogConfig {
    /// Reads the `[watchdog]` table of a fusebox TOML document; other tables are ignored
    /// and a missing table means all defaults.
    pub fn from_fusebox_toml(text: &str) -> Result<Self, ConfigError> {
        #[derive(Deserialize)]
        struct Root {
            #[serde(default)]
            watchdog: WatchdogConfig,
        }
        let root: Root = toml::from_str(text)?;
        root.watchdog.validate()?;
        Ok(root.watchdog)
    }

    pub fn from_file(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_fusebox_toml(&text)
    }

    /// The parsed sweep schedule.
    pub fn schedule(&self) -> Result<cron::Schedule, ConfigError> {
        cron::Schedule::from_str(&self.sweep_cron).map_err(|e| ConfigError::Cron {
            cron: self.sweep_cron.clone(),
            message: e.to_string(),
        })
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.schedule()?;
        let invalid = |m: &str| Err(ConfigError::Invalid(m.to_owned()));
        if self.regions.is_empty() {
            return invalid("regions must name at least one region");
        }
        if !(0.0..=1.0).contains(&self.max_termination_share) {
            return invalid("max_termination_share must be between 0 and 1");
        }
        if self.terminate_batch_size == 0 || self.terminate_batch_size > 1000 {
            return invalid("terminate_batch_size must be 1..=1000 (the EC2 limit)");
        }
        if self.retry.max_attempts == 0 {
            return invalid("retry.max_attempts must be at least 1");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_document_gives_defaults() {
        let c = WatchdogConfig::from_fusebox_toml("[guard]\nx = 1\n").unwrap();
        assert_eq!(c, WatchdogConfig::default());
    }

    #[test]
    fn example_file_parses_and_matches_defaults_where_commented() {
        let c =
            WatchdogConfig::from_fusebox_toml(include_str!("../watchdog.example.toml")).unwrap();
        assert_eq!(c.sweep_cron, "0 * * * * *");
        assert_eq!(
            c.regions,
            vec!["us-east-1".to_owned(), "eu-west-1".to_owned()]
        );
    }

    #[test]
    fn rejects_bad_values() {
        for bad in [
            "[watchdog]\nsweep_cron = \"every minute\"",
            "[watchdog]\nregions = []",
            "[watchdog]\nmax_termination_share = 1.5",
            "[watchdog]\nterminate_batch_size = 0",
            "[watchdog]\nunknown = 1",
        ] {
            assert!(WatchdogConfig::from_fusebox_toml(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn backoff_is_bounded() {
        let r = RetryConfig {
            max_attempts: 10,
            initial_backoff_ms: 100,
            max_backoff_ms: 1_000,
        };
        assert_eq!(r.backoff(1), Duration::from_millis(100));
        assert_eq!(r.backoff(3), Duration::from_millis(400));
        assert_eq!(r.backoff(40), Duration::from_millis(1_000));
    }
}
