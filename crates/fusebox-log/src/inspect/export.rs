use std::io::Write;

use serde::Serialize;

use crate::error::LogError;
use crate::record;
use crate::store::{EventLog, Tree};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ExportSummary {
    pub events: u64,
    /// Operation records (policy changes, prunes) have no JSONL form and are left out:
    /// replaying an export whose log changed policies or pruned runs that later came
    /// back can decide differently from the log.
    pub operations_skipped: u64,
}

/// Writes every event of the log, in log order, as JSONL that `fusebox replay` reads.
/// The stored record already is the event's wire JSON, so it is copied as is.
pub fn export<L: EventLog>(log: &L, out: &mut dyn Write) -> Result<ExportSummary, LogError> {
    let mut summary = ExportSummary::default();
    for item in log.scan(Tree::Events, &[]) {
        let (_, value) = item?;
        if record::is_op(value.as_ref()) {
            summary.operations_skipped += 1;
            continue;
        }
        out.write_all(value.as_ref()).map_err(LogError::Export)?;
        out.write_all(b"\n").map_err(LogError::Export)?;
        summary.events += 1;
    }
    out.flush().map_err(LogError::Export)?;
    Ok(summary)
}
