//! Refusing to open a store that crashed and lost its log.
//!
//! A store that was not closed cleanly holds, in its log (`PATH.wal`), every operation
//! acknowledged since its last checkpoint; the store file alone does not. So such a store
//! refuses to open ([`OpenError::LostLog`]) when its log is:
//! - missing, or empty (a backup that copied only the store file, a cleanup script);
//! - shorter than it was when the store last opened (truncated: the log never shrinks, and
//!   each open records its length in `idemstore.meta` under `"log_len"`);
//! - another store's log (it would be set aside after a clean close; here it is refused, so
//!   that the store's own log can be put back).
//!
//! A new store is created with the clean-close mark, since nothing was logged yet. An operator
//! who accepts the loss opens with [`Builder::accept_log_loss`](crate::Builder::accept_log_loss)
//! (or runs `idemstore recover --accept-loss PATH`): the store then opens with what its file
//! holds, sets another store's log aside as usual, and starts a new log.

use std::path::Path;

use redb::{ReadableDatabase, TableError, WriteTransaction};

use crate::error::{OpenError, StorageError};
use crate::tree::META;

/// The meta key of the log's length when the store last opened.
pub(crate) const META_LOG_LEN: &str = "log_len";

/// The log's length recorded by the last open (0 when none was). Read by opens only.
pub(crate) fn recorded_len(db: &impl ReadableDatabase) -> Result<u64, OpenError> {
    let ctx = "reading the log's recorded length";
    let txn = db.begin_read().map_err(|e| StorageError::redb(ctx, e))?;
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        Err(TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(StorageError::redb(ctx, e).into()),
    };
    let value = meta
        .get(META_LOG_LEN)
        .map_err(|e| StorageError::redb(ctx, e))?;
    Ok(value.map_or(0, |v| v.value()))
}

/// Records the log's length in `txn`; returns whether it changed.
pub(crate) fn record_len(txn: &WriteTransaction, len: u64) -> Result<bool, StorageError> {
    let ctx = "recording the log's length";
    let mut meta = txn
        .open_table(META)
        .map_err(|e| StorageError::redb(ctx, e))?;
    let old = meta
        .insert(META_LOG_LEN, len)
        .map_err(|e| StorageError::redb(ctx, e))?;
    Ok(old.is_none_or(|v| v.value() != len))
}

/// The refusal for the store at `store` whose log at `log` is in the state `what`.
pub(crate) fn refuse(store: &Path, log: &Path, what: impl Into<String>) -> OpenError {
    OpenError::LostLog {
        store: store.to_path_buf(),
        log: log.to_path_buf(),
        reason: what.into(),
    }
}

/// The refusal for a log of `len` bytes that had `recorded` bytes when the store last opened.
pub(crate) fn truncated(store: &Path, log: &Path, len: u64, recorded: u64) -> OpenError {
    refuse(
        store,
        log,
        format!(
            "is {len} bytes, shorter than the {recorded} bytes it had when the store last opened (truncated)"
        ),
    )
}
