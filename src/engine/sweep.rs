//! Expiry: bounded, incremental deletion of expired records through the deadline index (the
//! slice size, the writer's unlogged sweep transaction, the walk of the index), and the lookup
//! of stale reservations through its lease entries.
//!
//! Expired records already read as absent (see [`decide`](crate::decide)); sweeping only
//! reclaims their space, so it can run at any pace without changing any answer.

use std::sync::Arc;

use redb::{ReadOnlyTable, ReadableTable};

use crate::engine::commit::{CommitKind, Writer};
use crate::engine::stats::Counter;
use crate::error::Error;
use crate::format::tables::{decode_record, IndexEntries, Tables, EXPIRY, LEASE};
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

/// Deletes up to `limit` records that expired at or before `now`, earliest expiry first;
/// returns their keys.
///
/// Two ranges of the deadline index hold them: the `EXPIRY` entries due at `now` (records that
/// are not pending), and, among the `LEASE` entries due at `now` (leases that ran out), the
/// pending records whose own expiry has passed too. Up to `limit` of each are read, merged by
/// expiry, and the first `limit` deleted. A stale reservation that has not expired yet is
/// passed over; at most `limit` lease entries are read per sweep, so expired reservations
/// behind more than `limit` unexpired stale ones wait until those expire (they read as absent
/// meanwhile). A corrupt record found this way is left in place (and its index entry dropped,
/// so sweeps do not stall on it); reading the key reports the corruption.
pub(crate) fn sweep_expired(
    tables: &mut Tables<'_>,
    now: Millis,
    limit: usize,
) -> Result<Vec<Key>, Error> {
    let ctx = "sweeping expired records";
    let mut due = Vec::new();
    for kind in [EXPIRY, LEASE] {
        let range = (kind, 0, &[][..])..(kind, now.saturating_add(1), &[][..]);
        let entries: Vec<(u64, Vec<u8>)> = tables
            .deadlines
            .range(range)
            .map_err(|e| Error::storage(ctx, e))?
            .take(limit)
            .map(|entry| entry.map(|(k, _)| (k.value().1, k.value().2.to_vec())))
            .collect::<Result<_, _>>()
            .map_err(|e| Error::storage(ctx, e))?;
        for (at, key) in entries {
            match tables.load(&key)? {
                Ok(Some(record)) if IndexEntries::of(&record).entry == Some((kind, at)) => {
                    if record.expires_at <= now {
                        due.push((record.expires_at, key, record));
                    }
                }
                _ => tables.drop_deadline_entry(kind, at, &key)?,
            }
        }
    }
    due.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let mut deleted = Vec::new();
    for (_, key, record) in due.into_iter().take(limit) {
        tables.delete(&key, Some(IndexEntries::of(&record)))?;
        deleted.extend(Key::decode(&key));
    }
    Ok(deleted)
}

/// Up to `limit` pending reservations that are stale at `now` under `floor` (their lease ran
/// out, or an earlier owner acquired them) and that have not expired, oldest lease first.
///
/// Reads the `LEASE` entries of the deadline index: without a floor only the leases that ran
/// out, with one the leases still running too, for those of an earlier owner. The cost grows
/// with the pending records, not with the store.
pub(crate) fn stale(
    records: &ReadOnlyTable<&'static [u8], &'static [u8]>,
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
    for entry in entries.map_err(|e| Error::storage(ctx, e))? {
        if found.len() >= limit {
            break;
        }
        let (index_key, _) = entry.map_err(|e| Error::storage(ctx, e))?;
        let key_bytes = index_key.value().2;
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
