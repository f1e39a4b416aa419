//! Applying logged batches to redb off the batch path.
//!
//! The log is what makes a batch durable, so its B-tree writes need not come before the
//! answer. The writer decides each batch against [`Deferring`]: the changes since the last
//! redb commit (its `latest` map), then the record cache, then the last committed redb state;
//! it appends the frame and queues the batch's changes here. The applier thread applies them,
//! in order, to the write transaction it keeps open; [`Writer::flush`](super::Writer::flush)
//! applies whatever is left, commits, and only then forgets `latest`. So the serial stage
//! before a sync is deciding and framing, and the three B-tree inserts per new key run on
//! another thread while callers wait for the sync.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use redb::{Database, ReadOnlyTable, ReadableDatabase, WriteTransaction};

use crate::engine::cache::RecordCache;
use crate::error::Error;
use crate::format::tables::{decode_record, IndexEntries, Tables, RECORDS};
use crate::key::Key;
use crate::record::Record;

use super::{Engine, Written};

/// Where an operation reads the state it is decided against and writes the new one: a write
/// transaction's tables directly ([`Tables`]), or the batch path's [`Deferring`].
pub(crate) trait Target {
    /// The record stored under `key`, expired or not; `Ok(Err(_))` is a corrupt record.
    fn load(&mut self, key: &Key) -> Result<Result<Option<Record>, Error>, Error>;
    /// [`load`](Target::load), given `seen`: the state the caller read in the current epoch,
    /// if any. Only a target that knows which keys changed within the epoch may use it.
    fn load_seen(
        &mut self,
        key: &Key,
        seen: Option<Option<Record>>,
    ) -> Result<Result<Option<Record>, Error>, Error> {
        let _ = seen;
        self.load(key)
    }
    /// Stores `record` (encoded as `encoded`) where `old` was indexed.
    fn put(
        &mut self,
        key: &Key,
        old: Option<IndexEntries>,
        record: &Record,
        encoded: &[u8],
    ) -> Result<(), Error>;
    /// Deletes `key`, indexed at `old`.
    fn delete(&mut self, key: &Key, old: Option<IndexEntries>) -> Result<(), Error>;
}

impl Target for Tables<'_> {
    fn load(&mut self, key: &Key) -> Result<Result<Option<Record>, Error>, Error> {
        Tables::load(self, key.encoded())
    }

    fn put(
        &mut self,
        key: &Key,
        old: Option<IndexEntries>,
        record: &Record,
        encoded: &[u8],
    ) -> Result<(), Error> {
        Tables::put(self, key.encoded(), old, record, encoded)
    }

    fn delete(&mut self, key: &Key, old: Option<IndexEntries>) -> Result<(), Error> {
        Tables::delete(self, key.encoded(), old)
    }
}

/// One change to apply: the key, where its old record was indexed, and the new record with
/// its index entries and encoding (`None`: a deletion).
struct Change {
    key: Key,
    old: Option<IndexEntries>,
    new: Option<(IndexEntries, Vec<u8>)>,
}

/// A logged batch's changes, with the frame that logged them and the token counter after it.
pub(super) struct DeferredBatch {
    changes: Vec<Change>,
    seq: u64,
    next_token: u64,
}

impl DeferredBatch {
    /// The changes of a batch logged as frame `seq`, taken from what the writer recorded
    /// (the encodings move here: the frame is written already).
    pub(super) fn logged(written: &mut [Written], seq: u64, next_token: u64) -> DeferredBatch {
        let changes = written
            .iter_mut()
            .map(|w| Change {
                key: w.key.clone(),
                old: w.old,
                new: w.record.as_ref().map(|record| {
                    let encoded = w.encoded.take().expect("a stored record is logged encoded");
                    (IndexEntries::of(record), encoded)
                }),
            })
            .collect();
        DeferredBatch {
            changes,
            seq,
            next_token,
        }
    }
}

/// The batch path's [`Target`]: reads the latest state (changes since the last redb commit,
/// then the cache, then committed redb) and keeps each change in `latest`; the applier gets
/// the changes from the writer's record of them ([`DeferredBatch::logged`]).
pub(super) struct Deferring<'w> {
    latest: &'w mut HashMap<Key, Option<Record>>,
    cache: &'w RecordCache,
    db: &'w Database,
    /// The committed records, opened on the first key neither in `latest` nor in the cache.
    committed: Option<ReadOnlyTable<&'static [u8], &'static [u8]>>,
}

impl<'w> Deferring<'w> {
    pub(super) fn new(
        latest: &'w mut HashMap<Key, Option<Record>>,
        cache: &'w RecordCache,
        db: &'w Database,
    ) -> Deferring<'w> {
        Deferring {
            latest,
            cache,
            db,
            committed: None,
        }
    }
}

