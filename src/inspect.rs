//! Read-only inspection for operators and tools: counts by state ([`Store::counts`]), filtered
//! listings ([`Store::scan`]), file facts ([`Store::file_info`]) and a full consistency check of
//! records and indexes ([`Store::verify`]). The `idemstore` command-line tool is built on them.
//!
//! Each call first commits the writer's open transaction (without a sync: the log already
//! holds it), so it sees every acknowledged operation, and then reads one redb read
//! transaction: a consistent snapshot that never blocks writers. `counts`, `verify` and most
//! `scan`s read every record, so their cost grows with the store; they are meant for tools and
//! occasional monitoring, not for the request path.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use redb::{ReadOnlyTable, ReadableTable};

use crate::clock::duration_millis;
use crate::error::Error;
use crate::key::Key;
use crate::record::{Millis, Phase, Record, State};
use crate::store::Store;
use crate::tables::{IndexEntries, EXPIRY, LEASES, META, META_NEXT_TOKEN, META_WAL_SEQ, RECORDS};
use crate::wal::log_path;

/// The state a stored record is in at a given moment, as the inspection APIs count and filter
/// records. Unlike [`Status`](crate::Status), it tells a live reservation from a stale one and
/// counts records past their expiry that a sweep has not deleted yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum RecordClass {
    /// Reserved, and the lease is live: a worker is doing the work.
    Pending,
    /// Reserved, but the lease ran out without a completion: the worker probably died, maybe
    /// after side effects. See [`Store::stale`].
    Stale,
    /// Parked for a person by [`Store::mark_needs_review`].
    NeedsReview,
    /// Done; the result is replayed to duplicates.
    Completed,
    /// Past its expiry: it already reads as absent, and [`Store::sweep`] will delete it.
    Expired,
}

impl RecordClass {
    /// Every class, in the order tools print them.
    pub const ALL: [RecordClass; 5] = [
        RecordClass::Pending,
        RecordClass::Stale,
        RecordClass::NeedsReview,
        RecordClass::Completed,
        RecordClass::Expired,
    ];

    /// A short lowercase name: `pending`, `stale`, `needs-review`, `completed` or `expired`.
    pub fn name(self) -> &'static str {
        match self {
            RecordClass::Pending => "pending",
            RecordClass::Stale => "stale",
            RecordClass::NeedsReview => "needs-review",
            RecordClass::Completed => "completed",
            RecordClass::Expired => "expired",
        }
    }

    /// The class of `record` at `now` (milliseconds since the Unix epoch), with the same rules
    /// as [`reserve`](Store::reserve): a lease is live while `now < lease_until`, and a record
    /// reads as absent from `expires_at` on.
    fn of(record: &Record, now: Millis) -> RecordClass {
        RecordClass::of_phase(record.phase(now))
    }

    /// The class of a record in `phase`.
    pub(crate) fn of_phase(phase: Phase) -> RecordClass {
        match phase {
            Phase::Expired => RecordClass::Expired,
            Phase::Live => RecordClass::Pending,
            Phase::Stale => RecordClass::Stale,
            Phase::Completed => RecordClass::Completed,
            Phase::NeedsReview => RecordClass::NeedsReview,
        }
    }
}

impl fmt::Display for RecordClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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

    fn matches(&self, record: &Record, class: RecordClass, now: Millis) -> bool {
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

    fn add(&mut self, class: RecordClass) {
        *match class {
            RecordClass::Pending => &mut self.pending,
            RecordClass::Stale => &mut self.stale,
            RecordClass::NeedsReview => &mut self.needs_review,
            RecordClass::Completed => &mut self.completed,
            RecordClass::Expired => &mut self.expired,
        } += 1;
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
    /// The write-ahead log: the store file's name with `.wal` appended.
    pub log_path: PathBuf,
    /// The log's size in bytes. The log is overwritten in place from its start after each
    /// checkpoint, so this is its high-water mark, not the amount of unreplayed data.
    pub log_bytes: u64,
    /// The last log frame whose changes the file holds (meta `wal_seq`). Right after
    /// [`Store::open`] this is the checkpoint: every frame up to it is in the B-tree file.
    pub wal_seq: u64,
    /// The fencing token the next acquisition will get (meta `next_token`).
    pub next_token: u64,
}

/// What [`Problem`] was found by [`Store::verify`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemKind {
    /// A record fails its checksum or does not decode; reading its key reports
    /// [`Error::Corruption`].
    DamagedRecord,
    /// A stored key is not a valid `(scope, operation, id)` encoding.
    BadKey,
    /// A record has no entry where the expiry or lease index should hold one: a sweep would
    /// not delete it, or [`Store::stale`] would not list it.
    MissingIndexEntry,
    /// An index entry points to no record, or to a record that does not match it. Harmless
    /// to answers (sweeps drop such entries), but a sign of earlier damage.
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
    /// Expiry index entries read.
    pub expiry_entries: u64,
    /// Lease index entries read.
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
    Error::storage("inspecting the store", source)
}

