//! Expiry: whole windows of expired records deleted at once (the background sweeper, and the
//! applier when its transaction commits), the per-record sweep [`Store::sweep`](crate::Store::sweep)
//! asks for, and the lookup of stale reservations through the lease index.
//!
//! Expired records already read as absent (see [`decide`](crate::decide)); sweeping only
//! reclaims their space, so it can run at any pace without changing any answer.

use std::sync::Arc;

use redb::{ReadOnlyTable, ReadableTable, ReadableTableMetadata};

use crate::commit::{CommitKind, Writer};
use crate::error::{Error, StorageError};
use crate::key::Key;
use crate::record::{Millis, Record, RecordClass, TokenFloor};
use crate::state::{Counter, Engine};
use crate::tree::{decode_record, IndexEntries, Tables, LEASE};
use crate::tree::{span, Records, Windows};

impl Writer {
    /// Deletes up to `limit` expired records in one unlogged transaction, earliest expiry
    /// first; returns how many.
    pub(crate) fn sweep(&mut self, limit: usize) -> Result<usize, Error> {
        let engine = Arc::clone(&self.engine);
        self.transact(CommitKind::Unlogged, |_, txn, now, written| {
            let mut tables = Tables::open(txn, &engine.windows)?;
            let deleted = sweep_expired(&mut tables, now, limit)?;
            let count = deleted.len();
            engine.counters.add(Counter::Swept, count as u64);
            for key in deleted {
                Writer::deleted(written, key);
            }
            Ok(Ok(count))
        })
    }

    /// Deletes every window that has ended, in one unlogged transaction; returns how many
    /// records they held. (The background sweeper's work on a store whose applier holds no
    /// transaction: the applier deletes them itself when it commits one.)
    pub(crate) fn drop_ended_windows(&mut self) -> Result<u64, Error> {
        let engine = Arc::clone(&self.engine);
        self.transact(CommitKind::Unlogged, |_, txn, now, _| {
            let (windows, held) = Tables::open(txn, &engine.windows)?.drop_ended_windows(now)?;
            engine.counters.add(Counter::WindowsDeleted, windows);
            engine.counters.add(Counter::Swept, held);
            if windows > 0 {
                forget_ended_windows(&engine, now);
            }
            Ok(Ok(held))
        })
    }
}

/// After the windows that ended at `now` were deleted (in the transaction that deletes them):
/// their records leave the record cache, the one in-memory copy that outlives a redb commit.
/// (The overlay's entries and the writer's own move to the cache after the commit, which
/// refuses them from now on.)
pub(crate) fn forget_ended_windows(engine: &Engine, now: Millis) {
    // Every record of an ended window expired before `now`, and so does every record the cache
    // drops with them: an expired record reads as absent, cached or not.
    engine.cache.forget_expiring_before(now);
}

/// Deletes up to `limit` records that expired at or before `now`, earliest expiry first;
/// returns their keys.
///
/// The windows that start at or before `now` are read the earliest to end first: a window that
/// has ended holds only expired records, any other its expired records are found by reading its
/// table. When all of them fit in `limit`, every ended window goes whole (one table deletion
/// each) and the other expired records one by one; otherwise the ended windows' records are
/// read too, and the `limit` earliest of all, by (expiry, key), are deleted one by one (windows
/// of different widths nest, so one window's records are not all earlier than the next
/// one's). A window that starts after `now` holds nothing expired. A corrupt record in a window
/// that has not ended is left in place; reading its key reports the corruption.
pub(crate) fn sweep_expired(
    tables: &mut Tables<'_>,
    now: Millis,
    limit: usize,
) -> Result<Vec<Key>, Error> {
    let ctx = "sweeping expired records";
    let windows = tables.windows();
    let mut ended: Vec<(u64, u64)> = Vec::new();
    let mut due: Vec<(Millis, Vec<u8>, Record)> = Vec::new();
    for (window, _) in windows.list() {
        if span(window).is_none_or(|(start, _)| start > now) {
            continue;
        }
        let table = tables.window(window)?;
        if Windows::end(window) <= now {
            ended.push((window, table.len().map_err(|e| StorageError::redb(ctx, e))?));
            continue;
        }
        due.extend(expired_in(table, now)?);
    }
    let in_ended: u64 = ended.iter().map(|(_, held)| held).sum();
    let mut deleted = Vec::new();
    if in_ended.saturating_add(due.len() as u64) <= limit as u64 {
        for (window, _) in ended {
            let table = tables.window(window)?;
            for entry in table.iter().map_err(|e| StorageError::redb(ctx, e))? {
                let (key, _) = entry.map_err(|e| StorageError::redb(ctx, e))?;
                deleted.extend(Key::decode(key.value()));
            }
            tables.drop_window(window)?;
        }
    } else {
        for (window, _) in ended {
            due.extend(expired_in(tables.window(window)?, now)?);
        }
        due.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        due.truncate(limit);
    }
    for (_, key, record) in due {
        tables.delete(&key, Some(IndexEntries::of(&record)))?;
        deleted.extend(Key::decode(&key));
    }
    Ok(deleted)
}

/// The records of `table` that expired at or before `now`: (expiry, key, record). Records that
/// do not decode are left out.
fn expired_in(
    table: &redb::Table<'_, &'static [u8], &'static [u8]>,
    now: Millis,
) -> Result<Vec<(Millis, Vec<u8>, Record)>, Error> {
    let ctx = "sweeping expired records";
    let mut due = Vec::new();
    for entry in table.iter().map_err(|e| StorageError::redb(ctx, e))? {
        let (key, value) = entry.map_err(|e| StorageError::redb(ctx, e))?;
        let Ok(record) = decode_record(key.value(), value.value()) else {
            continue;
        };
        if record.expires_at <= now {
            due.push((record.expires_at, key.value().to_vec(), record));
        }
    }
    Ok(due)
}

/// Up to `limit` pending reservations that are stale at `now` under `floor` (their lease ran
/// out, or an earlier owner acquired them) and that have not expired, oldest lease first.
///
/// Reads the entries of the lease index: without a floor only the leases that ran
/// out, with one the leases still running too, for those of an earlier owner. The cost grows
/// with the pending records, not with the store.
pub(crate) fn stale(
    records: &Records,
    deadlines: &ReadOnlyTable<(u8, u64, &'static [u8]), ()>,
    now: Millis,
    floor: TokenFloor,
    limit: usize,
) -> Result<Vec<(Key, Record)>, Error> {
    let ctx = "listing stale reservations";
    let mut found = Vec::new();
    let end = if floor == TokenFloor::NONE {
        (LEASE, now.saturating_add(1), &[][..])
    } else {
        (LEASE + 1, 0, &[][..])
    };
    let entries = deadlines.range((LEASE, 0, &[][..])..end);
    for entry in entries.map_err(|e| StorageError::redb(ctx, e))? {
        if found.len() >= limit {
            break;
        }
        let (index_key, _) = entry.map_err(|e| StorageError::redb(ctx, e))?;
        let key_bytes = index_key.value().2;
        let Some(bytes) = records
            .get(key_bytes)
            .map_err(|e| StorageError::redb(ctx, e))?
        else {
            continue;
        };
        let record = decode_record(key_bytes, bytes.value())?;
        let key = Key::decode(key_bytes)
            .ok_or_else(|| StorageError::corrupt_record(key_bytes, "key does not decode"))?;
        if record.class(now, floor) == RecordClass::Stale {
            found.push((key, record));
        }
    }
    Ok(found)
}
