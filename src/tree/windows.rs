//! Expiry windows: a store keeps its records in one redb table per window of expiry time, so
//! the keys of a window leave together.
//!
//! A window is an aligned span of expiry times: `2^level` milliseconds starting at a multiple
//! of `2^level` (its table: `idemstore.records.<id as 16 hex digits>`, the id holding the level
//! and the span's index, [`window_id`]). A record whose `expires_at` is `t` lives in a window
//! whose span holds `t`, chosen when it is written ([`Windows::place`]) from its horizon `h`
//! (`t` minus the time its state began: its completion, say; `tables::written_at`): the span holding `t` whose width is the largest power of two at most
//! `h / 16` (at least 1 ms). So a window is narrow for a record that expires soon and wide for
//! one that expires far out, whatever the mix of retentions (per store, per operation, per
//! call, or changed between opens): records of one horizon share [`PER_HORIZON`] to twice as
//! many windows, and each kind of horizon in use adds its own. Spans of different widths may
//! nest (a wide window far out holds the short-lived keys written later within it only once
//! the store is crowded, below).
//!
//! A record of a horizon of about 17 minutes or more is first written to a window [`NARROW`]
//! levels narrower than its own, so the window taking a horizon's new keys stays small enough
//! for its B-tree to stay in the page cache; once its enclosing window of its own level can no
//! longer receive records of that horizon ([`Windows::closed_narrow`]), the records move there,
//! the children of one enclosing window read together in key order (`Tables::merge_closed_windows`).
//!
//! Every record of a window has expired once its span has ended, so expiry deletes the
//! window's table at once ([`Windows::due`]) instead of one key at a time: the cost of expiring
//! a key is a share of one table deletion, and the space returns to the file's free pages for
//! the next windows. A key is stored in at most one window: a write that moves a record to
//! another window deletes it from the windows that hold its old expiry and may hold the key.
//!
//! The count of windows is bounded for any mix: once a store has [`CROWDED`] windows, a record
//! whose own window does not exist joins the narrowest window that holds its expiry, and where
//! none does, the new window is 16 times wider (as wide as the record's horizon). An expired
//! record stays stored until its window ends: at most a 16th of its horizon when it was written
//! while the store is not crowded, and at most one window (of the horizon of the record that
//! made it, or 16 times that) when crowded (docs/format.md, "Windows").
//!
//! Lookups do not read every window's table. Each window has a [`Filter`] in memory (a blocked
//! Bloom filter, about 10 bits per key, built from the table's keys when the store opens and
//! kept by every insert), and a key is looked up only in the windows whose filter may hold it:
//! a key that is absent (most keys a deduplication store is asked about) is answered without
//! reading a page.
//!
//! The filters hash a key with the store's own hash ([`Windows::hash`]): SipHash-1-3 of its
//! bytes, keyed by a random seed the store keeps in its meta table. The saved filters are
//! read by later builds on other platforms, so the hash is defined on bytes (with a
//! known-answer test), never an in-memory hasher's; and it is keyed, so a client choosing its
//! own keys cannot aim them at one block of a filter.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use redb::{
    AccessGuard, ReadOnlyTable, ReadTransaction, ReadableDatabase, ReadableTable,
    ReadableTableMetadata, TableDefinition, TableError, TableHandle,
};
use siphasher::sip::SipHasher13;

use super::filter::{Filter, Probe};
use crate::error::StorageError;
use crate::record::Millis;

/// The prefix of every window's records table; the window's id follows as 16 hex digits.
pub(crate) const RECORDS_PREFIX: &str = "idemstore.records.";

/// A window is at most this fraction of the horizon of the record that makes it (and more than
/// half that): records of one horizon share 16 to 33 windows, and an expired record stays
/// stored at most a 16th of its horizon (the figures behind the choice: BENCHMARKS.md,
/// "Windows of expiry time").
pub(crate) const PER_HORIZON: u64 = 16;