type RecordsTable = ReadOnlyTable<&'static [u8], &'static [u8]>;

impl Store {
    /// The [`RecordClass`] of `record` now, by the store's clock.
    ///
    /// ```
    /// use idemstore::{Fingerprint, Key, RecordClass, Store};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("keys.idem"))?;
    /// let key = Key::new("user-1", "charge", "k1")?;
    /// let _lease = store.reserve(&key, Fingerprint::of(b"amount=5"))?;
    /// let record = store.get(&key)?.expect("just reserved");
    /// assert_eq!(store.class_of(&record), RecordClass::Pending);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn class_of(&self, record: &Record) -> RecordClass {
        RecordClass::of(record, self.now())
    }

    /// Counts the stored records in each [`RecordClass`], and finds the oldest reservation.
    ///
    /// Reads every record (one snapshot; writers are not blocked).
    ///
    /// ```
    /// use idemstore::{Fingerprint, Key, Reservation, Store};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("keys.idem"))?;
    /// for id in ["a", "b", "c"] {
    ///     let key = Key::new("user-1", "charge", id)?;
    ///     if let Reservation::Acquired(lease) = store.reserve(&key, Fingerprint::of(id))? {
    ///         if id != "c" {
    ///             store.complete(&lease, b"200 OK".to_vec())?;
    ///         }
    ///     }
    /// }
    /// let counts = store.counts()?;
    /// assert_eq!((counts.completed, counts.pending, counts.total()), (2, 1, 3));
    /// let (oldest, _record) = counts.oldest_pending.expect("c is pending");
    /// assert_eq!(oldest.id(), b"c");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// Storage errors, and [`Error::Poisoned`]. Damaged records are counted, not errors.
    pub fn counts(&self) -> Result<StateCounts, Error> {
        let txn = self.snapshot()?;
        let records = txn.open_table(RECORDS).map_err(storage)?;
        let now = self.now();
        let mut counts = StateCounts::default();
        let mut oldest: Option<(Millis, Key, Record)> = None;
        for entry in records.iter().map_err(storage)? {
            let (key, value) = entry.map_err(storage)?;
            let (Some(key), Ok(record)) = (Key::decode(key.value()), Record::decode(value.value()))
            else {
                counts.damaged += 1;
                continue;
            };
            let class = RecordClass::of(&record, now);
            counts.add(class);
            if let (RecordClass::Pending | RecordClass::Stale, Some(lease_until)) =
                (class, record.lease_until())
            {
                if oldest.as_ref().is_none_or(|(t, _, _)| lease_until < *t) {
                    oldest = Some((lease_until, key, record));
                }
            }
        }
        counts.oldest_pending = oldest.map(|(_, key, record)| (key, record));
        Ok(counts)
    }

    /// Up to `limit` stored records that match `filter`, with their keys.
    ///
    /// Order: reservations (pending or stale) by lease deadline, oldest first, read through
    /// the lease index; expired records by expiry, oldest first, through the expiry index;
    /// every other filter in key order, by reading every record. Records whose bytes do not
    /// decode are skipped: [`verify`](Store::verify) reports them and
    /// [`counts`](Store::counts) counts them.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idemstore::{Fingerprint, Key, ManualClock, RecordClass, Reservation, ScanFilter, Store};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let clock = ManualClock::new();
    /// let store = Store::builder()
    ///     .lease(Duration::from_secs(30))
    ///     .clock(clock.clone())
    ///     .open(dir.path().join("keys.idem"))?;
    /// let key = Key::new("user-1", "charge", "k1")?;
    /// let Reservation::Acquired(_lease) = store.reserve(&key, Fingerprint::of(b"x"))? else {
    ///     unreachable!("a fresh key is acquired")
    /// };
    /// // The worker dies; ten minutes later its reservation has been stale for 9.5 minutes.
    /// clock.advance(Duration::from_secs(600));
    /// let filter = ScanFilter::of(RecordClass::Stale).older_than(Duration::from_secs(300));
    /// let found = store.scan(&filter, 100)?;
    /// assert_eq!(found.len(), 1);
    /// assert_eq!(found[0].0, key);
    /// assert_eq!(found[0].1.attempt(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// Storage errors, and [`Error::Poisoned`].
    pub fn scan(&self, filter: &ScanFilter, limit: usize) -> Result<Vec<(Key, Record)>, Error> {
        let txn = self.snapshot()?;
        let records = txn.open_table(RECORDS).map_err(storage)?;
        let now = self.now();
        let mut found = Vec::new();
        if limit == 0 {
            return Ok(found);
        }
        let keep = |found: &mut Vec<(Key, Record)>, key: &[u8], record: Record| {
            let class = RecordClass::of(&record, now);
            if filter.matches(&record, class, now) {
                if let Some(key) = Key::decode(key) {
                    found.push((key, record));
                }
            }
            found.len() >= limit
        };
        match filter.class {
            Some(class @ (RecordClass::Pending | RecordClass::Stale)) => {
                let leases = txn.open_table(LEASES).map_err(storage)?;
                let boundary = (now.saturating_add(1), &[][..]);
                let entries = match class {
                    RecordClass::Stale => leases.range(..boundary),
                    _ => leases.range(boundary..),
                };
                for entry in entries.map_err(storage)? {
                    let (index, _) = entry.map_err(storage)?;
                    let (lease_until, key) = index.value();
                    let Some(record) = load(&records, key)? else {
                        continue;
                    };
                    if record.lease_until() == Some(lease_until) && keep(&mut found, key, record) {
                        break;
                    }
                }
            }
            Some(RecordClass::Expired) => {
                let expiry = txn.open_table(EXPIRY).map_err(storage)?;
                let due = ..(now.saturating_add(1), &[][..]);
                for entry in expiry.range(due).map_err(storage)? {
                    let (index, _) = entry.map_err(storage)?;
                    let (deadline, key) = index.value();
                    let Some(record) = load(&records, key)? else {
                        continue;
                    };
                    if record.expires_at == deadline && keep(&mut found, key, record) {
                        break;
                    }
                }
            }
            _ => {
                for entry in records.iter().map_err(storage)? {
                    let (key, value) = entry.map_err(storage)?;
                    let Ok(record) = Record::decode(value.value()) else {
                        continue;
                    };
                    if keep(&mut found, key.value(), record) {
                        break;
                    }
                }
            }
        }
        Ok(found)
    }

    /// The store's file and log sizes and its log position and next fencing token.
    ///
    /// ```
    /// use idemstore::Store;
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("keys.idem"))?;
    /// let info = store.file_info()?;
    /// assert!(info.file_bytes > 0);
    /// assert!(info.log_path.to_string_lossy().ends_with("keys.idem.wal"));
    /// assert_eq!(info.next_token, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Io`] when a file's size cannot be read; storage errors; [`Error::Poisoned`].
    pub fn file_info(&self) -> Result<FileInfo, Error> {
        let txn = self.snapshot()?;
        let meta = txn.open_table(META).map_err(storage)?;
        let read = |name: &str| -> Result<u64, Error> {
            Ok(meta.get(name).map_err(storage)?.map_or(0, |v| v.value()))
        };
        let (wal_seq, next_token) = (read(META_WAL_SEQ)?, read(META_NEXT_TOKEN)?);
        let size = |path: &std::path::Path| {
            std::fs::metadata(path)
                .map(|m| m.len())
                .map_err(|e| Error::io(format!("reading the size of {}", path.display()), e))
        };
        let log_path = log_path(self.path());
        Ok(FileInfo {
            file_bytes: size(self.path())?,
            log_bytes: size(&log_path)?,
            path: self.path().to_path_buf(),
            log_path,
            wal_seq,
            next_token,
        })
    }

    /// Checks the whole store: every record's checksum and encoding, every key's encoding,
    /// that every record has exactly the expiry and lease index entries it should and that
    /// every index entry matches a record, and that no record's fencing token is at or above
    /// the next token. Changes nothing.
    ///
    /// ```
    /// use idemstore::{Fingerprint, Key, Store};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("keys.idem"))?;
    /// let _ = store.reserve(&Key::new("user-1", "charge", "k1")?, Fingerprint::of(b"x"))?;
    /// let report = store.verify()?;
    /// assert!(report.is_ok(), "{:?}", report.problems);
    /// assert_eq!((report.records, report.lease_entries, report.expiry_entries), (1, 1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// Storage errors (including damage redb itself detects in its pages), and
    /// [`Error::Poisoned`]. Damage to records and indexes is reported in the result.
    pub fn verify(&self) -> Result<Verification, Error> {
        let txn = self.snapshot()?;
        let records = txn.open_table(RECORDS).map_err(storage)?;
        let expiry = txn.open_table(EXPIRY).map_err(storage)?;
        let leases = txn.open_table(LEASES).map_err(storage)?;
        let meta = txn.open_table(META).map_err(storage)?;
        let mut report = Verification::default();
        let next_token = match meta.get(META_NEXT_TOKEN).map_err(storage)? {
            Some(v) => Some(v.value()),
            None => {
                report.problems.push(Problem::new(
                    ProblemKind::Meta,
                    &[],
                    "the next fencing token (meta next_token) is missing",
                ));
                None
            }
        };
        for entry in records.iter().map_err(storage)? {
            let (key, value) = entry.map_err(storage)?;
            let key = key.value();
            report.records += 1;
            if Key::decode(key).is_none() {
                report.problems.push(Problem::new(
                    ProblemKind::BadKey,
                    key,
                    "the stored key is not a valid (scope, operation, id) encoding",
                ));
            }
            let record = match Record::decode(value.value()) {
                Ok(record) => record,
                Err(reason) => {
                    report.problems.push(Problem::new(
                        ProblemKind::DamagedRecord,
                        key,
                        format!("damaged record: {reason}"),
                    ));
                    continue;
                }
            };
            let index = IndexEntries::of(&record);
            if let Some(deadline) = index.expiry {
                if expiry.get((deadline, key)).map_err(storage)?.is_none() {
                    report.problems.push(Problem::new(
                        ProblemKind::MissingIndexEntry,
                        key,
                        format!(
                            "no expiry index entry at its expiry {}",
                            describe_millis(deadline)
                        ),
                    ));
                }
            }
            if let Some(lease_until) = index.lease {
                if leases.get((lease_until, key)).map_err(storage)?.is_none() {
                    report.problems.push(Problem::new(
                        ProblemKind::MissingIndexEntry,
                        key,
                        format!(
                            "no lease index entry at its lease deadline {}",
                            describe_millis(lease_until)
                        ),
                    ));
                }
            }
            if next_token.is_some_and(|next| record.token >= next) {
                report.problems.push(Problem::new(
                    ProblemKind::TokenAhead,
                    key,
                    format!(
                        "fencing token {} is not below the store's next token {}",
                        record.token,
                        next_token.unwrap_or_default()
                    ),
                ));
            }
        }
        for (name, table, count) in [
            ("expiry", &expiry, &mut report.expiry_entries),
            ("lease", &leases, &mut report.lease_entries),
        ] {
            for entry in table.iter().map_err(storage)? {
                let (index, _) = entry.map_err(storage)?;
                let (at, key) = index.value();
                *count += 1;
                let detail = match records.get(key).map_err(storage)? {
                    None => "points to no record",
                    Some(value) => match Record::decode(value.value()) {
                        Err(_) => continue, // reported with the record
                        Ok(record) => {
                            let expected = IndexEntries::of(&record);
                            let matches = match name {
                                "expiry" => expected.expiry == Some(at),
                                _ => expected.lease == Some(at),
                            };
                            if matches {
                                continue;
                            }
                            "does not match the record"
                        }
                    },
                };
                report.problems.push(Problem::new(
                    ProblemKind::StrayIndexEntry,
                    key,
                    format!("{name} index entry at {} {detail}", describe_millis(at)),
                ));
            }
        }
        Ok(report)
    }
}