impl Target for Deferring<'_> {
    /// Every change since the epoch began is in `latest`; any other key is as its caller saw
    /// it. So a new key is known absent without a second B-tree miss.
    fn load_seen(
        &mut self,
        key: &Key,
        seen: Option<Option<Record>>,
    ) -> Result<Result<Option<Record>, Error>, Error> {
        if let Some(state) = self.latest.get(key) {
            return Ok(Ok(state.clone()));
        }
        match seen {
            Some(state) => Ok(Ok(state)),
            None => self.load(key),
        }
    }

    fn load(&mut self, key: &Key) -> Result<Result<Option<Record>, Error>, Error> {
        if let Some(state) = self.latest.get(key) {
            return Ok(Ok(state.clone()));
        }
        if let Some(record) = self.cache.get(key) {
            return Ok(Ok(Some(record)));
        }
        let ctx = "reading a record";
        if self.committed.is_none() {
            let txn = self.db.begin_read().map_err(|e| Error::storage(ctx, e))?;
            let table = txn
                .open_table(RECORDS)
                .map_err(|e| Error::storage(ctx, e))?;
            self.committed = Some(table);
        }
        let table = self.committed.as_ref().expect("opened above");
        let value = table
            .get(key.encoded())
            .map_err(|e| Error::storage(ctx, e))?;
        Ok(value
            .map(|bytes| decode_record(key.encoded(), bytes.value()))
            .transpose())
    }

    fn put(
        &mut self,
        key: &Key,
        _old: Option<IndexEntries>,
        record: &Record,
        _encoded: &[u8],
    ) -> Result<(), Error> {
        self.latest.insert(key.clone(), Some(record.clone()));
        Ok(())
    }

    fn delete(&mut self, key: &Key, _old: Option<IndexEntries>) -> Result<(), Error> {
        self.latest.insert(key.clone(), None);
        Ok(())
    }
}

/// The changes of `batches` (in the order they were logged), one per key, in key order: a
/// key changed several times (a reserve and its completion, say) is written once, with its
/// last state, where its first change found it indexed. So each key is written at most once
/// per call, and the B-tree inserts walk the leaves in order.
fn merged(batches: Vec<DeferredBatch>) -> Vec<Change> {
    let mut changes: Vec<Change> = if batches.len() == 1 {
        batches.into_iter().next().expect("one batch").changes
    } else {
        batches.into_iter().flat_map(|b| b.changes).collect()
    };
    if changes.len() <= 1 {
        return changes;
    }
    // Stable: the changes of one key keep the order they were logged in.
    changes.sort_by(|a, b| a.key.cmp(&b.key));
    let mut out: Vec<Change> = Vec::with_capacity(changes.len());
    for change in changes {
        match out.last_mut() {
            Some(previous) if previous.key == change.key => previous.new = change.new,
            _ => out.push(change),
        }
    }
    out
}

/// The open write transaction, and when it was opened.
pub(super) type OpenTxn = Option<(WriteTransaction, Instant)>;

#[derive(Default)]
struct Queue {
    batches: Vec<DeferredBatch>,
    /// Changes in `batches`.
    changes: usize,
    shutdown: bool,
}

/// The most changes queued for the applier before the writer applies them itself: this
/// bounds the work a flush (every 100 ms, under the writer) may find left over when the
/// applier falls behind, such as under a stream of large `reserve_many` batches.
const MAX_QUEUED: usize = 4096;

