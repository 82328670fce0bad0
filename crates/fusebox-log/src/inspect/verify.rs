use std::collections::{BTreeMap, HashMap};

use fusebox_core::sequencer::DEFAULT_MAX_HELD;
use serde::Serialize;

use crate::error::LogError;
use crate::keys::{self, FORMAT_VERSION, FORMAT_VERSION_KEY};
use crate::log::{last_position, records, snapshot_positions};
use crate::record::{LogOp, Record};
use crate::snapshot;
use crate::state::LogState;
use crate::store::{EventLog, Tree};

/// Problems listed in full; more are only counted.
const MAX_PROBLEMS: usize = 50;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct VerifyReport {
    pub records: u64,
    pub events: u64,
    pub operations: u64,
    /// Decisions re-derived by replay and found identical, byte for byte.
    pub decisions_matched: u64,
    /// Snapshots that decoded and equal the replayed state at their position.
    pub snapshots_matched: u64,
    pub ids_checked: u64,
    pub ledger_keys: u64,
    pub problems: Vec<String>,
    pub problems_omitted: u64,
}

impl VerifyReport {
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    fn problem(&mut self, text: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(text);
        } else {
            self.problems_omitted += 1;
        }
    }
}

/// Checks the whole log: the format version; records contiguous from position 1 and
/// each decoding; every decision re-derived byte for byte by replaying from scratch;
/// every snapshot decoding and equal to the replayed state at its position; the ids
/// and ledger trees consistent with the replay. Problems are collected, not raised;
/// `Err` is for a store that cannot be read at all.
pub fn verify<L: EventLog>(log: &L) -> Result<VerifyReport, LogError> {
    let mut report = VerifyReport::default();
    match log.get(Tree::Meta, FORMAT_VERSION_KEY)? {
        Some(v) if v.as_ref() == FORMAT_VERSION.to_string().as_bytes() => {}
        other => report.problem(format!(
            "format version is {:?}, expected {FORMAT_VERSION}",
            other.map(|v| String::from_utf8_lossy(v.as_ref()).into_owned())
        )),
    }
    let mut snapshots = load_snapshots(log, &mut report)?;
    let state = replay_and_compare(log, &mut report, &mut snapshots)?;
    for pos in snapshots.into_keys() {
        report.problem(format!(
            "snapshot at position {pos} is beyond the log's end {}",
            state.position
        ));
    }
    check_ids(log, &mut report, &state)?;
    check_ledger(log, &mut report, &state)?;
    let decisions = log.scan(Tree::Decisions, &[]).count() as u64;
    if decisions != report.events {
        report.problem(format!(
            "{decisions} decisions stored for {} events",
            report.events
        ));
    }
    Ok(report)
}

fn load_snapshots<L: EventLog>(
    log: &L,
    report: &mut VerifyReport,
) -> Result<BTreeMap<u64, LogState>, LogError> {
    let mut snapshots = BTreeMap::new();
    for pos in snapshot_positions(log)? {
        let Some(bytes) = log.get(Tree::Snapshots, &keys::position(pos))? else {
            continue;
        };
        match snapshot::decode(bytes.as_ref()) {
            Ok(state) if state.position == pos => {
                snapshots.insert(pos, state);
            }
            Ok(state) => report.problem(format!(
                "snapshot at position {pos} holds position {}",
                state.position
            )),
            Err(why) => report.problem(format!(
                "snapshot at position {pos} is unusable ({why}); start-up skips it"
            )),
        }
    }
    Ok(snapshots)
}

