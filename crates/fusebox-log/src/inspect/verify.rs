use std::collections::{BTreeMap, HashMap};

use fusebox_core::ledger::Ledger;
use fusebox_core::sequencer::DEFAULT_MAX_HELD;
use serde::Serialize;

use crate::error::LogError;
use crate::keys::{self, FORMAT_VERSION, FORMAT_VERSION_KEY};
use crate::log::{decode_frame, frames, last_position, snapshot_bytes, snapshot_positions};
use crate::record::{self, Record};
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
    /// Entries of the replayed dedup index checked against the event they point at.
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
/// every snapshot decoding and equal to the replayed state at its position; the dedup
/// index pointing at the right events; the ledger tree equal to the replayed ledger at
/// the position it says it holds. Problems are collected, not raised; `Err` is for a
/// store that cannot be read at all.
pub fn verify<L: EventLog>(log: &L) -> Result<VerifyReport, LogError> {
    let mut report = VerifyReport::default();
    match log.get(Tree::Meta, FORMAT_VERSION_KEY)? {
        Some(v) if keys::is_readable_format(v.as_ref()) => {}
        other => report.problem(format!(
            "format version is {:?}, expected {FORMAT_VERSION} (this build reads {:?})",
            other.map(|v| String::from_utf8_lossy(v.as_ref()).into_owned()),
            keys::READABLE_FORMATS
        )),
    }
    let mut snapshots = load_snapshots(log, &mut report)?;
    let ledger_position = ledger_position(log, &mut report)?;
    let state = replay_and_compare(log, &mut report, &mut snapshots, ledger_position)?;
    for pos in snapshots.into_keys() {
        report.problem(format!(
            "snapshot at position {pos} is beyond the log's end {}",
            state.position
        ));
    }
    check_index(&mut report, &state);
    match (ledger_position, &state.ledger_at) {
        (Some(_), Some(ledger)) => check_ledger(log, &mut report, ledger)?,
        (Some(pos), None) => report.problem(format!(
            "the ledger tree holds position {pos}, beyond the log's end {}",
            state.position
        )),
        (None, _) => {}
    }
    Ok(report)
}

/// The position whose ledger the ledger tree holds; a problem when it does not say.
fn ledger_position<L: EventLog>(
    log: &L,
    report: &mut VerifyReport,
) -> Result<Option<u64>, LogError> {
    let found = log.get(Tree::Ledger, keys::LEDGER_POSITION_KEY)?;
    let pos = found
        .as_ref()
        .and_then(|v| keys::decode_position(v.as_ref()));
    if pos.is_none() {
        report.problem("the ledger tree does not say which position it holds".to_owned());
    }
    Ok(pos)
}

fn load_snapshots<L: EventLog>(
    log: &L,
    report: &mut VerifyReport,
) -> Result<BTreeMap<u64, LogState>, LogError> {
    let mut snapshots = BTreeMap::new();
    for pos in snapshot_positions(log)? {
        let Some(bytes) = snapshot_bytes(log, pos)? else {
            continue;
        };
        match snapshot::decode(&bytes) {
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

/// Replays from scratch, comparing decisions and snapshots on the way. Also notes
/// the id of the event at each position (for the index check).
fn replay_and_compare<L: EventLog>(
    log: &L,
    report: &mut VerifyReport,
    snapshots: &mut BTreeMap<u64, LogState>,
    ledger_position: Option<u64>,
) -> Result<ReplayedLog, LogError> {
    let mut state = LogState::new(DEFAULT_MAX_HELD);
    let mut ids: HashMap<u64, (String, String, u64)> = HashMap::new();
    let mut ledger_at = (ledger_position == Some(0)).then(Ledger::default);
    let end = last_position(log)?;
    'frames: for frame in frames(log, 1) {
        let (first, frame) = match frame
            .and_then(|(first, bytes)| Ok((first, decode_frame(log, first, bytes.as_ref())?)))
        {
            Ok(frame) => frame,
            Err(LogError::Corrupt { what, detail, .. }) => {
                report.problem(format!("{what}: {detail}; replay stops here"));
                break;
            }
            Err(other) => return Err(other),
        };
        for (pos, entry) in (first..).zip(frame.entries()) {
            let record = match entry.decode() {
                Ok(record) => record,
                Err(detail) => {
                    report.problem(format!("position {pos}: {detail}; replay stops here"));
                    break 'frames;
                }
            };
            report.records += 1;
            match &record {
                Record::Event(event) => {
                    report.events += 1;
                    ids.insert(
                        pos,
                        (
                            event.tenant.clone(),
                            event.run.clone(),
                            fusebox_core::sequencer::id_hash(&event.id),
                        ),
                    );
                }
                Record::Op(_) => report.operations += 1,
            }
            if let Some(decision) = state.apply(&record)? {
                let derived = record::encode(&decision, "a decision")?;
                if entry.decision == derived.as_slice() {
                    report.decisions_matched += 1;
                } else if entry.decision.is_empty() {
                    report.problem(format!("decision at position {pos} is missing"));
                } else {
                    report.problem(format!(
                        "decision at position {pos} differs from replay: stored {}, replayed {}",
                        describe(entry.decode_decision()),
                        describe(Ok(decision))
                    ));
                }
            }
            if let Some(snapshot) = snapshots.remove(&pos) {
                compare_snapshot(report, pos, &snapshot, &state);
            }
            if ledger_position == Some(pos) {
                ledger_at = Some(state.engine.ledger().clone());
            }
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
        ids,
        ledger_at,
    })
}

/// A decision as JSON for a report, or why it does not decode.
fn describe(decision: Result<fusebox_core::Decision, String>) -> String {
    match decision {
        Ok(decision) => serde_json::to_string(&decision).unwrap_or_else(|e| e.to_string()),
        Err(why) => why,
    }
}

fn compare_snapshot(report: &mut VerifyReport, pos: u64, snapshot: &LogState, state: &LogState) {
    // The sequencer's held-event bound is configuration, not state: compare the rest.
    if snapshot.engine == state.engine
        && snapshot.event_time_ms == state.event_time_ms
        && snapshot.applied.same_state(&state.applied)
        && snapshot.ledger_times == state.ledger_times
    {
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
    /// Position → tenant, run and id hash of the event there.
    ids: HashMap<u64, (String, String, u64)>,
    /// The replayed ledger at the position the ledger tree holds.
    ledger_at: Option<Ledger>,
}

/// Every entry of the replayed dedup index points at the event with that id.
fn check_index(report: &mut VerifyReport, replayed: &ReplayedLog) {
    for (tenant, run, hash, pos) in replayed.state.applied.recorded() {
        report.ids_checked += 1;
        let right = replayed
            .ids
            .get(&pos)
            .is_some_and(|(t, r, h)| t == tenant && r == run && *h == hash);
        if !right {
            report.problem(format!(
                "the index entry of run {tenant}/{run} points at position {pos}, which is not that event"
            ));
        }
    }
}

fn check_ledger<L: EventLog>(
    log: &L,
    report: &mut VerifyReport,
    ledger: &Ledger,
) -> Result<(), LogError> {
    let mut wanted = BTreeMap::new();
    for (tenant, op_key, entry) in ledger.iter() {
        let bytes = record::encode(entry, "a ledger entry")?;
        wanted.insert(keys::ledger(tenant, op_key), bytes);
    }
    for item in log.scan(Tree::Ledger, &[]) {
        let (key, value) = item?;
        if key.as_ref() == keys::LEDGER_POSITION_KEY {
            continue;
        }
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
