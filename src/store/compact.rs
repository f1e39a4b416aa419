//! Giving a closed store's free pages back to the file system: [`compact`].

use std::path::Path;

use crate::error::{OpenError, StorageError};
use crate::store::open::file::{check_format, open_redb};

/// Moves the pages of the closed store at `path` towards the start of its file and shortens
/// the file to what they need (redb's own compaction, a series of durable commits). Returns
/// the file's size in bytes before and after.
///
/// Why a store holds free pages: its file is copy-on-write (a page changed since the last
/// durable commit exists twice) and redb doubles the file each time it runs out of pages,
/// until it is 4 GiB long, so a store filled with keys spread over the key space has about
/// as many free pages as used ones (1M keys: 571 MB, of which 314 MB used; BENCHMARKS.md,
/// "Growth"). Compacting gives them back once; **writing to the store afterwards takes the
/// room back, and more**: the next writes need the copies again, and the file doubles from
/// its compacted size (the same 1M-key store, compacted to 314 MB, was 1,255 MB after 100,000
/// more keys). This is why a store never compacts itself, at close or otherwise, and why this
/// is meant for a store that will be read, copied or archived rather than written: it costs
/// about 5 s per million keys.
///
/// What the store holds is not changed: records, indexes and the clean-close mark. The log of
/// a cleanly closed store holds nothing the store needs, and is cut to its 32-byte identity
/// block; the log of a store that was not closed cleanly is left as it is (its next open
/// replays it, as before). A crash
/// during compaction leaves a file that redb repairs at the next open. The store must not be
/// open (it is refused with [`OpenError::AlreadyOpen`]).
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("orders.idem");
/// drop(idemstore::Store::open(&path)?);
/// let (before, after) = idemstore::compact(&path)?;
/// assert!(after <= before);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// An [`OpenError`], as opening the file can fail (it converts into
/// [`Error::Open`](crate::Error::Open)): [`OpenError::AlreadyOpen`] while a store has the
/// file open, [`OpenError::NotAStore`] for a file that is not an idemstore store (a foreign
/// redb database is left untouched), and [`OpenError::Storage`] for I/O, a damaged block
/// (naming it) or redb's compaction failing.
pub fn compact(path: impl AsRef<Path>) -> Result<(u64, u64), OpenError> {
    let path = path.as_ref();
    let size = || {
        std::fs::metadata(path)
            .map(|m| m.len())
            .map_err(|e| StorageError::io(format!("reading metadata of {}", path.display()), e))
    };
    let before = size()?;
    let mut db = open_redb(path)?;
    check_format(&db, path)?;
    // redb compacts until nothing more moves; a second call finds nothing to do.
    while db
        .compact()
        .map_err(|e| StorageError::redb("compacting the store file", e))?
    {}
    let store_id = crate::store::open::store_id(&db)?;
    crate::log::shrink_log(&db, store_id, &crate::log::log_path(path))?;
    drop(db);
    Ok((before, size()?))
}
