//! `fusebox watchdog …` runs the `fusebox-watchdog` binary: the AWS SDK lives in that
//! crate alone, so the main CLI never waits for it to compile.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// The `fusebox-watchdog` next to this executable, else the one on PATH.
fn locate() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("fusebox-watchdog")))
        .filter(|path| path.exists())
        .unwrap_or_else(|| PathBuf::from("fusebox-watchdog"))
}

pub fn run(args: &[String]) -> Result<ExitCode, String> {
    let binary = locate();
    let status = Command::new(&binary).args(args).status().map_err(|e| {
        format!(
            "cannot run {}: {e} (build it with `cargo build -p fusebox-watchdog`)",
            binary.display()
        )
    })?;
    Ok(ExitCode::from(
        status.code().unwrap_or(2).clamp(0, 255) as u8
    ))
}
