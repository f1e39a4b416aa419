//! The writer: decides a batch against the current state, applies it to the open redb
//! transaction and appends it to the log as one frame.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redb::{Database, WriteTransaction};

use crate::builder::Durability;
use crate::cache::{Overlay, RecordCache};
use crate::clock::{to_millis, Clock};
use crate::decide::{decide, Change, Operation};
use crate::error::Error;
use crate::key::Key;
use crate::record::{Millis, Record};
use crate::retention::Policies;
use crate::stats::{Counter, Counters};
use crate::tables::{IndexEntries, Tables};
use crate::wal::Wal;

use super::syncer::PendingBatch;
use super::{Queued, Schedule, Syncer};
use crate::poison::{error_copy, Poison};

/// How long the committer keeps one redb write transaction open across batches.
///
/// Each (non-durable) commit of it holds the writer for a moment while redb finalizes its
/// dirty pages, and callers queue behind it: at 20 ms that pause hit more than 1% of the
/// reserves at 32 callers (p99 3.5 ms), and batches of 1000 new keys paid it every few
/// batches. At 100 ms, in A/B runs of the load generator: 32 callers p99 1.8-2.4 ms
/// (3.5-3.6 ms before) and +3% throughput, batches of new keys 106k against 85k keys/s.
/// The overlay holds what the open transaction has not committed, so its size is bounded by
/// this span times the write rate (~10k records at 100k writes/s).
pub(super) const TXN_SPAN: Duration = Duration::from_millis(100);

/// A change made by a transaction: for the log, the overlay and the cache.
pub(crate) struct Written {
    pub(super) key: Key,
    pub(super) record: Option<Record>,
    pub(super) encoded: Option<Vec<u8>>,
}

/// The single writer: owns the database's write side, the log and the fencing-token counter.
pub(crate) struct Writer {
    pub(super) db: Arc<Database>,
    pub(super) wal: Wal,
    pub(super) syncer: Arc<Syncer>,
    /// The write transaction kept open across batches, and when it was opened.
    pub(super) txn: Option<(WriteTransaction, Instant)>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) policy: Policies,
    pub(super) next_token: u64,
    pub(super) poison: Arc<Poison>,
    pub(super) cache: Arc<RecordCache>,
    pub(super) overlay: Arc<Overlay>,
    pub(super) counters: Arc<Counters>,
    pub(super) schedule: Schedule,
    pub(super) last_checkpoint: Instant,
    pub(super) last_sync: Instant,
    pub(super) last_sweep: Instant,
    /// The last background sweep slice was full: more expired records are waiting.
    pub(super) sweep_backlog: bool,
}

