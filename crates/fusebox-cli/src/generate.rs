//! `fusebox generate`: the project's benchmark workload (`fusebox_log::workload`) as a
//! JSONL trace, for `fusebox replay`, `fusebox whatif` and soak tests. The same options
//! give the same bytes.

use std::io::{self, Write};

use fusebox_log::workload::{Workload, WorkloadConfig};

pub struct Options {
    pub events: u64,
    pub concurrent_runs: u64,
    pub seed: u64,
    pub tenants: u64,
}

/// Writes `options.events` events as JSONL.
pub fn generate(options: &Options, out: &mut dyn Write) -> io::Result<()> {
    let workload = Workload::new(WorkloadConfig {
        seed: options.seed,
        tenants: u32::try_from(options.tenants.max(1)).unwrap_or(u32::MAX),
        concurrent_runs: usize::try_from(options.concurrent_runs.max(1)).unwrap_or(usize::MAX),
        ..WorkloadConfig::default()
    });
    for event in workload.take(usize::try_from(options.events).unwrap_or(usize::MAX)) {
        serde_json::to_writer(&mut *out, &event)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}
