//! The writer: decides a batch against the latest state and appends it to the log as one
//! frame; the applier (`apply.rs`) writes it into redb off this path.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use redb::WriteTransaction;

use crate::decide::{decide, with_token, Change, Operation};
use crate::error::{Error, StorageError};
use crate::key::Key;
use crate::log::Wal;
use crate::record::{Millis, Record};
use crate::state::Counter;
use crate::state::Durability;
use crate::state::Held;
use crate::tree::{IndexEntries, Tables};

use super::apply::{Applier, DeferredBatch, Queued, Written, SELF_APPLIED};
use super::request::Request;
use super::request::{CallerDecision, Decide, Known, Ops, Outcomes};
use super::syncer::PendingBatch;
use super::{Schedule, Syncer};
use crate::state::error_copy;
use crate::state::Engine;

/// The single writer: owns the database's write side, the log and the fencing-token counter.
pub(crate) struct Writer {
    /// The parts shared with the callers and the other threads.
    pub(crate) engine: Arc<Engine>,
    pub(super) wal: Wal,
    pub(super) syncer: Arc<Syncer>,
    /// Applies logged batches to the write transaction it keeps open across batches.
    pub(super) applier: Arc<Applier>,
    /// Every change no redb commit holds yet (applied to the open transaction or still
    /// queued for the applier), with its frame: what the next batch is decided against first.
    pub(super) latest: Latest,
    /// The last frame whose changes were forgotten from `latest` (a redb commit holds them).
    pub(super) drained: u64,
    /// When the first change since the last redb commit was logged (the transaction's age).
    pub(super) unflushed_since: Option<Instant>,
    pub(super) next_token: u64,
    pub(super) schedule: Schedule,
    pub(super) last_checkpoint: Instant,
    pub(super) last_sync: Instant,
    pub(super) last_sweep: Instant,
    /// The background checkpoint whose durable commit runs now, if any (`checkpoint.rs`).
    pub(super) checkpointing: Option<super::checkpoint::Running>,
    /// The requests of the batch being run, kept to answer them if it panics (a buffer reused
    /// from batch to batch).
    pub(super) in_batch: Vec<Arc<Request>>,
}

impl Writer {
    pub(crate) fn new(
        engine: Arc<Engine>,
        wal: Wal,
        next_token: u64,
        schedule: Schedule,
    ) -> Writer {
        let syncer = Arc::new(Syncer::new(&wal, Arc::clone(&engine)));
        engine.poison.set_replay(wal.unreplayed());
        let apply_unsynced = matches!(schedule.durability, Durability::Buffered { .. });
        let applier = Arc::new(Applier::new(
            Arc::clone(&engine),
            Arc::clone(&syncer),
            apply_unsynced,
            schedule.sweep_interval.is_some(),
        ));
        Writer {
            engine,
            wal,
            syncer,
            applier,
            latest: HashMap::new(),
            drained: 0,
            unflushed_since: None,
            next_token,
            schedule,
            last_checkpoint: Instant::now(),
            last_sync: Instant::now(),
            last_sweep: Instant::now(),
            checkpointing: None,
            in_batch: Vec::new(),
        }
    }

    /// Latches `error`: the store refuses all further work.
    pub(crate) fn fail(&mut self, error: Error) -> Error {
        self.applier.fail(&mut self.applier.txn.lock(), &error);
        self.latest.clear();
        self.engine.overlay.next_epoch();
        self.unflushed_since = None;
        self.engine.overlay.clear();
        self.engine.cache.clear();
        error
    }

    pub(super) fn begin(&self, durability: redb::Durability) -> Result<WriteTransaction, Error> {
        let ctx = "starting a write transaction";
        let mut txn = self
            .engine
            .db
            .begin_write()
            .map_err(|e| StorageError::redb(ctx, e))?;
        txn.set_durability(durability)
            .map_err(|e| StorageError::redb(ctx, e))?;
        // A durable commit (a checkpoint) also records redb's allocator state, so that opening
        // after a crash loads it instead of walking the whole file: one more sync per
        // checkpoint, and an open whose cost does not grow with the store.
        txn.set_quick_repair(matches!(durability, redb::Durability::Immediate));
        Ok(txn)
    }

    /// Decides and logs one batch; hands it to the syncer. Whoever ran it (a lone caller, or
    /// the committer thread) then drives its sync ([`Syncer::drive`]).
    pub(super) fn run_batch(&mut self, batch: Vec<Arc<Request>>) {
        if let Err(error) = self.engine.poison.check() {
            for request in &batch {
                request.fail(error_copy(&error));
            }
            return;
        }
        match self.decide_and_log(&batch) {
            Ok((ops, written, seq)) => {
                self.engine.counters.batch(ops as u64);
                let pending = PendingBatch {
                    seq,
                    requests: batch,
                    changes: written,
                };
                match self.schedule.durability {
                    Durability::Buffered { .. } => self.syncer.publish_unsynced(pending),
                    Durability::Immediate => self.syncer.push(pending),
                }
            }
            Err(error) => {
                let error = self.fail(error);
                for request in &batch {
                    request.fail(self.engine.poison.answer(&error));
                }
            }
        }
    }

