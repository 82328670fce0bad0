//! The workspace's unseeded, process-independent hashes.
//!
//! - [`fnv1a`]: a value that is stored or compared across processes — event-id dedup
//!   hashes in snapshots, tool grouping, ids derived from request bodies. It must never
//!   change.
//! - [`FixedHasher`]: the hasher of the in-memory maps (engine runs, ledger shards, the
//!   sequencer, which is also the log's dedup index). The engine may not use `RandomState` (no randomness). foldhash's
//!   fixed-seed variant reads eight bytes at a time; FNV-1a, one byte at a time, cost a
//!   replay's reading thread 4.4% more instructions (callgrind). Its values never leave
//!   the process and map order never reaches an output: whatever is listed is sorted
//!   first.

const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a of `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(OFFSET_BASIS, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(PRIME)
    })
}

pub type FixedHasher = foldhash::fast::FixedState;
