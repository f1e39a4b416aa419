//! Expiry: bounded, incremental deletion of expired records through the expiry index, and the
//! lookup of stale reservations through the lease index.
//!
//! Expired records already read as absent (see [`decide`](crate::decide)); sweeping only
//! reclaims their space, so it can run at any pace without changing any answer.

use redb::{ReadOnlyTable, ReadableTable};

use crate::error::Error;
use crate::format::tables::{decode_record, IndexEntries, Tables};
use crate::key::Key;
use crate::record::{Millis, Record, RecordClass};

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

/// Up to `limit` pending reservations whose lease ran out by `now` and that have not expired,
/// oldest lease first.
pub(crate) fn stale(
    records: &ReadOnlyTable<&'static [u8], &'static [u8]>,
    leases: &ReadOnlyTable<(u64, &'static [u8]), ()>,
    now: Millis,
    limit: usize,
) -> Result<Vec<(Key, Record)>, Error> {
    let ctx = "listing stale reservations";
    let mut found = Vec::new();
    for entry in leases
        .range(..(now.saturating_add(1), &[][..]))
        .map_err(|e| Error::storage(ctx, e))?
    {
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
        if record.class(now) == RecordClass::Stale {
            found.push((key, record));
        }
    }
    Ok(found)
}
