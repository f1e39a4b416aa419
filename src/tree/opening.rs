//! What an open reads of a store's tables before anything else: its identity, and its
//! expiry windows with their filters (converting a store of the earlier format first, or, for
//! a read-only inspection, writing nothing).

use redb::{Database, ReadableDatabase, ReadableTable, Table, TableError, WriteTransaction};

use super::tables::*;
use super::windows::{
    table_name, FilterSeed, RecordsDef, Windows, FILTERS, FILTER_HASH, RECORDS_PREFIX,
};
use crate::error::StorageError;

/// The windows of the store in `db`, as its tables hold them, with every window's filter
/// ([`Windows::load`]).
///
/// A store of format [`CONVERTED_FORMAT`] (windows of one width, the meta key `window_ms`) is
/// converted first, in one durable commit before anything is read ([`convert_windows`]). The saved filters are read only when the meta table
/// names the hash this build writes them with ([`FILTER_HASH`]) and its seed. Otherwise (a
/// store of the format as first released, whose rows came from foldhash, or one written with
/// another hash), and when the filters table cannot be opened (of another type), the store gets
/// a new random seed and the identity, and its saved filters are deleted, in one durable commit
/// before anything is read: every window's filter is then built from its keys, and saved by the
/// next durable commit.
pub(crate) fn open_windows(db: &Database) -> Result<Windows, StorageError> {
    let ctx = "reading the store's windows";
    let mut txn = db.begin_write().map_err(|e| StorageError::redb(ctx, e))?;
    txn.set_quick_repair(true);
    let (convert, known, mut changed) = {
        let mut meta = txn
            .open_table(META)
            .map_err(|e| StorageError::redb(ctx, e))?;
        let read = |name: &str| -> Result<Option<u64>, StorageError> {
            let value = meta.get(name).map_err(|e| StorageError::redb(ctx, e))?;
            Ok(value.map(|v| v.value()))
        };
        // A store of the earlier format: its records are moved to this format's windows.
        let convert = read(META_FORMAT)? == Some(CONVERTED_FORMAT);
        match saved_seed(read)? {
            Some(seed) => (convert, seed, false),
            None => {
                let seed = write_filter_hash(&mut meta, ctx)?;
                (convert, seed, true)
            }
        }
    };
    if convert {
        convert_windows(&txn)?;
        changed = true;
    }
    // The saved filters are a cache of the windows' keys: a table of rows this build cannot
    // trust, or cannot open (of another type), goes, and every window's filter is built. A
    // page that fails its checksum is the file's damage, reported as such.
    let unreadable = match txn.open_table(FILTERS) {
        Ok(_) => false,
        Err(TableError::Storage(e)) => return Err(StorageError::redb(ctx, e)),
        Err(_) => true,
    };
    if changed || unreadable {
        txn.delete_table(FILTERS)
            .map_err(|e| StorageError::redb(ctx, e))?;
        txn.open_table(FILTERS)
            .map_err(|e| StorageError::redb(ctx, e))?;
        changed = true;
    }
    if changed {
        txn.commit().map_err(|e| StorageError::redb(ctx, e))?;
    } else {
        txn.abort().map_err(|e| StorageError::redb(ctx, e))?;
    }
    Windows::load(db, known, true)
}

/// The filters' seed the meta table names (through `read`, a meta key's value), when it also
/// names the hash this build writes them with ([`FILTER_HASH`]).
fn saved_seed(
    read: impl Fn(&str) -> Result<Option<u64>, StorageError>,
) -> Result<Option<FilterSeed>, StorageError> {
    Ok(
        match (
            read(META_FILTER_HASH)?,
            read(META_FILTER_SEED[0])?,
            read(META_FILTER_SEED[1])?,
        ) {
            (Some(FILTER_HASH), Some(k0), Some(k1)) => Some(FilterSeed(k0, k1)),
            _ => None,
        },
    )
}

