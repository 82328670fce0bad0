//! Snapshot bytes: a magic tag, the SHA-256 of the payload, and the payload (LZ4 of
//! MessagePack with field names of the engine, the applied-events sequencer (also the
//! dedup index) and the ledger times at a log position). The checksum catches a torn or bit-rotted
//! snapshot, which start-up then skips for an older one.
//!
//! MessagePack rather than JSON: several times smaller and faster to decode (start-up
//! was dominated by the JSON snapshot), self-describing so the core types' skipped
//! `None` fields still decode, and `f64` is stored as its bits, so `cost_usd` sums
//! round-trip exactly. LZ4 because field names repeat for every run: it halves the
//! snapshot for little CPU, and sled rewrites and rereads the snapshot tree's node, so
//! its size is paid on every start. The engine's runs refer to a table of policies
//! (fusebox-core's `engine_form.rs`) rather than each carrying its own.

use fusebox_core::{Engine, Sequencer};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::LogError;
use crate::record;
use crate::state::{LedgerTimes, LogState};

/// 3: runs refer to a table of policies. 4: the sequencer keeps each id's position;
/// no separate dedup index. 5: runs keep their compaction log and streak, and policies
/// their compaction and volatile-text settings. 6: an op_key in flight keeps when it was
/// last heard of (its lease), and policies carry the lease settings. 7: runs remember
/// (call, answer) and (question, answer) pairs, poll clocks, the retry gates' start and
/// the post-compaction tail; policies their wait settings. A snapshot with
/// another tag is skipped (an older one, or a full replay, does the job).
const MAGIC: &[u8; 8] = b"FBSNAP7\n";
const HEADER: usize = MAGIC.len() + 32;

#[derive(Serialize)]
struct SnapshotRef<'a> {
    position: u64,
    event_time_ms: u64,
    engine: &'a Engine,
    sequencer: &'a Sequencer,
    ledger_times: &'a LedgerTimes,
}

#[derive(Deserialize)]
struct SnapshotOwned {
    position: u64,
    event_time_ms: u64,
    engine: Engine,
    sequencer: Sequencer,
    ledger_times: LedgerTimes,
}

pub fn encode(state: &LogState) -> Result<Vec<u8>, LogError> {
    let mut payload = Vec::with_capacity(4096);
    record::encode_into(
        &mut payload,
        &SnapshotRef {
            position: state.position,
            event_time_ms: state.event_time_ms,
            engine: &state.engine,
            sequencer: &state.applied,
            ledger_times: &state.ledger_times,
        },
        "a snapshot",
    )?;
    let compressed = lz4_flex::compress_prepend_size(&payload);
    let mut bytes = Vec::with_capacity(HEADER + compressed.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&[0; 32]);
    bytes.extend_from_slice(&compressed);
    let digest = Sha256::digest(&bytes[HEADER..]);
    bytes[MAGIC.len()..HEADER].copy_from_slice(&digest);
    Ok(bytes)
}

/// The state a snapshot holds; the error says why it cannot be used.
pub fn decode(bytes: &[u8]) -> Result<LogState, String> {
    if bytes.len() < HEADER || &bytes[..MAGIC.len()] != MAGIC {
        return Err(match bytes.get(..MAGIC.len() - 1) {
            Some(tag) if tag.starts_with(b"FBSNAP") => format!(
                "a snapshot of another format ({}), which this build does not read",
                String::from_utf8_lossy(tag)
            ),
            _ => "not a fusebox snapshot (bad header)".to_owned(),
        });
    }
    let payload = &bytes[HEADER..];
    if Sha256::digest(payload).as_slice() != &bytes[MAGIC.len()..HEADER] {
        return Err("checksum mismatch (torn or damaged)".to_owned());
    }
    let payload = lz4_flex::decompress_size_prepended(payload)
        .map_err(|e| format!("does not decompress: {e}"))?;
    decode_payload(&payload)
}

/// The state in a snapshot's decompressed payload (MessagePack), checksum and header
/// already checked. Public for the fuzz target, which cannot forge a checksum.
pub fn decode_payload(payload: &[u8]) -> Result<LogState, String> {
    let snapshot: SnapshotOwned =
        record::decode_value(payload).map_err(|e| format!("does not decode: {e}"))?;
    Ok(LogState {
        engine: snapshot.engine,
        applied: snapshot.sequencer,
        ledger_times: snapshot.ledger_times,
        position: snapshot.position,
        event_time_ms: snapshot.event_time_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_damage() {
        let state = LogState::new(16);
        let bytes = encode(&state).unwrap();
        assert_eq!(decode(&bytes).unwrap(), state);

        // A busy state (runs open and closed, ledger entries, costs, held-free
        // sequencer with its positions) must come back equal, or a rebuild would drift.
        let mut busy = LogState::new(16);
        let events = crate::workload::Workload::new(crate::workload::WorkloadConfig::default());
        for event in events.take(5_000) {
            busy.apply_event(&event);
        }
        assert!(!busy.engine.ledger().is_empty() && busy.engine.run_count() > 0);
        assert_eq!(decode(&encode(&busy).unwrap()).unwrap(), busy);

        type Damage = fn(&mut Vec<u8>);
        let cases: [(&str, Damage); 4] = [
            ("truncated", |b| b.truncate(b.len() - 3)),
            ("flipped byte", |b| *b.last_mut().unwrap() ^= 1),
            ("bad magic", |b| b[0] = b'x'),
            ("header only", |b| b.truncate(10)),
        ];
        for (name, damage) in cases {
            let mut bad = bytes.clone();
            damage(&mut bad);
            assert!(decode(&bad).is_err(), "{name} was accepted");
        }

        // A snapshot an older build wrote is named as such, not as damage.
        let mut older = bytes.clone();
        older[..MAGIC.len()].copy_from_slice(b"FBSNAP4\n");
        assert_eq!(
            decode(&older).unwrap_err(),
            "a snapshot of another format (FBSNAP4), which this build does not read"
        );
    }
}
