//! Debian's `prometheus` on a free loopback port, scraping given targets every second
//! with given rule files, and instant queries against its HTTP API.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::http::{http_get, url_encode, wait_http_ok};
use crate::paths::require_tool;
use crate::ports::free_port;
use crate::proc::Proc;

pub struct Prometheus {
    pub port: u16,
    proc: Proc,
}

impl Prometheus {
    /// Starts Prometheus with its config, TSDB and log under `dir`, scraping
    /// `127.0.0.1:<port>` of each of `targets` (job `fuseboxd`) and evaluating
    /// `rule_files` every second; returns once it is ready.
    pub fn start(dir: &Path, targets: &[u16], rule_files: &[PathBuf]) -> Prometheus {
        let port = free_port();
        let config = dir.join("prometheus.yml");
        let rules: String = rule_files
            .iter()
            .map(|f| format!("  - {}\n", f.display()))
            .collect();
        let targets: Vec<String> = targets
            .iter()
            .map(|p| format!("\"127.0.0.1:{p}\""))
            .collect();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n{rules}\
                 scrape_configs:\n  - job_name: fuseboxd\n    static_configs:\n      \
                 - targets: [{}]\n",
                targets.join(", ")
            ),
        )
        .expect("writing prometheus.yml");
        let mut cmd = Command::new(require_tool("prometheus"));
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"));
        let mut proc = Proc::spawn("prometheus", cmd, &dir.join("prometheus.log"));
        wait_http_ok(&mut proc, port, "/-/ready", Duration::from_secs(30));
        Prometheus { port, proc }
    }

    pub fn logs(&self) -> String {
        self.proc.logs()
    }

    /// Instant query: the number of series returned, or Prometheus's error.
    pub fn query(&self, expr: &str) -> Result<usize, String> {
        let (status, body) = http_get(
            self.port,
            &format!("/api/v1/query?query={}", url_encode(expr)),
        )
        .map_err(|e| format!("HTTP: {e}"))?;
        let reply: Value = serde_json::from_str(&body)
            .map_err(|e| format!("HTTP {status}, not JSON ({e}): {body}"))?;
        if reply["status"] != "success" {
            return Err(format!("{}: {}", reply["errorType"], reply["error"]));
        }
        Ok(match &reply["data"]["result"] {
            Value::Array(series) => series.len(),
            // A scalar or string result is one value.
            _ => 1,
        })
    }
}