/// Windows from which a store is crowded: a record whose own window does not exist joins the
/// narrowest window that holds its expiry instead of making one, and a window made where none
/// does is [`CROWDED_WIDER`] times wider. What keeps a store at most about 64 windows for any
/// mix of retentions (tests/windows.rs).
pub(crate) const CROWDED: usize = 48;

/// Levels a window made while the store is crowded is above its record's own: 16 times wider,
/// as wide as the record's horizon.
const CROWDED_WIDER: u32 = 4;

/// Levels a record's first window is below its horizon's ([`level_for`]): a record is written
/// to a window `2^NARROW` times narrower than its own, so that the window taking a horizon's new
/// records stays small enough for its B-tree to stay in the page cache whatever the store's
/// size; once no record of that horizon can be written to the narrow windows its own spans any
/// more, they are merged into it in key order ([`Windows::closed_narrow`]).
pub(crate) const NARROW: u32 = 3;

/// The narrowest level a record is written narrow at: windows of `2^13` ms (about 8 s), several
/// of the sweeper's intervals, so narrow windows are merged about as soon as they close even
/// when no batch is applied. A record whose horizon's level is below `NARROW_FLOOR + NARROW`
/// (a horizon under about 17 minutes) is written to its own window at once: such a window's
/// B-tree holds at most 17 minutes of keys.
const NARROW_FLOOR: u32 = 13;

/// The widest window's level: spans of `2^62` ms.
const MAX_LEVEL: u32 = 62;
/// Where a window's level sits in its id: the top 6 bits; the span's index below them.
const LEVEL_SHIFT: u32 = 58;

/// The windows' filters as the last durable commit saved them: window id → encoded [`Filter`].
/// A window without a row (or with a row that does not read as one) has its filter built from
/// its table's keys at open.
pub(crate) const FILTERS: TableDefinition<u64, &[u8]> = TableDefinition::new("idemstore.filters");

/// The hash of the saved filters, as the meta key `filter_hash` names it: `1` is SipHash-1-3
/// keyed by the store's [`FilterSeed`] ([`Windows::hash`]). Rows are read only under this
/// identity; a store without it (the format as first released, whose rows came from foldhash)
/// or with another has its filters built from the windows' keys (`tables::open_windows`).
pub(crate) const FILTER_HASH: u64 = 1;

/// The key of a store's filter hash: SipHash-1-3's two 64-bit key words, random per store
/// (meta keys `filter_seed_0` and `filter_seed_1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FilterSeed(pub(crate) u64, pub(crate) u64);

impl FilterSeed {
    /// The hasher of this seed: SipHash-1-3 with key words `k0 = self.0`, `k1 = self.1`.
    fn hasher(self) -> SipHasher13 {
        SipHasher13::new_with_keys(self.0, self.1)
    }
}

/// A records table: encoded key → encoded record.
pub(crate) type RecordsDef<'a> = TableDefinition<'a, &'static [u8], &'static [u8]>;
/// One window's records table in a read transaction.
pub(crate) type RecordsTable = ReadOnlyTable<&'static [u8], &'static [u8]>;
/// A stored key and its record's bytes.
type Entry = (Vec<u8>, Vec<u8>);

/// The name of window `window`'s records table.
pub(crate) fn table_name(window: u64) -> String {
    format!("{RECORDS_PREFIX}{window:016x}")
}

/// The window a table named `name` holds, if it is a records table of a valid span.
pub(crate) fn parse_table_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix(RECORDS_PREFIX)?;
    if hex.len() != 16 {
        return None;
    }
    let window = u64::from_str_radix(hex, 16).ok()?;
    span(window).map(|_| window)
}

