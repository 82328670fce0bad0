use std::io::Write;

use serde::Serialize;

use crate::error::LogError;
use crate::log::records;
use crate::record::Record;
use crate::store::EventLog;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ExportSummary {
    pub events: u64,
    /// Operation records (policy changes, prunes, forgotten ledger keys) have no JSONL
    /// form and are left out: replaying an export whose log changed policies or pruned
    /// runs that later came back can decide differently from the log.
    pub operations_skipped: u64,
}

/// Writes every event of the log, in log order, as JSONL that `fusebox replay` reads:
/// each stored event decoded and written in its wire JSON form.
pub fn export<L: EventLog>(log: &L, out: &mut dyn Write) -> Result<ExportSummary, LogError> {
    let mut summary = ExportSummary::default();
    let mut line = Vec::with_capacity(512);
    for item in records(log, 1) {
        match item? {
            (_, Record::Op(_)) => summary.operations_skipped += 1,
            (_, Record::Event(event)) => {
                line.clear();
                serde_json::to_writer(&mut line, &event).map_err(|e| LogError::Export(e.into()))?;
                line.push(b'\n');
                out.write_all(&line).map_err(LogError::Export)?;
                summary.events += 1;
            }
        }
    }
    out.flush().map_err(LogError::Export)?;
    Ok(summary)
}
