//! `fusebox log stats | verify | export`: the durable log, read offline (stop fuseboxd
//! first: sled locks its directory).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use fusebox_log::inspect;

pub enum LogCommand {
    Stats,
    Verify,
    Export { out: Option<PathBuf> },
}

/// Returns whether the log is sound (verify), or Ok(true) for the others.
pub fn run(data_dir: &Path, command: LogCommand) -> Result<bool, String> {
    let log = inspect::open(data_dir).map_err(|e| e.to_string())?;
    match command {
        LogCommand::Stats => {
            let stats = inspect::stats(&log).map_err(|e| e.to_string())?;
            println!(
                "{}",
                serde_json::to_string_pretty(&stats).map_err(|e| e.to_string())?
            );
            eprintln!(
                "{} events, {:.0} disk bytes per event, space amplification {:.2}",
                stats.events,
                stats.disk_bytes_per_event(),
                stats.space_amplification()
            );
            if stats.torn_snapshots > 0 {
                eprintln!(
                    "{} torn snapshot(s) (a write cut short by a crash): unused, and removed when the log is next opened by fuseboxd",
                    stats.torn_snapshots
                );
            }
            Ok(true)
        }
        LogCommand::Verify => {
            let report = inspect::verify(&log).map_err(|e| e.to_string())?;
            println!(
                "{}",
                serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
            );
            if report.is_ok() {
                eprintln!("log at {} is sound", data_dir.display());
            } else {
                eprintln!("log at {} has problems (see above)", data_dir.display());
            }
            Ok(report.is_ok())
        }
        LogCommand::Export { out } => {
            let mut writer: Box<dyn Write> = match &out {
                Some(path) => Box::new(BufWriter::new(
                    File::create(path).map_err(|e| format!("{}: {e}", path.display()))?,
                )),
                None => Box::new(BufWriter::new(io::stdout().lock())),
            };
            let summary = inspect::export(&log, &mut writer).map_err(|e| e.to_string())?;
            writer.flush().map_err(|e| e.to_string())?;
            eprintln!(
                "{}",
                serde_json::to_string(&summary).map_err(|e| e.to_string())?
            );
            Ok(true)
        }
    }
}
