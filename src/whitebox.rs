//! The internals the crate's own tests (`tests/`) and fuzz targets (`fuzz/`) reach, behind the
//! hidden feature `__whitebox`: the log's frames, identity block and recovery (the `decode`
//! fuzz target and the torn-tail tests read and write them directly), the record codec and a
//! key's stored form, the clean-close mark, the time conversions the models use, the
//! directories synced, the store's tables on a database of their own ([`Tree`], for writes a
//! cache's stale record could make, and the B-tree writes a put makes), the applier's merge,
//! the record cache and the epochs' snapshots, and the pure parts of the state machine, the
//! windows' filters, the page layer, the admin socket and the HTTP and gRPC layers, whose unit
//! tests live in `tests/` too. The store itself is reached through the public
//! storage seam ([`Builder::open_with_storage`](crate::Builder::open_with_storage)) plus the
//! `Store::__*` and `Builder::__*` methods. Not part of the API: no stability promise, and a
//! user never turns the feature on (CONTRIBUTING.md, "The storage seam and the white-box
//! feature").

use std::path::PathBuf;

pub use crate::clock::{describe_millis, duration_millis, from_millis, to_millis};
pub use crate::commit::Background;
pub use crate::log::Wal;
pub use crate::log::{block as identity_block, parse as parse_identity};
pub use crate::log::{
    decode_payload, encode, header_crc, padded, parse_header, Entry, EntryRecord, Frame, Header,
    ALIGN, HEADER_LEN,
};
pub use crate::log::{Identity, LOG_HEADER_LEN};
pub use crate::log::{LogPosition, Recovered};
pub use crate::record::codec::HEADER_LEN as RECORD_HEADER_LEN;
pub use crate::record::Millis;
use crate::record::Record;
pub use crate::state::reopen_room;
pub use crate::state::CheckpointStart;
pub use crate::tree::Tree;
use crate::Key;

/// The state machine (`src/decide/`): each operation, decided against a stored record, and the
/// class of a record at a moment, which the transitions go by.
pub mod decide {
    pub use crate::decide::{
        decide, with_token, Change, Complete, Completion, Decision, Expire, Extend,
        MarkNeedsReview, Observe, Operation, Policy, RecordStep, Release, Reserve, Reserved,
        Resolve, WithRetention,
    };
    pub use crate::record::TokenFloor;
    use crate::record::{Millis, Record, RecordClass};

    /// The class of `record` at `now` under the owner's `floor`.
    pub fn class(record: &Record, now: Millis, floor: TokenFloor) -> RecordClass {
        record.class(now, floor)
    }
}

/// A window's filter, its saved form and the filters' hash (`src/tree/filter.rs`,
/// `src/tree/windows.rs`).
pub mod filter {
    use crate::tree::{FilterSeed, Probe, Windows};

    /// The fewest keys a filter's first part is sized for.
    pub const MIN_CAPACITY: usize = crate::tree::MIN_CAPACITY;

    /// A window's filter of the keys it holds.
    pub struct Filter(crate::tree::Filter);

    impl Filter {
        /// An empty filter, its first part sized for `keys` keys (at least [`MIN_CAPACITY`]).
        pub fn with_capacity(keys: usize) -> Filter {
            Filter(crate::tree::Filter::with_capacity(keys))
        }

        /// Adds the key whose hash is `hash`.
        pub fn insert(&self, hash: u64) {
            self.0.insert(hash);
        }

        /// Whether the key whose hash is `hash` may have been inserted, tested with its probe.
        pub fn may_hold(&self, hash: u64) -> bool {
            self.0.may_hold(&Probe::of(hash))
        }

        /// The filter's row in `idemstore.filters`.
        pub fn encode(&self) -> Vec<u8> {
            self.0.encode()
        }

        /// The filter a row holds, or `None` for bytes that are not one as the store writes it.
        pub fn decode(bytes: &[u8]) -> Option<Filter> {
            crate::tree::Filter::decode(bytes).map(Filter)
        }

        /// Keys inserted.
        pub fn inserted(&self) -> usize {
            self.0.len()
        }

        /// Whether the filter counts as saved (a filter read from its row does).
        pub fn saved(&self) -> bool {
            self.0.saved.load(std::sync::atomic::Ordering::Acquire)
        }

        /// Parts in use.
        pub fn parts(&self) -> usize {
            self.0.parts_used()
        }
    }

    /// The filters' hash of `bytes` under the seed of key words `seed`.
    pub fn hash(seed: (u64, u64), bytes: &[u8]) -> u64 {
        Windows::seeded(FilterSeed(seed.0, seed.1)).hash(bytes)
    }

    /// The filters' hash of `bytes` in windows made without a store's seed.
    pub fn unseeded_hash(bytes: &[u8]) -> u64 {
        Windows::new().hash(bytes)
    }
}

