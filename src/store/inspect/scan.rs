//! Counts, listings and file facts.

use super::*;
use crate::error::StorageError;

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
        record.class(self.now(), self.token_floor())
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
    /// Storage errors, and [`StorageError::Poisoned`](crate::StorageError::Poisoned). Damaged records are counted, not errors.
    pub fn counts(&self) -> Result<StateCounts, Error> {
        self.guard_read("counting records", || self.reading()?.counts())
    }

    /// Up to `limit` stored records that match `filter`, with their keys.
    ///
    /// Order: reservations (pending or stale) by lease deadline, oldest first, read through
    /// the lease index; expired records by expiry, oldest first (read window by window);
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
    /// Storage errors, and [`StorageError::Poisoned`](crate::StorageError::Poisoned).
    pub fn scan(&self, filter: &ScanFilter, limit: usize) -> Result<Vec<(Key, Record)>, Error> {
        self.guard_read("scanning records", || self.reading()?.scan(filter, limit))
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
    /// [`StorageError::Io`](crate::StorageError::Io) when a file's size cannot be read; storage
    /// errors; [`StorageError::Poisoned`](crate::StorageError::Poisoned).
    pub fn file_info(&self) -> Result<FileInfo, Error> {
        self.guard_read("reading the file's layout", || {
            let since = self.log_since_checkpoint()?;
            self.reading()?.file_info(self.path(), since)
        })
    }
}

impl Snapshot<'_> {
    /// [`Store::counts`] in this snapshot.
    pub(crate) fn counts(&self) -> Result<StateCounts, Error> {
        let records = Records::open(&self.txn, self.windows)?;
        let (now, floor) = (self.now, self.floor);
        let mut counts = StateCounts::default();
        for (_, table) in records.tables() {
            for entry in table.iter().map_err(storage)? {
                let (key, value) = entry.map_err(storage)?;
                let (Some(key), Ok(record)) =
                    (Key::decode(key.value()), Record::decode(value.value()))
                else {
                    counts.damaged += 1;
                    continue;
                };
                counts.count(record.class(now, floor), key, record);
            }
        }
        Ok(counts)
    }

    /// [`Store::scan`] in this snapshot.
    pub(crate) fn scan(
        &self,
        filter: &ScanFilter,
        limit: usize,
    ) -> Result<Vec<(Key, Record)>, Error> {
        let txn = &self.txn;
        let records = Records::open(txn, self.windows)?;
        let (now, floor) = (self.now, self.floor);
        let mut found = Vec::new();
        if limit == 0 {
            return Ok(found);
        }
        let keep = |found: &mut Vec<(Key, Record)>, key: &[u8], record: Record| {
            let class = record.class(now, floor);
            if filter.matches(&record, class, now) {
                if let Some(key) = Key::decode(key) {
                    found.push((key, record));
                }
            }
            found.len() >= limit
        };
        match filter.class {
            Some(class @ (RecordClass::Pending | RecordClass::Stale)) => {
                let deadlines = txn.open_table(DEADLINES).map_err(storage)?;
                let boundary = (LEASE, now.saturating_add(1), &[][..]);
                // Reservations of an earlier owner are stale whatever their lease time says,
                // so with a floor the stale ones are looked for among every lease.
                let (start, end) = ((LEASE, 0, &[][..]), (LEASE + 1, 0, &[][..]));
                let entries = match class {
                    RecordClass::Stale if floor == TokenFloor::NONE => {
                        deadlines.range(start..boundary)
                    }
                    RecordClass::Stale => deadlines.range(start..end),
                    _ => deadlines.range(boundary..end),
                };
                for entry in entries.map_err(storage)? {
                    let (index, _) = entry.map_err(storage)?;
                    let (_, lease_until, key) = index.value();
                    let Some(record) = load(&records, key)? else {
                        continue;
                    };
                    if record.lease_until() == Some(lease_until) && keep(&mut found, key, record) {
                        break;
                    }
                }
            }
            Some(RecordClass::Expired) => {
                // Window by window, the earliest to end first. A window that starts after `now`
                // holds nothing expired (a later one may: windows of different widths nest).
                'windows: for (window, table) in records.tables() {
                    if span(window).is_none_or(|(start, _)| start > now) {
                        continue;
                    }
                    let mut due: Vec<(Millis, Vec<u8>, Record)> = Vec::new();
                    for entry in table.iter().map_err(storage)? {
                        let (key, value) = entry.map_err(storage)?;
                        if let Ok(record) = Record::decode(value.value()) {
                            if record.expires_at <= now {
                                due.push((record.expires_at, key.value().to_vec(), record));
                            }
                        }
                    }
                    due.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
                    for (_, key, record) in due {
                        if keep(&mut found, &key, record) {
                            break 'windows;
                        }
                    }
                }
            }
            _ => {
                records.each_in_key_order(|key, value| {
                    Ok(match Record::decode(value) {
                        Ok(record) => keep(&mut found, key, record),
                        Err(_) => false,
                    })
                })?;
            }
        }
        Ok(found)
    }

    /// [`Store::file_info`] in this snapshot, of the store file at `path` whose log holds
    /// `since` bytes written after the last checkpoint.
    pub(crate) fn file_info(&self, path: &Path, since: u64) -> Result<FileInfo, Error> {
        let txn = &self.txn;
        let meta = txn.open_table(META).map_err(storage)?;
        let read = |name: &str| -> Result<u64, Error> {
            Ok(meta.get(name).map_err(storage)?.map_or(0, |v| v.value()))
        };
        let (wal_seq, next_token) = (read(META_WAL_SEQ)?, read(META_NEXT_TOKEN)?);
        let size = |path: &std::path::Path| {
            std::fs::metadata(path)
                .map(|m| m.len())
                .map_err(|e| StorageError::io(format!("reading the size of {}", path.display()), e))
        };
        let log_path = log_path(path);
        Ok(FileInfo {
            log_since_checkpoint: since,
            checkpoint_room: crate::state::reopen_room(since),
            file_bytes: size(path)?,
            log_bytes: size(&log_path)?,
            path: path.to_path_buf(),
            log_path,
            wal_seq,
            next_token,
            token_floor: self.floor.0,
        })
    }
}
