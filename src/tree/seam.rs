//! The store's tables on a database of their own, for the tests that drive the writes every
//! path makes ([`Tables`]: a record's put, a window's deletion) directly, with the record a
//! caller believes stored before: a stale one, as a cache could hold, which the public API
//! may never hand the tables (hidden feature `__whitebox`, re-exported by
//! `idemstore::whitebox`).

use std::sync::Arc;

use redb::backends::InMemoryBackend;
use redb::{Database, ReadableDatabase};

use super::tables::{open_windows, IndexEntries, Tables};
use super::windows::{Records, Windows};
use crate::clock::{to_millis, Clock, ManualClock};
use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::record::{Millis, Record, State};

/// A new store's tables in memory, with its windows as a store keeps them.
pub struct Tree {
    db: Database,
    windows: Windows,
    clock: Arc<dyn Clock>,
}

impl Tree {
    /// An empty store's tables, opened as a store opens them, its records completed at the
    /// time of `clock`.
    pub fn new(clock: &ManualClock) -> Result<Tree, Error> {
        let ctx = "making a whitebox tree";
        let db = redb::Builder::new()
            .create_with_backend(InMemoryBackend::new())
            .map_err(|e| Error::storage(ctx, e))?;
        let txn = db.begin_write().map_err(|e| Error::storage(ctx, e))?;
        Tables::open(&txn, &Windows::new())?.initialize()?;
        txn.commit().map_err(|e| Error::storage(ctx, e))?;
        let clock: Arc<dyn Clock> = Arc::new(clock.clone());
        let windows = open_windows(&db)?;
        Ok(Tree { db, windows, clock })
    }

    /// Stores a completed record of `key` (encoded) expiring at `expires_at`, in one durable
    /// commit that saves the filters, telling the tables that the record stored before it
    /// expires at `old` (`None`: none), as a caller that read it, maybe from a stale cache,
    /// would.
    pub fn put(&self, key: &[u8], old: Option<Millis>, expires_at: Millis) -> Result<(), Error> {
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

    /// Deletes the windows a record expiring at `expires_at` may live in, in one durable commit.
    pub fn drop_window_of(&self, expires_at: Millis) -> Result<(), Error> {
        let windows = self.windows.holding(expires_at);
        self.write(|tables| {
            for (window, _) in windows {
                tables.drop_window(window)?;
            }
            Ok(())
        })
    }

    /// Deletes every window that has ended at `now`, in one durable commit, as the store's
    /// sweeper does.
    pub fn drop_ended_windows(&self, now: Millis) -> Result<(), Error> {
        self.write(|tables| tables.drop_ended_windows(now).map(drop))
    }

    /// The windows that may have a table (one per window the tree's records made and that was
    /// not deleted), as a store counts them.
    pub fn windows(&self) -> usize {
        self.windows.count()
    }

    /// The records tables in the tree's file.
    pub fn tables(&self) -> Result<usize, Error> {
        let ctx = "reading a whitebox tree";
        let txn = self.db.begin_read().map_err(|e| Error::storage(ctx, e))?;
        Ok(Records::open(&txn, &self.windows)?.tables().count())
    }

    /// Whether a lookup through the windows' filters finds `key`.
    pub fn finds(&self, key: &[u8]) -> Result<bool, Error> {
        let ctx = "reading a whitebox tree";
        let txn = self.db.begin_read().map_err(|e| Error::storage(ctx, e))?;
        let records = Records::open(&txn, &self.windows)?;
        let found = records.get(key).map_err(|e| Error::storage(ctx, e))?;
        Ok(found.is_some())
    }

    /// Reads the windows and their saved filters again, as the next open would.
    pub fn reopen(&mut self) -> Result<(), Error> {
        self.windows = open_windows(&self.db)?;
        Ok(())
    }

    /// Runs `change` in one write transaction that saves the filters, committed durably.
    fn write(
        &self,
        change: impl FnOnce(&mut Tables<'_>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let ctx = "writing a whitebox tree";
        let txn = self.db.begin_write().map_err(|e| Error::storage(ctx, e))?;
        {
            let mut tables = Tables::open(&txn, &self.windows)?;
            change(&mut tables)?;
            tables.save_filters()?;
        }
        txn.commit().map_err(|e| Error::storage(ctx, e))
    }
}
