//! Read-only inspection for operators and tools: counts by state ([`Store::counts`]), filtered
//! listings ([`Store::scan`]), file facts ([`Store::file_info`]) and a full consistency check of
//! records and indexes ([`Store::verify`]). The `idemstore` command-line tool is built on them.
//! The same calls read a closed store without writing to its files: [`ReadOnlyStore`]
//! (`read_only.rs`). Both read through a [`Snapshot`]: one read transaction at one time.
//!
//! On an open store, each call first commits the writer's open transaction (without a sync: the log already
//! holds it), so it sees every acknowledged operation, and then reads one redb read
//! transaction: a consistent snapshot that never blocks writers. `counts`, `verify` and most
//! `scan`s read every record, so their cost grows with the store; they are meant for tools and
//! occasional monitoring, not for the request path.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use redb::ReadableTable;

use crate::clock::{describe_millis, duration_millis};
use crate::error::{Error, StorageError};
use crate::key::Key;
use crate::log::log_path;
use crate::record::{Millis, Record, RecordClass, State, TokenFloor};
use crate::store::Store;
use crate::tree::{span, Probe, Records, Windows};
use crate::tree::{DEADLINES, LEASE, META, META_NEXT_TOKEN, META_WAL_SEQ};

pub use read_only::ReadOnlyStore;
pub(crate) use read_only::{needs_recovery, open_clean};

/// One read transaction of a store's tables, with its windows and the time and token floor
/// that classify its records: what every inspection call reads, on an open [`Store`] and on a
/// [`ReadOnlyStore`] alike.
pub(crate) struct Snapshot<'w> {
    txn: redb::ReadTransaction,
    windows: &'w Windows,
    now: Millis,
    floor: TokenFloor,
}

impl Store {
    /// A snapshot of this store now, after the writer's open transaction is committed.
    fn reading(&self) -> Result<Snapshot<'_>, Error> {
        Ok(Snapshot {
            txn: self.snapshot()?,
            windows: self.windows(),
            now: self.now(),
            floor: self.token_floor(),
        })
    }
}

/// The time a record's age is measured from, for [`ScanFilter::older_than`].
fn age_reference(record: &Record, class: RecordClass) -> Millis {
    match (&record.state, class) {
        (_, RecordClass::Expired) => record.expires_at,
        (State::Pending { lease_until, .. }, _) => *lease_until,
        (State::Completed { completed_at, .. }, _) => *completed_at,
        (State::NeedsReview { since, .. }, _) => *since,
    }
}

/// Which records [`Store::scan`] returns.
///
/// ```
/// use std::time::Duration;
/// use idemstore::{RecordClass, ScanFilter};
///
/// let everything = ScanFilter::any();
/// let old_stale = ScanFilter::of(RecordClass::Stale).older_than(Duration::from_secs(300));
/// assert_ne!(everything, old_stale);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanFilter {
    pub(crate) class: Option<RecordClass>,
    pub(crate) older_than: Option<Duration>,
}

impl ScanFilter {
    /// Every record, whatever its state.
    pub fn any() -> ScanFilter {
        ScanFilter::default()
    }

    /// Only records of `class`.
    pub fn of(class: RecordClass) -> ScanFilter {
        ScanFilter {
            class: Some(class),
            older_than: None,
        }
    }

    /// Only records whose state began at least `age` ago. A state begins when it is entered:
    /// a completed key at its completion, a key under review when it was marked, an expired
    /// record at its expiry; a stale reservation when its lease ran out (so this is "stale for
    /// at least `age`"). A live reservation's lease ends in the future, so no live reservation
    /// is older than any `age`.
    pub fn older_than(mut self, age: Duration) -> ScanFilter {
        self.older_than = Some(age);
        self
    }

    pub(crate) fn matches(&self, record: &Record, class: RecordClass, now: Millis) -> bool {
        if self.class.is_some_and(|wanted| wanted != class) {
            return false;
        }
        match self.older_than {
            None => true,
            Some(age) => age_reference(record, class)
                .checked_add(duration_millis(age))
                .is_some_and(|t| t <= now),
        }
    }
}