/// The id of the window of level `level` (`2^level` ms wide) whose span holds `t`: the level in
/// the top 6 bits, the span's index (`t >> level`) below. `None` when the index does not fit
/// (a `t` past 2^58 ms at that level: the caller takes a wider level).
pub(crate) fn window_id(level: u32, t: Millis) -> Option<u64> {
    let index = t >> level;
    (level <= MAX_LEVEL && index < 1 << LEVEL_SHIFT)
        .then(|| u64::from(level) << LEVEL_SHIFT | index)
}

/// The first and last expiry times window `window` holds; `None` for an id that is no span
/// (a table name not written by a store).
pub(crate) fn span(window: u64) -> Option<(Millis, Millis)> {
    let level = u32::try_from(window >> LEVEL_SHIFT).ok()?;
    if level > MAX_LEVEL {
        return None;
    }
    let index = window & ((1 << LEVEL_SHIFT) - 1);
    let start = index.checked_mul(1 << level)?;
    let last = start.checked_add((1 << level) - 1)?;
    Some((start, last))
}

/// The level of a window for a record `horizon` ms from expiring: the largest power of two at
/// most a [`PER_HORIZON`]th of it (level 0 below 32 ms).
pub(crate) fn level_for(horizon: Millis) -> u32 {
    (horizon / PER_HORIZON).max(1).ilog2().min(MAX_LEVEL)
}

/// The window of level `level` or wider whose span holds `t` (wider only for a `t` past
/// 2^58 ms).
fn fitting(level: u32, t: Millis) -> u64 {
    (level.min(MAX_LEVEL)..=MAX_LEVEL)
        .find_map(|level| window_id(level, t))
        .expect("level 62 holds every u64 time")
}

/// The filter of `window` in `map`, made for about `keys` keys (and a quarter more) if it has
/// none.
fn filter_of(map: &mut BTreeMap<u64, Arc<Filter>>, window: u64, keys: usize) -> Arc<Filter> {
    let filter = map
        .entry(window)
        .or_insert_with(|| Arc::new(Filter::with_capacity(keys.saturating_add(keys / 4))));
    Arc::clone(filter)
}

/// The level of window `window`.
pub(crate) fn level_of(window: u64) -> u64 {
    window >> LEVEL_SHIFT
}

/// The windows of one store and the filter of every window that may have a table (a
/// superset: a window whose table a rolled-back transaction created has a filter and no
/// table).
pub(crate) struct Windows {
    /// The filters' hash, keyed by the store's seed.
    hasher: SipHasher13,
    map: RwLock<BTreeMap<u64, Arc<Filter>>>,
    /// The most keys one window's filter has taken: the most a new window's filter is sized for.
    largest: AtomicUsize,
    /// By level, the shortest horizon of a record placed for it since the store opened
    /// (`u64::MAX`: none yet): when its narrow windows are closed ([`closed_narrow`]).
    ///
    /// [`closed_narrow`]: Windows::closed_narrow
    shortest: [AtomicU64; MAX_LEVEL as usize + 1],
}

impl std::fmt::Debug for Windows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Windows")
            .field("windows", &self.map.read().len())
            .finish()
    }
}

impl Windows {
    /// Windows, none yet, hashing keys with the all-zero seed: for a transaction on the meta
    /// table alone, and for tests. A store's own are [`load`]ed.
    ///
    /// [`load`]: Windows::load
    pub(crate) fn new() -> Windows {
        Windows::seeded(FilterSeed(0, 0))
    }

    /// Windows whose filters hash keys under `seed`, none yet.
    pub(crate) fn seeded(seed: FilterSeed) -> Windows {
        Windows {
            hasher: seed.hasher(),
            map: RwLock::new(BTreeMap::new()),
            largest: AtomicUsize::new(0),
            shortest: std::array::from_fn(|_| AtomicU64::new(u64::MAX)),
        }
    }

