//! The clean-close mark: what lets a store that was closed cleanly open in constant time.
//!
//! Closing a store ends with a checkpoint (a durable redb commit that holds every frame of the
//! log) which also writes `"closed_clean" → 1` into `idemstore.meta`. Opening a store whose
//! file carries the mark:
//!
//! - skips reading the log: the checkpoint holds every frame, and the frames left in the file
//!   are under older salts, so none of them can be current (see [`crate::log::wal`]);
//! - skips redb's full integrity check ([`Builder::verify_on_open`](crate::Builder::verify_on_open)):
//!   nothing was in flight when the file was last written. The mark is read through a
//!   read-only handle before the store is opened for writing, so a store that was not closed
//!   cleanly is verified by redb's own open, before any of its pages is trusted.
//!
//! The mark is removed, durably, in the open's first commit, before any new frame is written,
//! so a store that dies later is never taken for cleanly closed: its next open replays the log
//! (at most [`Builder::checkpoint_bytes`](crate::Builder::checkpoint_bytes) of it) and, with
//! `verify_on_open`, verifies the file.
//!
//! Without the integrity check, a page damaged after the clean close (on the disk, or by
//! another program) is first met by a read; reads of the store's tables are guarded
//! ([`Store::guard_read`](crate::Store)), so such a page gives an error naming the file,
//! never a panic.

use redb::{ReadableDatabase, TableError, WriteTransaction};

use crate::error::{Error, OpenError};
use crate::tree::tables::{META, META_CLOSED_CLEAN};

/// Whether the file carries the clean-close mark (read without writing). Read by opens only.
pub(crate) fn recorded(db: &impl ReadableDatabase) -> Result<bool, OpenError> {
    let ctx = "reading the clean-close mark";
    let txn = db.begin_read().map_err(|e| OpenError::storage(ctx, e))?;
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        // Not a store: the format check reports it.
        Err(TableError::TableDoesNotExist(_)) => return Ok(false),
        Err(e) => return Err(OpenError::storage(ctx, e)),
    };
    let value = meta
        .get(META_CLOSED_CLEAN)
        .map_err(|e| OpenError::storage(ctx, e))?;
    Ok(value.is_some_and(|v| v.value() == 1))
}

/// Removes the mark in `txn` and returns whether it was there.
pub(crate) fn take(txn: &WriteTransaction) -> Result<bool, Error> {
    let ctx = "clearing the clean-close mark";
    let mut meta = txn.open_table(META).map_err(|e| Error::storage(ctx, e))?;
    let removed = meta
        .remove(META_CLOSED_CLEAN)
        .map_err(|e| Error::storage(ctx, e))?;
    Ok(removed.is_some_and(|v| v.value() == 1))
}

/// Writes the mark in `txn` (a new store, which has logged nothing).
pub(crate) fn mark(txn: &WriteTransaction) -> Result<(), Error> {
    let ctx = "writing the clean-close mark";
    let mut meta = txn.open_table(META).map_err(|e| Error::storage(ctx, e))?;
    meta.insert(META_CLOSED_CLEAN, 1)
        .map_err(|e| Error::storage(ctx, e))?;
    Ok(())
}