/// How many records a store holds in each [`RecordClass`], from [`Store::counts`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StateCounts {
    /// Reservations with a live lease.
    pub pending: u64,
    /// Reservations whose lease ran out without a completion.
    pub stale: u64,
    /// Keys parked for a person.
    pub needs_review: u64,
    /// Completed keys within their retention.
    pub completed: u64,
    /// Records past their expiry that a sweep has not deleted yet.
    pub expired: u64,
    /// Records whose key or bytes do not decode (see [`Store::verify`]).
    pub damaged: u64,
    /// The reservation (live or stale) whose lease ran out first, or ends first.
    pub oldest_pending: Option<(Key, Record)>,
}

impl StateCounts {
    /// How many records are in `class`.
    pub fn get(&self, class: RecordClass) -> u64 {
        match class {
            RecordClass::Pending => self.pending,
            RecordClass::Stale => self.stale,
            RecordClass::NeedsReview => self.needs_review,
            RecordClass::Completed => self.completed,
            RecordClass::Expired => self.expired,
        }
    }

    /// Every stored record, damaged ones included.
    pub fn total(&self) -> u64 {
        RecordClass::ALL.iter().map(|c| self.get(*c)).sum::<u64>() + self.damaged
    }

    pub(crate) fn add(&mut self, class: RecordClass) {
        *match class {
            RecordClass::Pending => &mut self.pending,
            RecordClass::Stale => &mut self.stale,
            RecordClass::NeedsReview => &mut self.needs_review,
            RecordClass::Completed => &mut self.completed,
            RecordClass::Expired => &mut self.expired,
        } += 1;
    }

    /// Counts one record of `class`, and keeps it as the oldest reservation when it is pending
    /// or stale and its lease ends before the one kept: how every backend's `counts` tallies.
    pub(crate) fn count(&mut self, class: RecordClass, key: Key, record: Record) {
        self.add(class);
        if let (RecordClass::Pending | RecordClass::Stale, Some(lease_until)) =
            (class, record.lease_until())
        {
            let kept = self.oldest_pending.as_ref();
            if kept
                .and_then(|(_, kept)| kept.lease_until())
                .is_none_or(|kept| lease_until < kept)
            {
                self.oldest_pending = Some((key, record));
            }
        }
    }
}

/// Facts about a store's files, from [`Store::file_info`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileInfo {
    /// The store file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub file_bytes: u64,
    /// The log: the store file's name with `.wal` appended.
    pub log_path: PathBuf,
    /// The log's size in bytes. The log is overwritten in place from its start after each
    /// checkpoint, so this is its high-water mark, not the amount of unreplayed data.
    pub log_bytes: u64,
    /// The last log frame whose changes the file holds (meta `wal_seq`). Right after
    /// [`Store::open`] this is the checkpoint: every frame up to it is in the B-tree file.
    pub wal_seq: u64,
    /// The fencing token the next acquisition will get (meta `next_token`).
    pub next_token: u64,
    /// Bytes of log written since the last checkpoint.
    pub log_since_checkpoint: u64,
    /// Free space the store file's disk needs for the next checkpoint, or for a reopen after
    /// a crash now, which write the log since the last checkpoint into the file: an upper
    /// estimate, the figure a full disk's error names.
    pub checkpoint_room: u64,
    /// The first fencing token this owner of the file handed out: a pending record under a
    /// lower token was acquired by an earlier owner and is stale. 0 when leases outlast a
    /// restart ([`Builder::leases_survive_restart`](crate::Builder::leases_survive_restart)).
    pub token_floor: u64,
}

/// What [`Problem`] was found by [`Store::verify`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemKind {
    /// A record fails its checksum or does not decode; reading its key reports
    /// [`StorageError::Corruption`](crate::StorageError::Corruption).
    DamagedRecord,
    /// A stored key is not a valid `(scope, operation, id)` encoding.
    BadKey,
    /// A pending record has no entry in the lease index at its lease deadline:
    /// [`Store::stale`] would not list it.
    MissingIndexEntry,
    /// A record is kept in the table of another expiry window than its own: it would be
    /// deleted with that window, before or after its expiry.
    MisplacedRecord,
    /// A record's key is not held by its window's filter in memory: lookups of the key
    /// would answer "absent" without reading it.
    UnfilteredRecord,
    /// An index entry points to no record, or to a record that does not match it (a second
    /// entry for one key among them: a record has at most one). Harmless to answers (sweeps
    /// drop such entries), but a sign of earlier damage.
    StrayIndexEntry,
    /// A record's fencing token is not below the store's next token, so a token could be
    /// handed out twice.
    TokenAhead,
    /// The store's metadata is missing or damaged.
    Meta,
}

