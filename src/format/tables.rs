//! The redb tables of a store and the record/index bookkeeping shared by every write path.
//!
//! - `idemstore.records`: encoded key → encoded [`Record`].
//! - `idemstore.deadlines`: (kind, time, key) → (), at most one entry per record (format 3):
//!   a pending record at (`LEASE`, lease_until), a completed one at (`EXPIRY`, expires_at), a
//!   record that never expires nowhere. Stale reservations are found without a scan (the
//!   `LEASE` range), and a sweep reads only what has expired (the `EXPIRY` range, and the
//!   leases that ran out). Format 2 had two tables, `idemstore.expiry` and `idemstore.leases`;
//!   [`upgrade_to_current`] converts them.
//! - `idemstore.meta`: "format" → format version, "next_token" → the next fencing token,
//!   "wal_seq" → the last log frame whose changes this file holds, "log_salt" → the salt of the
//!   log frames written since the last checkpoint, "log_start" → the offset of the log region
//!   those frames start at (absent: the first frame's place), "next_log_salt" → the salt the
//!   next region's frames will carry (chosen before any frame uses it), "store_id" → the
//!   store's random identity, which its log carries.
//!
//! Tables whose names start with `idemstore.` belong to the store; a caller's own tables (see
//! [`Store::complete_with`](crate::Store::complete_with)) must use other names.

use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};

use crate::error::Error;
use crate::record::{Millis, Record};

pub(crate) const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemstore.records");
/// The deadline index: (kind, time, encoded key) → (); see the module's documentation.
pub(crate) const DEADLINES: TableDefinition<(u8, u64, &[u8]), ()> =
    TableDefinition::new("idemstore.deadlines");
/// The kind of a pending record's deadline entry: its time is `lease_until`.
pub(crate) const LEASE: u8 = 1;
/// The kind of the deadline entry of a record that is not pending: its time is `expires_at`.
pub(crate) const EXPIRY: u8 = 2;
/// Format 2's expiry index, read only by the upgrade.
const V2_EXPIRY: TableDefinition<(u64, &[u8]), ()> = TableDefinition::new("idemstore.expiry");
/// Format 2's lease index, read only by the upgrade.
const V2_LEASES: TableDefinition<(u64, &[u8]), ()> = TableDefinition::new("idemstore.leases");
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("idemstore.meta");

pub(crate) const META_FORMAT: &str = "format";
pub(crate) const META_NEXT_TOKEN: &str = "next_token";
pub(crate) const META_WAL_SEQ: &str = "wal_seq";
pub(crate) const META_LOG_SALT: &str = "log_salt";
pub(crate) const META_STORE_ID: &str = "store_id";
/// Where the frames after `wal_seq` start (absent: right after the log's identity block).
pub(crate) const META_LOG_START: &str = "log_start";
/// The salt of the next log region's frames, durable before any frame carries it.
pub(crate) const META_NEXT_LOG_SALT: &str = "next_log_salt";
/// Present (value 1) while the store is closed cleanly: set by the last checkpoint on close,
/// removed by the next open (`engine/clean_close.rs`).
pub(crate) const META_CLOSED_CLEAN: &str = "closed_clean";

/// The store format version written by this build. Version 3: one deadline index
/// (`idemstore.deadlines`), at most one entry per record, instead of version 2's two (an expiry
/// and a lease index). Version 2: the store's random identity and first log salt are made at
/// creation; the log starts with an identity block; frames carry the highest sequence number
/// known durable.
pub(crate) const FORMAT_VERSION: u64 = 3;
/// The earlier format this build converts at open ([`upgrade_to_current`]).
pub(crate) const FORMAT_VERSION_2: u64 = 2;

/// Decodes a stored record, naming the key on damage.
pub(crate) fn decode_record(key: &[u8], bytes: &[u8]) -> Result<Record, Error> {
    Record::decode(bytes).map_err(|reason| Error::corrupt_record(key, reason))
}

/// The store's tables opened in one write transaction.
pub(crate) struct Tables<'txn> {
    pub(crate) records: Table<'txn, &'static [u8], &'static [u8]>,
    pub(crate) deadlines: Table<'txn, (u8, u64, &'static [u8]), ()>,
    meta: Table<'txn, &'static str, u64>,
}

