//! An exact, bounded cache of recently written records, for the duplicate path.
//!
//! Only the committer fills it, with the record it just committed, so an entry is never older
//! than what redb holds: a read that finds an entry needs no transaction, and a read that
//! misses falls back to redb. Eviction is first-in first-out per shard; evicting is always
//! safe.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;

use foldhash::fast::FixedState;

use parking_lot::RwLock;

use crate::error::Error;
use crate::key::Key;
use crate::record::{Record, State};

const SHARDS: usize = 16;

/// A key's state as a batch read hands it back: the record (`None`: absent), or why it could
/// not be read.
pub(crate) type ReadState = Result<Option<Record>, Error>;

/// The hasher of every in-memory map here (and of shard selection): fast, and fixed so that a
/// key's shard never changes.
pub(crate) type Hasher = FixedState;

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<Key, Record, Hasher>,
    order: VecDeque<Key>,
    /// The [`entry_bytes`] of the entries in `map`.
    bytes: usize,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct RecordCache {
    shards: Vec<RwLock<Shard>>,
    per_shard: usize,
    bytes_per_shard: usize,
}

/// What one cached record costs besides its key's and its data's bytes: the map's slot (key
/// handle and record, with the table's spare slots), the eviction queue's slot, and the
/// allocator's headers of the key and the data (about 350 bytes measured per record of a
/// 26-byte key and a 2-byte result, BENCHMARKS.md).
const ENTRY_OVERHEAD: usize = 320;

/// The memory a cached record is counted for: [`ENTRY_OVERHEAD`], the key, and the variable
/// data (a result, a recovery point or a review note).
fn entry_bytes(key: &Key, record: &Record) -> usize {
    let data = match &record.state {
        State::Pending { progress, .. } => progress.as_ref().map_or(0, |p| 4 + p.data.len()),
        State::Completed { result, .. } => result.len(),
        State::NeedsReview { note, .. } => note.len(),
    };
    ENTRY_OVERHEAD + key.encoded().len() + data
}

impl RecordCache {
    /// A cache of about `capacity` records taking about `bytes` of memory at most (counted by
    /// [`entry_bytes`]); the first limit reached evicts. 0 records disables it.
    pub(crate) fn new(capacity: usize, bytes: usize) -> RecordCache {
        RecordCache {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            per_shard: capacity.div_ceil(SHARDS),
            bytes_per_shard: bytes.div_ceil(SHARDS),
        }
    }

    fn shard(&self, key: &Key) -> &RwLock<Shard> {
        // A different seed from the maps' own, so shard choice and bucket choice differ.
        let hash = FixedState::with_seed(0x5eed).hash_one(key);
        &self.shards[hash as usize % SHARDS]
    }

    pub(crate) fn get(&self, key: &Key) -> Option<Record> {
        if self.per_shard == 0 {
            return None;
        }
        self.shard(key).read().map.get(key).cloned()
    }

    /// The index of [`shard`](RecordCache::shard)'s shard.
    fn shard_of(&self, key: &Key) -> usize {
        FixedState::with_seed(0x5eed).hash_one(key) as usize % SHARDS
    }

    /// [`get`](RecordCache::get) for many keys: for each `keys[i]` not found before
    /// (`found[i]` false) and cached, sets `states[i]` to its record and `found[i]`, taking
    /// each shard's lock once for all its keys instead of once per key.
    pub(crate) fn get_many(&self, keys: &[&Key], found: &mut [bool], states: &mut [ReadState]) {
        if self.per_shard == 0 {
            return;
        }
        // The keys' indexes grouped by shard (a counting sort), to visit each shard once.
        let mut starts = [0usize; SHARDS + 1];
        let shards: Vec<u8> = keys
            .iter()
            .map(|key| {
                let shard = self.shard_of(key);
                starts[shard + 1] += 1;
                shard as u8
            })
            .collect();
        for shard in 0..SHARDS {
            starts[shard + 1] += starts[shard];
        }
        let mut next = starts;
        let mut order = vec![0u32; keys.len()];
        for (i, &shard) in shards.iter().enumerate() {
            order[next[shard as usize]] = i as u32;
            next[shard as usize] += 1;
        }
        for shard in 0..SHARDS {
            let members = &order[starts[shard]..starts[shard + 1]];
            if members.iter().all(|&i| found[i as usize]) {
                continue;
            }
            let shard = self.shards[shard].read();
            for &i in members {
                let i = i as usize;
                if !found[i] {
                    if let Some(record) = shard.map.get(keys[i]) {
                        states[i] = Ok(Some(record.clone()));
                        found[i] = true;
                    }
                }
            }
        }
    }

