//! Key layouts of the sled trees. Positions are big-endian so sled's byte order is the
//! log's order; the separators are NUL, which the id character sets of tenants and runs
//! exclude, so a prefix scan of `tenant NUL run NUL` finds exactly one run's ids.

/// Tree names.
pub const EVENTS: &str = "events";
pub const DECISIONS: &str = "decisions";
pub const IDS: &str = "ids";
pub const LEDGER: &str = "ledger";
pub const SNAPSHOTS: &str = "snapshots";
pub const META: &str = "meta";

/// `meta` key of the on-disk format version.
pub const FORMAT_VERSION_KEY: &[u8] = b"format_version";
pub const FORMAT_VERSION: u32 = 1;

pub fn position(pos: u64) -> [u8; 8] {
    pos.to_be_bytes()
}

/// The position a key encodes, or `None` for a key that is not 8 bytes (damage).
pub fn decode_position(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

pub fn run_prefix(tenant: &str, run: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(tenant.len() + run.len() + 2);
    key.extend_from_slice(tenant.as_bytes());
    key.push(0);
    key.extend_from_slice(run.as_bytes());
    key.push(0);
    key
}

/// `ids` key: tenant NUL run NUL event-id.
pub fn event_id(tenant: &str, run: &str, id: &str) -> Vec<u8> {
    let mut key = run_prefix(tenant, run);
    key.extend_from_slice(id.as_bytes());
    key
}

/// `ledger` key: tenant NUL op_key.
pub fn ledger(tenant: &str, op_key: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(tenant.len() + op_key.len() + 1);
    key.extend_from_slice(tenant.as_bytes());
    key.push(0);
    key.extend_from_slice(op_key.as_bytes());
    key
}

/// The tenant and run of an `ids` key, for counting runs.
pub fn split_run(key: &[u8]) -> Option<&[u8]> {
    let tenant_end = key.iter().position(|&b| b == 0)?;
    let run_end = tenant_end + 1 + key[tenant_end + 1..].iter().position(|&b| b == 0)?;
    Some(&key[..run_end])
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
    fn run_prefix_does_not_match_a_longer_run_id() {
        let key = event_id("acme", "run-10", "e1");
        assert!(key.starts_with(&run_prefix("acme", "run-10")));
        assert!(!key.starts_with(&run_prefix("acme", "run-1")));
        assert_eq!(split_run(&key), Some(&b"acme\0run-10"[..]));
    }
}