impl<'txn> Tables<'txn> {
    pub(crate) fn open(txn: &'txn WriteTransaction) -> Result<Tables<'txn>, Error> {
        let open = "opening the store's tables";
        Ok(Tables {
            records: txn
                .open_table(RECORDS)
                .map_err(|e| Error::storage(open, e))?,
            deadlines: txn
                .open_table(DEADLINES)
                .map_err(|e| Error::storage(open, e))?,
            meta: txn.open_table(META).map_err(|e| Error::storage(open, e))?,
        })
    }

    /// Writes the format marker, the first token, the store's random identity and its first
    /// log salt into a new store: both are durable before any frame is written.
    pub(crate) fn initialize(&mut self) -> Result<(), Error> {
        let ctx = "initializing a new store";
        self.meta
            .insert(META_FORMAT, FORMAT_VERSION)
            .map_err(|e| Error::storage(ctx, e))?;
        self.meta
            .insert(META_NEXT_TOKEN, 1)
            .map_err(|e| Error::storage(ctx, e))?;
        self.meta
            .insert(META_WAL_SEQ, 0)
            .map_err(|e| Error::storage(ctx, e))?;
        self.meta
            .insert(META_STORE_ID, new_salt().max(1))
            .map_err(|e| Error::storage(ctx, e))?;
        self.meta
            .insert(META_LOG_SALT, new_salt())
            .map_err(|e| Error::storage(ctx, e))?;
        Ok(())
    }

    /// The store's random identity, made at creation; the log carries it.
    pub(crate) fn store_id(&self) -> Result<u64, Error> {
        let value = self.meta_u64(META_STORE_ID, "reading the store's identity")?;
        value.ok_or_else(|| Error::Corruption {
            location: "table idemstore.meta".into(),
            reason: "the store's identity is missing".into(),
        })
    }

    /// The last log frame whose changes this file holds.
    pub(crate) fn wal_seq(&self) -> Result<u64, Error> {
        Ok(self
            .meta_u64(META_WAL_SEQ, "reading the log position")?
            .unwrap_or(0))
    }

    /// The salt of the log frames written since the last checkpoint (random from creation on).
    pub(crate) fn log_salt(&self) -> Result<u64, Error> {
        Ok(self
            .meta_u64(META_LOG_SALT, "reading the log salt")?
            .unwrap_or(0))
    }

    /// Where the frames after [`wal_seq`](Tables::wal_seq) start (`None`: at the log's first
    /// frame, as in a store written before log regions).
    pub(crate) fn log_start(&self) -> Result<Option<u64>, Error> {
        self.meta_u64(META_LOG_START, "reading the log region")
    }

    /// The salt of the next log region's frames (`None` in a store written before regions).
    pub(crate) fn next_log_salt(&self) -> Result<Option<u64>, Error> {
        self.meta_u64(META_NEXT_LOG_SALT, "reading the next log salt")
    }

    /// The meta value `name`, if present (`doing` names the read in an error).
    fn meta_u64(&self, name: &str, doing: &'static str) -> Result<Option<u64>, Error> {
        let value = self.meta.get(name).map_err(|e| Error::storage(doing, e))?;
        Ok(value.map(|v| v.value()))
    }

    /// Records where the frames after `wal_seq` are: the region starting at `start`, under
    /// `salt`, and the salt the region after it will use.
    pub(crate) fn set_log_region(
        &mut self,
        start: u64,
        salt: u64,
        next_salt: u64,
    ) -> Result<(), Error> {
        let ctx = "saving the log region";
        self.meta
            .insert(META_LOG_START, start)
            .map_err(|e| Error::storage(ctx, e))?;
        self.meta
            .insert(META_LOG_SALT, salt)
            .map_err(|e| Error::storage(ctx, e))?;
        self.meta
            .insert(META_NEXT_LOG_SALT, next_salt)
            .map_err(|e| Error::storage(ctx, e))?;
        Ok(())
    }

    pub(crate) fn set_wal_seq(&mut self, seq: u64) -> Result<(), Error> {
        self.meta
            .insert(META_WAL_SEQ, seq)
            .map_err(|e| Error::storage("saving the log position", e))?;
        Ok(())
    }

    pub(crate) fn next_token(&self) -> Result<u64, Error> {
        let value = self.meta_u64(META_NEXT_TOKEN, "reading the next fencing token")?;
        value.ok_or_else(|| Error::Corruption {
            location: "table idemstore.meta".into(),
            reason: "the next fencing token is missing".into(),
        })
    }

    pub(crate) fn set_next_token(&mut self, token: u64) -> Result<(), Error> {
        self.meta
            .insert(META_NEXT_TOKEN, token)
            .map_err(|e| Error::storage("saving the next fencing token", e))?;
        Ok(())
    }

    /// The record stored under `key`, expired or not.
    ///
    /// `Ok(Err(_))` is a corrupt record: an error for that key alone, not for the whole batch.
    pub(crate) fn load(&self, key: &[u8]) -> Result<Result<Option<Record>, Error>, Error> {
        let value = self
            .records
            .get(key)
            .map_err(|e| Error::storage("reading a record", e))?;
        Ok(value
            .map(|bytes| decode_record(key, bytes.value()))
            .transpose())
    }

    /// Stores `record` (encoded as `encoded`) under `key` and keeps both indexes exact: the
    /// entries of the record stored there now (`old`, from [`IndexEntries::of`], `None` when
    /// absent or unreadable) go, `record`'s come. Every write of a record goes through here or
    /// [`delete`](Tables::delete).
    pub(crate) fn put(
        &mut self,
        key: &[u8],
        old: Option<IndexEntries>,
        record: &Record,
        encoded: &[u8],
    ) -> Result<(), Error> {
        self.put_indexed(key, old, IndexEntries::of(record), encoded)
    }

    /// [`put`](Tables::put) of a record whose index entries are `index`.
    pub(crate) fn put_indexed(
        &mut self,
        key: &[u8],
        old: Option<IndexEntries>,
        index: IndexEntries,
        encoded: &[u8],
    ) -> Result<(), Error> {
        let ctx = "writing a record";
        if let Some(old) = old {
            self.unindex(key, old)?;
        }
        count_write();
        self.records
            .insert(key, encoded)
            .map_err(|e| Error::storage(ctx, e))?;
        if let Some((kind, at)) = index.entry {
            count_write();
            self.deadlines
                .insert((kind, at, key), ())
                .map_err(|e| Error::storage(ctx, e))?;
        }
        Ok(())
    }

    /// Deletes `key` with its index entries (`old`, as for [`put`](Tables::put)).
    pub(crate) fn delete(&mut self, key: &[u8], old: Option<IndexEntries>) -> Result<(), Error> {
        if let Some(old) = old {
            self.unindex(key, old)?;
        }
        count_write();
        self.records
            .remove(key)
            .map_err(|e| Error::storage("deleting a record", e))?;
        Ok(())
    }

    /// Drops one deadline entry that matches no record (a damaged or replaced record); the
    /// sweep uses it so it never stalls on such an entry.
    pub(crate) fn drop_deadline_entry(
        &mut self,
        kind: u8,
        at: Millis,
        key: &[u8],
    ) -> Result<(), Error> {
        count_write();
        self.deadlines
            .remove((kind, at, key))
            .map_err(|e| Error::storage("updating the deadline index", e))?;
        Ok(())
    }

    /// Removes a record's index entry.
    fn unindex(&mut self, key: &[u8], index: IndexEntries) -> Result<(), Error> {
        if let Some((kind, at)) = index.entry {
            count_write();
            self.deadlines
                .remove((kind, at, key))
                .map_err(|e| Error::storage("updating the deadline index", e))?;
        }
        Ok(())
    }
}

/// Where a record stands in the deadline index: at most one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexEntries {
    /// (kind, time) of its entry: ([`LEASE`], lease_until) for a pending record,
    /// ([`EXPIRY`], expires_at) for any other record that expires, `None` for one that never
    /// does.
    pub(crate) entry: Option<(u8, Millis)>,
}

