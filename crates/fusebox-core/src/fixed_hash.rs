//! FNV-1a: the one short, unseeded, process-independent hash of the workspace — for the
//! engine's maps, event-id dedup, tool grouping, and ids derived from request bodies.
//!
//! The engine may not use `RandomState` (no randomness), and SipHash with fixed keys was
//! a measurable share of every event (two lookups: tenant, then run). FNV-1a is short,
//! fast on the short ids it hashes, and the same in every process. Map order never
//! reaches an output: whatever is listed is sorted first.

use std::hash::{BuildHasherDefault, Hasher};

const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a of `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(OFFSET_BASIS, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(PRIME)
    })
}

#[derive(Debug, Clone, Copy)]
pub struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(OFFSET_BASIS)
    }
}

impl Hasher for Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 ^ u64::from(*byte)).wrapping_mul(PRIME);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

pub type FixedHasher = BuildHasherDefault<Fnv1a>;
