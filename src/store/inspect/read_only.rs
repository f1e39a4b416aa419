//! [`ReadOnlyStore`]: the inspection calls on a closed store, without writing to its files.

use std::sync::Arc;

use redb::{ReadOnlyDatabase, ReadableDatabase};

use super::*;
use crate::clock::{to_millis, Clock};
use crate::error::{OpenError, StorageError};
use crate::store::builder::Builder;
use crate::store::open::file::{check_format, check_page_file, open_error, page_file};
use crate::tree::{decode_record, read_windows};

/// A closed store opened for reading only: [`get`](ReadOnlyStore::get),
/// [`counts`](ReadOnlyStore::counts), [`scan`](ReadOnlyStore::scan),
/// [`file_info`](ReadOnlyStore::file_info) and [`verify`](ReadOnlyStore::verify), with the
/// answers [`Store`]'s calls of the same names give, and nothing written to the store file or
/// its log: not a byte, not a modification time. For tools that look into a store a service
/// is not running (the `idemstore` command-line tool's `stats`, `list`, `get` and `check`),
/// and for reading a copy, a backup or a file on read-only media.
///
/// Only a store that was **closed cleanly** opens this way: its file then holds every
/// acknowledged operation, and its log holds nothing the file lacks. A store that was not (its
/// process crashed or was killed, or it is open in a service now, which refuses with
/// [`OpenError::AlreadyOpen`]) has operations in its log that only replaying it into the file
/// can show, and replaying writes. It is refused with [`OpenError::InvalidConfig`] (setting
/// `open_read_only`) naming the file and saying how to recover it: open it writable once
/// ([`Store::open`], or `idemstore recover FILE`), which replays the log and, when dropped,
/// closes it cleanly. Refusing is chosen over replaying the log into memory so that what this
/// reads is always exactly what the file holds.
///
/// A reservation still pending in a closed store was made by a process that is gone, so it
/// reads as stale, as it would to the next owner of the file; open with
/// [`Builder::leases_survive_restart`] to read it as a service built with it would.
///
/// The windows' filters in memory belong to a running store: this reads every window's table
/// for a key, and [`verify`](ReadOnlyStore::verify) reports no
/// [`ProblemKind::UnfilteredRecord`].
///
/// ```
/// use idemstore::{Fingerprint, Key, ReadOnlyStore, Reservation, Store};
///
/// # let dir = tempfile::tempdir()?;
/// let path = dir.path().join("keys.idem");
/// let key = Key::new("user-1", "charge", "k1")?;
/// {
///     let store = Store::open(&path)?;
///     if let Reservation::Acquired(lease) = store.reserve(&key, Fingerprint::of(b"x"))? {
///         store.complete(&lease, b"200 OK".to_vec())?;
///     }
/// } // dropped: closed cleanly
/// let store = ReadOnlyStore::open(&path)?;
/// assert_eq!(store.counts()?.completed, 1);
/// assert!(store.get(&key)?.is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ReadOnlyStore {
    db: ReadOnlyDatabase,
    path: PathBuf,
    windows: Windows,
    floor: TokenFloor,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for ReadOnlyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadOnlyStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl ReadOnlyStore {
    /// Opens the closed store at `path` for reading, by the system clock.
    ///
    /// # Errors
    /// [`OpenError::InvalidConfig`] (setting `open_read_only`) for a store that was not closed
    /// cleanly, saying how to recover it; [`OpenError::AlreadyOpen`] when a process holds it;
    /// [`OpenError::NotAStore`], [`OpenError::Storage`] as [`Store::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<ReadOnlyStore, OpenError> {
        ReadOnlyStore::open_with(&Builder::default(), path.as_ref())
    }

    /// Opens for reading with `builder`'s clock and
    /// [`leases_survive_restart`](Builder::leases_survive_restart); its other settings
    /// are for writing and are not used. [`Builder::open_read_only`] calls this.
    pub(crate) fn open_with(builder: &Builder, path: &Path) -> Result<ReadOnlyStore, OpenError> {
        let db = open_clean(path, "open_read_only")?;
        let storage = |e: redb::Error| StorageError::redb("inspecting the store", e);
        let next_token = || -> Result<u64, StorageError> {
            let txn = db.begin_read().map_err(|e| storage(e.into()))?;
            let meta = txn.open_table(META).map_err(|e| storage(e.into()))?;
            let value = meta.get(META_NEXT_TOKEN).map_err(|e| storage(e.into()))?;
            Ok(value.map_or(0, |v| v.value()))
        };
        let next_token = next_token()?;
        let Some(windows) = read_windows(&db)? else {
            return Err(OpenError::InvalidConfig {
                setting: "open_read_only",
                reason: format!(
                    "the store {} is of the earlier format (one window width), which only a \
                     writable open converts (`idemstore compact FILE`, or any open by the \
                     service); nothing was written",
                    path.display()
                ),
            });
        };
        Ok(ReadOnlyStore {
            db,
            path: path.to_path_buf(),
            windows,
            floor: if builder.leases_survive_restart {
                TokenFloor::NONE
            } else {
                TokenFloor(next_token)
            },
            clock: Arc::clone(&builder.clock),
        })
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The [`RecordClass`] of `record` now, as [`Store::class_of`].
    pub fn class_of(&self, record: &Record) -> RecordClass {
        record.class(to_millis(self.clock.now()), self.floor)
    }

    /// The record stored under `key`, unless it expired; as [`Store::get`].
    ///
    /// # Errors
    /// [`StorageError::Corruption`] naming the key of a damaged record, or the file for a damaged
    /// page; storage errors.
    pub fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        self.guard("reading a record", |snapshot| {
            let records = Records::open(&snapshot.txn, snapshot.windows)?;
            let found = records.get(key.encoded()).map_err(storage)?;
            let record = match found {
                Some(bytes) => decode_record(key.encoded(), bytes.value())?,
                None => return Ok(None),
            };
            Ok(Some(record).filter(|record| !record.is_expired(snapshot.now)))
        })
    }

    /// As [`Store::counts`].
    ///
    /// # Errors
    /// Storage errors; damage redb meets in a page, as [`StorageError::Corruption`].
    pub fn counts(&self) -> Result<StateCounts, Error> {
        self.guard("counting records", |snapshot| snapshot.counts())
    }

    /// As [`Store::scan`].
    ///
    /// # Errors
    /// As [`counts`](ReadOnlyStore::counts).
    pub fn scan(&self, filter: &ScanFilter, limit: usize) -> Result<Vec<(Key, Record)>, Error> {
        self.guard("scanning records", |snapshot| snapshot.scan(filter, limit))
    }

    /// As [`Store::file_info`]: a cleanly closed store has no log written since its last
    /// checkpoint.
    ///
    /// # Errors
    /// [`StorageError::Io`] when a file's size cannot be read (the log, too, must exist); storage
    /// errors.
    pub fn file_info(&self) -> Result<FileInfo, Error> {
        self.guard("reading the file's layout", |snapshot| {
            snapshot.file_info(&self.path, 0)
        })
    }

    /// As [`Store::verify_with_progress`].
    ///
    /// # Errors
    /// As [`counts`](ReadOnlyStore::counts).
    pub fn verify_with_progress(
        &self,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<Verification, Error> {
        self.guard("verifying records", |snapshot| {
            snapshot.verify(&mut progress)
        })
    }

    /// As [`Store::verify`].
    ///
    /// # Errors
    /// As [`counts`](ReadOnlyStore::counts).
    pub fn verify(&self) -> Result<Verification, Error> {
        self.verify_with_progress(|_, _| {})
    }

    /// Runs `read` in a snapshot now, a panic inside redb turned into [`StorageError::Corruption`].
    fn guard<T>(
        &self,
        doing: &str,
        read: impl FnOnce(&Snapshot<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        crate::store::guard_read(&self.path, doing, || {
            let snapshot = Snapshot {
                txn: self.db.begin_read().map_err(storage)?,
                windows: &self.windows,
                now: to_millis(self.clock.now()),
                floor: self.floor,
            };
            read(&snapshot)
        })
    }
}

/// The file of the closed store at `path`, opened read only, after checking that it is a store
/// and that it was closed cleanly: the check of every open that must not replay the log
/// (`setting` names it in the refusal). Writes nothing.
pub(crate) fn open_clean(
    path: &Path,
    setting: &'static str,
) -> Result<ReadOnlyDatabase, OpenError> {
    check_page_file(path)?;
    let file = std::fs::File::open(path)
        .map_err(|e| StorageError::io(format!("opening {}", path.display()), e))?;
    // redb refuses to open read only a file its last writer did not commit cleanly.
    let db = match redb::Builder::new().open_read_only_with_backend(page_file(file, path)?) {
        Ok(db) => db,
        Err(redb::DatabaseError::RepairAborted) => return Err(needs_recovery(path, setting)),
        Err(e) => return Err(open_error(path, "opening", e)),
    };
    check_format(&db, path)?;
    if !crate::log::recorded(&db)? {
        return Err(needs_recovery(path, setting));
    }
    Ok(db)
}

/// The refusal of a store that needs recovery by an open that must not replay its log
/// (`setting` names that open), naming the file and how to recover it.
pub(crate) fn needs_recovery(path: &Path, setting: &'static str) -> OpenError {
    OpenError::InvalidConfig {
        setting,
        reason: format!(
            "store {} was not closed cleanly (its process stopped without closing it, or it is \
             being recovered): its log {} may hold operations the file does not, and only \
             replaying the log, which writes, shows them; recover it first with \
             `idemstore recover {}` (or open it writable once, Store::open, and drop it), then \
             read it again",
            path.display(),
            log_path(path).display(),
            path.display()
        ),
    }
}