    /// Decides every request (staging their outcomes) and logs the changes as one frame,
    /// queued for the applier; returns how many operations there were, the changes, and the
    /// sequence number of the frame that logged them (the last written frame when nothing
    /// changed).
    fn decide_and_log(
        &mut self,
        batch: &[Arc<Request>],
    ) -> Result<(usize, Vec<Written>, u64), Error> {
        let now = self.engine.now();
        self.drain_committed();
        let mut latest = std::mem::take(&mut self.latest);
        let engine = Arc::clone(&self.engine);
        let next_seq = self.wal.last_seq() + 1;
        let mut target = Deferring::new(&mut latest, next_seq, &engine);
        let result: Result<_, Error> = (|| {
            let mut ops = 0;
            let mut written = self.syncer.spare_changes();
            for request in batch {
                // The request is data: its operations come out, are decided here, and their
                // outcomes go back to wait for the sync.
                let Some(taken) = request.take() else {
                    continue;
                };
                let mut deciding = Deciding {
                    writer: self,
                    target: &mut target,
                    now,
                    written: &mut written,
                };
                let decided = taken.decide(&mut deciding)?;
                ops += decided.len();
                request.stage(decided);
            }
            Ok((ops, written))
        })();
        let logged = result.and_then(|(ops, written)| {
            if written.is_empty() {
                return Ok((ops, written, self.wal.last_seq(), None));
            }
            let entries = written
                .iter()
                .map(|w| (w.key.encoded(), w.record.as_deref()));
            let durable = self.syncer.synced_seq();
            self.wal.encode(self.next_token, durable, entries);
            if !self.wal.fits() {
                // The frame would reach the region a running checkpoint still needs: wait
                // for its commit (rare: the region left is as large as a checkpoint's worth).
                self.finish_checkpoint(true)?;
            }
            let seq = self.wal.write_encoded()?;
            self.engine.poison.set_replay(self.wal.unreplayed());
            debug_assert_eq!(
                seq, next_seq,
                "the changes were recorded under another frame"
            );
            let deferred = DeferredBatch::logged(&written, seq, self.next_token);
            Ok((ops, written, seq, Some(deferred)))
        });
        self.latest = latest;
        let (ops, written, seq, deferred) = logged?;
        if let Some(deferred) = deferred {
            self.unflushed_since.get_or_insert_with(Instant::now);
            let queued = self.applier.push(deferred);
            // The applier fell behind: apply a share of its queue here, so a flush never finds
            // much left. Not while a checkpoint commits (the applier's next transaction waits
            // for that commit, and so would the writer), nor while the applier merges windows
            // unless the queue is full.
            let share = match queued {
                Queued::Room => false,
                _ if self.checkpointing.is_some() => false,
                Queued::Over => !self.applier.merging(),
                Queued::Full => true,
            };
            if share {
                let mut txn = self.applier.txn.lock();
                self.applier.apply_some(&mut txn, SELF_APPLIED)?;
            }
        }
        Ok((ops, written, seq))
    }

    /// Decides one operation against `target` and writes the change there, recording it in
    /// `written`. The inner `Err` is an error for this operation alone (a corrupt record).
    pub(crate) fn decide_into<O: Operation>(
        &mut self,
        tables: &mut impl Target,
        key: &Key,
        op: O,
        now: Millis,
        written: &mut Vec<Written>,
    ) -> Result<Result<O::Outcome, Error>, Error> {
        self.decide_queued(tables, key.clone(), op, None, now, written)
    }

