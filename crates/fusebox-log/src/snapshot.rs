//! Snapshot bytes: a magic tag, the SHA-256 of the payload, and the payload (JSON of the
//! engine and the applied-events sequencer at a log position). The checksum catches a
//! torn or bit-rotted snapshot, which start-up then skips for an older one.

use fusebox_core::{Engine, Sequencer};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::LogError;
use crate::state::LogState;

const MAGIC: &[u8; 8] = b"FBSNAP1\n";
const HEADER: usize = MAGIC.len() + 32;

#[derive(Serialize)]
struct SnapshotRef<'a> {
    position: u64,
    event_time_ms: u64,
    engine: &'a Engine,
    sequencer: &'a Sequencer,
}

#[derive(Deserialize)]
struct SnapshotOwned {
    position: u64,
    event_time_ms: u64,
    engine: Engine,
    sequencer: Sequencer,
}

pub fn encode(state: &LogState) -> Result<Vec<u8>, LogError> {
    let mut bytes = Vec::with_capacity(HEADER + 4096);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&[0; 32]);
    serde_json::to_writer(
        &mut bytes,
        &SnapshotRef {
            position: state.position,
            event_time_ms: state.event_time_ms,
            engine: &state.engine,
            sequencer: &state.applied,
        },
    )
    .map_err(|source| LogError::Encode {
        what: "a snapshot",
        source,
    })?;
    let digest = Sha256::digest(&bytes[HEADER..]);
    bytes[MAGIC.len()..HEADER].copy_from_slice(&digest);
    Ok(bytes)
}

/// The state a snapshot holds; the error says why it cannot be used.
pub fn decode(bytes: &[u8]) -> Result<LogState, String> {
    if bytes.len() < HEADER || &bytes[..MAGIC.len()] != MAGIC {
        return Err("not a fusebox snapshot (bad header)".to_owned());
    }
    let payload = &bytes[HEADER..];
    if Sha256::digest(payload).as_slice() != &bytes[MAGIC.len()..HEADER] {
        return Err("checksum mismatch (torn or damaged)".to_owned());
    }
    let snapshot: SnapshotOwned =
        serde_json::from_slice(payload).map_err(|e| format!("does not decode: {e}"))?;
    Ok(LogState {
        engine: snapshot.engine,
        applied: snapshot.sequencer,
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
    }
}