/// The record stored under `key`, or `None` when it is absent or does not decode.
fn load(records: &RecordsTable, key: &[u8]) -> Result<Option<Record>, Error> {
    let value = records.get(key).map_err(storage)?;
    Ok(value.and_then(|bytes| Record::decode(bytes.value()).ok()))
}

/// A time in a problem report, in UTC as RFC 3339 (`2026-11-29T12:00:00.250Z`).
pub(crate) fn describe_millis(millis: Millis) -> String {
    if millis == Millis::MAX {
        return "never".into();
    }
    let (days, ms) = (millis / 86_400_000, millis % 86_400_000);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's days_from_civil, inverted).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1_000 % 60,
        ms % 1_000
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::ManualClock;
    use crate::fingerprint::Fingerprint;
    use crate::reservation::Reservation;
    use crate::tables::Tables;

    fn store(dir: &tempfile::TempDir, clock: &ManualClock) -> Store {
        Store::builder()
            .lease(Duration::from_secs(10))
            .retention(Duration::from_secs(100))
            .clock(clock.clone())
            .open(dir.path().join("s.idem"))
            .unwrap()
    }

    fn acquire(store: &Store, id: &str) -> crate::Lease {
        let key = Key::new("u", "op", id).unwrap();
        match store.reserve(&key, Fingerprint::of(id)).unwrap() {
            Reservation::Acquired(lease) => lease,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn times_in_reports_are_rfc3339_utc() {
        assert_eq!(describe_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(describe_millis(951_782_400_250), "2000-02-29T00:00:00.250Z");
        assert_eq!(
            describe_millis(1_795_000_000_000),
            "2026-11-18T11:06:40.000Z"
        );
    }

    #[test]
    fn classes_counts_and_scans_follow_the_clock() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let store = store(&dir, &clock);
        let done = acquire(&store, "done");
        store.complete(&done, b"ok".to_vec()).unwrap();
        let review = acquire(&store, "review");
        store.mark_needs_review(&review, "unknown").unwrap();
        let _stale = acquire(&store, "stale");
        clock.advance(Duration::from_secs(20));
        let _live = acquire(&store, "live");
        let counts = store.counts().unwrap();
        assert_eq!(
            (
                counts.pending,
                counts.stale,
                counts.needs_review,
                counts.completed
            ),
            (1, 1, 1, 1)
        );
        assert_eq!(counts.oldest_pending.unwrap().0.id(), b"stale");
        let stale = store.scan(&ScanFilter::of(RecordClass::Stale), 10).unwrap();
        assert_eq!(stale.len(), 1);
        let old = ScanFilter::of(RecordClass::Stale).older_than(Duration::from_secs(11));
        assert!(store.scan(&old, 10).unwrap().is_empty());
        let old = ScanFilter::of(RecordClass::Stale).older_than(Duration::from_secs(10));
        assert_eq!(store.scan(&old, 10).unwrap().len(), 1);
        assert_eq!(store.scan(&ScanFilter::any(), 10).unwrap().len(), 4);
        assert_eq!(store.scan(&ScanFilter::any(), 2).unwrap().len(), 2);
        clock.advance(Duration::from_secs(200));
        let counts = store.counts().unwrap();
        assert_eq!((counts.expired, counts.needs_review), (3, 1));
        let expired = store
            .scan(&ScanFilter::of(RecordClass::Expired), 10)
            .unwrap();
        assert_eq!(expired.len(), 3);
        assert!(store.verify().unwrap().is_ok());
    }

    #[test]
    fn verify_reports_damage_and_index_mismatches_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let store = store(&dir, &clock);
        let a = acquire(&store, "a");
        store.complete(&a, b"ok".to_vec()).unwrap();
        let _b = acquire(&store, "b");
        let _c = acquire(&store, "c");
        let key = |id: &str| Key::new("u", "op", id).unwrap();
        store
            .with_writer(|writer| {
                writer.transact(crate::commit::CommitKind::Durable, |_, txn, _, _| {
                    let mut tables = Tables::open(txn)?;
                    let ctx = "damaging";
                    // a: flip a byte of the stored record.
                    let mut bytes = tables
                        .records
                        .get(key("a").encoded())
                        .map_err(|e| Error::storage(ctx, e))?
                        .unwrap()
                        .value()
                        .to_vec();
                    bytes[5] ^= 0xff;
                    tables
                        .records
                        .insert(key("a").encoded(), bytes.as_slice())
                        .map_err(|e| Error::storage(ctx, e))?;
                    // b: drop its lease index entry and add a stray one.
                    let record = tables.load(key("b").encoded())?.unwrap().unwrap();
                    let lease = record.lease_until().unwrap();
                    tables
                        .leases
                        .remove((lease, key("b").encoded()))
                        .map_err(|e| Error::storage(ctx, e))?;
                    tables
                        .leases
                        .insert((lease + 1, key("b").encoded()), ())
                        .map_err(|e| Error::storage(ctx, e))?;
                    Ok(Ok(()))
                })
            })
            .unwrap();
        store.clear_cache();
        let report = store.verify().unwrap();
        let kinds: Vec<_> = report
            .problems
            .iter()
            .map(|p| (p.kind, p.key.as_ref().map(|k| k.id().to_vec())))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (ProblemKind::DamagedRecord, Some(b"a".to_vec())),
                (ProblemKind::MissingIndexEntry, Some(b"b".to_vec())),
                (ProblemKind::StrayIndexEntry, Some(b"b".to_vec())),
            ],
            "{:#?}",
            report.problems
        );
        assert!(report.problems[0].to_string().contains("u/op/a"));
        assert!(report.problems[0].to_string().contains("checksum"));
        assert_eq!(store.counts().unwrap().damaged, 1);
        // Scans skip the damaged record instead of failing.
        assert_eq!(store.scan(&ScanFilter::any(), 10).unwrap().len(), 2);
    }
}
