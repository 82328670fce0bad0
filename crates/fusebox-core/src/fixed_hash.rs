//! A fixed, unseeded hasher for the engine's maps: FNV-1a.
//!
//! The engine may not use `RandomState` (no randomness), and SipHash with fixed keys was
//! a measurable share of every event (two lookups: tenant, then run). FNV-1a is short,
//! fast on the short ids it hashes, and the same in every process. Map order never
//! reaches an output: whatever is listed is sorted first.

use std::hash::{BuildHasherDefault, Hasher};

#[derive(Debug, Clone, Copy)]
pub struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

pub type FixedHasher = BuildHasherDefault<Fnv1a>;