impl Writer {
    #[expect(
        clippy::too_many_arguments,
        reason = "the writer is assembled once, in Store::from_parts, from the store's parts"
    )]
    pub(crate) fn new(
        db: Arc<Database>,
        wal: Wal,
        clock: Arc<dyn Clock>,
        policy: Policies,
        next_token: u64,
        poison: Arc<Poison>,
        cache: Arc<RecordCache>,
        overlay: Arc<Overlay>,
        counters: Arc<Counters>,
        schedule: Schedule,
    ) -> Writer {
        let syncer = Arc::new(Syncer::new(
            &wal,
            Arc::clone(&poison),
            Arc::clone(&overlay),
            Arc::clone(&counters),
        ));
        Writer {
            db,
            wal,
            syncer,
            txn: None,
            clock,
            policy,
            next_token,
            poison,
            cache,
            overlay,
            counters,
            schedule,
            last_checkpoint: Instant::now(),
            last_sync: Instant::now(),
            last_sweep: Instant::now(),
            sweep_backlog: false,
        }
    }

    /// Latches `error`: the store refuses all further work.
    pub(crate) fn fail(&mut self, error: Error) -> Error {
        self.poison.set(&error);
        self.txn = None;
        self.overlay.clear();
        self.cache.clear();
        error
    }

    pub(super) fn begin(&self, durability: redb::Durability) -> Result<WriteTransaction, Error> {
        let ctx = "starting a write transaction";
        let mut txn = self.db.begin_write().map_err(|e| Error::storage(ctx, e))?;
        txn.set_durability(durability)
            .map_err(|e| Error::storage(ctx, e))?;
        // A durable commit (a checkpoint) also records redb's allocator state, so that opening
        // after a crash loads it instead of walking the whole file: one more sync per
        // checkpoint, and an open whose cost does not grow with the store.
        txn.set_quick_repair(matches!(durability, redb::Durability::Immediate));
        Ok(txn)
    }

    /// Decides, applies and logs one batch; hands it to the syncer.
    pub(super) fn run_batch(&mut self, batch: Vec<Arc<dyn Queued>>) {
        if let Err(error) = self.poison.check() {
            for request in &batch {
                request.fail(error_copy(&error));
            }
            return;
        }
        match self.apply_batch(&batch) {
            Ok((ops, written, seq)) => {
                self.counters.batch(ops as u64);
                let changes = written.into_iter().map(|w| (w.key, w.record)).collect();
                let pending = PendingBatch {
                    seq,
                    requests: batch,
                    changes,
                };
                match self.schedule.durability {
                    Durability::Buffered { .. } => self.syncer.answer_now(pending),
                    Durability::Immediate => {
                        if let Some(driver) = self.syncer.push(pending) {
                            driver.waiter().wake();
                        }
                        if !self.every_pending_batch_has_a_thread() {
                            self.syncer.drive(None);
                        }
                    }
                }
            }
            Err(error) => {
                let error = self.fail(error);
                for request in &batch {
                    request.fail(error_copy(&error));
                }
            }
        }
    }

    /// Whether every batch waiting for a sync has a blocked thread that can run it; when not
    /// (async callers only), the committer syncs.
    fn every_pending_batch_has_a_thread(&self) -> bool {
        self.syncer
            .state
            .lock()
            .pending
            .iter()
            .all(|b| b.requests.iter().any(|r| r.waiter().is_thread()))
    }

    /// Decides and applies every request (staging their outcomes); returns how many operations
    /// there were, the changes, and the sequence number of the frame that logged them (the last
    /// written frame when nothing changed).
    fn apply_batch(
        &mut self,
        batch: &[Arc<dyn Queued>],
    ) -> Result<(usize, Vec<Written>, u64), Error> {
        if self.txn.is_none() {
            self.txn = Some((self.begin(redb::Durability::None)?, Instant::now()));
        }
        let now = to_millis(self.clock.now());
        let (txn, since) = self.txn.take().expect("opened above");
        let result = (|| {
            let mut tables = Tables::open(&txn)?;
            let mut ops = 0;
            let mut written = Vec::new();
            for request in batch {
                ops += request.apply(self, &mut tables, now, &mut written)?;
            }
            let seq = if written.is_empty() {
                self.wal.last_seq()
            } else {
                let entries = written
                    .iter()
                    .map(|w| (w.key.encoded(), w.encoded.as_deref()));
                let durable = self.syncer.synced_seq();
                let seq = self.wal.append(self.next_token, durable, entries)?;
                tables.set_wal_seq(seq)?;
                tables.set_next_token(self.next_token)?;
                seq
            };
            Ok((ops, written, seq))
        })();
        if result.is_ok() {
            self.txn = Some((txn, since));
        }
        result
    }

    /// Decides and applies one operation inside an open transaction, recording the change in
    /// `written`. The inner `Err` is an error for this operation alone (a corrupt record).
    pub(crate) fn apply<O: Operation>(
        &mut self,
        tables: &mut Tables<'_>,
        key: &Key,
        op: O,
        now: Millis,
        written: &mut Vec<Written>,
    ) -> Result<Result<O::Outcome, Error>, Error> {
        let old = match tables.load(key.encoded())? {
            Ok(old) => old,
            Err(corrupt) => return Ok(Err(corrupt)),
        };
        let old_index = old.as_ref().map(IndexEntries::of);
        let decision = decide(old, op, now, self.policy.for_key(key), self.next_token);
        if decision.used_token {
            self.next_token += 1;
        }
        match decision.change {
            Change::Keep => {}
            Change::Put(record) => {
                let encoded = record.encode();
                tables.put(key.encoded(), old_index, &record, &encoded)?;
                written.push(Written {
                    key: key.clone(),
                    record: Some(record),
                    encoded: Some(encoded),
                });
            }
            Change::Delete => {
                tables.delete(key.encoded(), old_index)?;
                Writer::deleted(written, key.clone());
            }
        }
        Ok(Ok(decision.outcome))
    }

    /// Records that `key` was deleted by a transaction (for the cache).
    pub(crate) fn deleted(written: &mut Vec<Written>, key: Key) {
        written.push(Written {
            key,
            record: None,
            encoded: None,
        });
    }

    /// Makes every written frame durable and answered, then commits the open transaction
    /// (non-durably) and moves the overlay into the cache.
    pub(crate) fn flush(&mut self) -> Result<(), Error> {
        self.poison.check()?;
        if let Err(error) = self.syncer.drive_all() {
            self.txn = None;
            return Err(error);
        }
        self.last_sync = Instant::now();
        if let Some((txn, _)) = self.txn.take() {
            if let Err(e) = txn.commit() {
                return Err(self.fail(Error::storage("committing a write transaction", e)));
            }
            self.counters.add(Counter::Commits, 1);
            self.overlay.drain_into(&self.cache);
        }
        Ok(())
    }
}
