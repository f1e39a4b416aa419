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

use std::path::Path;

use redb::{Database, ReadableDatabase, TableError, WriteTransaction};

use crate::error::{OpenError, StorageError};
use crate::log::identity::{self, Identity, LOG_HEADER_LEN};
use crate::log::lost_log::META_LOG_LEN;
use crate::log::wal::OsFile;
use crate::tree::{META, META_CLOSED_CLEAN, META_LOG_START};

/// Whether the file carries the clean-close mark (read without writing). Read by opens only.
pub(crate) fn recorded(db: &impl ReadableDatabase) -> Result<bool, OpenError> {
    let ctx = "reading the clean-close mark";
    let txn = db.begin_read().map_err(|e| StorageError::redb(ctx, e))?;
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        // Not a store: the format check reports it.
        Err(TableError::TableDoesNotExist(_)) => return Ok(false),
        Err(e) => return Err(StorageError::redb(ctx, e).into()),
    };
    let value = meta
        .get(META_CLOSED_CLEAN)
        .map_err(|e| StorageError::redb(ctx, e))?;
    Ok(value.is_some_and(|v| v.value() == 1))
}

/// Removes the mark in `txn` and returns whether it was there.
pub(crate) fn take(txn: &WriteTransaction) -> Result<bool, StorageError> {
    let ctx = "clearing the clean-close mark";
    let mut meta = txn
        .open_table(META)
        .map_err(|e| StorageError::redb(ctx, e))?;
    let removed = meta
        .remove(META_CLOSED_CLEAN)
        .map_err(|e| StorageError::redb(ctx, e))?;
    Ok(removed.is_some_and(|v| v.value() == 1))
}

/// Writes the mark in `txn` (a new store, which has logged nothing).
pub(crate) fn mark(txn: &WriteTransaction) -> Result<(), StorageError> {
    let ctx = "writing the clean-close mark";
    let mut meta = txn
        .open_table(META)
        .map_err(|e| StorageError::redb(ctx, e))?;
    meta.insert(META_CLOSED_CLEAN, 1)
        .map_err(|e| StorageError::redb(ctx, e))?;
    Ok(())
}

/// Cuts the log of the cleanly closed store in `db` (identity `store_id`) at `log_path` to its
/// identity block, and moves the place of the next frame back to right after it, so that an
/// archived store does not carry a log as long as its checkpoint region. A cleanly closed
/// store's log holds nothing the store needs: its last checkpoint holds every frame, and the
/// frames left are under older salts (see [`crate::log::wal`]).
///
/// The new place is durable before the log is cut, so a crash in between leaves old frames
/// that no salt recorded matches. A log is left alone when the store was not closed cleanly
/// (its next open replays it), or when it is missing or not the store's own. Returns the
/// log's length after, `None` when it was left alone.
pub(crate) fn shrink_log(
    db: &Database,
    store_id: u64,
    log_path: &Path,
) -> Result<Option<u64>, OpenError> {
    if !recorded(db)? {
        return Ok(None);
    }
    let io = |what: &str, e| StorageError::io(format!("{what} log {}", log_path.display()), e);
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(log_path)
    {
        Ok(file) => OsFile(file),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("opening", e).into()),
    };
    if identity::read(&file, store_id).map_err(|e| io("reading the identity of", e))?
        != Identity::Ours
    {
        return Ok(None);
    }
    let ctx = "moving the log's first frame back to its start";
    let txn = db.begin_write().map_err(|e| StorageError::redb(ctx, e))?;
    {
        let mut meta = txn
            .open_table(META)
            .map_err(|e| StorageError::redb(ctx, e))?;
        for key in [META_LOG_START, META_LOG_LEN] {
            meta.insert(key, LOG_HEADER_LEN)
                .map_err(|e| StorageError::redb(ctx, e))?;
        }
    }
    txn.commit().map_err(|e| StorageError::redb(ctx, e))?;
    file.0
        .set_len(LOG_HEADER_LEN)
        .and_then(|()| file.0.sync_all())
        .map_err(|e| io("shortening", e))?;
    Ok(Some(LOG_HEADER_LEN))
}
