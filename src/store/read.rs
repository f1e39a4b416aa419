//! Reads: records by key, stale reservations, and snapshots for inspection.

use redb::ReadableDatabase;

use crate::commit::sweep;
use crate::error::Error;
use crate::key::Key;
use crate::record::Record;
use crate::tree::tables::{decode_record, DEADLINES};

use super::Store;

impl Store {
    /// A redb read transaction on the store's file, to read the caller's own tables (those
    /// written with [`complete_with`](Store::complete_with)) while the store is open. It sees
    /// every durable redb commit; tables named `idemstore.*` belong to the store.
    ///
    /// # Errors
    /// Storage errors.
    pub fn begin_read(&self) -> Result<redb::ReadTransaction, Error> {
        self.engine.poison.check()?;
        self.engine
            .db
            .begin_read()
            .map_err(|e| Error::storage("starting a read transaction", e))
    }

    /// The record stored for `key`, or `None` when it is absent or expired.
    ///
    /// # Errors
    /// [`Error::Corruption`] naming the key when its record is damaged.
    pub fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        self.engine.poison.check()?;
        let now = self.now();
        Ok(self.read(key)?.filter(|record| !record.is_expired(now)))
    }

    /// The stored record, from the overlay, the cache or a read transaction; expired or not.
    /// (No vector for the one key: this is the duplicate path.)
    pub(super) fn read(&self, key: &Key) -> Result<Option<Record>, Error> {
        self.read_hook();
        self.read_one(key)
    }

    /// The stored records of `keys`, in order (see [`read`](Store::read)). Each source is
    /// visited once for the batch: the overlay under one lock, the cache under one lock per
    /// shard, and the keys in neither are read from the writer epoch's shared redb snapshot
    /// (`Overlay::committed`, its epoch checked for each key), in key order (the B-tree pages
    /// of neighbouring keys are then read one after the other). Every key is
    /// still looked up in the overlay before the cache and in the cache before redb, the
    /// order [`read_one`](Store::read_one) keeps. Never an older state than acknowledged:
    /// after the store is poisoned a record read from redb is [`Error::Poisoned`] instead.
    pub(super) fn read_many<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k Key>,
    ) -> Vec<Result<Option<Record>, Error>> {
        self.read_hook();
        let keys: Vec<&Key> = keys.into_iter().collect();
        let mut found = vec![false; keys.len()];
        let mut answers: Vec<Result<Option<Record>, Error>> =
            keys.iter().map(|_| Ok(None)).collect();
        self.engine
            .overlay
            .get_many(&keys, &mut found, &mut answers);
        self.engine.cache.get_many(&keys, &mut found, &mut answers);
        let mut missing: Vec<usize> = (0..keys.len()).filter(|&i| !found[i]).collect();
        missing.sort_unstable_by(|&a, &b| keys[a].encoded().cmp(keys[b].encoded()));
        for i in missing {
            // Looks in the overlay and the cache again (a newer state may have been
            // published since) before redb.
            answers[i] = self.read_one(keys[i]);
        }
        answers
    }

    /// Runs the test hook set to race a read against other work.
    fn read_hook(&self) {
        self.read_hook.run();
    }

    /// One key of [`read_many`](Store::read_many).
    fn read_one(&self, key: &Key) -> Result<Option<Record>, Error> {
        let ctx = "reading a record";
        let overlay = &self.engine.overlay;
        if let Some(state) = overlay.get(key) {
            return Ok(state);
        }
        if let Some(record) = self.engine.cache.get(key) {
            return Ok(Some(record));
        }
        self.guard_read(ctx, || {
            // The epoch's shared snapshot (see `Overlay::committed`), looked up for each key
            // after the overlay missed: a batch that outlives an epoch must not read a key the
            // writer has since drained from the overlay in the snapshot of the epoch before.
            let (_, table) = overlay.committed(|| {
                let txn = self
                    .engine
                    .db
                    .begin_read()
                    .map_err(|e| Error::storage(ctx, e))?;
                crate::tree::windows::Records::open(&txn, &self.engine.windows)
            })?;
            let value = table
                .get_hashed(key.encoded(), key.hash64())
                .map_err(|e| Error::storage(ctx, e))?;
            // A failed write clears the overlay and the cache after latching the poison: if
            // that happened since the caller checked, the overlay or the cache may have held
            // a newer acknowledged state than redb, so refuse rather than return an older one.
            self.engine.poison.check()?;
            value
                .map(|bytes| decode_record(key.encoded(), bytes.value()))
                .transpose()
        })
    }

    /// Runs `read`, which reads redb pages, turning a panic inside redb into
    /// [`Error::Corruption`] naming the file. A store closed cleanly opens without verifying
    /// every page (`clean_close.rs`), so a page damaged since is first met by a read, and redb
    /// can panic on a damaged page it trusts.
    pub(crate) fn guard_read<T>(
        &self,
        doing: &str,
        read: impl FnOnce() -> Result<T, Error>,
    ) -> Result<T, Error> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)).unwrap_or_else(|_| {
            Err(Error::Corruption {
                location: format!("store {}", self.path.display()),
                reason: format!("redb panicked {doing}: a page of the file is damaged"),
            })
        })
    }

    /// Up to `limit` reservations whose lease ran out without completion, oldest first: work
    /// that may have had side effects and died. Recover each by asking the external system
    /// about the key, then take it over with [`reserve`](Store::reserve) or settle it with
    /// [`resolve`](Store::resolve).
    ///
    /// # Errors
    /// [`Error::Corruption`] naming the key of a damaged record; storage errors.
    pub fn stale(&self, limit: usize) -> Result<Vec<(Key, Record)>, Error> {
        // Commit what the committer holds in its open transaction, so the listing sees every
        // acknowledged operation.
        self.committer.with_writer(|_| Ok(()))?;
        let ctx = "listing stale reservations";
        self.guard_read(ctx, || {
            let txn = self
                .engine
                .db
                .begin_read()
                .map_err(|e| Error::storage(ctx, e))?;
            let records = crate::tree::windows::Records::open(&txn, &self.engine.windows)?;
            let deadlines = txn
                .open_table(DEADLINES)
                .map_err(|e| Error::storage(ctx, e))?;
            sweep::stale(&records, &deadlines, self.now(), self.token_floor(), limit)
        })
    }

    /// Commits the writer's open transaction and begins a snapshot that sees every
    /// acknowledged operation (for inspection).
    pub(crate) fn snapshot(&self) -> Result<redb::ReadTransaction, Error> {
        self.engine.poison.check()?;
        self.committer.with_writer(|_| Ok(()))?;
        self.engine
            .db
            .begin_read()
            .map_err(|e| Error::storage("inspecting the store", e))
    }
}