/// The admin socket's peer check and its messages (`src/admin/`).
pub mod admin {
    pub use crate::admin::peer::admits;
    pub use crate::admin::protocol::{Answer, Failure, Request, VERSION};
}

/// The HTTP guard's `Idempotency-Key` parser, its stored response form and problem+json
/// refusals (feature `http`).
#[cfg(feature = "http")]
pub mod guard {
    pub use crate::guard::key::{sf_string, trim_spaces, unescaped_string};
    pub use crate::guard::stored::{encode, encoded_len, not_stored, not_stored_status, status};
    pub use crate::http::problem::problem;
}

/// The gRPC layer's stored answer form and its reading of one request message (feature
/// `grpc`).
#[cfg(feature = "grpc")]
pub mod grpc {
    pub use crate::grpc::service::{decode, encode, single_message};
}

/// What the applier writes for queued batches of changes, each change a key with the expiry
/// of its record before and after (`None`: absent; the records are not pending): each key
/// once, in key order, with its last state, unindexed where its first change found it.
pub fn merged_changes(batches: Vec<Vec<ExpiryChange>>) -> Vec<ChangeOf> {
    use crate::commit::{merged, DeferredBatch, TreeChange};
    use crate::tree::IndexEntries;
    let index = |expires_at| IndexEntries {
        lease: None,
        expires_at,
    };
    let batches = (1..)
        .zip(batches)
        .map(|(seq, changes)| DeferredBatch {
            changes: changes
                .into_iter()
                .map(|(key, old, new)| TreeChange {
                    key,
                    old: old.map(index),
                    new: new.map(|expires_at| {
                        std::sync::Arc::new(Record {
                            fingerprint: crate::Fingerprint::of(b"x"),
                            token: 1,
                            attempt: 1,
                            expires_at,
                            state: crate::record::State::Completed {
                                completed_at: 0,
                                result: Vec::new(),
                            },
                        })
                    }),
                })
                .collect(),
            seq,
            next_token: seq,
        })
        .collect();
    merged(batches)
        .into_iter()
        .map(|change| {
            let entries = |e: IndexEntries| (e.lease, e.expires_at);
            let new = change.new.map(|record| entries(IndexEntries::of(&record)));
            (change.key, change.old.map(entries), new)
        })
        .collect()
}

/// A key with the expiry of its record before and after a change (`None`: absent).
pub type ExpiryChange = (Key, Option<Millis>, Option<Millis>);

/// A key with its index entries before and after a change, each a lease deadline (`None`:
/// not pending) and an expiry.
pub type ChangeOf = (
    Key,
    Option<(Option<Millis>, Millis)>,
    Option<(Option<Millis>, Millis)>,
);

/// The page layer's arithmetic: where a data block sits among the checksum blocks, and the
/// file's length with and without them (`src/tree/pages.rs`).
pub mod pages {
    pub use crate::tree::{data_offset, logical_len, physical_len, BLOCK, GROUP, GROUP_BYTES};
}

/// The bounded cache of committed records readers check before redb
/// (`src/state/overlay.rs`).
pub struct RecordCache(crate::state::RecordCache);

impl RecordCache {
    /// A cache of at most `records` records and `bytes` bytes (0 records: none kept).
    pub fn new(records: usize, bytes: usize) -> RecordCache {
        RecordCache(crate::state::RecordCache::new(records, bytes))
    }

    /// Caches `record` as the state of `key` (`None`: forgets it).
    pub fn set(&self, key: &Key, record: Option<Record>) {
        self.0.set(key, record.map(std::sync::Arc::new));
    }

    /// The cached record of `key`, if any.
    pub fn get(&self, key: &Key) -> Option<Record> {
        self.0.get(key)
    }

    /// The bytes the cache counts itself as holding, over its shards.
    pub fn bytes(&self) -> usize {
        self.0.shards.iter().map(|shard| shard.read().bytes).sum()
    }

    /// The bytes one cached record is counted for.
    pub fn entry_bytes(key: &Key, record: &Record) -> usize {
        crate::state::entry_bytes(key, record)
    }
}

/// The writer's epochs over a [`Tree`], and the snapshot of its records an epoch's readers
/// share (`src/state/overlay.rs`, `Overlay::committed`).
#[derive(Default)]
pub struct Epochs {
    overlay: crate::state::Overlay,
    opened: std::cell::Cell<u64>,
}

/// An epoch's read snapshot of a tree's records.
pub struct Snapshot(std::sync::Arc<crate::state::RecordsTable>);

impl Epochs {
    /// The current epoch's snapshot and the epoch it serves, opened on `tree` when no reader
    /// of the epoch has opened one yet.
    pub fn committed(&self, tree: &Tree) -> Result<(u64, Snapshot), crate::Error> {
        let (epoch, table) = self.overlay.committed(|| {
            self.opened.set(self.opened.get() + 1);
            tree.records()
        })?;
        Ok((epoch, Snapshot(table)))
    }

