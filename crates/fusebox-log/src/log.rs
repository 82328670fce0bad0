//! Reading the log back: format check, the records in order, snapshots, start-up repair
//! of a batch that was cut short, and the rebuild of the state.

use fusebox_core::Decision;
use tracing::{info, warn};

use crate::error::LogError;
use crate::keys::{self, FORMAT_VERSION, FORMAT_VERSION_KEY};
use crate::record::{self, Record};
use crate::snapshot;
use crate::state::LogState;
use crate::store::{EventLog, Tree, WriteBatch};

pub(crate) fn corrupt<L: EventLog>(log: &L, what: String, detail: String) -> LogError {
    LogError::Corrupt {
        path: log.path().to_owned(),
        what,
        detail,
    }
}

/// Checks the format version; a new, empty log gets the current one.
pub fn check_format<L: EventLog>(log: &mut L) -> Result<(), LogError> {
    match log.get(Tree::Meta, FORMAT_VERSION_KEY)? {
        Some(found) if found.as_ref() == FORMAT_VERSION.to_string().as_bytes() => Ok(()),
        Some(found) => Err(LogError::FormatVersion {
            path: log.path().to_owned(),
            found: String::from_utf8_lossy(found.as_ref()).into_owned(),
            expected: FORMAT_VERSION,
        }),
        None if log.last(Tree::Events)?.is_some() => Err(LogError::FormatVersion {
            path: log.path().to_owned(),
            found: "none".to_owned(),
            expected: FORMAT_VERSION,
        }),
        None => {
            let mut batch = WriteBatch::default();
            batch.insert(
                Tree::Meta,
                FORMAT_VERSION_KEY,
                FORMAT_VERSION.to_string().into_bytes(),
            );
            log.write(batch)?;
            log.flush()
        }
    }
}

fn position_of<L: EventLog>(log: &L, tree: Tree, key: &[u8]) -> Result<u64, LogError> {
    keys::decode_position(key).ok_or_else(|| {
        corrupt(
            log,
            format!("a key of the {} tree", tree.name()),
            format!("{} bytes where a position has 8", key.len()),
        )
    })
}

/// Position of the last record (0 for an empty log).
pub fn last_position<L: EventLog>(log: &L) -> Result<u64, LogError> {
    match log.last(Tree::Events)? {
        Some((key, _)) => position_of(log, Tree::Events, key.as_ref()),
        None => Ok(0),
    }
}

/// The records from position `from` on, checking that positions are contiguous.
pub fn records<L: EventLog>(
    log: &L,
    from: u64,
) -> impl Iterator<Item = Result<(u64, Record), LogError>> + '_ {
    let mut expected = from;
    log.scan(Tree::Events, &keys::position(from))
        .map(move |item| {
            let (key, value) = item?;
            let pos = position_of(log, Tree::Events, key.as_ref())?;
            if pos != expected {
                return Err(corrupt(
                    log,
                    format!("position {expected}"),
                    format!("the next record is at position {pos}: records are missing"),
                ));
            }
            expected += 1;
            let record = record::decode(value.as_ref())
                .map_err(|detail| corrupt(log, format!("position {pos}"), detail))?;
            Ok((pos, record))
        })
}

/// The recorded decision at `pos`.
pub fn decision_at<L: EventLog>(log: &L, pos: u64) -> Result<Option<Decision>, LogError> {
    match log.get(Tree::Decisions, &keys::position(pos))? {
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(bytes.as_ref())
            .map(Some)
            .map_err(|e| {
                corrupt(
                    log,
                    format!("the decision at position {pos}"),
                    e.to_string(),
                )
            }),
    }
}

/// Snapshot positions, newest first.
pub fn snapshot_positions<L: EventLog>(log: &L) -> Result<Vec<u64>, LogError> {
    let mut positions = log
        .scan(Tree::Snapshots, &[])
        .map(|item| position_of(log, Tree::Snapshots, item?.0.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    positions.reverse();
    Ok(positions)
}

/// The newest snapshot that decodes, verifies and is not ahead of the log; damaged ones
/// are skipped with a warning (an older one, or a full replay, does the job).
pub fn latest_snapshot<L: EventLog>(log: &L, end: u64) -> Result<Option<LogState>, LogError> {
    for pos in snapshot_positions(log)? {
        let Some(bytes) = log.get(Tree::Snapshots, &keys::position(pos))? else {
            continue;
        };
        match snapshot::decode(bytes.as_ref()) {
            Ok(state) if state.position == pos && pos <= end => return Ok(Some(state)),
            Ok(state) => warn!(
                path = %log.path().display(),
                snapshot = pos,
                holds = state.position,
                log_end = end,
                "skipping a snapshot that does not match the log"
            ),
            Err(why) => warn!(
                path = %log.path().display(),
                snapshot = pos,
                %why,
                "skipping a damaged snapshot"
            ),
        }
    }
    Ok(None)
}

/// Removes what a batch cut short by a crash left beyond the last record: decisions,
/// their ids, snapshots. (A batch writes its record tree last, so nothing of a batch
/// whose records are all on disk is missing.) Returns how many entries were removed.
pub fn repair_tail<L: EventLog>(log: &mut L) -> Result<usize, LogError> {
    let end = last_position(log)?;
    let mut batch = WriteBatch::default();
    let mut removed = 0;
    for item in log.scan(Tree::Decisions, &keys::position(end + 1)) {
        let (key, value) = item?;
        if let Ok(decision) = serde_json::from_slice::<Decision>(value.as_ref()) {
            let id = keys::event_id(&decision.tenant, &decision.run, &decision.event_id);
            if log.get(Tree::Ids, &id)?.as_ref().map(AsRef::as_ref) == Some(key.as_ref()) {
                batch.remove(Tree::Ids, id);
                removed += 1;
            }
        }
        batch.remove(Tree::Decisions, key.as_ref());
        removed += 1;
    }
    for item in log.scan(Tree::Snapshots, &keys::position(end + 1)) {
        batch.remove(Tree::Snapshots, item?.0.as_ref());
        removed += 1;
    }
    if removed > 0 {
        info!(
            path = %log.path().display(),
            log_end = end,
            removed,
            "removed the unfinished tail of a batch cut short by a crash"
        );
        log.write(batch)?;
        log.flush()?;
    }
    Ok(removed)
}

/// The latest valid snapshot plus the records after it.
pub fn rebuild<L: EventLog>(log: &L, max_held: usize) -> Result<LogState, LogError> {
    let end = last_position(log)?;
    let mut state = latest_snapshot(log, end)?.unwrap_or_else(|| LogState::new(max_held));
    replay_into(log, &mut state)?;
    Ok(state)
}

/// Applies every record after `state.position`.
pub fn replay_into<L: EventLog>(log: &L, state: &mut LogState) -> Result<(), LogError> {
    for item in records(log, state.position + 1) {
        let (_, record) = item?;
        state.apply(&record)?;
    }
    Ok(())
}