    /// [`decide_into`](Writer::decide_into) of a queued operation: `caller` is its caller's decision
    /// against the state it read in the current epoch (see [`Known`]), taken with this
    /// writer's token when the key has not changed since; otherwise the writer reads the key
    /// and decides.
    pub(super) fn decide_queued<O: Operation>(
        &mut self,
        tables: &mut impl Target,
        key: Key,
        op: O,
        caller: Option<CallerDecision<O>>,
        now: Millis,
        written: &mut Vec<Written>,
    ) -> Result<Result<O::Outcome, Error>, Error> {
        let (old_index, decision) = match caller.filter(|_| !tables.changed(&key)) {
            Some(caller) => (
                caller.old,
                with_token::<O>(caller.decision, self.next_token),
            ),
            None => {
                let old = match tables.load(&key)? {
                    Ok(old) => old,
                    Err(corrupt) => return Ok(Err(corrupt)),
                };
                let old_index = old.as_ref().map(IndexEntries::of);
                let policy = self.engine.policy.for_key(&key);
                (old_index, decide(old, op, now, policy, self.next_token))
            }
        };
        if decision.used_token {
            self.next_token += 1;
        }
        match decision.change {
            Change::Keep => {}
            Change::Put(record) => {
                let record = Arc::new(record);
                tables.put(&key, old_index, &record)?;
                written.push(Written {
                    key,
                    record: Some(record),
                    old: old_index,
                });
            }
            Change::Delete => {
                tables.delete(&key, old_index)?;
                written.push(Written {
                    key,
                    record: None,
                    old: old_index,
                });
            }
        }
        Ok(Ok(decision.outcome))
    }

    /// Records that `key` was deleted by a transaction (for the cache).
    pub(crate) fn deleted(written: &mut Vec<Written>, key: Key) {
        written.push(Written {
            key,
            record: None,
            old: None,
        });
    }

    /// Makes every written frame durable and answered, applies what the applier has not,
    /// commits the open transaction (non-durably), and moves the overlay into the cache.
    /// Waits first for a background checkpoint, if one runs.
    pub(crate) fn flush(&mut self) -> Result<(), Error> {
        self.engine.poison.check()?;
        self.finish_checkpoint(true)?;
        if let Err(error) = self.syncer.drive_all() {
            return Err(self.fail(error));
        }
        self.last_sync = Instant::now();
        let mut txn = self.applier.txn.lock();
        let applied = self.applier.apply_queued(&mut txn);
        let committed = applied.and_then(|()| match txn.take() {
            Some((open, _)) => open
                .commit()
                .map(|()| true)
                .map_err(|e| StorageError::redb("committing a write transaction", e).into()),
            None => Ok(false),
        });
        drop(txn);
        match committed {
            Ok(committed) => {
                if committed {
                    self.engine.counters.add(Counter::Commits, 1);
                }
                self.applier.committed_all();
                self.drained = self.applier.committed();
                self.latest.clear();
                // States read before this commit may predate changes `latest` no longer holds.
                self.engine.overlay.next_epoch();
                self.unflushed_since = None;
                self.engine.overlay.drain_into(&self.engine.cache);
                Ok(())
            }
            Err(error) => Err(self.fail(error)),
        }
    }

    /// Forgets the changes a redb commit of the applier's holds, keeping those of later
    /// frames, and ends the epoch; the applier then moves their overlay entries to the record
    /// cache. Cheap when there is nothing new: called before every batch.
    pub(super) fn drain_committed(&mut self) {
        let committed = self.applier.committed();
        if committed <= self.drained {
            return;
        }
        self.drained = committed;
        self.latest.retain(|_, (_, seq)| *seq > committed);
        // States read before now may predate changes `latest` no longer holds.
        self.engine.overlay.next_epoch();
        // After the epoch ended; moving them to the record cache is the applier's.
        self.applier.drain_overlay(committed);
        self.unflushed_since = if self.latest.is_empty() {
            None
        } else {
            Some(Instant::now())
        };
    }
}

/// The writer deciding the operations of one queued request ([`Decide`]), against `target`,
/// with what the request's caller decided of them.
struct Deciding<'a, 'w> {
    writer: &'a mut Writer,
    target: &'a mut Deferring<'w>,
    now: Millis,
    written: &'a mut Vec<Written>,
}

impl Decide for Deciding<'_, '_> {
    fn decide<O: Operation>(&mut self, ops: Ops<O>) -> Result<Outcomes<O::Outcome>, Error> {
        let Ops { ops, seen } = ops;
        let count = ops.len();
        // What the caller read is the state still, unless the epoch ended since (the writer
        // committed to redb and forgot its own changes); a key changed within the epoch is in
        // the writer's `latest` (`Target::changed`).
        let decided = match seen {
            Some(Known { epoch, decided })
                if epoch == self.writer.engine.overlay.epoch() && decided.len() == count =>
            {
                decided
            }
            _ => Vec::new(),
        };
        let (now, writer, target) = (self.now, &mut *self.writer, &mut *self.target);
        if count <= 1 {
            let mut outcomes = Vec::with_capacity(count);
            let mut decided = decided.into_iter();
            for (key, op) in ops {
                let seen = decided.next();
                outcomes.push(writer.decide_queued(target, key, op, seen, now, self.written)?);
            }
            return Ok(outcomes);
        }
        let mut seen: Vec<Option<CallerDecision<O>>> = decided.into_iter().map(Some).collect();
        let mut seen_at = |index: usize| seen.get_mut(index).and_then(Option::take);
        // Many keys: apply them in key order, so the B-tree inserts of the records and of
        // both indexes (ordered by deadline, then key: one deadline per batch) walk each page
        // once instead of jumping between random leaves. The sort is stable, so operations on
        // one key keep their order; outcomes go back to the caller's order.
        let mut order: Vec<usize> = (0..count).collect();
        order.sort_by(|&a, &b| ops[a].0.encoded().cmp(ops[b].0.encoded()));
        let mut slots: Vec<Option<(Key, O)>> = ops.into_iter().map(Some).collect();
        let mut outcomes: Vec<Option<Result<O::Outcome, Error>>> =
            (0..count).map(|_| None).collect();
        for index in order {
            let (key, op) = slots[index].take().expect("each index once");
            let seen = seen_at(index);
            outcomes[index] =
                Some(writer.decide_queued(target, key, op, seen, now, self.written)?);
        }
        Ok(outcomes
            .into_iter()
            .map(|o| o.expect("every index applied"))
            .collect())
    }
}

