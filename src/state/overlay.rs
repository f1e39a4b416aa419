//! The records in memory in front of the B-tree, which every reader checks before it reads
//! redb: the overlay, records acknowledged but not yet committed to redb ([`Overlay`], with
//! the writer's epochs, the one read snapshot of redb the readers of an epoch share, and the
//! waiters woken when a key changes); then the record cache, an exact, bounded cache of
//! recently committed records for the duplicate path ([`RecordCache`]), which the overlay's
//! entries move to once redb holds them.
//!
//! Only the committer fills it, with the record it just committed, so an entry is never older
//! than what redb holds: a read that finds an entry needs no transaction, and a read that
//! misses falls back to redb. Eviction is first-in first-out per shard; evicting is always
//! safe.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use foldhash::fast::FixedState;
use parking_lot::RwLock;

use crate::error::Error;
use crate::key::Key;
use crate::record::{Millis, Record, State};
use crate::state::wait::Waiters;

/// A key's changed state as memory holds it until redb does: its new record, or `None` for a
/// deletion. The record is shared, not copied, by the writer's latest states, the overlay,
/// the applier's queue and then the record cache.
pub(crate) type Held = Option<Arc<Record>>;

/// Records acknowledged but not yet committed to redb: the applier keeps one redb write
/// transaction open across several batches, so readers must see these first. Every entry is
/// the latest acknowledged state of its key (`None` is a deletion), with the log frame that
/// logged it. Not bounded by a capacity: the entries a redb commit covers move to the record
/// cache after each commit (every 250 ms at most, `TXN_SPAN`).
///
/// It also counts the writer's *epochs* ([`epoch`](Overlay::epoch)): an epoch ends each time
/// the writer commits to redb (and forgets the changes it kept since the last commit), and
/// when the store is poisoned. A state a caller read at the start of an epoch, of a key the
/// writer has not changed since, is still the key's state while the epoch lasts: that is how a
/// reserve hands its decision on the state it read to the writer, instead of the writer
/// reading the key and deciding again.
#[derive(Debug, Default)]
pub(crate) struct Overlay {
    map: RwLock<HashMap<Key, (Held, u64), Hasher>>,
    /// Whether `map` holds an entry: set under its write lock after the entries are in (with
    /// release), cleared under it when it is emptied. A reader that finds it unset skips the
    /// lock: a publication it misses is not acknowledged yet (changes are published before they
    /// are answered), and an emptied map's entries are in the record cache or redb before it is
    /// cleared. (The duplicate path of a store without writes then takes no lock here.)
    occupied: AtomicBool,
    /// Threads waiting for keys to change; woken on every publication.
    pub(crate) waiters: Waiters,
    epoch: AtomicU64,
    /// The records table as redb held it when the current epoch began, shared by the readers
    /// of the epoch ([`committed`](Overlay::committed)).
    snapshot: SharedSnapshot,
    /// Held by a drain ([`drain_through`](Overlay::drain_through)) from start to end.
    draining: parking_lot::Mutex<()>,
}

/// The records of one redb read transaction (every window's table).
pub(crate) type RecordsTable = crate::tree::Records;

/// One read snapshot of the records table and the epoch it was opened in (see
/// [`Overlay::committed`]).
#[derive(Default)]
struct SharedSnapshot {
    slot: RwLock<Option<(u64, Arc<RecordsTable>)>>,
}

impl std::fmt::Debug for SharedSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let epoch = self.slot.read().as_ref().map(|(epoch, _)| *epoch);
        f.debug_struct("SharedSnapshot")
            .field("epoch", &epoch)
            .finish()
    }
}

impl Overlay {
    /// The current epoch. Read it *before* reading a state (overlay, cache, redb) that is to
    /// be handed to the writer: the acquire pairs with [`next_epoch`](Overlay::next_epoch)'s
    /// release, so a read that starts after it sees the redb commit that ended the epoch.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Ends the current epoch (the writer, holding the writer lock, after a redb commit or a
    /// reset): every state read before this call is stale for the writer.
    pub(crate) fn next_epoch(&self) {
        self.epoch.fetch_add(1, Ordering::Release);
        // The shared snapshot belongs to the epoch that ended: let redb free the pages it
        // holds once its last reader is done (the next reader opens a new one).
        let ended = self.snapshot.slot.write().take();
        drop(ended);
    }

