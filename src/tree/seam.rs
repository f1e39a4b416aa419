//! The store's tables on a database of their own, for the tests that drive the writes every
//! path makes ([`Tables`]: a record's put, a window's deletion) directly, with the record a
//! caller believes stored before: a stale one, as a cache could hold, which the public API
//! may never hand the tables (hidden feature `__whitebox`, re-exported by
//! `idemstore::whitebox`).

use std::sync::Arc;

use redb::backends::InMemoryBackend;
use redb::{Database, ReadableDatabase, ReadableTable};

use super::opening::open_windows;
use super::tables::{IndexEntries, Tables};
use super::windows::{Records, Windows};
use crate::clock::{to_millis, Clock, ManualClock};
use crate::error::StorageError;
use crate::fingerprint::Fingerprint;
use crate::record::{Millis, Record, State};

thread_local! {
    /// B-tree writes (inserts and removals) made through [`Tables`] on this thread.
    static BTREE_WRITES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts one B-tree write made through [`Tables`] on this thread.
pub(crate) fn count_write() {
    BTREE_WRITES.with(|n| n.set(n.get() + 1));
}

/// A new store's tables in memory, with its windows as a store keeps them.
pub struct Tree {
    db: Database,
    windows: Windows,
    clock: Arc<dyn Clock>,
}

impl Tree {
    /// An empty store's tables, opened as a store opens them, its records completed at the
    /// time of `clock`.
    pub fn new(clock: &ManualClock) -> Result<Tree, StorageError> {
        let ctx = "making a whitebox tree";
        let db = redb::Builder::new()
            .create_with_backend(InMemoryBackend::new())
            .map_err(|e| StorageError::redb(ctx, e))?;
        let txn = db.begin_write().map_err(|e| StorageError::redb(ctx, e))?;
        Tables::open(&txn, &Windows::new())?.initialize()?;
        txn.commit().map_err(|e| StorageError::redb(ctx, e))?;
        let clock: Arc<dyn Clock> = Arc::new(clock.clone());
        let windows = open_windows(&db)?;
        Ok(Tree { db, windows, clock })
    }

    /// Stores a completed record of `key` (encoded) expiring at `expires_at`, in one durable
    /// commit that saves the filters, telling the tables that the record stored before it
    /// expires at `old` (`None`: none), as a caller that read it, maybe from a stale cache,
    /// would.
    pub fn put(
        &self,
        key: &[u8],
        old: Option<Millis>,
        expires_at: Millis,
    ) -> Result<(), StorageError> {
        let record = Record {
            fingerprint: Fingerprint::of(b"whitebox tree"),
            token: 1,
            attempt: 1,
            expires_at,
            state: State::Completed {
                completed_at: to_millis(self.clock.now()),
                result: Vec::new(),
            },
        };
        let old = old.map(|expires_at| IndexEntries {
            lease: None,
            expires_at,
        });
        self.write(|tables| tables.put(key, old, &record, &record.encode()))
    }

    /// Stores `record` under `key` (encoded) as the applier and log replay do, telling the
    /// tables the record stored before it was `old`, in one durable commit; returns the
    /// B-tree writes (inserts and removals) the put made.
    pub fn put_record(
        &self,
        key: &[u8],
        old: Option<&Record>,
        record: &Record,
    ) -> Result<u64, StorageError> {
        let mut writes = 0;
        self.write(|tables| {
            let before = BTREE_WRITES.with(|n| n.get());
            let old = old.map(IndexEntries::of);
            tables.put(key, old, record, &record.encode())?;
            writes = BTREE_WRITES.with(|n| n.get()) - before;
            Ok(())
        })?;
        Ok(writes)
    }

    /// The record of `key` (encoded) as the tables look it up; a damaged one is an error.
    pub fn load(&self, key: &[u8]) -> Result<Option<Record>, StorageError> {
        let mut found = None;
        self.write(|tables| {
            found = tables.load(key)??;
            Ok(())
        })?;
        Ok(found)
    }

    /// Whether a window that may hold records expiring at `expires_at` holds `key` (encoded).
    pub fn window_holds(&self, expires_at: Millis, key: &[u8]) -> Result<bool, StorageError> {
        let windows = self.windows.holding(expires_at);
        let mut held = false;
        self.write(|tables| {
            let ctx = "reading a whitebox tree's window";
            for (window, _) in windows {
                let table = tables.window(window)?;
                held |= table
                    .get(key)
                    .map_err(|e| StorageError::redb(ctx, e))?
                    .is_some();
            }
            Ok(())
        })?;
        Ok(held)
    }

    /// The entries of the lease and expiry index.
    pub fn deadline_entries(&self) -> Result<usize, StorageError> {
        let mut count = 0;
        self.write(|tables| {
            let ctx = "reading a whitebox tree's index";
            count = tables
                .deadlines
                .iter()
                .map_err(|e| StorageError::redb(ctx, e))?
                .count();
            Ok(())
        })?;
        Ok(count)
    }

    /// Whether the first existing windows holding `expires_at` and `other` differ.
    pub fn windows_differ(&self, expires_at: Millis, other: Millis) -> bool {
        let first = |at: Millis| self.windows.holding(at).first().map(|(window, _)| *window);
        first(expires_at) != first(other)
    }

    /// Deletes the windows a record expiring at `expires_at` may live in, in one durable commit.
    pub fn drop_window_of(&self, expires_at: Millis) -> Result<(), StorageError> {
        let windows = self.windows.holding(expires_at);
        self.write(|tables| {
            for (window, _) in windows {
                tables.drop_window(window)?;
            }
            Ok(())
        })
    }

    /// Deletes every window that has ended at `now` and merges the closed narrow windows, in
    /// one durable commit, as the store's applier does.
    pub fn drop_ended_windows(&self, now: Millis) -> Result<(), StorageError> {
        self.write(|tables| {
            tables.drop_ended_windows(now)?;
            let closed = tables.windows().closed_narrow(now);
            tables.merge_closed_windows(closed).map(drop)
        })
    }

    /// The windows that may have a table (one per window the tree's records made and that was
    /// not deleted), as a store counts them.
    pub fn windows(&self) -> usize {
        self.windows.count()
    }

    /// The records tables in the tree's file.
    pub fn tables(&self) -> Result<usize, StorageError> {
        let ctx = "reading a whitebox tree";
        let txn = self
            .db
            .begin_read()
            .map_err(|e| StorageError::redb(ctx, e))?;
        Ok(Records::open(&txn, &self.windows)?.tables().count())
    }

    /// Whether a lookup through the windows' filters finds `key`.
    pub fn finds(&self, key: &[u8]) -> Result<bool, StorageError> {
        let ctx = "reading a whitebox tree";
        let found = self
            .records()?
            .get(key)
            .map_err(|e| StorageError::redb(ctx, e))?;
        Ok(found.is_some())
    }

    /// A read snapshot of the records of every window, as a store's reader opens it.
    pub(crate) fn records(&self) -> Result<Records, StorageError> {
        let ctx = "reading a whitebox tree";
        let txn = self
            .db
            .begin_read()
            .map_err(|e| StorageError::redb(ctx, e))?;
        Records::open(&txn, &self.windows)
    }

    /// Reads the windows and their saved filters again, as the next open would.
    pub fn reopen(&mut self) -> Result<(), StorageError> {
        self.windows = open_windows(&self.db)?;
        Ok(())
    }

    /// Runs `change` in one write transaction that saves the filters, committed durably.
    fn write(
        &self,
        change: impl FnOnce(&mut Tables<'_>) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        let ctx = "writing a whitebox tree";
        let txn = self
            .db
            .begin_write()
            .map_err(|e| StorageError::redb(ctx, e))?;
        {
            let mut tables = Tables::open(&txn, &self.windows)?;
            change(&mut tables)?;
            tables.save_filters()?;
        }
        txn.commit().map_err(|e| StorageError::redb(ctx, e))
    }
}
