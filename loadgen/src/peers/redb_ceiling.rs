//! `redb-ceiling` (asked for by name only): what redb alone takes to store what idemstore's
//! applier stores for a new key, with nothing else. The bound of any engine that keeps every
//! key in a redb B-tree, as idemstore does.
//!
//! Each new key costs one record insert (a value of a pending record's size in idemstore's
//! format, 70 bytes, holding the request's fingerprint) and one deadline index entry ((kind,
//! lease deadline, key) → ()), in the same two-table shape as idemstore's format. Nothing is
//! durable: one write transaction stays open across batches and is committed with
//! `Durability::None` every 100 ms (as idemstore's applier does), never synced. The page cache
//! is idemstore's default (64 MiB) for `redb-ceiling`, redb's own default (1 GiB, as the
//! `redb` peer runs) for `redb-ceiling-1g`. No log, no read before the insert
//! (`insert` returns what it replaced: that is the insert-if-absent), no answer to build.
//!
//! Only batches of new keys are meaningful here: a duplicate is detected by the insert and
//! then written back, which no real engine would do.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redb::{Database, Durability, TableDefinition, WriteTransaction};

use super::{context, BenchKey, BenchResult, Engine, Handle};

const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
const DEADLINES: TableDefinition<(u8, u64, &[u8]), ()> = TableDefinition::new("deadlines");

/// How long one write transaction stays open (idemstore's applier: `TXN_SPAN`).
const SPAN: Duration = Duration::from_millis(100);

/// The size of a pending record without a recovery point in idemstore's format.
const RECORD_LEN: usize = 70;

/// See the module docs; `MIB` is the page cache in MiB.
pub struct RedbCeilingWith<const MIB: usize>(Arc<Shared>);

/// The ceiling with idemstore's default page cache.
pub type RedbCeiling = RedbCeilingWith<64>;
/// The ceiling with redb's default page cache.
pub type RedbCeiling1g = RedbCeilingWith<1024>;

/// The database and the write transaction kept open across batches.
pub struct Shared {
    db: Database,
    open: Mutex<Option<(WriteTransaction, Instant)>>,
}

impl<const MIB: usize> Engine for RedbCeilingWith<MIB> {
    const NAME: &'static str = if MIB == 64 {
        "redb-ceiling"
    } else {
        "redb-ceiling-1g"
    };
    type Handle = CeilingHandle;

    fn open(dir: &Path) -> BenchResult<Self> {
        let db = Database::builder()
            .set_cache_size(MIB << 20)
            .create(dir.join("ceiling.redb"))
            .map_err(context("redb-ceiling: open"))?;
        Ok(RedbCeilingWith(Arc::new(Shared {
            db,
            open: Mutex::new(None),
        })))
    }

    fn handle(&self) -> BenchResult<CeilingHandle> {
        Ok(CeilingHandle(Arc::clone(&self.0)))
    }
}

/// A thread's handle: the shared database.
pub struct CeilingHandle(Arc<Shared>);

impl CeilingHandle {
    /// Stores each key (pending, or completed with `result`) and its deadline entry in the
    /// open transaction; returns how many were new.
    fn put(&mut self, keys: &[BenchKey], result: Option<&[u8]>) -> BenchResult<usize> {
        let mut open = self.0.open.lock().expect("no panic holds this lock");
        if open.is_none() {
            let mut txn = self
                .0
                .db
                .begin_write()
                .map_err(context("redb-ceiling: begin_write"))?;
            txn.set_durability(Durability::None)
                .map_err(context("redb-ceiling: set_durability"))?;
            *open = Some((txn, Instant::now()));
        }
        let (txn, since) = open.as_mut().expect("opened above");
        let mut new = 0;
        {
            let mut records = txn
                .open_table(RECORDS)
                .map_err(context("redb-ceiling: open_table"))?;
            let mut deadlines = txn
                .open_table(DEADLINES)
                .map_err(context("redb-ceiling: open_table"))?;
            let mut value = Vec::with_capacity(RECORD_LEN + 64);
            for key in keys {
                value.clear();
                value.extend_from_slice(&key.fingerprint());
                value.resize(RECORD_LEN, 1);
                if let Some(result) = result {
                    value.extend_from_slice(result);
                }
                let replaced = records
                    .insert(&key.flat()[..], &value[..])
                    .map_err(context("redb-ceiling: insert"))?
                    .map(|old| old.value().to_vec());
                match replaced {
                    None => {
                        new += 1;
                        let deadline = 1_000 + key.flat()[24] as u64;
                        deadlines
                            .insert((1, deadline, &key.flat()[..]), ())
                            .map_err(context("redb-ceiling: insert"))?;
                    }
                    Some(old) if result.is_none() => {
                        records
                            .insert(&key.flat()[..], &old[..])
                            .map_err(context("redb-ceiling: insert"))?;
                    }
                    Some(_) => {}
                }
            }
        }
        if since.elapsed() >= SPAN {
            let (txn, _) = open.take().expect("open");
            txn.commit().map_err(context("redb-ceiling: commit"))?;
        }
        Ok(new)
    }
}

impl Handle for CeilingHandle {
    type Lease = ();

    fn reserve(&mut self, key: &BenchKey) -> BenchResult<Option<()>> {
        Ok((self.put(std::slice::from_ref(key), None)? == 1).then_some(()))
    }

    fn complete(&mut self, key: &BenchKey, _lease: (), result: &[u8]) -> BenchResult<()> {
        self.put(std::slice::from_ref(key), Some(result)).map(drop)
    }

    fn reserve_many(&mut self, keys: &[BenchKey]) -> BenchResult<usize> {
        self.put(keys, None)
    }

    fn fill(&mut self, keys: &[BenchKey], result: &[u8]) -> BenchResult<()> {
        self.put(keys, Some(result)).map(drop)
    }
}
