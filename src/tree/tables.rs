//! The redb tables of a store and the record/index bookkeeping shared by every write path.
//!
//! - `idemstore.records.<window>`: encoded key → encoded [`Record`], one table per window of
//!   expiry time (see [`windows`](super::windows)): a record lives in the table of the window
//!   its `expires_at` falls in, and a key in at most one table.
//! - `idemstore.deadlines`: (kind, time, key) → (), the lease index: one entry per pending
//!   record, at (`LEASE`, lease_until). Stale reservations are found without a scan. Records
//!   that are not pending have no entry: their expiry is their window's.
//! - `idemstore.meta`: "format" → format version, "next_token" → the next fencing token, "wal_seq" → the last log frame whose
//!   changes this file holds, "log_salt" → the salt of the log frames written since the last
//!   checkpoint, "log_start" → the offset of the log region those frames start at (absent: the
//!   first frame's place), "next_log_salt" → the salt the next region's frames will carry
//!   (chosen before any frame uses it), "store_id" → the store's random identity, which its log
//!   carries, "filter_hash" → the hash of the windows' saved filters ([`FILTER_HASH`]),
//!   "filter_seed_0" and "filter_seed_1" → its random seed.
//!
//! Tables whose names start with `idemstore.` belong to the store; a caller's own tables (see
//! [`Store::complete_with`](crate::Store::complete_with)) must use other names.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use redb::{ReadableTable, ReadableTableMetadata, Table, TableDefinition, WriteTransaction};

use super::filter::Filter;
use super::filter::Probe;
use super::opening::write_filter_hash;
use super::windows::{level_for, level_of, table_name, RecordsDef, Windows, FILTERS};
use crate::error::StorageError;
use crate::record::{Millis, Record, State};

/// The lease index: (kind, time, encoded key) → (); see the module's documentation.
pub(crate) const DEADLINES: TableDefinition<(u8, u64, &[u8]), ()> =
    TableDefinition::new("idemstore.deadlines");
/// The kind of a pending record's deadline entry: its time is `lease_until`.
pub(crate) const LEASE: u8 = 1;
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("idemstore.meta");

pub(crate) const META_FORMAT: &str = "format";
pub(crate) const META_NEXT_TOKEN: &str = "next_token";
pub(crate) const META_WAL_SEQ: &str = "wal_seq";
pub(crate) const META_LOG_SALT: &str = "log_salt";
pub(crate) const META_STORE_ID: &str = "store_id";
/// The width of the expiry windows of a store of format [`CONVERTED_FORMAT`], in milliseconds;
/// removed when it is converted.
pub(crate) const META_WINDOW_MS: &str = "window_ms";
/// The hash the windows' saved filters were written with ([`FILTER_HASH`]); absent in a store
/// of the format as first released (foldhash), whose saved filters are not read.
pub(crate) const META_FILTER_HASH: &str = "filter_hash";
/// The two words of the filter hash's random seed ([`FilterSeed`]).
pub(crate) const META_FILTER_SEED: [&str; 2] = ["filter_seed_0", "filter_seed_1"];
/// Where the frames after `wal_seq` start (absent: right after the log's identity block).
pub(crate) const META_LOG_START: &str = "log_start";
/// The salt of the next log region's frames, durable before any frame carries it.
pub(crate) const META_NEXT_LOG_SALT: &str = "next_log_salt";
/// Present (value 1) while the store is closed cleanly: set by the last checkpoint on close,
/// removed by the next open (`log/clean_close.rs`).
pub(crate) const META_CLOSED_CLEAN: &str = "closed_clean";

/// The store format version written and read by this build: the first format of a release
/// (docs/format.md). Earlier numbers were development formats that no release wrote; a file
/// of [`CONVERTED_FORMAT`] is converted at open, one of an earlier one refused.
pub(crate) const FORMAT_VERSION: u64 = 5;

/// The format before windows were sized by their records' horizons (all one width, the meta
/// key `window_ms`): converted when opened ([`open_windows`]).
pub(crate) const CONVERTED_FORMAT: u64 = 4;

/// Decodes a stored record, naming the key on damage.
pub(crate) fn decode_record(key: &[u8], bytes: &[u8]) -> Result<Record, StorageError> {
    Record::decode(bytes).map_err(|reason| StorageError::corrupt_record(key, reason))
}