/// Replays from scratch, comparing decisions and snapshots on the way. Also counts
/// the events of each run still in the log (for the ids check).
fn replay_and_compare<L: EventLog>(
    log: &L,
    report: &mut VerifyReport,
    snapshots: &mut BTreeMap<u64, LogState>,
) -> Result<ReplayedLog, LogError> {
    let mut state = LogState::new(DEFAULT_MAX_HELD);
    let mut run_events: HashMap<Vec<u8>, u64> = HashMap::new();
    let end = last_position(log)?;
    for item in records(log, 1) {
        let (pos, record) = match item {
            Ok(item) => item,
            Err(LogError::Corrupt { what, detail, .. }) => {
                report.problem(format!("{what}: {detail}; replay stops here"));
                break;
            }
            Err(other) => return Err(other),
        };
        report.records += 1;
        match &record {
            Record::Event(event) => {
                report.events += 1;
                *run_events
                    .entry(keys::run_prefix(&event.tenant, &event.run))
                    .or_default() += 1;
            }
            Record::Op(op) => {
                report.operations += 1;
                if let LogOp::Prune { runs } = op {
                    for run in runs {
                        run_events.remove(&keys::run_prefix(&run.tenant, &run.run));
                    }
                }
            }
        }
        if let Some(decision) = state.apply(&record)? {
            let derived = serde_json::to_vec(&decision).map_err(|source| LogError::Encode {
                what: "a decision",
                source,
            })?;
            match log.get(Tree::Decisions, &keys::position(pos))? {
                Some(stored) if stored.as_ref() == derived => report.decisions_matched += 1,
                Some(stored) => report.problem(format!(
                    "decision at position {pos} differs from replay: stored {}, replayed {}",
                    String::from_utf8_lossy(stored.as_ref()),
                    String::from_utf8_lossy(&derived)
                )),
                None => report.problem(format!("decision at position {pos} is missing")),
            }
        }
        if let Some(snapshot) = snapshots.remove(&pos) {
            compare_snapshot(report, pos, &snapshot, &state);
        }
    }
    if report.records != end {
        report.problem(format!(
            "{} records readable of {end} written",
            report.records
        ));
    }
    Ok(ReplayedLog {
        position: state.position,
        state,
        run_events,
    })
}

fn compare_snapshot(report: &mut VerifyReport, pos: u64, snapshot: &LogState, state: &LogState) {
    // The sequencer's held-event bound is configuration, not state: compare the rest.
    if snapshot.engine == state.engine && snapshot.event_time_ms == state.event_time_ms {
        report.snapshots_matched += 1;
    } else {
        report.problem(format!(
            "snapshot at position {pos} differs from the replayed state"
        ));
    }
}

struct ReplayedLog {
    position: u64,
    state: LogState,
    run_events: HashMap<Vec<u8>, u64>,
}

/// Every id entry points at the event with that id, and every event of a run still in
/// the log has one.
fn check_ids<L: EventLog>(
    log: &L,
    report: &mut VerifyReport,
    replayed: &ReplayedLog,
) -> Result<(), LogError> {
    let mut per_run: HashMap<Vec<u8>, u64> = HashMap::new();
    for item in log.scan(Tree::Ids, &[]) {
        let (key, value) = item?;
        report.ids_checked += 1;
        let Some(pos) = keys::decode_position(value.as_ref()) else {
            report.problem("an id entry holds no position".to_owned());
            continue;
        };
        let points_right = match log.get(Tree::Events, &keys::position(pos))? {
            Some(bytes) => match crate::record::decode(bytes.as_ref()) {
                Ok(Record::Event(e)) => keys::event_id(&e.tenant, &e.run, &e.id) == key.as_ref(),
                _ => false,
            },
            None => false,
        };
        if !points_right {
            report.problem(format!(
                "id entry {:?} points at position {pos}, which is not that event",
                String::from_utf8_lossy(key.as_ref())
            ));
        }
        if let Some(run) = keys::split_run(key.as_ref()) {
            let mut prefix = run.to_vec();
            prefix.push(0);
            *per_run.entry(prefix).or_default() += 1;
        }
    }
    for (run, events) in &replayed.run_events {
        let ids = per_run.get(run).copied().unwrap_or(0);
        if ids < *events {
            report.problem(format!(
                "run {:?} has {events} events but {ids} id entries",
                String::from_utf8_lossy(run)
            ));
        }
    }
    Ok(())
}

fn check_ledger<L: EventLog>(
    log: &L,
    report: &mut VerifyReport,
    replayed: &ReplayedLog,
) -> Result<(), LogError> {
    let mut wanted = BTreeMap::new();
    for (tenant, op_key, entry) in replayed.state.engine.ledger().iter() {
        let bytes = serde_json::to_vec(entry).map_err(|source| LogError::Encode {
            what: "a ledger entry",
            source,
        })?;
        wanted.insert(keys::ledger(tenant, op_key), bytes);
    }
    for item in log.scan(Tree::Ledger, &[]) {
        let (key, value) = item?;
        report.ledger_keys += 1;
        if wanted.remove(key.as_ref()).as_deref() != Some(value.as_ref()) {
            report.problem(format!(
                "ledger entry {:?} differs from the replayed ledger",
                String::from_utf8_lossy(key.as_ref())
            ));
        }
    }
    for key in wanted.keys() {
        report.problem(format!(
            "ledger entry {:?} is missing",
            String::from_utf8_lossy(key)
        ));
    }
    Ok(())
}
