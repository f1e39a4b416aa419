//! fjall, the embedded LSM a Rust user would pick for write-heavy deduplication, as such a user
//! would write insert-if-absent on it: a point read answers duplicates, and a new key is
//! inserted and made durable with `persist(PersistMode::SyncData)` (one per reserve, one per
//! batch in `reserve_many`).

use std::path::Path;
use std::sync::Arc;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use parking_lot::Mutex;

use super::{context, BenchKey, BenchResult, Engine, Handle};

const PENDING: u8 = 0;
const COMPLETED: u8 = 1;

/// fjall with one keyspace of key -> fingerprint (32 bytes), state, result. A plain fjall
/// keyspace has no insert-if-absent, so a mutex makes the read-then-insert atomic (held for
/// the read and the in-memory insert only); the journal sync (`persist`) runs outside it, so
/// concurrent callers' syncs can overlap.
pub struct Fjall(Arc<Shared>);

pub struct Shared {
    db: Database,
    keys: Keyspace,
    insert: Mutex<()>,
}

impl Engine for Fjall {
    const NAME: &'static str = "fjall";
    const FILL_THREADS: usize = 1;
    type Handle = FjallHandle;

    fn open(dir: &Path) -> BenchResult<Self> {
        let db = Database::builder(dir.join("fjall"))
            .open()
            .map_err(context("fjall: open"))?;
        let keys = db
            .keyspace("reservations", KeyspaceCreateOptions::default)
            .map_err(context("fjall: keyspace"))?;
        Ok(Fjall(Arc::new(Shared {
            db,
            keys,
            insert: Mutex::new(()),
        })))
    }

    fn handle(&self) -> BenchResult<FjallHandle> {
        Ok(FjallHandle(Arc::clone(&self.0)))
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
        Err(format!("fjall: {key} is stored with another fingerprint").into())
    }
}

/// A thread's handle: the shared database.
pub struct FjallHandle(Arc<Shared>);

impl FjallHandle {
    /// Inserts `key` as pending unless present (not yet durable); whether it was new.
    fn insert_if_absent(&self, key: &BenchKey) -> BenchResult<bool> {
        let shared = &*self.0;
        let _one = shared.insert.lock();
        if let Some(stored) = shared
            .keys
            .get(&key.flat()[..])
            .map_err(context("fjall: get"))?
        {
            check_fingerprint(key, &stored)?;
            return Ok(false);
        }
        shared
            .keys
            .insert(&key.flat()[..], value(key, PENDING, &[]))
            .map_err(context("fjall: insert"))?;
        Ok(true)
    }

    fn persist(&self) -> BenchResult<()> {
        self.0
            .db
            .persist(PersistMode::SyncData)
            .map_err(context("fjall: persist"))
    }
}

impl Handle for FjallHandle {
    type Lease = ();

    fn reserve(&mut self, key: &BenchKey) -> BenchResult<Option<()>> {
        if !self.insert_if_absent(key)? {
            return Ok(None);
        }
        self.persist()?;
        Ok(Some(()))
    }

    fn complete(&mut self, key: &BenchKey, _lease: (), result: &[u8]) -> BenchResult<()> {
        self.0
            .keys
            .insert(&key.flat()[..], value(key, COMPLETED, result))
            .map_err(context("fjall: insert"))?;
        self.persist()
    }

    fn reserve_many(&mut self, keys: &[BenchKey]) -> BenchResult<usize> {
        let mut new = 0;
        for key in keys {
            new += usize::from(self.insert_if_absent(key)?);
        }
        if new > 0 {
            self.persist()?;
        }
        Ok(new)
    }

    fn fill(&mut self, keys: &[BenchKey], result: &[u8]) -> BenchResult<()> {
        for key in keys {
            self.0
                .keys
                .insert(&key.flat()[..], value(key, COMPLETED, result))
                .map_err(context("fjall: insert"))?;
        }
        self.persist()
    }
}