/// The store's tables opened in one write transaction: the windows' records tables as they
/// are needed, the lease index and the meta table.
pub(crate) struct Tables<'txn> {
    txn: &'txn WriteTransaction,
    windows: &'txn Windows,
    records: BTreeMap<u64, Table<'txn, &'static [u8], &'static [u8]>>,
    pub(crate) deadlines: Table<'txn, (u8, u64, &'static [u8]), ()>,
    meta: Table<'txn, &'static str, u64>,
    filters: Table<'txn, u64, &'static [u8]>,
}

impl<'txn> Tables<'txn> {
    pub(crate) fn open(
        txn: &'txn WriteTransaction,
        windows: &'txn Windows,
    ) -> Result<Tables<'txn>, StorageError> {
        let open = "opening the store's tables";
        Ok(Tables {
            txn,
            windows,
            records: BTreeMap::new(),
            deadlines: txn
                .open_table(DEADLINES)
                .map_err(|e| StorageError::redb(open, e))?,
            meta: txn
                .open_table(META)
                .map_err(|e| StorageError::redb(open, e))?,
            filters: txn
                .open_table(FILTERS)
                .map_err(|e| StorageError::redb(open, e))?,
        })
    }

    /// Saves the filter of every window whose saved filter is missing or out of date: every
    /// durable commit does, so a durable state's saved filters hold every key of its tables.
    pub(crate) fn save_filters(&mut self) -> Result<(), StorageError> {
        for (window, filter) in self.windows.list() {
            if !filter.saved.load(Ordering::Acquire) {
                self.filters
                    .insert(window, filter.encode().as_slice())
                    .map_err(|e| StorageError::redb("saving a window's filter", e))?;
                filter.saved.store(true, Ordering::Release);
            }
        }
        Ok(())
    }

    /// The windows the records are kept in.
    pub(crate) fn windows(&self) -> &'txn Windows {
        self.windows
    }

    /// The records table of `window`, opened (and made, if it does not exist) on first use.
    pub(crate) fn window(
        &mut self,
        window: u64,
    ) -> Result<&mut Table<'txn, &'static [u8], &'static [u8]>, StorageError> {
        use std::collections::btree_map::Entry;
        match self.records.entry(window) {
            Entry::Occupied(open) => Ok(open.into_mut()),
            Entry::Vacant(slot) => {
                let table = self
                    .txn
                    .open_table(RecordsDef::new(&table_name(window)))
                    .map_err(|e| StorageError::redb("opening a window's records", e))?;
                Ok(slot.insert(table))
            }
        }
    }

    /// Deletes every window that has ended at `now` (a table deletion each: the records are
    /// not read, and a cache may keep them, as they read as absent), and every window that a
    /// record left since the last look and that holds none now (a pending record's window that
    /// its completion moved it out of, say: it would otherwise stay, empty, until it ends);
    /// returns how many windows and how many records they held.
    ///
    /// Only transactions that never roll back call it (the applier's and the sweeper's): a
    /// window deleted here is forgotten at once.
    pub(crate) fn drop_ended_windows(&mut self, now: Millis) -> Result<(u64, u64), StorageError> {
        let (mut windows, mut held) = (0, 0);
        for window in self.windows.due(now) {
            held += self.drop_window(window)?;
            windows += 1;
        }
        for (window, filter) in self.windows.list() {
            if filter.shrunk.swap(false, Ordering::AcqRel) {
                let table = self.window(window)?;
                let empty = table
                    .is_empty()
                    .map_err(|e| StorageError::redb("deleting an empty window", e))?;
                if empty {
                    self.forget_window(window, "deleting an empty window")?;
                    windows += 1;
                }
            }
        }
        Ok((windows, held))
    }

    /// Deletes window `window`'s table with every record in it (all expired: the window ended)
    /// and the lease entries of its pending records; returns how many records it held.
    pub(crate) fn drop_window(&mut self, window: u64) -> Result<u64, StorageError> {
        let ctx = "deleting an expired window";
        let end = Windows::end(window);
        let candidates: Vec<(Millis, Vec<u8>)> = self
            .deadlines
            .range::<(u8, u64, &[u8])>((LEASE, 0, &[][..])..(LEASE, end, &[][..]))
            .map_err(|e| StorageError::redb(ctx, e))?
            .map(|entry| entry.map(|(k, _)| (k.value().1, k.value().2.to_vec())))
            .collect::<Result<_, _>>()
            .map_err(|e| StorageError::redb(ctx, e))?;
        let table = self.window(window)?;
        let held = table.len().map_err(|e| StorageError::redb(ctx, e))?;
        let mut spent = Vec::new();
        for (at, key) in candidates {
            if table
                .get(key.as_slice())
                .map_err(|e| StorageError::redb(ctx, e))?
                .is_some()
            {
                spent.push((at, key));
            }
        }
        for (at, key) in spent {
            self.drop_deadline_entry(LEASE, at, &key)?;
        }
        self.forget_window(window, ctx)?;
        Ok(held)
    }

    /// Deletes window `window`'s table and saved filter, and forgets it.
    fn forget_window(&mut self, window: u64, ctx: &'static str) -> Result<(), StorageError> {
        self.records.remove(&window);
        self.txn
            .delete_table(RecordsDef::new(&table_name(window)))
            .map_err(|e| StorageError::redb(ctx, e))?;
        self.filters
            .remove(window)
            .map_err(|e| StorageError::redb(ctx, e))?;
        self.windows.forget(window);
        Ok(())
    }

    /// Writes the format marker, the first token, the store's random identity, its first log
    /// salt and the filters' hash with its random seed into a new store: all durable before any
    /// frame is written.
    pub(crate) fn initialize(&mut self) -> Result<(), StorageError> {
        let ctx = "initializing a new store";
        self.meta
            .insert(META_FORMAT, FORMAT_VERSION)
            .map_err(|e| StorageError::redb(ctx, e))?;
        write_filter_hash(&mut self.meta, ctx)?;
        self.meta
            .insert(META_NEXT_TOKEN, 1)
            .map_err(|e| StorageError::redb(ctx, e))?;
        self.meta
            .insert(META_WAL_SEQ, 0)
            .map_err(|e| StorageError::redb(ctx, e))?;
        self.meta
            .insert(META_STORE_ID, new_salt().max(1))
            .map_err(|e| StorageError::redb(ctx, e))?;
        self.meta
            .insert(META_LOG_SALT, new_salt())
            .map_err(|e| StorageError::redb(ctx, e))?;
        Ok(())
    }

    /// The last log frame whose changes this file holds.
    pub(crate) fn wal_seq(&self) -> Result<u64, StorageError> {
        Ok(self
            .meta_u64(META_WAL_SEQ, "reading the log position")?
            .unwrap_or(0))
    }

    /// The salt of the log frames written since the last checkpoint (random from creation on).
    pub(crate) fn log_salt(&self) -> Result<u64, StorageError> {
        Ok(self
            .meta_u64(META_LOG_SALT, "reading the log salt")?
            .unwrap_or(0))
    }

    /// Where the frames after [`wal_seq`](Tables::wal_seq) start (`None`: at the log's first
    /// frame, as in a store written before log regions).
    pub(crate) fn log_start(&self) -> Result<Option<u64>, StorageError> {
        self.meta_u64(META_LOG_START, "reading the log region")
    }

    /// The salt of the next log region's frames (`None` in a store written before regions).
    pub(crate) fn next_log_salt(&self) -> Result<Option<u64>, StorageError> {
        self.meta_u64(META_NEXT_LOG_SALT, "reading the next log salt")
    }

    /// The meta value `name`, if present (`doing` names the read in an error).
    fn meta_u64(&self, name: &str, doing: &'static str) -> Result<Option<u64>, StorageError> {
        let value = self
            .meta
            .get(name)
            .map_err(|e| StorageError::redb(doing, e))?;
        Ok(value.map(|v| v.value()))
    }

    /// Records where the frames after `wal_seq` are: the region starting at `start`, under
    /// `salt`, and the salt the region after it will use.
    pub(crate) fn set_log_region(
        &mut self,
        start: u64,
        salt: u64,
        next_salt: u64,
    ) -> Result<(), StorageError> {
        let ctx = "saving the log region";
        self.meta
            .insert(META_LOG_START, start)
            .map_err(|e| StorageError::redb(ctx, e))?;
        self.meta
            .insert(META_LOG_SALT, salt)
            .map_err(|e| StorageError::redb(ctx, e))?;
        self.meta
            .insert(META_NEXT_LOG_SALT, next_salt)
            .map_err(|e| StorageError::redb(ctx, e))?;
        Ok(())
    }

    pub(crate) fn set_wal_seq(&mut self, seq: u64) -> Result<(), StorageError> {
        self.meta
            .insert(META_WAL_SEQ, seq)
            .map_err(|e| StorageError::redb("saving the log position", e))?;
        Ok(())
    }

    pub(crate) fn next_token(&self) -> Result<u64, StorageError> {
        let value = self.meta_u64(META_NEXT_TOKEN, "reading the next fencing token")?;
        value.ok_or_else(|| StorageError::Corruption {
            location: "table idemstore.meta".into(),
            reason: "the next fencing token is missing".into(),
        })
    }

    pub(crate) fn set_next_token(&mut self, token: u64) -> Result<(), StorageError> {
        self.meta
            .insert(META_NEXT_TOKEN, token)
            .map_err(|e| StorageError::redb("saving the next fencing token", e))?;
        Ok(())
    }

    /// The record stored under `key`, expired or not.
    ///
    /// `Ok(Err(_))` is a corrupt record: an error for that key alone, not for the whole batch.
    pub(crate) fn load(
        &mut self,
        key: &[u8],
    ) -> Result<Result<Option<Record>, StorageError>, StorageError> {
        let probe = Probe::of(self.windows.hash(key));
        for (window, filter) in self.windows.list() {
            if !filter.may_hold(&probe) {
                continue;
            }
            let value = self
                .window(window)?
                .get(key)
                .map_err(|e| StorageError::redb("reading a record", e))?;
            if let Some(bytes) = value {
                return Ok(decode_record(key, bytes.value()).map(Some));
            }
        }
        Ok(Ok(None))
    }

    /// Stores `record` (encoded as `encoded`) under `key` and keeps the tables exact: the
    /// record stored there now (`old`, from [`IndexEntries::of`], `None` when absent) leaves
    /// its window and its lease entry, `record` goes to its own window with its own entry.
    /// Every write of a record goes through here or [`delete`](Tables::delete).
    pub(crate) fn put(
        &mut self,
        key: &[u8],
        old: Option<IndexEntries>,
        record: &Record,
        encoded: &[u8],
    ) -> Result<(), StorageError> {
        self.put_indexed(
            key,
            old,
            IndexEntries::of(record),
            written_at(record),
            encoded,
        )
    }

    /// [`put`](Tables::put) of a record whose index entries are `index`, written at `written`
    /// ([`written_at`]).
    fn put_indexed(
        &mut self,
        key: &[u8],
        old: Option<IndexEntries>,
        index: IndexEntries,
        written: Millis,
        encoded: &[u8],
    ) -> Result<(), StorageError> {
        let ctx = "writing a record";
        let (target, filter) = self.windows.place(index.expires_at, written);
        let probe = Probe::of(self.windows.hash(key));
        if let Some(old) = old {
            self.unindex(key, old)?;
            self.remove_from_holding(old.expires_at, &probe, key, Some(target))?;
        }
        self.learn(target, &filter, &probe)?;
        count_write();
        self.window(target)?
            .insert(key, encoded)
            .map_err(|e| StorageError::redb(ctx, e))?;
        if let Some(at) = index.lease {
            count_write();
            self.deadlines
                .insert((LEASE, at, key), ())
                .map_err(|e| StorageError::redb(ctx, e))?;
        }
        Ok(())
    }

    /// Adds the key of `probe` to `window`'s filter, unless the filter already answers "may
    /// hold" for it (a rewrite in place): not on the word of where the record was, whose
    /// window may have been deleted and made again since (a stale cached record, a clock
    /// stepped back), its filter a new one without the key. A filter never unlearns a key, so
    /// what it answers now it answers for as long as the window lives, and from its saved row.
    fn learn(&mut self, window: u64, filter: &Filter, probe: &Probe) -> Result<(), StorageError> {
        if !filter.may_hold(probe) {
            if filter.saved.swap(false, Ordering::AcqRel) {
                // The saved filter no longer holds every key: a durable commit without it
                // makes the next open build the window's filter from its keys.
                self.filters
                    .remove(window)
                    .map_err(|e| StorageError::redb("updating a window's filter", e))?;
            }
            filter.insert_probe(probe);
        }
        Ok(())
    }

    /// Moves the records written to narrow windows into their horizon's window once no record
    /// of that horizon can be written to those windows any more ([`Windows::closed_narrow`]):
    /// the children of one enclosing window read together in key order, so that window is
    /// written once, by appends when it is new (its leaves then full). A record stays where it
    /// is if its horizon's window is not the enclosing one (a record placed where a crowded
    /// store put it, or one that is in its own window already) or if it does not decode; a
    /// narrow window that keeps none is deleted. Returns how many narrow windows were merged.
    ///
    /// `closed` is [`Windows::closed_narrow`]'s list. Only transactions that never roll back
    /// call it, as for [`drop_ended_windows`](Tables::drop_ended_windows): the windows'
    /// filters change at once.
    pub(crate) fn merge_closed_windows(
        &mut self,
        closed: Vec<(u64, Vec<u64>)>,
    ) -> Result<u64, StorageError> {
        let mut merged = 0;
        for (parent, mut children) in closed {
            // Not those deleted since the list was made (ended, in the same transaction).
            children.retain(|child| self.windows.existing(*child).is_some());
            if children.is_empty() {
                continue;
            }
            self.merge_into(parent, &children)?;
            merged += children.len() as u64;
        }
        Ok(merged)
    }

    /// Moves the records of `children` whose horizon's window is `parent` into it, in key order.
    fn merge_into(&mut self, parent: u64, children: &[u64]) -> Result<(), StorageError> {
        let ctx = "moving records into their horizon's window";
        let level = level_of(parent);
        let moves = |value: &[u8]| {
            Record::decode(value).is_ok_and(|record| {
                let horizon = record.expires_at.saturating_sub(written_at(&record));
                u64::from(level_for(horizon)) == level
            })
        };
        // A table is open once per transaction: these are opened here, not through `window`.
        self.records.remove(&parent);
        for child in children {
            self.records.remove(child);
        }
        let mut sources = Vec::with_capacity(children.len());
        let mut total = 0u64;
        for child in children {
            let table = self
                .txn
                .open_table(RecordsDef::new(&table_name(*child)))
                .map_err(|e| StorageError::redb(ctx, e))?;
            total += table.len().map_err(|e| StorageError::redb(ctx, e))?;
            sources.push(table);
        }
        let filter = self
            .windows
            .make(parent, usize::try_from(total).unwrap_or(usize::MAX));
        let mut target = self
            .txn
            .open_table(RecordsDef::new(&table_name(parent)))
            .map_err(|e| StorageError::redb(ctx, e))?;
        let mut kept = vec![0u64; children.len()];
        {
            type Item<'t> = (
                redb::AccessGuard<'t, &'static [u8]>,
                redb::AccessGuard<'t, &'static [u8]>,
            );
            let mut iters = Vec::with_capacity(sources.len());
            let mut heads: Vec<Option<Item<'_>>> = Vec::with_capacity(sources.len());
            for table in &sources {
                let mut iter = table.iter().map_err(|e| StorageError::redb(ctx, e))?;
                heads.push(
                    iter.next()
                        .transpose()
                        .map_err(|e| StorageError::redb(ctx, e))?,
                );
                iters.push(iter);
            }
            loop {
                let smallest = heads
                    .iter()
                    .enumerate()
                    .filter_map(|(i, head)| head.as_ref().map(|(k, _)| (k.value(), i)))
                    .min()
                    .map(|(_, i)| i);
                let Some(i) = smallest else { break };
                let (key, value) = heads[i].take().expect("a head was found");
                heads[i] = iters[i]
                    .next()
                    .transpose()
                    .map_err(|e| StorageError::redb(ctx, e))?;
                if !moves(value.value()) {
                    kept[i] += 1;
                    continue;
                }
                let probe = Probe::of(self.windows.hash(key.value()));
                self.learn(parent, &filter, &probe)?;
                count_write();
                target
                    .insert(key.value(), value.value())
                    .map_err(|e| StorageError::redb(ctx, e))?;
            }
        }
        drop(target);
        for ((child, mut table), kept) in children.iter().zip(sources).zip(kept) {
            if kept == 0 {
                drop(table);
                self.forget_window(*child, ctx)?;
                continue;
            }
            table
                .retain(|_, value| !moves(value))
                .map_err(|e| StorageError::redb(ctx, e))?;
            if let Some(filter) = self.windows.existing(*child) {
                filter.unmerged.store(false, Ordering::Release);
            }
        }
        Ok(())
    }

    /// Deletes `key` with its lease entry (`old`, as for [`put`](Tables::put); `None` when
    /// unknown, as for a record that does not decode: then every window that may hold it).
    pub(crate) fn delete(
        &mut self,
        key: &[u8],
        old: Option<IndexEntries>,
    ) -> Result<(), StorageError> {
        match old {
            Some(old) => {
                self.unindex(key, old)?;
                let probe = Probe::of(self.windows.hash(key));
                self.remove_from_holding(old.expires_at, &probe, key, None)
            }
            None => self.remove_everywhere(key),
        }
    }

    /// Removes `key` from every window that may hold it: for a record whose window is not
    /// known (it does not decode).
    pub(crate) fn remove_everywhere(&mut self, key: &[u8]) -> Result<(), StorageError> {
        let probe = Probe::of(self.windows.hash(key));
        for (window, filter) in self.windows.list() {
            if filter.may_hold(&probe) {
                self.remove_from(window, key)?;
            }
        }
        Ok(())
    }

    /// Removes `key` (of `probe`) from every window but `keep` that may hold it with a record
    /// expiring at `t`: the windows whose span holds `t` and whose filter may hold the key (a
    /// record written at another time, or on a stale word of where it was, may be in any of
    /// them).
    fn remove_from_holding(
        &mut self,
        t: Millis,
        probe: &Probe,
        key: &[u8],
        keep: Option<u64>,
    ) -> Result<(), StorageError> {
        for window in self.windows.holding_key(t, probe, keep) {
            self.remove_from(window, key)?;
        }
        Ok(())
    }

    /// Removes `key` from `window`'s table, if the window has one.
    fn remove_from(&mut self, window: u64, key: &[u8]) -> Result<(), StorageError> {
        let Some(filter) = self.windows.existing(window) else {
            return Ok(());
        };
        count_write();
        let removed = self
            .window(window)?
            .remove(key)
            .map_err(|e| StorageError::redb("deleting a record", e))?;
        if removed.is_some() {
            filter.shrunk.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Drops one deadline entry that matches no record (a damaged or replaced record).
    pub(crate) fn drop_deadline_entry(
        &mut self,
        kind: u8,
        at: Millis,
        key: &[u8],
    ) -> Result<(), StorageError> {
        count_write();
        self.deadlines
            .remove((kind, at, key))
            .map_err(|e| StorageError::redb("updating the lease index", e))?;
        Ok(())
    }

    /// Removes a record's lease entry.
    fn unindex(&mut self, key: &[u8], index: IndexEntries) -> Result<(), StorageError> {
        if let Some(at) = index.lease {
            count_write();
            self.deadlines
                .remove((LEASE, at, key))
                .map_err(|e| StorageError::redb("updating the lease index", e))?;
        }
        Ok(())
    }
}

/// When `record` was written, as far as its window is concerned: its horizon is its expiry
/// minus this (`Windows::place`). The time its state began: a pending record's lease end (its
/// expiry is that plus the retention), a completed record's completion, a parked record's
/// parking. Taken from the record, not from a clock, so a record goes to the same window
/// whether the applier writes it at once, later, or log replay writes it after a crash.
pub(crate) fn written_at(record: &Record) -> Millis {
    match &record.state {
        State::Pending { lease_until, .. } => *lease_until,
        State::Completed { completed_at, .. } => *completed_at,
        State::NeedsReview { since, .. } => *since,
    }
}

/// Where a record is kept: the window of its expiry, and its lease entry if it is pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexEntries {
    /// `lease_until` of a pending record (its entry in the lease index).
    pub(crate) lease: Option<Millis>,
    /// When it expires: its window.
    pub(crate) expires_at: Millis,
}

impl IndexEntries {
    pub(crate) fn of(record: &Record) -> IndexEntries {
        IndexEntries {
            lease: record.lease_until(),
            expires_at: record.expires_at,
        }
    }
}

/// Counts a B-tree write (an insert or a removal) for the tests, which read the count through
/// the white-box tree ([`seam`](super::seam)); nothing without the hidden feature.
#[inline]
fn count_write() {
    #[cfg(feature = "__whitebox")]
    super::seam::count_write();
}

/// A fresh random number: a store's identity, or the salt of the log's frames after a
/// checkpoint.
pub(crate) fn new_salt() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}
