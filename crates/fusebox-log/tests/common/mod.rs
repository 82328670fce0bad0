//! Helpers shared by the integration tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::Path;
use std::time::Duration;

use fusebox_core::{parse_event, Event, PolicySet};
use fusebox_log::log::replay_into;
use fusebox_log::{EventLog, Guard, GuardOptions, LogState};

/// One event from compact JSON, with the envelope filled in.
pub fn ev(run: &str, seq: u64, ts_ms: u64, body: &str) -> Event {
    let json = format!(
        r#"{{"v":1,"id":"{run}-{seq}","tenant":"acme","run":"{run}","seq":{seq},"ts_ms":{ts_ms},{body}}}"#
    );
    parse_event(json.as_bytes()).unwrap_or_else(|e| panic!("{json}: {e}"))
}

pub fn options(snapshot_every_records: u64) -> GuardOptions {
    GuardOptions {
        snapshot_every_records,
        snapshot_every_event_time: Duration::ZERO,
        retention: None,
        ..GuardOptions::default()
    }
}

pub fn open(dir: &Path, options: GuardOptions) -> Guard {
    Guard::open(dir, PolicySet::default(), options).expect("open the log")
}

/// The state a replay of the whole log gives, from an empty engine.
pub fn full_replay<L: EventLog>(log: &L) -> LogState {
    let mut state = LogState::new(fusebox_core::sequencer::DEFAULT_MAX_HELD);
    replay_into(log, &mut state).expect("replay the log");
    state
}