    /// The windows of the store in `db` (hashing under `seed`), with their filters: each as saved in `idemstore.filters` by the last durable commit, or, for a
    /// window whose saved filter is missing (a window written since, before a crash) or does
    /// not read as one (damaged, or hostile), built from its table's keys. The caller has
    /// checked that the rows were written under `seed` (else `trust_saved` is false and every
    /// filter is built), and replaced a filters table that could not be opened
    /// (`tables::open_windows`); a page that fails its checksum is an error, as everywhere.
    pub(crate) fn load(
        db: &impl ReadableDatabase,
        seed: FilterSeed,
        trust_saved: bool,
    ) -> Result<Windows, StorageError> {
        let ctx = "reading the store's windows";
        let windows = Windows::seeded(seed);
        let txn = db.begin_read().map_err(|e| StorageError::redb(ctx, e))?;
        let names: Vec<String> = txn
            .list_tables()
            .map_err(|e| StorageError::redb(ctx, e))?
            .map(|handle| handle.name().to_string())
            .collect();
        let saved = match txn.open_table(FILTERS) {
            Ok(table) if trust_saved => Some(table),
            Ok(_) | Err(TableError::TableDoesNotExist(_)) => None,
            Err(TableError::Storage(e)) => return Err(StorageError::redb(ctx, e)),
            Err(_) if !trust_saved => None,
            Err(e) => return Err(StorageError::redb(ctx, e)),
        };
        let mut map = windows.map.write();
        for name in names {
            if !name.starts_with(RECORDS_PREFIX) {
                continue;
            }
            let Some(window) = parse_table_name(&name) else {
                return Err(StorageError::Corruption {
                    location: format!("table {name}"),
                    reason: "a records table whose name is no window's".into(),
                });
            };
            let row = match &saved {
                Some(table) => table.get(window).map_err(|e| StorageError::redb(ctx, e))?,
                None => None,
            };
            let filter = match row.and_then(|bytes| Filter::decode(bytes.value())) {
                Some(filter) => filter,
                None => windows.filter_of_table(&txn, &name)?,
            };
            // Any window may hold records written narrow that no merge moved yet: each is
            // looked at once its enclosing window is closed for a horizon written since.
            filter.unmerged.store(true, Ordering::Release);
            windows.largest.fetch_max(filter.len(), Ordering::Relaxed);
            map.insert(window, Arc::new(filter));
        }
        drop(map);
        Ok(windows)
    }

    /// A filter of every key in table `name` (not saved: the next durable commit saves it).
    fn filter_of_table(&self, txn: &ReadTransaction, name: &str) -> Result<Filter, StorageError> {
        let ctx = "reading a window's keys";
        let table = txn
            .open_table(RecordsDef::new(name))
            .map_err(|e| StorageError::redb(ctx, e))?;
        let len = table.len().map_err(|e| StorageError::redb(ctx, e))?;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let filter = Filter::with_capacity(len.saturating_add(len / 4));
        for entry in table.iter().map_err(|e| StorageError::redb(ctx, e))? {
            let (key, _) = entry.map_err(|e| StorageError::redb(ctx, e))?;
            filter.insert(self.hash(key.value()));
        }
        Ok(filter)
    }

    /// When window `window` ends: every record in it has expired from then on.
    pub(crate) fn end(window: u64) -> Millis {
        span(window).map_or(Millis::MAX, |(_, last)| last.saturating_add(1))
    }

    /// Whether window `window`'s span holds the expiry time `t`.
    pub(crate) fn holds(window: u64, t: Millis) -> bool {
        span(window).is_some_and(|(start, last)| (start..=last).contains(&t))
    }

