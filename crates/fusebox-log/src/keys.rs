//! Key layouts of the sled trees. Positions are big-endian so sled's byte order is the
//! log's order; the ledger separator is NUL, which the id character set of tenants
//! excludes.

/// Tree names.
pub const EVENTS: &str = "events";
pub const LEDGER: &str = "ledger";
pub const SNAPSHOTS: &str = "snapshots";
pub const META: &str = "meta";

/// `meta` key of the on-disk format version.
pub const FORMAT_VERSION_KEY: &[u8] = b"format_version";
/// 2: records and decisions in MessagePack frames of consecutive positions, dedup
/// index in the snapshot instead of an `ids` tree, MessagePack snapshots and ledger.
/// 3: events in their positional stored form (`stored.rs`) instead of named fields;
/// the ledger tree is written at snapshots and on open, and says at which position.
/// 4: snapshots in pieces of [`SNAPSHOT_PIECE_BYTES`] ([`snapshot_piece`] keys).
/// 5: the latest commits may be only in the commit file (`wal.rs`) beside sled's files.
/// A build that knows nothing of it must not open such a log: it would miss them, then
/// append at their positions what the next open overwrote with them.
pub const FORMAT_VERSION: u32 = 5;
/// Formats this build reads. A format-3 log is a format-4 log whose snapshots are each
/// one piece under an 8-byte key; a format-4 log is a format-5 log with nothing in a
/// commit file. Opening either for writing records format 5.
pub const READABLE_FORMATS: [u32; 3] = [3, 4, FORMAT_VERSION];

/// Whether a stored format version is one this build reads.
pub fn is_readable_format(found: &[u8]) -> bool {
    READABLE_FORMATS
        .iter()
        .any(|v| v.to_string().as_bytes() == found)
}

pub fn position(pos: u64) -> [u8; 8] {
    pos.to_be_bytes()
}

/// The position a key encodes, or `None` for a key that is not 8 bytes (damage).
pub fn decode_position(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

/// Bytes of one snapshot piece. sled 0.34 writes a value, or a tree node, larger than a
/// quarter of its 512 KiB segments to a file of its own that it never fsyncs, and
/// recovery after a power loss stops at such a file if it is missing or torn, dropping
/// every later write, flushed or not. A leaf holds up to 16 entries (a few more until it
/// is split), so values stay below 4 KiB and no node of the snapshots tree gets near
/// the 128 KiB limit.
pub const SNAPSHOT_PIECE_BYTES: usize = 4 * 1024;

/// `snapshots` key of piece `piece` of the snapshot at `pos`: both big-endian, so the
/// pieces of a snapshot follow each other in order and snapshots sort by position.
pub fn snapshot_piece(pos: u64, piece: u32) -> [u8; 12] {
    let mut key = [0; 12];
    key[..8].copy_from_slice(&pos.to_be_bytes());
    key[8..].copy_from_slice(&piece.to_be_bytes());
    key
}

/// The position of the snapshot a `snapshots` key belongs to: a piece key, or the
/// whole-snapshot key (the position alone) of format 3. `None` for other lengths.
pub fn decode_snapshot_position(key: &[u8]) -> Option<u64> {
    match key.len() {
        8 | 12 => decode_position(&key[..8]),
        _ => None,
    }
}

/// Whether a `snapshots` key is its snapshot's commit point: piece 0, or the whole
/// snapshot of format 3. Stored, it is the first key of its position; a position whose
/// first key is another piece holds a torn snapshot (a write or a removal cut short).
pub fn is_snapshot_commit_key(key: &[u8]) -> bool {
    key.len() == 8 || (key.len() == 12 && key[8..] == [0; 4])
}

/// `ledger` key of the position whose ledger the tree holds (8 bytes, big-endian). No
/// entry's key starts with NUL: tenants are non-empty.
pub const LEDGER_POSITION_KEY: &[u8] = &[0];

/// `ledger` key: tenant NUL op_key.
pub fn ledger(tenant: &str, op_key: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(tenant.len() + op_key.len() + 1);
    key.extend_from_slice(tenant.as_bytes());
    key.push(0);
    key.extend_from_slice(op_key.as_bytes());
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_sort_as_numbers() {
        let mut keys: Vec<[u8; 8]> = [300u64, 2, 1 << 40, 0, 255, 256]
            .into_iter()
            .map(position)
            .collect();
        keys.sort();
        let decoded: Vec<u64> = keys.iter().filter_map(|k| decode_position(k)).collect();
        assert_eq!(decoded, vec![0, 2, 255, 256, 300, 1 << 40]);
        assert_eq!(decode_position(b"short"), None);
    }

    #[test]
    fn snapshot_pieces_sort_by_position_then_piece() {
        let mut keys: Vec<Vec<u8>> = vec![
            snapshot_piece(256, 0).to_vec(),
            snapshot_piece(2, 300).to_vec(),
            snapshot_piece(2, 1).to_vec(),
            position(7).to_vec(),
        ];
        keys.sort();
        let decoded: Vec<Option<u64>> = keys.iter().map(|k| decode_snapshot_position(k)).collect();
        assert_eq!(decoded, vec![Some(2), Some(2), Some(7), Some(256)]);
        assert_eq!(keys[0], snapshot_piece(2, 1).to_vec());
        assert_eq!(decode_snapshot_position(b"ten bytes!"), None);
    }

    #[test]
    fn piece_0_and_a_whole_snapshot_are_commit_keys_other_pieces_are_not() {
        assert!(is_snapshot_commit_key(&snapshot_piece(9, 0)));
        assert!(is_snapshot_commit_key(&position(9)));
        assert!(!is_snapshot_commit_key(&snapshot_piece(9, 1)));
        assert!(!is_snapshot_commit_key(b"ten bytes!"));
    }

    #[test]
    fn ledger_keys_separate_tenant_and_key() {
        assert_eq!(ledger("acme", "op-1"), b"acme\0op-1".to_vec());
    }
}