/// The windows of the closed store in `db` for reading only, writing nothing: with the saved
/// filters when the meta table names this build's hash ([`FILTER_HASH`]) and its seed, else
/// with every window's filter built from its keys in memory. `None` for a store of format
/// [`CONVERTED_FORMAT`], whose windows only a writable open converts.
pub(crate) fn read_windows(db: &impl ReadableDatabase) -> Result<Option<Windows>, StorageError> {
    let ctx = "reading the store's windows";
    let txn = db.begin_read().map_err(|e| StorageError::redb(ctx, e))?;
    let meta = txn
        .open_table(META)
        .map_err(|e| StorageError::redb(ctx, e))?;
    let read = |name: &str| -> Result<Option<u64>, StorageError> {
        let value = meta.get(name).map_err(|e| StorageError::redb(ctx, e))?;
        Ok(value.map(|v| v.value()))
    };
    if read(META_FORMAT)? == Some(CONVERTED_FORMAT) {
        return Ok(None);
    }
    let seed = saved_seed(read)?;
    drop(meta);
    drop(txn);
    let trusted = seed.is_some();
    Windows::load(db, seed.unwrap_or(FilterSeed(0, 0)), trusted).map(Some)
}

/// Converts a store of format [`CONVERTED_FORMAT`], whose windows were all one width (table
/// `idemstore.records.<n>` holding expiries `n * window_ms` to `(n + 1) * window_ms - 1`), to
/// this format in `txn`: every record (read into memory: stores of that format were
/// development stores) moves to the window [`Windows::place`] gives it, each old table is deleted, `window_ms` is removed and the format set to
/// [`FORMAT_VERSION`]. A record that does not decode is refused by name: its window is unknown.
fn convert_windows(txn: &WriteTransaction) -> Result<(), StorageError> {
    let ctx = "converting the store's windows";
    let names: Vec<String> = txn
        .list_tables()
        .map_err(|e| StorageError::redb(ctx, e))?
        .map(|handle| redb::TableHandle::name(&handle).to_string())
        .filter(|name| name.starts_with(RECORDS_PREFIX))
        .collect();
    let placing = Windows::new();
    let mut moved: Vec<(u64, Vec<u8>, Vec<u8>)> = Vec::new();
    for name in &names {
        let table = txn
            .open_table(RecordsDef::new(name))
            .map_err(|e| StorageError::redb(ctx, e))?;
        for entry in table.iter().map_err(|e| StorageError::redb(ctx, e))? {
            let (key, value) = entry.map_err(|e| StorageError::redb(ctx, e))?;
            let record = decode_record(key.value(), value.value())?;
            let (window, _) = placing.place(record.expires_at, written_at(&record));
            moved.push((window, key.value().to_vec(), value.value().to_vec()));
        }
    }
    for name in &names {
        txn.delete_table(RecordsDef::new(name))
            .map_err(|e| StorageError::redb(ctx, e))?;
    }
    for (window, key, value) in moved {
        txn.open_table(RecordsDef::new(&table_name(window)))
            .map_err(|e| StorageError::redb(ctx, e))?
            .insert(key.as_slice(), value.as_slice())
            .map_err(|e| StorageError::redb(ctx, e))?;
    }
    let mut meta = txn
        .open_table(META)
        .map_err(|e| StorageError::redb(ctx, e))?;
    meta.remove(META_WINDOW_MS)
        .map_err(|e| StorageError::redb(ctx, e))?;
    meta.insert(META_FORMAT, FORMAT_VERSION)
        .map_err(|e| StorageError::redb(ctx, e))?;
    Ok(())
}

/// The random identity of the store in `db`, made at creation; the log carries it. Read from
/// the meta table alone, before [`open_windows`] has checked the other tables.
pub(crate) fn store_id(db: &Database) -> Result<u64, StorageError> {
    let ctx = "reading the store's identity";
    let txn = db.begin_read().map_err(|e| StorageError::redb(ctx, e))?;
    let meta = txn
        .open_table(META)
        .map_err(|e| StorageError::redb(ctx, e))?;
    let value = meta
        .get(META_STORE_ID)
        .map_err(|e| StorageError::redb(ctx, e))?;
    value
        .map(|v| v.value())
        .ok_or_else(|| StorageError::Corruption {
            location: "table idemstore.meta".into(),
            reason: "the store's identity is missing".into(),
        })
}

/// Writes the filters' hash identity ([`FILTER_HASH`]) and a new random seed into `meta`.
pub(super) fn write_filter_hash(
    meta: &mut Table<'_, &'static str, u64>,
    ctx: &'static str,
) -> Result<FilterSeed, StorageError> {
    let seed = FilterSeed(new_salt(), new_salt());
    for (name, value) in [
        (META_FILTER_HASH, FILTER_HASH),
        (META_FILTER_SEED[0], seed.0),
        (META_FILTER_SEED[1], seed.1),
    ] {
        meta.insert(name, value)
            .map_err(|e| StorageError::redb(ctx, e))?;
    }
    Ok(seed)
}
