//! Restoring records into a closed store: [`import`].

use std::path::Path;

use crate::error::{OpenError, StorageError};
use crate::key::Key;
use crate::record::Record;
use crate::store::inspect::{needs_recovery, open_clean};
use crate::store::open::file::{check_format, open_redb};
use crate::tree::{open_windows, Tables};

/// What [`import`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Imported {
    /// Records written.
    pub imported: u64,
    /// Records left out because the store already holds their key (its record is kept).
    pub already_stored: u64,
}

/// Writes `records` into the closed store at `path`, each exactly as given (state, times,
/// fencing token, attempt, fingerprint, result), in one durable commit: for restoring an
/// export (the `idemstore export` and `import` commands) or moving keys between stores.
///
/// A key the store already holds keeps its record (counted in
/// [`Imported::already_stored`]): an import never replaces what a service stored. The
/// store's next fencing token is raised above every imported token, so no token is handed out
/// twice. A record whose expiry has passed is written too, and reads as absent, as any
/// expired record does, until a sweep deletes it.
///
/// The store must be closed, and closed cleanly (its log holds nothing the file lacks):
/// otherwise this is refused, as [`ReadOnlyStore::open`](crate::ReadOnlyStore::open) refuses
/// it, with how to recover it. The clean-close mark stays, so the store's next open does not
/// read its log.
///
/// ```
/// use idemstore::{Fingerprint, Key, Reservation, Store};
///
/// # let dir = tempfile::tempdir()?;
/// # let (from, to) = (dir.path().join("a.idem"), dir.path().join("b.idem"));
/// let key = Key::new("user-1", "charge", "k1")?;
/// let store = Store::open(&from)?;
/// if let Reservation::Acquired(lease) = store.reserve(&key, Fingerprint::of(b"x"))? {
///     store.complete(&lease, b"200 OK".to_vec())?;
/// }
/// let record = store.get(&key)?.expect("completed");
/// drop(Store::open(&to)?); // a new, empty store, closed
/// let done = idemstore::import(&to, [(key.clone(), record.clone())])?;
/// assert_eq!(done.imported, 1);
/// assert_eq!(Store::open(&to)?.get(&key)?, Some(record));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As [`compact`](crate::compact): [`OpenError::AlreadyOpen`] while a store has the file open,
/// [`OpenError::NotAStore`], [`OpenError::Storage`] (I/O, redb, or
/// [`StorageError::Corruption`] naming a damaged block); and [`OpenError::InvalidConfig`] (setting `import`) for a
/// store that was not closed cleanly. Nothing is written when it fails.
pub fn import(
    path: impl AsRef<Path>,
    records: impl IntoIterator<Item = (Key, Record)>,
) -> Result<Imported, OpenError> {
    let path = path.as_ref();
    // Checked without writing first: opening a file redb must repair for writing repairs it.
    drop(open_clean(path, "import")?);
    let db = open_redb(path)?;
    check_format(&db, path)?;
    if !crate::log::recorded(&db)? {
        return Err(needs_recovery(path, "import"));
    }
    let windows = open_windows(&db)?;
    let ctx = "importing records";
    let mut txn = db.begin_write().map_err(|e| StorageError::redb(ctx, e))?;
    txn.set_durability(redb::Durability::Immediate)
        .map_err(|e| StorageError::redb(ctx, e))?;
    txn.set_quick_repair(true);
    let mut done = Imported::default();
    let write = |done: &mut Imported| -> Result<(), StorageError> {
        let mut tables = Tables::open(&txn, &windows)?;
        let mut next_token = tables.next_token()?;
        for (key, record) in records {
            // A damaged record is the store's: kept, as a stored one is.
            if !matches!(tables.load(key.encoded())?, Ok(None)) {
                done.already_stored += 1;
                continue;
            }
            tables.put(key.encoded(), None, &record, &record.encode())?;
            next_token = next_token.max(record.token.saturating_add(1));
            done.imported += 1;
        }
        tables.set_next_token(next_token)?;
        tables.save_filters()
    };
    write(&mut done)?;
    txn.commit().map_err(|e| StorageError::redb(ctx, e))?;
    Ok(done)
}