impl IndexEntries {
    pub(crate) fn of(record: &Record) -> IndexEntries {
        let entry = match record.lease_until() {
            Some(lease_until) => Some((LEASE, lease_until)),
            None => (record.expires_at != Millis::MAX).then_some((EXPIRY, record.expires_at)),
        };
        IndexEntries { entry }
    }

    /// The entry of a record that is not pending and expires at `at`.
    #[cfg(test)]
    pub(crate) fn expiring_at(at: Millis) -> IndexEntries {
        IndexEntries {
            entry: Some((EXPIRY, at)),
        }
    }
}

#[cfg(test)]
thread_local! {
    /// B-tree writes (inserts and removals) made through [`Tables`] on this thread: what the
    /// tests below count per new key and per completion.
    static BTREE_WRITES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[inline]
fn count_write() {
    #[cfg(test)]
    BTREE_WRITES.with(|n| n.set(n.get() + 1));
}

/// Converts a store of format 2 to the current format inside `txn`, which the caller commits
/// durably: the deadline index is built from the records themselves (each record's entry, as
/// [`IndexEntries::of`] gives it), format 2's two indexes are deleted and the format marker
/// set to 3. Nothing else changes: records, tokens, the log position and salt stay as they
/// are, so a log that still holds frames is replayed after the conversion as before. A record
/// that does not decode is kept as it is, without an entry (reading its key reports the
/// damage, as it did before). Returns the number of records indexed.
pub(crate) fn upgrade_to_current(txn: &WriteTransaction) -> Result<u64, Error> {
    let ctx = "converting the store from format 2 to format 3";
    let mut indexed = 0;
    {
        let records = txn
            .open_table(RECORDS)
            .map_err(|e| Error::storage(ctx, e))?;
        let mut deadlines = txn
            .open_table(DEADLINES)
            .map_err(|e| Error::storage(ctx, e))?;
        for entry in records.iter().map_err(|e| Error::storage(ctx, e))? {
            let (key, value) = entry.map_err(|e| Error::storage(ctx, e))?;
            let Ok(record) = decode_record(key.value(), value.value()) else {
                continue;
            };
            if let Some((kind, at)) = IndexEntries::of(&record).entry {
                deadlines
                    .insert((kind, at, key.value()), ())
                    .map_err(|e| Error::storage(ctx, e))?;
                indexed += 1;
            }
        }
    }
    for old in [V2_EXPIRY, V2_LEASES] {
        txn.delete_table(old).map_err(|e| Error::storage(ctx, e))?;
    }
    let mut meta = txn.open_table(META).map_err(|e| Error::storage(ctx, e))?;
    meta.insert(META_FORMAT, FORMAT_VERSION)
        .map_err(|e| Error::storage(ctx, e))?;
    Ok(indexed)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;
    use crate::record::State;

    fn writes() -> u64 {
        BTREE_WRITES.with(|n| n.get())
    }

    fn record(state: State, expires_at: Millis) -> Record {
        Record {
            fingerprint: Fingerprint::of(b"r"),
            token: 1,
            attempt: 1,
            expires_at,
            state,
        }
    }

    /// B-tree writes per new key and per completion, as the applier and log replay make them:
    /// a new pending key is its record and one deadline entry (format 2: three, the record
    /// and an expiry and a lease entry); a completion rewrites the record and moves its one
    /// entry (format 2: four).
    #[test]
    fn a_new_key_is_two_btree_writes_and_a_completion_three() {
        let db = redb::Builder::new()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .unwrap();
        let txn = db.begin_write().unwrap();
        let mut tables = Tables::open(&txn).unwrap();
        let key = b"\x01u\x02op\x01k".as_slice();
        let pending = record(
            State::Pending {
                lease_until: 1_000,
                progress: None,
            },
            1_000 + 86_400_000,
        );
        let before = writes();
        tables.put(key, None, &pending, &pending.encode()).unwrap();
        assert_eq!(writes() - before, 2, "a new key");

        let completed = record(
            State::Completed {
                completed_at: 500,
                result: b"ok".to_vec(),
            },
            500 + 86_400_000,
        );
        let before = writes();
        let old = Some(IndexEntries::of(&pending));
        tables
            .put(key, old, &completed, &completed.encode())
            .unwrap();
        assert_eq!(writes() - before, 3, "a completion");

        // One entry, the completed record's, at its expiry.
        let entries: Vec<(u8, u64)> = tables
            .deadlines
            .iter()
            .unwrap()
            .map(|e| {
                let (k, _) = e.unwrap();
                (k.value().0, k.value().1)
            })
            .collect();
        assert_eq!(entries, vec![(EXPIRY, 500 + 86_400_000)]);
    }
}
