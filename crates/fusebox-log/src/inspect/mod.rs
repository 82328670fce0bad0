//! `fusebox log stats | verify | export`: the operator's view of a data directory.
//!
//! These work on a stopped daemon's directory (sled takes a lock: a running daemon's
//! log cannot be opened twice). They never write, except for what sled itself does to
//! recover its files.

mod export;
mod stats;
mod verify;

use std::io;
use std::path::Path;

pub use export::{export, ExportSummary};
pub use stats::{stats, LogStats};
pub use verify::{verify, VerifyReport};

use crate::error::LogError;
use crate::sled_log::{SledLog, SledOptions};

/// Opens an existing data directory for inspection; a missing directory is an error
/// (sled would otherwise create an empty log there).
pub fn open(data_dir: &Path) -> Result<SledLog, LogError> {
    if !data_dir.is_dir() {
        return Err(LogError::Open {
            path: data_dir.to_owned(),
            source: sled::Error::Io(io::Error::new(io::ErrorKind::NotFound, "no such directory")),
        });
    }
    SledLog::open(data_dir, &SledOptions::default())
}
