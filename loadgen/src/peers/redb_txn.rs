//! Plain redb, as a user would write insert-if-absent on it: a read transaction answers
//! duplicates, and a new key takes one durable write transaction (or one per batch).

use std::path::Path;
use std::sync::Arc;

use idemstore::redb::{
    self, Database, Durability, ReadableDatabase, ReadableTable, TableDefinition,
};

use super::{context, BenchError, BenchKey, BenchResult, Engine, Handle};

/// key -> fingerprint (32 bytes), state (0 pending, 1 completed), result.
const RESERVATIONS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("reservations");

const PENDING: u8 = 0;
const COMPLETED: u8 = 1;

/// redb (the version idemstore is built on, through its `idemstore::redb` re-export) with one
/// `Durability::Immediate` write transaction per reserve or completion, or per batch in
/// `reserve_many` (after one read transaction that answers the keys already stored).
pub struct RedbTxn(Arc<Database>);

fn err(what: &'static str) -> impl FnOnce(redb::Error) -> BenchError {
    context(what)
}

impl Engine for RedbTxn {
    const NAME: &'static str = "redb";
    type Handle = RedbHandle;

    fn open(dir: &Path) -> BenchResult<Self> {
        let db = Database::create(dir.join("reservations.redb")).map_err(context("redb: open"))?;
        let txn = db.begin_write().map_err(context("redb: open"))?;
        txn.open_table(RESERVATIONS)
            .map_err(context("redb: create table"))?;
        txn.commit().map_err(context("redb: open"))?;
        Ok(RedbTxn(Arc::new(db)))
    }

    fn handle(&self) -> BenchResult<RedbHandle> {
        Ok(RedbHandle(Arc::clone(&self.0)))
    }
}

fn value(key: &BenchKey, state: u8, result: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(33 + result.len());
    value.extend_from_slice(&key.fingerprint());
    value.push(state);
    value.extend_from_slice(result);
    value
}

fn check_fingerprint(key: &BenchKey, stored: &[u8]) -> BenchResult<()> {
    if stored.get(..32) == Some(&key.fingerprint()[..]) {
        Ok(())
    } else {
        Err(format!("redb: {key} is stored with another fingerprint").into())
    }
}

/// Runs `f` in one durable write transaction and commits it.
fn write<T>(
    db: &Database,
    f: impl FnOnce(&mut redb::Table<&[u8], &[u8]>) -> Result<T, redb::Error>,
) -> BenchResult<T> {
    let mut txn = db.begin_write().map_err(context("redb: begin_write"))?;
    txn.set_durability(Durability::Immediate)
        .map_err(context("redb: set_durability"))?;
    let out = {
        let mut table = txn
            .open_table(RESERVATIONS)
            .map_err(context("redb: open_table"))?;
        f(&mut table).map_err(err("redb: write"))?
    };
    txn.commit().map_err(context("redb: commit"))?;
    Ok(out)
}

/// Inserts `key` as pending unless present; whether it was new.
fn insert_if_absent(
    table: &mut redb::Table<&[u8], &[u8]>,
    key: &BenchKey,
) -> Result<bool, redb::Error> {
    if table.get(&key.flat()[..])?.is_some() {
        return Ok(false);
    }
    table.insert(&key.flat()[..], &value(key, PENDING, &[])[..])?;
    Ok(true)
}

/// A thread's handle: the shared database.
pub struct RedbHandle(Arc<Database>);

impl Handle for RedbHandle {
    type Lease = ();

    fn reserve(&mut self, key: &BenchKey) -> BenchResult<Option<()>> {
        // Duplicates are answered by a read transaction, which never waits for the writer.
        {
            let txn = self.0.begin_read().map_err(context("redb: begin_read"))?;
            let table = txn
                .open_table(RESERVATIONS)
                .map_err(context("redb: open_table"))?;
            if let Some(stored) = table.get(&key.flat()[..]).map_err(context("redb: get"))? {
                check_fingerprint(key, stored.value())?;
                return Ok(None);
            }
        }
        // Absent a moment ago: insert if still absent, in one durable write transaction.
        let new = write(&self.0, |table| insert_if_absent(table, key))?;
        Ok(new.then_some(()))
    }

    fn complete(&mut self, key: &BenchKey, _lease: (), result: &[u8]) -> BenchResult<()> {
        write(&self.0, |table| {
            table.insert(&key.flat()[..], &value(key, COMPLETED, result)[..])?;
            Ok(())
        })
    }

    fn reserve_many(&mut self, keys: &[BenchKey]) -> BenchResult<usize> {
        // One read transaction answers the keys already there (a batch of duplicates never
        // writes); one durable write transaction inserts the others.
        let mut absent = Vec::new();
        {
            let txn = self.0.begin_read().map_err(context("redb: begin_read"))?;
            let table = txn
                .open_table(RESERVATIONS)
                .map_err(context("redb: open_table"))?;
            for key in keys {
                match table.get(&key.flat()[..]).map_err(context("redb: get"))? {
                    Some(stored) => check_fingerprint(key, stored.value())?,
                    None => absent.push(key),
                }
            }
        }
        if absent.is_empty() {
            return Ok(0);
        }
        write(&self.0, |table| {
            let mut new = 0;
            for key in absent {
                new += usize::from(insert_if_absent(table, key)?);
            }
            Ok(new)
        })
    }

    fn fill(&mut self, keys: &[BenchKey], result: &[u8]) -> BenchResult<()> {
        write(&self.0, |table| {
            for key in keys {
                table.insert(&key.flat()[..], &value(key, COMPLETED, result)[..])?;
            }
            Ok(())
        })
    }
}