    /// Records the committed state of `key`: `None` for a deletion.
    pub(crate) fn set(&self, key: &Key, record: Option<Record>) {
        if self.per_shard == 0 {
            return;
        }
        let mut shard = self.shard(key).write();
        match record {
            None => {
                if let Some(old) = shard.map.remove(key) {
                    shard.bytes -= entry_bytes(key, &old);
                }
            }
            Some(record) => {
                shard.bytes += entry_bytes(key, &record);
                match shard.map.insert(key.clone(), record) {
                    Some(old) => shard.bytes -= entry_bytes(key, &old),
                    None => shard.order.push_back(key.clone()),
                }
                while shard.map.len() > self.per_shard || shard.bytes > self.bytes_per_shard {
                    match shard.order.pop_front() {
                        Some(old) => {
                            if let Some(record) = shard.map.remove(&old) {
                                shard.bytes -= entry_bytes(&old, &record);
                            }
                        }
                        None => break,
                    }
                }
                if shard.order.len() > 2 * self.per_shard {
                    // Drop queue entries of keys removed since they were queued.
                    let Shard { map, order, .. } = &mut *shard;
                    order.retain(|k| map.contains_key(k));
                }
            }
        }
    }

    /// Forgets everything (after a failed write, when memory may be ahead of disk).
    pub(crate) fn clear(&self) {
        for shard in &self.shards {
            let mut shard = shard.write();
            shard.map.clear();
            shard.order.clear();
            shard.bytes = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;
    use crate::record::State;

    fn record(token: u64) -> Record {
        Record {
            fingerprint: Fingerprint::of(b"x"),
            token,
            attempt: 1,
            expires_at: 10,
            state: State::Pending {
                lease_until: 5,
                progress: None,
            },
        }
    }

    #[test]
    fn holds_at_most_its_capacity_and_forgets_deletions() {
        let cache = RecordCache::new(32, usize::MAX);
        let keys: Vec<Key> = (0..1000)
            .map(|i| Key::new("s", "op", format!("{i}")).unwrap())
            .collect();
        for (i, key) in keys.iter().enumerate() {
            cache.set(key, Some(record(i as u64)));
        }
        let held = keys.iter().filter(|k| cache.get(k).is_some()).count();
        assert!(held <= 32 && held > 0, "{held}");
        let last = keys.last().unwrap();
        assert_eq!(cache.get(last).map(|r| r.token), Some(999));
        cache.set(last, None);
        assert_eq!(cache.get(last), None);
        let disabled = RecordCache::new(0, usize::MAX);
        disabled.set(last, Some(record(1)));
        assert_eq!(disabled.get(last), None);
    }

    fn completed(result_len: usize) -> Record {
        Record {
            state: State::Completed {
                completed_at: 1,
                result: vec![7; result_len],
            },
            ..record(1)
        }
    }

    #[test]
    fn holds_at_most_its_byte_budget_however_large_the_results() {
        let budget = 256 << 10;
        let cache = RecordCache::new(10_000, budget);
        let keys: Vec<Key> = (0..1000)
            .map(|i| Key::new("s", "op", format!("{i:04}")).unwrap())
            .collect();
        for key in &keys {
            cache.set(key, Some(completed(4096)));
        }
        let held: Vec<&Key> = keys.iter().filter(|k| cache.get(k).is_some()).collect();
        let bytes: usize = held.iter().map(|k| entry_bytes(k, &completed(4096))).sum();
        assert!(!held.is_empty(), "the newest records stay");
        assert!(
            bytes <= budget,
            "{} records of {bytes} bytes held, over the {budget}-byte budget",
            held.len()
        );
        // Each shard's count follows its replacements and removals too.
        for key in &held {
            cache.set(key, Some(completed(4096)));
        }
        for key in &held {
            cache.set(key, None);
        }
        for shard in &cache.shards {
            assert_eq!(shard.read().bytes, 0);
        }
        // A record larger than a shard's share is not kept.
        cache.set(&keys[0], Some(completed(budget)));
        assert_eq!(cache.get(&keys[0]), None);
        // Small records: the count limit binds first.
        let small = RecordCache::new(32, budget);
        for key in &keys {
            small.set(key, Some(record(1)));
        }
        let held = keys.iter().filter(|k| small.get(k).is_some()).count();
        assert!(held <= 32 && held > 0, "{held}");
    }
}