    /// Ends the epoch, as the writer does after a commit.
    pub fn next_epoch(&self) {
        self.overlay.next_epoch();
    }

    /// How many snapshots were opened.
    pub fn opened(&self) -> u64 {
        self.opened.get()
    }
}

impl Snapshot {
    /// Whether `self` and `other` are one snapshot, shared.
    pub fn is(&self, other: &Snapshot) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }

    /// The stored bytes of `key` (encoded) in this snapshot.
    pub fn stored(&self, key: &[u8]) -> Result<Option<Vec<u8>>, crate::StorageError> {
        let ctx = "reading a whitebox snapshot";
        let found = self
            .0
            .get(key)
            .map_err(|e| crate::StorageError::redb(ctx, e))?;
        Ok(found.map(|bytes| bytes.value().to_vec()))
    }
}

/// Counts `acquired` acquisitions and one batch of `ops` operations on new counters, as the
/// engine does: what reaches the `metrics` facade on this thread (feature `metrics`).
#[cfg(feature = "metrics")]
pub fn count_for_metrics(acquired: u64, ops: u64) {
    let counters = crate::state::Counters::default();
    counters.add(crate::state::Counter::Acquired, acquired);
    counters.batch(ops);
}

/// A key's stored form: `[len][scope][len][operation][len][id]`.
pub fn key_encoded(key: &crate::Key) -> Vec<u8> {
    key.encoded().to_vec()
}

/// A key from its stored form, or `None` when the bytes are not one.
pub fn key_decode(bytes: &[u8]) -> Option<crate::Key> {
    crate::Key::decode(bytes)
}

/// A record's stored bytes (the record codec, `src/record/codec.rs`).
pub fn encode_record(record: &Record) -> Vec<u8> {
    record.encode()
}

/// A record from its stored bytes, or why they are not one.
pub fn decode_record(bytes: &[u8]) -> Result<Record, String> {
    Record::decode(bytes)
}

/// Whether the store file on `db` (as a store writes it, checksummed pages and all) carries the
/// clean-close mark.
pub fn closed_clean(db: impl redb::StorageBackend) -> Result<bool, crate::Error> {
    let pages = crate::tree::PageFile::new(db, crate::store::open::STORAGE_NAME)
        .map_err(|e| crate::StorageError::io("reading a page file's header", e))?;
    let db = redb::Builder::new()
        .create_with_backend(pages)
        .map_err(|e| crate::StorageError::redb("opening a page file", e))?;
    crate::log::recorded(&db).map_err(crate::Error::from)
}

/// Every directory the store synced since the process started.
pub fn synced_dirs() -> Vec<PathBuf> {
    crate::store::open::file::SYNCED_DIRS.lock().clone()
}

/// Forgets the synced directories under `dir` (so a test sees its own syncs only).
pub fn forget_synced(dir: &std::path::Path) {
    crate::store::open::file::SYNCED_DIRS
        .lock()
        .retain(|d| d != dir);
}

/// The format version (meta `format`) of the store file on `db`, without opening the store
/// (opening converts a format-2 store).
pub fn format_version(db: impl redb::StorageBackend) -> Result<Option<u64>, crate::Error> {
    use redb::ReadableDatabase;
    let pages = crate::tree::PageFile::new(db, crate::store::open::STORAGE_NAME)
        .map_err(|e| crate::StorageError::io("reading a page file's header", e))?;
    let db = redb::Builder::new()
        .create_with_backend(pages)
        .map_err(|e| crate::StorageError::redb("opening a page file", e))?;
    let txn = db
        .begin_read()
        .map_err(|e| crate::StorageError::redb("reading the format", e))?;
    let meta = txn
        .open_table(crate::tree::META)
        .map_err(|e| crate::StorageError::redb("reading the format", e))?;
    let version = meta
        .get(crate::tree::META_FORMAT)
        .map_err(|e| crate::StorageError::redb("reading the format", e))?;
    Ok(version.map(|v| v.value()))
}

/// The page layer's work since the process started (the load generator divides it by the
/// operations of a run): 4 KiB blocks checksummed, read or written, and sums blocks written.
pub fn page_work() -> (u64, u64) {
    use crate::tree::work;
    use std::sync::atomic::Ordering::Relaxed;
    (work::SUMMED.load(Relaxed), work::SUMS_WRITTEN.load(Relaxed))
}

/// The CRC-32 the page layer keeps for a data block: the block number, then its 4 KiB (the
/// load generator times it).
pub fn page_sum(index: u64, data: &[u8]) -> u32 {
    crate::tree::sum(index, data)
}

/// What every caller of a batch that failed with `error` gets: the store poisoned, with
/// `error` and its causes as the cause (`state::error_copy`).
pub fn poisoned_copy(error: &crate::Error) -> crate::Error {
    crate::state::error_copy(error)
}