/// Applies queued batches to the open write transaction, on its own thread.
pub(crate) struct Applier {
    engine: Arc<Engine>,
    /// Held while applying, committing, or reading when the transaction was opened. A batch is
    /// taken from `queue` only while holding it, so that a flush never misses one.
    pub(super) txn: Mutex<OpenTxn>,
    queue: Mutex<Queue>,
    more: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Applier {
    pub(super) fn new(engine: Arc<Engine>) -> Applier {
        Applier {
            engine,
            txn: Mutex::new(None),
            queue: Mutex::new(Queue::default()),
            more: Condvar::new(),
            thread: Mutex::new(None),
        }
    }

    /// Starts the applier thread. Without it every batch is applied by the next flush.
    pub(super) fn start(self: &Arc<Applier>) -> Result<(), Error> {
        let applier = Arc::clone(self);
        let thread = thread::Builder::new()
            .name("idemstore-applier".into())
            .spawn(move || applier.run())
            .map_err(|e| Error::io("starting the applier thread", e))?;
        *self.thread.lock() = Some(thread);
        Ok(())
    }

    /// Stops the applier thread (after the final flush has applied everything).
    pub(super) fn stop(&self) {
        self.queue.lock().shutdown = true;
        self.more.notify_one();
        let thread = self.thread.lock().take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }

    /// Queues a logged batch's changes for the applier thread. Returns whether the queue is
    /// full, in which case the caller applies it ([`apply_queued`](Applier::apply_queued)).
    pub(super) fn push(&self, batch: DeferredBatch) -> bool {
        let mut queue = self.queue.lock();
        queue.changes += batch.changes.len();
        queue.batches.push(batch);
        if queue.batches.len() == 1 {
            self.more.notify_one();
        }
        queue.changes > MAX_QUEUED
    }

    fn run(&self) {
        loop {
            {
                let mut queue = self.queue.lock();
                while queue.batches.is_empty() && !queue.shutdown {
                    self.more.wait(&mut queue);
                }
                if queue.shutdown {
                    return;
                }
            }
            let mut txn = self.txn.lock();
            if let Err(error) = self.apply_queued(&mut txn) {
                self.fail(&mut txn, &error);
            }
        }
    }

    /// Applies every queued batch to the open transaction (opening one if needed). The caller
    /// holds `txn`.
    pub(super) fn apply_queued(&self, txn: &mut OpenTxn) -> Result<(), Error> {
        let batches = {
            let mut queue = self.queue.lock();
            queue.changes = 0;
            std::mem::take(&mut queue.batches)
        };
        if batches.is_empty() {
            return Ok(());
        }
        self.engine.poison.check()?;
        if txn.is_none() {
            // Not while a checkpoint commits (`checkpoint.rs`); its failure poisons the store.
            self.engine.checkpoint.wait_idle();
            self.engine.poison.check()?;
            let ctx = "starting a write transaction";
            let mut opened = self
                .engine
                .db
                .begin_write()
                .map_err(|e| Error::storage(ctx, e))?;
            opened
                .set_durability(redb::Durability::None)
                .map_err(|e| Error::storage(ctx, e))?;
            *txn = Some((opened, Instant::now()));
        }
        let (open, _) = txn.as_ref().expect("opened above");
        let mut tables = Tables::open(open)?;
        let last = batches.last().map(|b| (b.seq, b.next_token));
        for change in merged(batches) {
            let key = change.key.encoded();
            match change.new {
                Some((index, encoded)) => tables.put_indexed(key, change.old, index, &encoded)?,
                None => tables.delete(key, change.old)?,
            }
        }
        if let Some((seq, next_token)) = last {
            tables.set_wal_seq(seq)?;
            tables.set_next_token(next_token)?;
        }
        Ok(())
    }

    /// A failed apply poisons the store: the open transaction and everything read ahead of
    /// redb are dropped, and every later call is refused until the store is reopened (which
    /// replays the log).
    pub(super) fn fail(&self, txn: &mut OpenTxn, error: &Error) {
        self.engine.poison.set(error);
        *txn = None;
        let mut queue = self.queue.lock();
        queue.batches.clear();
        queue.changes = 0;
        self.engine.overlay.clear();
        self.engine.cache.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> Key {
        Key::new("t", "op", id).unwrap()
    }

    fn index(at: u64) -> IndexEntries {
        IndexEntries::expiring_at(at)
    }

    fn change(id: &str, old: Option<u64>, new: Option<u64>) -> Change {
        Change {
            key: key(id),
            old: old.map(index),
            new: new.map(|at| (index(at), at.to_le_bytes().to_vec())),
        }
    }

    fn batch(seq: u64, changes: Vec<Change>) -> DeferredBatch {
        DeferredBatch {
            changes,
            seq,
            next_token: seq,
        }
    }

    /// A key changed in several queued batches (a reserve, then its completion, then another
    /// change) is written once: its last state, unindexed where its first change found it.
    /// Keys come out in key order, each once.
    #[test]
    fn each_key_is_written_once_with_its_last_state_where_it_was_first_indexed() {
        let merged = merged(vec![
            batch(
                1,
                vec![change("b", None, Some(10)), change("a", Some(5), Some(11))],
            ),
            batch(2, vec![change("b", Some(10), Some(20))]),
            batch(
                3,
                vec![change("c", None, Some(30)), change("b", Some(20), None)],
            ),
        ]);
        let got: Vec<(Key, Option<IndexEntries>, Option<IndexEntries>)> = merged
            .into_iter()
            .map(|c| (c.key, c.old, c.new.map(|(index, _)| index)))
            .collect();
        assert_eq!(
            got,
            vec![
                (key("a"), Some(index(5)), Some(index(11))),
                (key("b"), None, None),
                (key("c"), None, Some(index(30))),
            ]
        );
    }
}
