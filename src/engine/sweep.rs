//! Expiry: bounded, incremental deletion of expired records through the expiry index (the
//! slice size, the writer's unlogged sweep transaction, the walk of the index), and the lookup
//! of stale reservations through the lease index.
//!
//! Expired records already read as absent (see [`decide`](crate::decide)); sweeping only
//! reclaims their space, so it can run at any pace without changing any answer.

use std::sync::Arc;

use redb::{ReadOnlyTable, ReadableTable};

use crate::engine::commit::{CommitKind, Writer};
use crate::engine::stats::Counter;
use crate::error::Error;
use crate::format::tables::{decode_record, IndexEntries, Tables};
use crate::key::Key;
use crate::record::{Millis, Record, RecordClass, TokenFloor};

/// The most expired records one background sweep slice deletes, in one short transaction that
/// holds the writer, so reserves queued behind it wait only briefly (the figures behind the
/// choice: BENCHMARKS.md, "Sweeping in slices").
pub const SWEEP_SLICE_RECORDS: usize = 200;

impl Writer {
    /// Deletes up to `limit` expired records in one unlogged transaction; returns how many.
    pub(crate) fn sweep(&mut self, limit: usize) -> Result<usize, Error> {
        let engine = Arc::clone(&self.engine);
        self.transact(CommitKind::Unlogged, |_, txn, now, written| {
            let mut tables = Tables::open(txn)?;
            let deleted = sweep_expired(&mut tables, now, limit)?;
            let count = deleted.len();
            engine.counters.add(Counter::Swept, count as u64);
            for key in deleted {
                Writer::deleted(written, key);
            }
            Ok(Ok(count))
        })
    }
}

/// Deletes up to `limit` records that expired at or before `now`; returns their keys.
///
/// A corrupt record found this way is left in place (and its index entry dropped, so sweeps do
/// not stall on it); reading the key reports the corruption.
pub(crate) fn sweep_expired(
    tables: &mut Tables<'_>,
    now: Millis,
    limit: usize,
) -> Result<Vec<Key>, Error> {
    let ctx = "sweeping expired records";
    let due: Vec<(u64, Vec<u8>)> = tables
        .expiry
        .range(..(now.saturating_add(1), &[][..]))
        .map_err(|e| Error::storage(ctx, e))?
        .take(limit)
        .map(|entry| entry.map(|(k, _)| (k.value().0, k.value().1.to_vec())))
        .collect::<Result<_, _>>()
        .map_err(|e| Error::storage(ctx, e))?;
    let mut deleted = Vec::new();
    for (deadline, key) in due {
        match tables.load(&key)? {
            Ok(Some(record)) if record.expires_at == deadline => {
                tables.delete(&key, Some(IndexEntries::of(&record)))?;
                deleted.extend(Key::decode(&key));
            }
            _ => tables.drop_expiry_entry(deadline, &key)?,
        }
    }
    Ok(deleted)
}

/// Up to `limit` pending reservations that are stale at `now` under `floor` (their lease ran
/// out, or an earlier owner acquired them) and that have not expired, oldest lease first.
///
/// Without a floor only the leases that ran out are read. With one, the leases still running
/// are read too, for those of an earlier owner: the cost grows with the pending records, not
/// with the store.
pub(crate) fn stale(
    records: &ReadOnlyTable<&'static [u8], &'static [u8]>,
    leases: &ReadOnlyTable<(u64, &'static [u8]), ()>,
    now: Millis,
    floor: TokenFloor,
    limit: usize,
) -> Result<Vec<(Key, Record)>, Error> {
    let ctx = "listing stale reservations";
    let mut found = Vec::new();
    let entries = if floor == TokenFloor::NONE {
        leases.range(..(now.saturating_add(1), &[][..]))
    } else {
        leases.range::<(u64, &[u8])>(..)
    };
    for entry in entries.map_err(|e| Error::storage(ctx, e))? {
        if found.len() >= limit {
            break;
        }
        let (index_key, _) = entry.map_err(|e| Error::storage(ctx, e))?;
        let key_bytes = index_key.value().1;
        let Some(bytes) = records.get(key_bytes).map_err(|e| Error::storage(ctx, e))? else {
            continue;
        };
        let record = decode_record(key_bytes, bytes.value())?;
        let key = Key::decode(key_bytes)
            .ok_or_else(|| Error::corrupt_record(key_bytes, "key does not decode"))?;
        if record.class(now, floor) == RecordClass::Stale {
            found.push((key, record));
        }
    }
    Ok(found)
}