/// The writer's changes since redb last committed them: each key's latest state, with the
/// log frame that logged it.
pub(super) type Latest = HashMap<Key, (Held, u64)>;

/// Where an operation reads the state it is decided against and writes the new one: a write
/// transaction's tables directly ([`Tables`]), or the batch path's [`Deferring`].
pub(crate) trait Target {
    /// The record stored under `key`, expired or not; `Ok(Err(_))` is a corrupt record.
    fn load(&mut self, key: &Key) -> Result<Result<Option<Record>, Error>, Error>;
    /// Whether `key` may have changed since the current epoch began: then a caller's
    /// decision against what it read in the epoch is decided again. Only a target that knows
    /// which keys changed within the epoch says no.
    fn changed(&self, key: &Key) -> bool {
        let _ = key;
        true
    }
    /// Stores `record` where `old` was indexed.
    fn put(
        &mut self,
        key: &Key,
        old: Option<IndexEntries>,
        record: &Arc<Record>,
    ) -> Result<(), Error>;
    /// Deletes `key`, indexed at `old`.
    fn delete(&mut self, key: &Key, old: Option<IndexEntries>) -> Result<(), Error>;
}

impl Target for Tables<'_> {
    fn load(&mut self, key: &Key) -> Result<Result<Option<Record>, Error>, Error> {
        Ok(Tables::load(self, key.encoded())?.map_err(Into::into))
    }

    fn put(
        &mut self,
        key: &Key,
        old: Option<IndexEntries>,
        record: &Arc<Record>,
    ) -> Result<(), Error> {
        Tables::put(self, key.encoded(), old, record, &record.encode()).map_err(Into::into)
    }

    fn delete(&mut self, key: &Key, old: Option<IndexEntries>) -> Result<(), Error> {
        Tables::delete(self, key.encoded(), old).map_err(Into::into)
    }
}

/// The batch path's [`Target`]: reads a key's latest state (the writer's own changes since
/// the last redb commit, then the engine's one read of the newest copy, `Engine::newest`) and
/// keeps each change in `latest`; the applier gets the changes from the writer's record of
/// them ([`DeferredBatch::logged`]).
pub(super) struct Deferring<'w> {
    latest: &'w mut Latest,
    /// The frame that will log the changes made through this target.
    seq: u64,
    engine: &'w Engine,
}

impl<'w> Deferring<'w> {
    pub(super) fn new(latest: &'w mut Latest, seq: u64, engine: &'w Engine) -> Deferring<'w> {
        Deferring {
            latest,
            seq,
            engine,
        }
    }
}

impl Target for Deferring<'_> {
    /// Every change since the epoch began is in `latest`; any other key is as its caller saw
    /// it. So a new key's caller decision stands without a second B-tree miss.
    fn changed(&self, key: &Key) -> bool {
        self.latest.contains_key(key)
    }

    fn load(&mut self, key: &Key) -> Result<Result<Option<Record>, Error>, Error> {
        if let Some((state, _)) = self.latest.get(key) {
            return Ok(Ok(state.as_deref().cloned()));
        }
        self.engine.newest(key)
    }

    fn put(
        &mut self,
        key: &Key,
        _old: Option<IndexEntries>,
        record: &Arc<Record>,
    ) -> Result<(), Error> {
        self.latest
            .insert(key.clone(), (Some(Arc::clone(record)), self.seq));
        Ok(())
    }

    fn delete(&mut self, key: &Key, _old: Option<IndexEntries>) -> Result<(), Error> {
        self.latest.insert(key.clone(), (None, self.seq));
        Ok(())
    }
}
