//! The redb tables of a store and the record/index bookkeeping shared by every write path.
//!
//! - `idemstore.records`: encoded key → encoded [`Record`].
//! - `idemstore.expiry`: (expires_at, key) → (), for every record that can expire, so a sweep
//!   reads only what has expired.
//! - `idemstore.leases`: (lease_until, key) → (), for every pending record, so stale
//!   reservations are found without a scan.
//! - `idemstore.meta`: "format" → format version, "next_token" → the next fencing token,
//!   "wal_seq" → the last log frame whose changes this file holds, "log_salt" → the salt of the
//!   log frames written since the last checkpoint, "store_id" → the store's random identity,
//!   which its log carries.
//!
//! Tables whose names start with `idemstore.` belong to the store; a caller's own tables (see
//! [`Store::complete_with`](crate::Store::complete_with)) must use other names.

use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};

use crate::error::Error;
use crate::record::{Millis, Record};

pub(crate) const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemstore.records");
pub(crate) const EXPIRY: TableDefinition<(u64, &[u8]), ()> =
    TableDefinition::new("idemstore.expiry");
pub(crate) const LEASES: TableDefinition<(u64, &[u8]), ()> =
    TableDefinition::new("idemstore.leases");
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("idemstore.meta");

pub(crate) const META_FORMAT: &str = "format";
pub(crate) const META_NEXT_TOKEN: &str = "next_token";
pub(crate) const META_WAL_SEQ: &str = "wal_seq";
pub(crate) const META_LOG_SALT: &str = "log_salt";
pub(crate) const META_STORE_ID: &str = "store_id";
/// Present (value 1) while the store is closed cleanly: set by the last checkpoint on close,
/// removed by the next open (`engine/clean_close.rs`).
pub(crate) const META_CLOSED_CLEAN: &str = "closed_clean";

/// The store format version written by this build. Version 2: the store's random identity
/// and first log salt are made at creation; the log starts with an identity block; frames
/// carry the highest sequence number known durable.
pub(crate) const FORMAT_VERSION: u64 = 2;

/// Decodes a stored record, naming the key on damage.
pub(crate) fn decode_record(key: &[u8], bytes: &[u8]) -> Result<Record, Error> {
    Record::decode(bytes).map_err(|reason| Error::corrupt_record(key, reason))
}

/// The store's tables opened in one write transaction.
pub(crate) struct Tables<'txn> {
    pub(crate) records: Table<'txn, &'static [u8], &'static [u8]>,
    pub(crate) expiry: Table<'txn, (u64, &'static [u8]), ()>,
    pub(crate) leases: Table<'txn, (u64, &'static [u8]), ()>,
    meta: Table<'txn, &'static str, u64>,
}

impl<'txn> Tables<'txn> {
    pub(crate) fn open(txn: &'txn WriteTransaction) -> Result<Tables<'txn>, Error> {
        let open = "opening the store's tables";
        Ok(Tables {
            records: txn
                .open_table(RECORDS)
                .map_err(|e| Error::storage(open, e))?,
            expiry: txn
                .open_table(EXPIRY)
                .map_err(|e| Error::storage(open, e))?,
            leases: txn
                .open_table(LEASES)
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
        let value = self
            .meta
            .get(META_STORE_ID)
            .map_err(|e| Error::storage("reading the store's identity", e))?;
        value.map(|v| v.value()).ok_or_else(|| Error::Corruption {
            location: "table idemstore.meta".into(),
            reason: "the store's identity is missing".into(),
        })
    }

    /// The last log frame whose changes this file holds.
    pub(crate) fn wal_seq(&self) -> Result<u64, Error> {
        let value = self
            .meta
            .get(META_WAL_SEQ)
            .map_err(|e| Error::storage("reading the log position", e))?;
        Ok(value.map_or(0, |v| v.value()))
    }

    /// The salt of the log frames written since the last checkpoint (random from creation on).
    pub(crate) fn log_salt(&self) -> Result<u64, Error> {
        let value = self
            .meta
            .get(META_LOG_SALT)
            .map_err(|e| Error::storage("reading the log salt", e))?;
        Ok(value.map_or(0, |v| v.value()))
    }

    pub(crate) fn set_log_salt(&mut self, salt: u64) -> Result<(), Error> {
        self.meta
            .insert(META_LOG_SALT, salt)
            .map_err(|e| Error::storage("saving the log salt", e))?;
        Ok(())
    }

    pub(crate) fn set_wal_seq(&mut self, seq: u64) -> Result<(), Error> {
        self.meta
            .insert(META_WAL_SEQ, seq)
            .map_err(|e| Error::storage("saving the log position", e))?;
        Ok(())
    }

    pub(crate) fn next_token(&self) -> Result<u64, Error> {
        let value = self
            .meta
            .get(META_NEXT_TOKEN)
            .map_err(|e| Error::storage("reading the next fencing token", e))?;
        value.map(|v| v.value()).ok_or_else(|| Error::Corruption {
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
        self.records
            .insert(key, encoded)
            .map_err(|e| Error::storage(ctx, e))?;
        if let Some(deadline) = index.expiry {
            self.expiry
                .insert((deadline, key), ())
                .map_err(|e| Error::storage(ctx, e))?;
        }
        if let Some(lease_until) = index.lease {
            self.leases
                .insert((lease_until, key), ())
                .map_err(|e| Error::storage(ctx, e))?;
        }
        Ok(())
    }

    /// Deletes `key` with its index entries (`old`, as for [`put`](Tables::put)).
    pub(crate) fn delete(&mut self, key: &[u8], old: Option<IndexEntries>) -> Result<(), Error> {
        if let Some(old) = old {
            self.unindex(key, old)?;
        }
        self.records
            .remove(key)
            .map_err(|e| Error::storage("deleting a record", e))?;
        Ok(())
    }

    /// Drops one expiry-index entry that matches no record (a damaged or replaced record);
    /// the sweep uses it so it never stalls on such an entry.
    pub(crate) fn drop_expiry_entry(&mut self, deadline: Millis, key: &[u8]) -> Result<(), Error> {
        self.expiry
            .remove((deadline, key))
            .map_err(|e| Error::storage("updating the indexes", e))?;
        Ok(())
    }

    /// Removes a record's index entries.
    fn unindex(&mut self, key: &[u8], index: IndexEntries) -> Result<(), Error> {
        let ctx = "updating the indexes";
        if let Some(deadline) = index.expiry {
            self.expiry
                .remove((deadline, key))
                .map_err(|e| Error::storage(ctx, e))?;
        }
        if let Some(lease_until) = index.lease {
            self.leases
                .remove((lease_until, key))
                .map_err(|e| Error::storage(ctx, e))?;
        }
        Ok(())
    }
}

/// Where a record stands in the two indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexEntries {
    /// Position in the expiry index; `None` for a record that never expires.
    pub(crate) expiry: Option<Millis>,
    /// Position in the lease index; `Some` for a pending record.
    pub(crate) lease: Option<Millis>,
}

impl IndexEntries {
    pub(crate) fn of(record: &Record) -> IndexEntries {
        IndexEntries {
            expiry: (record.expires_at != Millis::MAX).then_some(record.expires_at),
            lease: record.lease_until(),
        }
    }
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