    /// The committed records table for a read of a key that is neither in the overlay nor in
    /// the cache; call it only after looking there. Every reader of an epoch shares one redb
    /// read transaction, opened (by `open`) on the first such read of the epoch, instead of
    /// beginning its own: a transaction begun after the epoch began sees the redb commit that
    /// began it (the epoch is read with acquire before `open` runs), and redb's records only
    /// change again at the commit that ends the epoch. Changes the writer made since are in
    /// the overlay, which the caller looked at first; a commit outside the overlay (a sweep,
    /// a `complete_with`) is not acknowledged before the epoch it ends is over. A reader that
    /// missed the overlay because the writer drained it has seen the epoch end (the overlay's
    /// lock orders the two), so it gets a snapshot of the new epoch, never the old one.
    ///
    /// Returns the snapshot with the epoch it serves: a caller may keep it for more keys while
    /// [`epoch`](Overlay::epoch) still returns that epoch.
    pub(crate) fn committed<E>(
        &self,
        open: impl FnOnce() -> Result<RecordsTable, E>,
    ) -> Result<(u64, Arc<RecordsTable>), E> {
        let epoch = self.epoch();
        if let Some((at, table)) = &*self.snapshot.slot.read() {
            if *at == epoch {
                return Ok((epoch, Arc::clone(table)));
            }
        }
        // One reader opens the epoch's snapshot; the others wait for it rather than each
        // beginning a transaction of their own.
        let mut slot = self.snapshot.slot.write();
        match &*slot {
            // The epoch's, or a newer epoch's (this reader is late): that one sees every commit
            // this one would, and more, so it serves too.
            Some((at, table)) if *at >= epoch => Ok((*at, Arc::clone(table))),
            _ => {
                let table = Arc::new(open()?);
                // Kept for the epoch's other readers only while the epoch lasts: if it ended
                // meanwhile, `next_epoch` has emptied the slot (or will, once this lock is
                // released), and a snapshot left there would hold redb's pages until the next
                // read.
                let old = if self.epoch() == epoch {
                    slot.replace((epoch, Arc::clone(&table)))
                } else {
                    None
                };
                drop(slot);
                drop(old);
                Ok((epoch, table))
            }
        }
    }

    /// `Some(state)` when `key` changed since the last redb commit.
    pub(crate) fn get(&self, key: &Key) -> Option<Option<Record>> {
        if !self.occupied.load(Ordering::Acquire) {
            return None;
        }
        let map = self.map.read();
        if map.is_empty() {
            return None;
        }
        map.get(key).map(|(state, _)| state.as_deref().cloned())
    }

    /// [`get`](Overlay::get) for many keys under one lock: for each `keys[i]` changed since the
    /// last redb commit, sets `states[i]` to its state and `found[i]`.
    pub(crate) fn get_many(&self, keys: &[&Key], found: &mut [bool], states: &mut [ReadState]) {
        if !self.occupied.load(Ordering::Acquire) {
            return;
        }
        let map = self.map.read();
        if map.is_empty() {
            return;
        }
        for (i, key) in keys.iter().enumerate() {
            if let Some((state, _)) = map.get(*key) {
                states[i] = Ok(state.as_deref().cloned());
                found[i] = true;
            }
        }
    }

    /// Publishes acknowledged changes, logged by frame `seq`.
    pub(crate) fn publish(&self, changes: impl ExactSizeIterator<Item = (Key, Held)>, seq: u64) {
        // Waiters are woken after the change is visible, or they would read the old state.
        let waiting = self.waiters.any();
        let mut keys: Vec<Key> = Vec::new();
        let mut map = self.map.write();
        map.reserve(changes.len());
        for (key, state) in changes {
            if waiting {
                keys.push(key.clone());
            }
            map.insert(key, (state, seq));
        }
        self.occupied.store(!map.is_empty(), Ordering::Release);
        drop(map);
        self.waiters.notify(&keys);
    }

    /// After the open transaction committed: hands every entry to `cache` and empties itself.
    pub(crate) fn drain_into(&self, cache: &RecordCache) {
        self.drain_through(u64::MAX, cache);
    }

