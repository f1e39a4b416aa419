//! Expiry: bounded, incremental deletion of expired records through the deadline index (the
//! slice size, the writer's unlogged sweep transaction, the walk of the index), and the lookup
//! of stale reservations through its lease entries.
//!
//! Expired records already read as absent (see [`decide`](crate::decide)); sweeping only
//! reclaims their space, so it can run at any pace without changing any answer.

use std::collections::BinaryHeap;
use std::ops::Bound;
use std::sync::Arc;

use redb::{Database, ReadOnlyTable, ReadableDatabase, ReadableTable};

use crate::engine::commit::{CommitKind, Writer};
use crate::engine::stats::Counter;
use crate::error::Error;
use crate::format::tables::{
    decode_record, IndexEntries, Tables, DEADLINES, EXPIRY, LEASE, RECORDS,
};
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

/// How many due lease entries [`may_find_expired`] reads before it answers "maybe".
const LEASES_CHECKED: usize = 256;

/// Whether a sweep at `now` may find something to delete, judged on redb's last commit through
/// a read transaction: a background sweep first commits the applier's transaction and holds
/// the writer meanwhile, which a sweep with nothing to delete need not. Errs on "yes": an
/// entry due in the expiry range; a due lease entry whose record expired, is gone or no longer
/// has that entry (a sweep drops such an entry); more due lease entries than
/// [`LEASES_CHECKED`] (stale reservations that have not expired); any error or panic (the
/// sweep then meets and reports it). Records changed since redb's last commit are judged by a
/// later sweep, as skipping a sweep changes no answer.
pub(crate) fn may_find_expired(db: &Database, now: Millis) -> bool {
    let check = || -> Result<bool, Box<dyn std::error::Error>> {
        let txn = db.begin_read()?;
        let records = txn.open_table(RECORDS)?;
        let deadlines = txn.open_table(DEADLINES)?;
        let due = |kind: u8| {
            deadlines.range::<(u8, u64, &[u8])>(
                (kind, 0, &[][..])..(kind, now.saturating_add(1), &[][..]),
            )
        };
        if due(EXPIRY)?.next().is_some() {
            return Ok(true);
        }
        for (n, entry) in due(LEASE)?.enumerate() {
            if n >= LEASES_CHECKED {
                return Ok(true);
            }
            let (index_key, _) = entry?;
            let (_, at, key) = index_key.value();
            let Some(bytes) = records.get(key)? else {
                return Ok(true);
            };
            let record = decode_record(key, bytes.value())?;
            if IndexEntries::of(&record).entry != Some((LEASE, at)) || record.expires_at <= now {
                return Ok(true);
            }
        }
        Ok(false)
    };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(check))
        .map_or(true, |checked| checked.unwrap_or(true))
}

/// Deletes up to `limit` records that expired at or before `now`, earliest expiry first;
/// returns their keys.
///
/// Two ranges of the deadline index hold them. The `EXPIRY` entries due at `now` (records that
/// are not pending) are in expiry order, so their first `limit` are read. The `LEASE` entries
/// due at `now` (leases that ran out) hold the pending records whose own expiry has passed
/// too; a pending record expires at its lease end plus its operation's retention, so these
/// are not in expiry order. They are read in lease order until the next lease ends after the
/// latest of the `limit` earliest expiries found (no record further on can expire before it),
/// passing over stale reservations that have not expired yet: at most the leases that ran out
/// within one retention. A corrupt record found this way is left in place (and its index entry
/// dropped, so sweeps do not stall on it); reading the key reports the corruption.
pub(crate) fn sweep_expired(
    tables: &mut Tables<'_>,
    now: Millis,
    limit: usize,
) -> Result<Vec<Key>, Error> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let mut found = Found {
        due: Vec::new(),
        earliest: BinaryHeap::with_capacity(limit + 1),
        limit,
    };
    for (at, key) in entries_after(tables, EXPIRY, None, now, limit)? {
        found.consider(tables, EXPIRY, at, &key, now)?;
    }
    let mut after: Option<(Millis, Vec<u8>)> = None;
    'leases: loop {
        let chunk = entries_after(tables, LEASE, after.as_ref(), now, limit.max(64))?;
        if chunk.is_empty() {
            break;
        }
        for (at, key) in chunk {
            if found.later_than_all(at) {
                break 'leases;
            }
            found.consider(tables, LEASE, at, &key, now)?;
            after = Some((at, key));
        }
    }
    let mut due = found.due;
    due.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let mut deleted = Vec::new();
    for (_, key, record) in due.into_iter().take(limit) {
        tables.delete(&key, Some(IndexEntries::of(&record)))?;
        deleted.extend(Key::decode(&key));
    }
    Ok(deleted)
}

/// Up to `n` entries of `kind` due at or before `now`, after the entry `after` (from the
/// first when `None`).
fn entries_after(
    tables: &Tables<'_>,
    kind: u8,
    after: Option<&(Millis, Vec<u8>)>,
    now: Millis,
    n: usize,
) -> Result<Vec<(Millis, Vec<u8>)>, Error> {
    let ctx = "sweeping expired records";
    let end = Bound::Excluded((kind, now.saturating_add(1), &[][..]));
    let start = match after {
        Some((at, key)) => Bound::Excluded((kind, *at, key.as_slice())),
        None => Bound::Included((kind, 0, &[][..])),
    };
    tables
        .deadlines
        .range::<(u8, u64, &[u8])>((start, end))
        .map_err(|e| Error::storage(ctx, e))?
        .take(n)
        .map(|entry| entry.map(|(k, _)| (k.value().1, k.value().2.to_vec())))
        .collect::<Result<_, _>>()
        .map_err(|e| Error::storage(ctx, e))
}

/// What a sweep has found so far: the expired records, and the `limit` earliest expiries
/// among them (a max-heap: its top is the latest of those).
struct Found {
    due: Vec<(Millis, Vec<u8>, Record)>,
    earliest: BinaryHeap<Millis>,
    limit: usize,
}

impl Found {
    /// Whether `limit` expired records are known that all expire at or before `at`.
    fn later_than_all(&self, at: Millis) -> bool {
        self.earliest.len() >= self.limit && self.earliest.peek().is_some_and(|&last| at > last)
    }

    /// Looks at the record the entry (`kind`, `at`, `key`) speaks for: kept if it expired at
    /// or before `now`; the entry dropped if its record no longer has it.
    fn consider(
        &mut self,
        tables: &mut Tables<'_>,
        kind: u8,
        at: Millis,
        key: &[u8],
        now: Millis,
    ) -> Result<(), Error> {
        match tables.load(key)? {
            Ok(Some(record)) if IndexEntries::of(&record).entry == Some((kind, at)) => {
                if record.expires_at <= now {
                    self.earliest.push(record.expires_at);
                    if self.earliest.len() > self.limit {
                        self.earliest.pop();
                    }
                    self.due.push((record.expires_at, key.to_vec(), record));
                }
            }
            _ => tables.drop_deadline_entry(kind, at, key)?,
        }
        Ok(())
    }
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
