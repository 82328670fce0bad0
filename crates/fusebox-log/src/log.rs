//! Reading the log back: format check, the records in order, snapshots, start-up repair
//! of a batch that was cut short, and the rebuild of the state.

use std::sync::mpsc;

use fusebox_core::{Decision, Sequencer};
use tracing::{info, warn};

use crate::error::LogError;
use crate::keys::{self, FORMAT_VERSION, FORMAT_VERSION_KEY};
use crate::record::{self, Frame, FrameEntry, Record};
use crate::snapshot;
use crate::state::{note_order, LogState};
use crate::store::{EventLog, Tree, WriteBatch};

pub(crate) fn corrupt<L: EventLog>(log: &L, what: String, detail: String) -> LogError {
    LogError::Corrupt {
        path: log.path().to_owned(),
        what,
        detail,
    }
}

/// Checks the format version; a new, empty log gets the current one, and a log of an
/// older format this build reads is marked with the current one (it is one already).
pub fn check_format<L: EventLog>(log: &mut L) -> Result<(), LogError> {
    let current = FORMAT_VERSION.to_string();
    match log.get(Tree::Meta, FORMAT_VERSION_KEY)? {
        Some(found) if found.as_ref() == current.as_bytes() => Ok(()),
        Some(found) if !keys::is_readable_format(found.as_ref()) => Err(LogError::FormatVersion {
            path: log.path().to_owned(),
            found: String::from_utf8_lossy(found.as_ref()).into_owned(),
            expected: FORMAT_VERSION,
        }),
        None if log.last(Tree::Events)?.is_some() => Err(LogError::FormatVersion {
            path: log.path().to_owned(),
            found: "none".to_owned(),
            expected: FORMAT_VERSION,
        }),
        Some(_) | None => {
            let mut batch = WriteBatch::default();
            batch.insert(Tree::Meta, FORMAT_VERSION_KEY, current.into_bytes());
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

fn frame_len<L: EventLog>(log: &L, pos: u64, bytes: &[u8]) -> Result<u64, LogError> {
    record::frame_len(bytes)
        .map_err(|detail| corrupt(log, format!("the frame at position {pos}"), detail))
}

/// Position of the last record (0 for an empty log).
pub fn last_position<L: EventLog>(log: &L) -> Result<u64, LogError> {
    match log.last(Tree::Events)? {
        Some((key, value)) => {
            let first = position_of(log, Tree::Events, key.as_ref())?;
            Ok(first + frame_len(log, first, value.as_ref())? - 1)
        }
        None => Ok(0),
    }
}

/// The frames holding positions `from` on, as (first position, stored bytes), checking
/// that positions are contiguous.
pub fn frames<L: EventLog>(
    log: &L,
    from: u64,
) -> impl Iterator<Item = Result<(u64, L::Bytes), LogError>> + '_ {
    // The frame that holds `from` starts at or before it.
    let start = match log.floor(Tree::Events, &keys::position(from)) {
        Ok(Some((key, _))) => keys::decode_position(key.as_ref()).unwrap_or(from),
        _ => from,
    };
    let mut expected: Option<u64> = None;
    log.scan(Tree::Events, &keys::position(start))
        .map(move |item| {
            let (key, value) = item?;
            let pos = position_of(log, Tree::Events, key.as_ref())?;
            if let Some(expected) = expected.filter(|&e| e != pos) {
                return Err(corrupt(
                    log,
                    format!("position {expected}"),
                    format!("the next record is at position {pos}: records are missing"),
                ));
            }
            if expected.is_none() && pos > from.max(1) {
                return Err(corrupt(
                    log,
                    format!("position {}", from.max(1)),
                    format!("the first record found is at position {pos}: records are missing"),
                ));
            }
            expected = Some(pos + frame_len(log, pos, value.as_ref())?);
            Ok((pos, value))
        })
}

/// A stored frame, decompressed and checked.
pub fn decode_frame<L: EventLog>(log: &L, first: u64, bytes: &[u8]) -> Result<Frame, LogError> {
    let mut frame = Frame::default();
    decode_frame_into(log, &mut frame, first, bytes)?;
    Ok(frame)
}

/// [`decode_frame`] into a frame that is reused from one stored frame to the next.
fn decode_frame_into<L: EventLog>(
    log: &L,
    frame: &mut Frame,
    first: u64,
    bytes: &[u8],
) -> Result<(), LogError> {
    frame
        .decode(bytes)
        .map_err(|detail| corrupt(log, format!("the frame at position {first}"), detail))
}

fn decode_entry<L: EventLog>(
    log: &L,
    pos: u64,
    entry: &FrameEntry<'_>,
) -> Result<Record, LogError> {
    entry
        .decode()
        .map_err(|detail| corrupt(log, format!("position {pos}"), detail))
}

/// The records from position `from` on, in order.
pub fn records<L: EventLog>(
    log: &L,
    from: u64,
) -> impl Iterator<Item = Result<(u64, Record), LogError>> + '_ {
    let mut frame = Frame::default();
    frames(log, from).flat_map(move |stored| {
        let decoded: DecodedFrame = match stored {
            Err(e) => vec![Err(e)],
            Ok((first, bytes)) => {
                decode_frame_records(log, &mut frame, first, bytes.as_ref(), from)
            }
        };
        decoded
    })
}

/// The records of one frame from position `from` on, decoded through `frame` (reused
/// from one stored frame to the next); a damaged one ends the list.
fn decode_frame_records<L: EventLog>(
    log: &L,
    frame: &mut Frame,
    first: u64,
    bytes: &[u8],
    from: u64,
) -> DecodedFrame {
    if let Err(e) = decode_frame_into(log, frame, first, bytes) {
        return vec![Err(e)];
    }
    let mut out = Vec::with_capacity(frame.len());
    for (pos, entry) in (first..)
        .zip(frame.entries())
        .filter(|(pos, _)| *pos >= from)
    {
        match decode_entry(log, pos, &entry) {
            Ok(record) => out.push(Ok((pos, record))),
            Err(e) => {
                out.push(Err(e));
                break;
            }
        }
    }
    out
}

/// The recorded decision at `pos` (`None`: no event there).
pub fn decision_at<L: EventLog>(log: &L, pos: u64) -> Result<Option<Decision>, LogError> {
    let Some((key, bytes)) = log.floor(Tree::Events, &keys::position(pos))? else {
        return Ok(None);
    };
    let first = position_of(log, Tree::Events, key.as_ref())?;
    let frame = decode_frame(log, first, bytes.as_ref())?;
    let Some((_, entry)) = (first..).zip(frame.entries()).find(|(p, _)| *p == pos) else {
        return Ok(None);
    };
    if entry.is_op {
        return Ok(None);
    }
    entry
        .decode_decision()
        .map(Some)
        .map_err(|detail| corrupt(log, format!("the decision at position {pos}"), detail))
}

/// Positions of the complete snapshots, newest first: one seek per snapshot, not a
/// read of every piece. A snapshot is complete once its piece 0 is stored (the writer
/// stores it last; a format-3 snapshot is one whole key).
pub fn snapshot_positions<L: EventLog>(log: &L) -> Result<Vec<u64>, LogError> {
    let (mut complete, _torn) = snapshots_found(log)?;
    complete.reverse();
    Ok(complete)
}

/// Positions of the complete snapshots and of the torn ones (pieces without piece 0:
/// a write cut short, or a removal), oldest first.
pub(crate) fn snapshots_found<L: EventLog>(log: &L) -> Result<(Vec<u64>, Vec<u64>), LogError> {
    let (mut complete, mut torn) = (Vec::new(), Vec::new());
    let mut from = 0;
    while let Some(item) = log.scan(Tree::Snapshots, &keys::position(from)).next() {
        let key = item?.0;
        let key = key.as_ref();
        let pos = keys::decode_snapshot_position(key).ok_or_else(|| {
            corrupt(
                log,
                "a key of the snapshots tree".to_owned(),
                format!("{} bytes where a snapshot key has 8 or 12", key.len()),
            )
        })?;
        if keys::is_snapshot_commit_key(key) {
            complete.push(pos);
        } else {
            torn.push(pos);
        }
        match pos.checked_add(1) {
            Some(next) => from = next,
            None => break,
        }
    }
    Ok((complete, torn))
}

/// The stored bytes of the snapshot at `pos`: its pieces, in order (`None`: no snapshot
/// there). A missing piece is caught by the snapshot's checksum.
pub fn snapshot_bytes<L: EventLog>(log: &L, pos: u64) -> Result<Option<Vec<u8>>, LogError> {
    let mut bytes = Vec::new();
    let mut found = false;
    for item in log.scan_prefix(Tree::Snapshots, &keys::position(pos)) {
        bytes.extend_from_slice(item?.1.as_ref());
        found = true;
    }
    Ok(found.then_some(bytes))
}

/// The newest snapshot that decodes, verifies and is not ahead of the log; damaged ones
/// are skipped with a warning (an older one, or a full replay, does the job).
pub fn latest_snapshot<L: EventLog>(log: &L, end: u64) -> Result<Option<LogState>, LogError> {
    for pos in snapshot_positions(log)? {
        let Some(bytes) = snapshot_bytes(log, pos)? else {
            continue;
        };
        match snapshot::decode(&bytes) {
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

/// Removes snapshots beyond the last record, and the pieces of torn snapshots. Builds
/// that wrote a snapshot in the batch that took it could leave one beyond the end when
/// a crash cut the batch short; now a snapshot is written only once its records are
/// durable (`snapshotter.rs`), so that guards against older logs and damage. A crash
/// while a snapshot is written or removed leaves pieces without piece 0, which no
/// reader sees. Returns how many entries were removed.
pub fn repair_tail<L: EventLog>(log: &mut L) -> Result<usize, LogError> {
    let end = last_position(log)?;
    let mut batch = WriteBatch::default();
    let mut removed = 0;
    for item in log.scan(Tree::Snapshots, &keys::position(end + 1)) {
        batch.remove(Tree::Snapshots, item?.0.as_ref());
        removed += 1;
    }
    let beyond_end = removed;
    let (_, torn) = snapshots_found(log)?;
    for pos in torn.iter().filter(|&&pos| pos <= end) {
        for item in log.scan_prefix(Tree::Snapshots, &keys::position(*pos)) {
            batch.remove(Tree::Snapshots, item?.0.as_ref());
            removed += 1;
        }
    }
    if removed > 0 {
        info!(
            path = %log.path().display(),
            log_end = end,
            beyond_end,
            torn_snapshot_pieces = removed - beyond_end,
            "removed what a crash left unfinished (a batch cut short, a snapshot being written or removed)"
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

/// Frames decoded ahead of the thread that applies them.
const DECODED_AHEAD: usize = 8;

/// Applies every record after `state.position`. Reading, decoding and the order and
/// dedup bookkeeping (sequencer, index: functions of the records alone) run on a
/// second thread while this one applies the records to the engine, so a replay uses
/// both cores. Applied records go back to the reading thread to be freed there, where
/// they were allocated: freeing them here was ~6% of this thread's instructions, and a
/// free from another thread costs the allocator more. The result is the same as
/// `LogState::apply` record by record (the rebuild property test compares them).
pub fn replay_into<L: EventLog>(log: &L, state: &mut LogState) -> Result<(), LogError> {
    let from = state.position + 1;
    let mut applied = std::mem::replace(&mut state.applied, Sequencer::new(0));
    let result = std::thread::scope(|scope| {
        let (send, receive) = mpsc::sync_channel(DECODED_AHEAD);
        // Unbounded: the applying side must never wait on the reading side, which may
        // itself be waiting for room in `send`.
        let (give_back, spent) = mpsc::channel::<DecodedFrame>();
        let applied = &mut applied;
        let reader = scope.spawn(move || {
            let mut frame = Frame::default();
            for stored in frames(log, from) {
                let decoded = match stored {
                    Ok((first, bytes)) => {
                        decode_frame_records(log, &mut frame, first, bytes.as_ref(), from)
                    }
                    Err(e) => vec![Err(e)],
                };
                for (pos, record) in decoded.iter().flatten() {
                    note_order(applied, *pos, record);
                }
                // The applying side stops at an error and drops its end.
                if send.send(decoded).is_err() {
                    break;
                }
                spent.try_iter().for_each(drop);
            }
        });
        let applying = (|| {
            for decoded in receive {
                for item in &decoded {
                    match item {
                        Ok((_, record)) => state.apply_to_engine(record),
                        Err(_) => return Err(first_error(decoded)),
                    }
                }
                // Once the reader is done, the last few are freed here.
                let _ = give_back.send(decoded);
            }
            Ok(())
        })();
        reader.join().expect("the replay reader does not panic");
        applying
    });
    state.applied = applied;
    result
}

/// One stored frame's records, decoded, or the error that ends them.
type DecodedFrame = Vec<Result<(u64, Record), LogError>>;

fn first_error(decoded: DecodedFrame) -> LogError {
    decoded
        .into_iter()
        .find_map(Result::err)
        .expect("called for a frame with an error")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SledLog, SledOptions};

    fn set_format(log: &mut SledLog, version: &str) {
        let mut batch = WriteBatch::default();
        batch.insert(Tree::Meta, FORMAT_VERSION_KEY, version.as_bytes().to_vec());
        log.write(batch).unwrap();
    }

    #[test]
    fn an_older_readable_format_is_marked_current_and_others_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = SledLog::open(dir.path(), &SledOptions::default()).unwrap();
        set_format(&mut log, "3");
        check_format(&mut log).unwrap();
        let stored = log.get(Tree::Meta, FORMAT_VERSION_KEY).unwrap().unwrap();
        assert_eq!(stored.as_ref(), FORMAT_VERSION.to_string().as_bytes());

        set_format(&mut log, "2");
        match check_format(&mut log) {
            Err(LogError::FormatVersion { found, .. }) => assert_eq!(found, "2"),
            other => panic!("format 2 was not refused: {other:?}"),
        }
    }
}
