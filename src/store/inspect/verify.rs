//! The full consistency check of records and indexes.

use redb::ReadableTableMetadata;

use super::*;

impl Verification {
    /// How many entries [`Store::verify_with_progress`] checks between two progress calls.
    pub const PROGRESS_STEP: u64 = 4096;
}

impl Store {
    /// Checks the whole store: every record's checksum and encoding, every key's encoding,
    /// that every record is in the table of its own expiry window, that every pending record
    /// has its lease index entry and every index entry matches a record, and that no record's
    /// fencing token is at or above the next token. Changes nothing.
    ///
    /// ```
    /// use idemstore::{Fingerprint, Key, Store};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("keys.idem"))?;
    /// let _ = store.reserve(&Key::new("user-1", "charge", "k1")?, Fingerprint::of(b"x"))?;
    /// let report = store.verify()?;
    /// assert!(report.is_ok(), "{:?}", report.problems);
    /// // A pending record has one index entry, at its lease deadline.
    /// assert_eq!((report.records, report.lease_entries), (1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// Storage errors (including damage redb itself detects in its pages), and
    /// [`StorageError::Poisoned`](crate::StorageError::Poisoned). Damage to records and indexes is reported in the result.
    pub fn verify(&self) -> Result<Verification, Error> {
        self.verify_with_progress(|_, _| {})
    }

    /// [`verify`](Self::verify), calling `progress(checked, total)` as it goes: entries
    /// checked so far (records, then deadline index entries) out of all of them.
    /// It is called every [`Verification::PROGRESS_STEP`] entries and once at the end, so a command
    /// line tool can draw a progress bar over a big store.
    ///
    /// ```
    /// use idemstore::{Fingerprint, Key, Store};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("keys.idem"))?;
    /// let _ = store.reserve(&Key::new("user-1", "charge", "k1")?, Fingerprint::of(b"x"))?;
    /// let mut last = (0, 0);
    /// let report = store.verify_with_progress(|checked, total| last = (checked, total))?;
    /// assert!(report.is_ok());
    /// assert_eq!(last, (2, 2)); // one record and its lease index entry
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`verify`](Self::verify).
    pub fn verify_with_progress(
        &self,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<Verification, Error> {
        self.guard_read("verifying records", || {
            self.reading()?.verify(&mut progress)
        })
    }
}

impl Snapshot<'_> {
    /// [`Store::verify_with_progress`] in this snapshot.
    pub(crate) fn verify(
        &self,
        mut progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Verification, Error> {
        let txn = &self.txn;
        let records = Records::open(txn, self.windows)?;
        let deadlines = txn.open_table(DEADLINES).map_err(storage)?;
        let meta = txn.open_table(META).map_err(storage)?;
        let total = records.len().map_err(storage)? + deadlines.len().map_err(storage)?;
        let mut checked = 0u64;
        let mut tick = |progress: &mut dyn FnMut(u64, u64)| {
            checked += 1;
            if checked.is_multiple_of(Verification::PROGRESS_STEP) {
                progress(checked, total.max(checked));
            }
        };
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
        let windows = self.windows;
        for (window, table) in records.tables() {
            for entry in table.iter().map_err(storage)? {
                let (key, value) = entry.map_err(storage)?;
                let key = key.value();
                report.records += 1;
                tick(&mut progress);
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
                if !Windows::holds(window, record.expires_at) {
                    report.problems.push(Problem::new(
                        ProblemKind::MisplacedRecord,
                        key,
                        format!(
                            "kept in the window ending {} but expires {}",
                            describe_millis(Windows::end(window)),
                            describe_millis(record.expires_at)
                        ),
                    ));
                }
                // (A window deleted since the snapshot has no filter: nothing to check.)
                let missed = windows
                    .existing(window)
                    .is_some_and(|filter| !filter.may_hold(&Probe::of(windows.hash(key))));
                if missed {
                    report.problems.push(Problem::new(
                        ProblemKind::UnfilteredRecord,
                        key,
                        "its window's filter does not hold it: a lookup would miss it",
                    ));
                }
                if let Some(at) = record.lease_until() {
                    if deadlines.get((LEASE, at, key)).map_err(storage)?.is_none() {
                        report.problems.push(Problem::new(
                            ProblemKind::MissingIndexEntry,
                            key,
                            format!(
                                "no lease index entry at its lease deadline {}",
                                describe_millis(at)
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
        }
        for entry in deadlines.iter().map_err(storage)? {
            let (index, _) = entry.map_err(storage)?;
            let (kind, at, key) = index.value();
            let name = match kind {
                LEASE => {
                    report.lease_entries += 1;
                    "lease"
                }
                _ => "unknown kind of",
            };
            tick(&mut progress);
            let detail = match records.get(key).map_err(storage)? {
                None => "points to no record",
                Some(value) => match Record::decode(value.value()) {
                    Err(_) => continue, // reported with the record
                    Ok(record) => {
                        if kind == LEASE && record.lease_until() == Some(at) {
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
        progress(checked, checked);
        Ok(report)
    }
}
