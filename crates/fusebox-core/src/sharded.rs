//! A map from `String` keys whose clone is cheap and stays cheap while both copies
//! change: the entries sit in shards behind `Arc`s (changed through `Arc::make_mut`), so a
//! clone costs a pointer per shard and a change afterwards copies one shard, a few hundred
//! entries, not the whole map. The log takes such a clone (its snapshot view) while the
//! engine goes on deciding; with one map per tenant, a tenant's ledger of 30,000 keys was
//! copied whole by the first event that touched it.
//!
//! A key's shard is picked by the map hasher; the number of shards doubles as the map
//! grows, so which shard holds a key depends on the map's history. Nothing outside sees
//! that: equality, iteration and serde see the entries only, in key order, and serialise
//! like a `BTreeMap<String, V>`. A shard is a hash map: as `BTreeMap`s, the shards'
//! key comparisons (op_keys share long prefixes) and inserts were ~7% of a replay's
//! applying thread (perf).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::fixed_hash::FixedHasher;

type Shard<V> = HashMap<String, V, FixedHasher>;

/// Entries a shard holds on average before the shards double.
const SHARD_TARGET: usize = 16;

#[derive(Debug, Clone)]
pub struct ShardedMap<V> {
    /// A power of two of them.
    shards: Vec<Arc<Shard<V>>>,
    len: usize,
}

impl<V> Default for ShardedMap<V> {
    fn default() -> Self {
        ShardedMap {
            shards: vec![Arc::default()],
            len: 0,
        }
    }
}

/// Bits 32 and up of the key's hash: a shard's own table indexes its buckets by the low
/// bits and tags them with the top seven, which must not be the same for all its keys.
fn shard_of(key: &str, shards: usize) -> usize {
    (FixedHasher::default().hash_one(key) >> 32) as usize & (shards - 1)
}

impl<V: Clone> ShardedMap<V> {
    pub fn get(&self, key: &str) -> Option<&V> {
        self.shards[shard_of(key, self.shards.len())].get(key)
    }

    /// Copies the key's shard only when the key is there and the shard is shared.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        let at = shard_of(key, self.shards.len());
        let shard = &mut self.shards[at];
        if Arc::get_mut(shard).is_none() && !shard.contains_key(key) {
            return None;
        }
        Arc::make_mut(shard).get_mut(key)
    }

    pub fn insert(&mut self, key: String, value: V) -> Option<V> {
        let at = shard_of(&key, self.shards.len());
        let shard = &mut self.shards[at];
        let old = Arc::make_mut(shard).insert(key, value);
        if old.is_none() {
            self.len += 1;
            if self.len > self.shards.len() * SHARD_TARGET {
                self.double();
            }
        }
        old
    }

    pub fn remove(&mut self, key: &str) -> Option<V> {
        let at = shard_of(key, self.shards.len());
        let shard = &mut self.shards[at];
        if Arc::get_mut(shard).is_none() && !shard.contains_key(key) {
            return None;
        }
        let old = Arc::make_mut(shard).remove(key);
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        let mut all: Vec<(&str, &V)> = self
            .shards
            .iter()
            .flat_map(|shard| shard.iter().map(|(key, value)| (key.as_str(), value)))
            .collect();
        all.sort_unstable_by(|a, b| a.0.cmp(b.0));
        all.into_iter()
    }

    fn double(&mut self) {
        let count = self.shards.len() * 2;
        let mut shards = vec![Shard::default(); count];
        for shard in std::mem::take(&mut self.shards) {
            for (key, value) in Arc::unwrap_or_clone(shard) {
                shards[shard_of(&key, count)].insert(key, value);
            }
        }
        self.shards = shards.into_iter().map(Arc::new).collect();
    }
}

impl<V: Clone + PartialEq> PartialEq for ShardedMap<V> {
    fn eq(&self, other: &Self) -> bool {
        if self.len != other.len {
            return false;
        }
        if self.shards.len() == other.shards.len() {
            return self
                .shards
                .iter()
                .zip(&other.shards)
                .all(|(a, b)| Arc::ptr_eq(a, b) || a == b);
        }
        self.iter().eq(other.iter())
    }
}

impl<V: Clone + Serialize> Serialize for ShardedMap<V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de, V: Clone + Deserialize<'de>> Deserialize<'de> for ShardedMap<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let entries = Shard::<V>::deserialize(deserializer)?;
        let len = entries.len();
        let count = len.div_ceil(SHARD_TARGET).max(1).next_power_of_two();
        let mut shards = vec![Shard::default(); count];
        for (key, value) in entries {
            shards[shard_of(&key, count)].insert(key, value);
        }
        Ok(ShardedMap {
            shards: shards.into_iter().map(Arc::new).collect(),
            len,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn a_clone_shares_the_shards_a_change_does_not_touch_and_equality_ignores_the_layout() {
        let mut map = ShardedMap::default();
        for i in 0..5_000u64 {
            map.insert(format!("key-{i}"), i);
        }
        assert!(map.shards.len() >= 16);
        let view = map.clone();
        map.insert("key-7".to_owned(), 70);
        let copied = map
            .shards
            .iter()
            .zip(&view.shards)
            .filter(|(a, b)| !Arc::ptr_eq(a, b))
            .count();
        assert_eq!(copied, 1);
        assert_eq!(view.get("key-7"), Some(&7));
        assert_eq!(map.get("key-7"), Some(&70));

        // A map rebuilt from its entries has fewer shards (it never was smaller), and
        // is still equal; serde sees a plain map in key order.
        for i in 100..5_000u64 {
            map.remove(&format!("key-{i}"));
        }
        let json = serde_json::to_string(&map).unwrap();
        let back: ShardedMap<u64> = serde_json::from_str(&json).unwrap();
        assert!(back.shards.len() < map.shards.len());
        assert_eq!(back, map);
        let plain: BTreeMap<String, u64> = serde_json::from_str(&json).unwrap();
        assert_eq!(serde_json::to_string(&plain).unwrap(), json);
        assert_eq!(map.len(), 100);
        let keys: Vec<&str> = map.iter().map(|(k, _)| k).collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        assert_eq!(keys, sorted);
    }
}