    /// After a redb commit that holds every frame up to `seq`, and after the epoch it ended:
    /// hands the entries logged by those frames to `cache`, then forgets them. Entries of later
    /// frames stay: redb does not hold them yet.
    ///
    /// Into the cache first, while the overlay still answers for them, and out of the overlay
    /// after, each only if no later frame changed its key meanwhile: so a reader that no
    /// longer finds a key here finds its state in the cache (or, evicted, in a redb snapshot of
    /// the new epoch), never an older state the cache still held. Drains run one at a time
    /// (the writer's and the applier's), so a slower one never puts back a state a later one
    /// replaced.
    pub(crate) fn drain_through(&self, seq: u64, cache: &RecordCache) {
        let _one_at_a_time = self.draining.lock();
        let moving: Vec<(Key, Held, u64)> = self
            .map
            .read()
            .iter()
            .filter(|(_, (_, logged))| *logged <= seq)
            .map(|(key, (state, logged))| (key.clone(), state.clone(), *logged))
            .collect();
        if moving.is_empty() {
            return;
        }
        for (key, state, _) in &moving {
            cache.set(key, state.clone());
        }
        let mut map = self.map.write();
        for (key, _, logged) in &moving {
            if map.get(key).is_some_and(|(_, now)| now == logged) {
                map.remove(key);
            }
        }
        self.occupied.store(!map.is_empty(), Ordering::Release);
    }

    /// Forgets everything (the store is poisoned).
    pub(crate) fn clear(&self) {
        let mut map = self.map.write();
        map.clear();
        self.occupied.store(false, Ordering::Release);
    }
}

const SHARDS: usize = 16;

/// A key's state as a batch read hands it back: the record (`None`: absent), or why it could
/// not be read.
pub(crate) type ReadState = Result<Option<Record>, Error>;

/// The hasher of every in-memory map here (and of shard selection): fast, and fixed so that a
/// key's shard never changes.
pub(crate) type Hasher = FixedState;

#[derive(Debug, Default)]
pub(crate) struct Shard {
    map: HashMap<Key, Arc<Record>, Hasher>,
    order: VecDeque<Key>,
    /// The [`entry_bytes`] of the entries in `map`.
    pub(crate) bytes: usize,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct RecordCache {
    pub(crate) shards: Vec<RwLock<Shard>>,
    per_shard: usize,
    bytes_per_shard: usize,
    /// Records expiring before this time were in expiry windows deleted since: none is cached
    /// any more, nor ever again ([`forget_expiring_before`](RecordCache::forget_expiring_before)).
    gone_before: AtomicU64,
}

/// What one cached record costs besides its key's and its data's bytes: the map's slot (key
/// and record handles, with the table's spare slots), the eviction queue's slot, the record
/// (shared with the overlay it came from), and the allocator's headers of the key, the record
/// and the data (BENCHMARKS.md, "Memory": the live heap stays within the configured caches).
const ENTRY_OVERHEAD: usize = 320;

/// The memory a cached record is counted for: [`ENTRY_OVERHEAD`], the key, and the variable
/// data (a result, a recovery point or a review note).
pub(crate) fn entry_bytes(key: &Key, record: &Record) -> usize {
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
            gone_before: AtomicU64::new(0),
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
        self.shard(key)
            .read()
            .map
            .get(key)
            .map(|r| Record::clone(r))
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
                        states[i] = Ok(Some(Record::clone(record)));
                        found[i] = true;
                    }
                }
            }
        }
    }

    /// Records the committed state of `key`: `None` for a deletion. The record is the one
    /// the overlay held (shared, not copied).
    pub(crate) fn set(&self, key: &Key, record: Held) {
        if self.per_shard == 0 {
            return;
        }
        let mut shard = self.shard(key).write();
        // A record of a deleted window (moving here from the overlay after its window went)
        // is not cached: its key reads from redb, which no longer holds it.
        let record = record.filter(|r| r.expires_at >= self.gone_before.load(Ordering::Acquire));
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

    /// Forgets every record that expires before `before` and refuses such records from now on:
    /// the expiry windows holding them were deleted (called once their deletion is in the
    /// transaction that deletes them; a reader that misses here reads redb, whose snapshots
    /// hold the window until that commit and not after). So no in-memory copy answers for a
    /// deleted window's record.
    pub(crate) fn forget_expiring_before(&self, before: Millis) {
        if self.gone_before.fetch_max(before, Ordering::AcqRel) >= before {
            return;
        }
        for shard in &self.shards {
            let mut shard = shard.write();
            let Shard { map, order, bytes } = &mut *shard;
            map.retain(|key, record| {
                let keep = record.expires_at >= before;
                if !keep {
                    *bytes -= entry_bytes(key, record);
                }
                keep
            });
            order.retain(|key| map.contains_key(key));
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