    /// The filters' hash of an encoded key: SipHash-1-3 of exactly its bytes, keyed by the
    /// store's [`FilterSeed`] (`k0`, `k1`), its 64-bit output as the algorithm defines it
    /// (docs/format.md, "Filters"). Not the in-memory hash a [`Key`](crate::Key) carries.
    #[inline]
    pub(crate) fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash(key)
    }

    /// The window a record expiring at `t`, written at `written`, goes to, with its filter (made, empty, if the
    /// window is new): call it before inserting into the window's table. Its first window (the
    /// span holding `t` [`NARROW`] levels below its horizon's, or at its horizon's level for a
    /// horizon under about 17 minutes; see the module's documentation) if that exists or the
    /// store is not crowded; otherwise the narrowest window holding `t`, or, where none does, a
    /// new one [`CROWDED_WIDER`] levels wider than its horizon's. A window a record is written
    /// to narrow is marked for a merge ([`Filter::unmerged`]).
    pub(crate) fn place(&self, t: Millis, written: Millis) -> (u64, Arc<Filter>) {
        let horizon = t.saturating_sub(written);
        let level = level_for(horizon);
        let shortest = &self.shortest[level as usize];
        if horizon < shortest.load(Ordering::Relaxed) {
            shortest.fetch_min(horizon, Ordering::Relaxed);
        }
        let (window, filter) = self.choose(t, level);
        if level_of(window) + u64::from(NARROW) == u64::from(level)
            && !filter.unmerged.load(Ordering::Relaxed)
        {
            // Written narrow: a merge moves it into its horizon's window later.
            filter.unmerged.store(true, Ordering::Release);
        }
        (window, filter)
    }

    /// [`place`](Windows::place)'s window for a record expiring at `t` whose horizon's level
    /// is `level`, with its filter.
    fn choose(&self, t: Millis, level: u32) -> (u64, Arc<Filter>) {
        let first = if level >= NARROW_FLOOR + NARROW {
            level - NARROW
        } else {
            level
        };
        let own = fitting(first, t);
        let chosen = |map: &BTreeMap<u64, Arc<Filter>>| -> Option<u64> {
            if map.contains_key(&own) {
                return Some(own);
            }
            if map.len() < CROWDED {
                return None;
            }
            map.keys()
                .copied()
                .filter(|w| Windows::holds(*w, t))
                .min_by_key(|w| level_of(*w))
        };
        {
            let map = self.map.read();
            if let Some(window) = chosen(&map) {
                return (window, Arc::clone(&map[&window]));
            }
        }
        let mut map = self.map.write();
        let window = match chosen(&map) {
            Some(window) => return (window, Arc::clone(&map[&window])),
            None if map.len() < CROWDED => own,
            None => fitting(level + CROWDED_WIDER, t),
        };
        let capacity = self.capacity_for(&map, window);
        (window, filter_of(&mut map, window, capacity))
    }

    /// The filter of `window`, made for about `keys` keys if the window has none: the window a
    /// merge moves records into.
    pub(crate) fn make(&self, window: u64, keys: usize) -> Arc<Filter> {
        filter_of(&mut self.map.write(), window, keys)
    }

    /// The narrow windows whose records may now move into their horizon's window, by that
    /// window: each window a record was written to narrower than its horizon's since a merge
    /// last looked at it ([`Filter::unmerged`]), whose enclosing window `NARROW` levels wider
    /// the records of that level's horizons are no longer written to: its span ended one
    /// narrow window before `now` plus the shortest such horizon placed since the store
    /// opened. (None is closed for a level no record was placed for since the store opened:
    /// a reopened store looks at its windows, all of which may be narrow, only for the
    /// horizons it writes.) A record written there later (a clock stepped back) makes its
    /// narrow window again, merged at the next look. The enclosing windows' children are in
    /// one list each, so a merge writes each enclosing window once, in key order.
    pub(crate) fn closed_narrow(&self, now: Millis) -> Vec<(u64, Vec<u64>)> {
        let mut closed: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for (window, filter) in self.map.read().iter() {
            if !filter.unmerged.load(Ordering::Acquire) {
                continue;
            }
            let narrow = level_of(*window) as u32;
            let level = narrow + NARROW;
            let Some((start, _)) = span(*window) else {
                continue;
            };
            let Some(parent) = window_id(level, start) else {
                continue;
            };
            let shortest = self.shortest[level as usize].load(Ordering::Relaxed);
            if shortest == u64::MAX {
                continue;
            }
            let slack = 1u64 << narrow;
            if now.saturating_add(shortest) >= Windows::end(parent).saturating_add(slack) {
                closed.entry(parent).or_default().push(*window);
            }
        }
        closed.into_iter().collect()
    }

    /// Keys a new `window`'s filter is made for: the windows' densest (keys per ms) times its
    /// width, and no more than the most keys one window has taken (at steady state windows of
    /// one horizon are alike, so a new one's filter is one part).
    fn capacity_for(&self, map: &BTreeMap<u64, Arc<Filter>>, window: u64) -> usize {
        let width = |w: u64| 1u128 << level_of(w);
        let most = map
            .values()
            .map(|f| f.len())
            .max()
            .unwrap_or(0)
            .max(self.largest.load(Ordering::Relaxed));
        let scaled = map
            .iter()
            .map(|(w, f)| f.len() as u128 * width(window) / width(*w))
            .max()
            .unwrap_or(most as u128);
        usize::try_from(scaled).unwrap_or(usize::MAX).min(most)
    }

    /// The windows that may hold a record expiring at `t` (whose span holds it), narrowest first.
    #[cfg(feature = "__whitebox")]
    pub(crate) fn holding(&self, t: Millis) -> Vec<(u64, Arc<Filter>)> {
        let mut found: Vec<(u64, Arc<Filter>)> = self
            .map
            .read()
            .iter()
            .filter(|(w, _)| Windows::holds(**w, t))
            .map(|(w, f)| (*w, Arc::clone(f)))
            .collect();
        found.sort_by_key(|(w, _)| level_of(*w));
        found
    }

    /// The windows but `except` that may hold the key of `probe` with a record expiring at `t`:
    /// whose span holds `t` and whose filter may hold the key. (No allocation when there is
    /// none, as for most moves: a record rewritten in its own window.)
    pub(crate) fn holding_key(&self, t: Millis, probe: &Probe, except: Option<u64>) -> Vec<u64> {
        self.map
            .read()
            .iter()
            .filter(|(w, f)| Some(**w) != except && Windows::holds(**w, t) && f.may_hold(probe))
            .map(|(w, _)| *w)
            .collect()
    }

    /// The filter of `window` if it has one (its table may exist).
    pub(crate) fn existing(&self, window: u64) -> Option<Arc<Filter>> {
        self.map.read().get(&window).cloned()
    }

    /// How many windows may have a table.
    #[cfg(feature = "__whitebox")]
    pub(crate) fn count(&self) -> usize {
        self.map.read().len()
    }

    /// Every window that may have a table, the earliest to end first, with its filter.
    pub(crate) fn list(&self) -> Vec<(u64, Arc<Filter>)> {
        let mut all: Vec<(u64, Arc<Filter>)> = self
            .map
            .read()
            .iter()
            .map(|(w, f)| (*w, Arc::clone(f)))
            .collect();
        all.sort_by_key(|(w, _)| Windows::end(*w));
        all
    }

    /// The windows that have ended at `now`, the earliest to end first: every record in them
    /// expired.
    pub(crate) fn due(&self, now: Millis) -> Vec<u64> {
        let mut due: Vec<u64> = self
            .map
            .read()
            .keys()
            .copied()
            .filter(|w| Windows::end(*w) <= now)
            .collect();
        due.sort_by_key(|w| Windows::end(*w));
        due
    }

    /// Forgets `window` (its table was deleted).
    pub(crate) fn forget(&self, window: u64) {
        if let Some(filter) = self.map.write().remove(&window) {
            self.largest.fetch_max(filter.len(), Ordering::Relaxed);
        }
    }
}