impl ProblemKind {
    /// A short lowercase name, such as `damaged-record`.
    pub fn name(self) -> &'static str {
        match self {
            ProblemKind::DamagedRecord => "damaged-record",
            ProblemKind::BadKey => "bad-key",
            ProblemKind::MissingIndexEntry => "missing-index-entry",
            ProblemKind::MisplacedRecord => "misplaced-record",
            ProblemKind::UnfilteredRecord => "unfiltered-record",
            ProblemKind::StrayIndexEntry => "stray-index-entry",
            ProblemKind::TokenAhead => "token-ahead",
            ProblemKind::Meta => "meta",
        }
    }
}

impl fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One inconsistency found by [`Store::verify`], with the key it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Problem {
    /// What is wrong.
    pub kind: ProblemKind,
    /// The key concerned, when its stored bytes decode.
    pub key: Option<Key>,
    /// The key's stored (encoded) bytes; empty for a metadata problem.
    pub raw_key: Vec<u8>,
    /// A sentence saying what was found.
    pub detail: String,
}

impl Problem {
    fn new(kind: ProblemKind, raw_key: &[u8], detail: impl Into<String>) -> Problem {
        Problem {
            kind,
            key: Key::decode(raw_key),
            raw_key: raw_key.to_vec(),
            detail: detail.into(),
        }
    }
}

/// `record scope/operation/id: detail`, or the escaped raw bytes when the key does not decode.
impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.key, self.kind) {
            (_, ProblemKind::Meta) => write!(f, "store metadata: {}", self.detail),
            (Some(key), _) => write!(f, "key {key}: {}", self.detail),
            (None, _) => write!(
                f,
                "undecodable key bytes {}: {}",
                self.raw_key.escape_ascii(),
                self.detail
            ),
        }
    }
}

/// The result of [`Store::verify`]: what was read, and every problem found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Verification {
    /// Records read.
    pub records: u64,
    /// Entries of the lease index read (pending records).
    pub lease_entries: u64,
    /// Everything wrong, in the order found (records in key order, then the indexes).
    pub problems: Vec<Problem>,
}

impl Verification {
    /// True when no problem was found.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Storage errors of the inspection calls.
fn storage(source: impl Into<redb::Error>) -> Error {
    StorageError::redb("inspecting the store", source).into()
}

/// The record stored under `key`, or `None` when it is absent or does not decode.
fn load(records: &Records, key: &[u8]) -> Result<Option<Record>, Error> {
    let value = records.get(key).map_err(storage)?;
    Ok(value.and_then(|bytes| Record::decode(bytes.value()).ok()))
}

mod read_only;
mod scan;
mod verify;

/// A listing of the records that match a filter, for the backends that read every record in
/// key order: in key order it is complete at `limit` matches; by deadline (reservations,
/// expired records) it reads on, then orders the matches by deadline (a reservation's lease
/// end, any other record's expiry), those of one deadline in the order they were found, and
/// keeps the first `limit`.
#[cfg(any(feature = "etcd", feature = "postgres"))]
pub(crate) struct Listing<'f> {
    filter: &'f ScanFilter,
    limit: usize,
    by_deadline: bool,
    found: Vec<(Key, Record)>,
}

#[cfg(any(feature = "etcd", feature = "postgres"))]
impl<'f> Listing<'f> {
    pub(crate) fn new(filter: &'f ScanFilter, limit: usize) -> Listing<'f> {
        let by_deadline = matches!(
            filter.class,
            Some(RecordClass::Stale | RecordClass::Pending | RecordClass::Expired)
        );
        Listing {
            filter,
            limit,
            by_deadline,
            found: Vec::new(),
        }
    }

    /// Keeps `record` (of `class` at `now`) if it matches; returns whether to read on.
    pub(crate) fn offer(
        &mut self,
        key: Key,
        record: Record,
        class: RecordClass,
        now: Millis,
    ) -> bool {
        if self.filter.matches(&record, class, now) {
            self.found.push((key, record));
        }
        self.by_deadline || self.found.len() < self.limit
    }

    /// The matches, in the listing's order.
    pub(crate) fn finish(mut self) -> Vec<(Key, Record)> {
        if self.by_deadline {
            self.found
                .sort_by_key(|(_, record)| record.lease_until().unwrap_or(record.expires_at));
            self.found.truncate(self.limit);
        }
        self.found
    }
}
