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
pub const FORMAT_VERSION: u32 = 3;

pub fn position(pos: u64) -> [u8; 8] {
    pos.to_be_bytes()
}

/// The position a key encodes, or `None` for a key that is not 8 bytes (damage).
pub fn decode_position(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
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
    fn ledger_keys_separate_tenant_and_key() {
        assert_eq!(ledger("acme", "op-1"), b"acme\0op-1".to_vec());
    }
}