/// One read snapshot of every window's records table, with the filters: what a reader looks
/// a key up in.
pub(crate) struct Records {
    tables: Vec<(u64, Arc<Filter>, RecordsTable)>,
    /// The filters' hash ([`Windows::hash`]).
    hasher: SipHasher13,
}

impl Records {
    /// The records of `txn`: every window's table that `txn` holds (a window without a
    /// filter, one deleted since `txn` began, is looked up in for every key).
    pub(crate) fn open(txn: &ReadTransaction, windows: &Windows) -> Result<Records, StorageError> {
        let ctx = "reading the store's windows";
        let filters = windows.map.read().clone();
        let names: Vec<String> = txn
            .list_tables()
            .map_err(|e| StorageError::redb(ctx, e))?
            .map(|handle| handle.name().to_string())
            .collect();
        let mut tables = Vec::new();
        for name in names {
            let Some(window) = parse_table_name(&name) else {
                continue;
            };
            let filter = filters
                .get(&window)
                .cloned()
                .unwrap_or_else(|| Arc::new(Filter::everything()));
            match txn.open_table(RecordsDef::new(&name)) {
                Ok(table) => tables.push((window, filter, table)),
                Err(TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(StorageError::redb(ctx, e)),
            }
        }
        tables.sort_by_key(|(window, _, _)| Windows::end(*window));
        Ok(Records {
            tables,
            hasher: windows.hasher,
        })
    }

    /// The stored bytes of `key`, expired or not: looked up in each window whose filter may
    /// hold it, with one hash of the key.
    pub(crate) fn get(
        &self,
        key: &[u8],
    ) -> Result<Option<AccessGuard<'static, &'static [u8]>>, redb::StorageError> {
        let probe = Probe::of(self.hasher.hash(key));
        for (_, filter, table) in &self.tables {
            if filter.may_hold(&probe) {
                if let Some(found) = table.get(key)? {
                    return Ok(Some(found));
                }
            }
        }
        Ok(None)
    }

    /// Every window's table, the earliest to end first.
    pub(crate) fn tables(&self) -> impl Iterator<Item = (u64, &RecordsTable)> {
        self.tables.iter().map(|(w, _, t)| (*w, t))
    }

    /// Records in every window.
    pub(crate) fn len(&self) -> Result<u64, redb::StorageError> {
        let mut n = 0;
        for (_, _, table) in &self.tables {
            n += table.len()?;
        }
        Ok(n)
    }

    /// Calls `f` with every record's key and bytes in key order (the windows' tables merged),
    /// until it returns `Ok(true)`.
    pub(crate) fn each_in_key_order(
        &self,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<bool, StorageError>,
    ) -> Result<(), StorageError> {
        let ctx = "reading the store's records";
        type Iter<'t> = redb::Range<'t, &'static [u8], &'static [u8]>;
        let mut iters: Vec<Iter<'_>> = Vec::new();
        let mut heads: Vec<Option<Entry>> = Vec::new();
        let next = |iter: &mut Iter<'_>| -> Result<Option<Entry>, StorageError> {
            match iter.next() {
                None => Ok(None),
                Some(entry) => {
                    let (k, v) = entry.map_err(|e| StorageError::redb(ctx, e))?;
                    Ok(Some((k.value().to_vec(), v.value().to_vec())))
                }
            }
        };
        for (_, _, table) in &self.tables {
            let mut iter = table.iter().map_err(|e| StorageError::redb(ctx, e))?;
            heads.push(next(&mut iter)?);
            iters.push(iter);
        }
        loop {
            let smallest = heads
                .iter()
                .enumerate()
                .filter_map(|(i, head)| head.as_ref().map(|(k, _)| (k, i)))
                .min()
                .map(|(_, i)| i);
            let Some(i) = smallest else {
                return Ok(());
            };
            let (key, value) = heads[i].take().expect("a head was found");
            heads[i] = next(&mut iters[i])?;
            if f(&key, &value)? {
                return Ok(());
            }
        }
    }
}
