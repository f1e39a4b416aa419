//! Applying logged batches to redb off the batch path.
//!
//! The log is what makes a batch durable, so its B-tree writes need not come before the
//! answer. The writer decides each batch against its own changes since redb last committed
//! them (`Deferring`, in `writer.rs`), then the engine's newest copy; it appends the frame
//! and queues the batch's changes here. The applier thread applies them, in order and once their frame is
//! durable, several batches at a time ([`GATHER`]), to the write transaction it keeps open,
//! and commits that transaction itself (non-durably) when it is [`TXN_SPAN`] old. The writer
//! then forgets the changes that commit holds ([`Writer::drain_committed`](super::Writer::drain_committed)), keeping those of
//! later frames. So neither the B-tree inserts nor the periodic commit hold the writer;
//! [`Writer::flush`](super::Writer::flush) still applies and commits everything on the
//! writer where a transaction outside the batch path (a checkpoint, a sweep) needs it.
//!
//! Only frames known durable are applied, so a commit (which new readers of redb see) never
//! holds a change that a crash could still take back. The transaction that applies batches
//! also deletes the expiry windows that have ended (`Tables::drop_ended_windows`), and, on the
//! applier's thread or a background checkpoint's only, merges the closed narrow windows
//! (`Tables::merge_closed_windows`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use redb::WriteTransaction;

use crate::error::{Error, StorageError};
use crate::key::Key;
use crate::state::Counter;
use crate::state::Held;
use crate::tree::{IndexEntries, Tables};

use super::Syncer;
use crate::state::Engine;

/// How long one redb write transaction (the applier's) stays open across batches before the
/// applier commits it (non-durably).
///
/// The overlay and the writer's `latest` hold what redb has not committed, so their size is
/// bounded by about this span times the write rate (~25k records at 100k writes/s); a longer
/// span commits less often, and each page a span changes many times is written once (the
/// figures behind 250 ms: BENCHMARKS.md, "How long the applier's transaction stays open").
pub(super) const TXN_SPAN: Duration = Duration::from_millis(250);

/// A change made by a transaction: for the log, the overlay and the cache. The new record is
/// held once, shared by everything that holds the change until redb does (the writer's
/// `latest`, the overlay, the applier's queue, then the record cache), and encoded where its
/// bytes go (the log frame, the applier's insert) rather than kept encoded beside it.
pub(crate) struct Written {
    pub(super) key: Key,
    pub(super) record: Held,
    /// Where the record it replaced was indexed (for the applier).
    pub(super) old: Option<IndexEntries>,
}

/// One change to apply: the key, where its old record was indexed, and the new record
/// (`None`: a deletion).
pub(crate) struct TreeChange {
    pub(crate) key: Key,
    pub(crate) old: Option<IndexEntries>,
    pub(crate) new: Held,
}

/// A logged batch's changes, with the frame that logged them and the token counter after it.
pub(crate) struct DeferredBatch {
    pub(crate) changes: Vec<TreeChange>,
    pub(crate) seq: u64,
    pub(crate) next_token: u64,
}

impl DeferredBatch {
    /// The changes of a batch logged as frame `seq`, taken from what the writer recorded.
    pub(super) fn logged(written: &[Written], seq: u64, next_token: u64) -> DeferredBatch {
        let changes = written
            .iter()
            .map(|w| TreeChange {
                key: w.key.clone(),
                old: w.old,
                new: w.record.clone(),
            })
            .collect();
        DeferredBatch {
            changes,
            seq,
            next_token,
        }
    }
}

/// The changes of `batches` (in the order they were logged), one per key, in key order: a
/// key changed several times (a reserve and its completion, say) is written once, with its
/// last state, where its first change found it indexed. So each key is written at most once
/// per call, and the B-tree inserts walk the leaves in order.
pub(crate) fn merged(batches: Vec<DeferredBatch>) -> Vec<TreeChange> {
    let mut changes: Vec<TreeChange> = if batches.len() == 1 {
        batches.into_iter().next().expect("one batch").changes
    } else {
        batches.into_iter().flat_map(|b| b.changes).collect()
    };
    if changes.len() <= 1 {
        return changes;
    }
    // Stable: the changes of one key keep the order they were logged in.
    changes.sort_by(|a, b| a.key.cmp(&b.key));
    let mut out: Vec<TreeChange> = Vec::with_capacity(changes.len());
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
struct Backlog {
    batches: Vec<DeferredBatch>,
    /// Changes in `batches`.
    changes: usize,
    /// When the oldest batch in `batches` was queued.
    since: Option<Instant>,
    shutdown: bool,
}

/// The most changes queued for the applier before the writer applies some itself: this
/// bounds the work a flush may find left over when the applier falls behind, such as under a
/// stream of large `reserve_many` batches.
const MAX_QUEUED: usize = 65536;

/// The most changes queued for the applier at all: past [`MAX_QUEUED`] the writer does not
/// wait for the applier while it merges windows (a second or more at 10M live keys), up to
/// this many; past it, the writer waits (the memory the queue, the overlay and the writer's
/// own changes take stays bounded).
const MOST_QUEUED: usize = 8 * MAX_QUEUED;

/// The most changes the writer applies itself at a time, the oldest first, when the queue is
/// past [`MAX_QUEUED`]: each batch over the bound pays a share of the applier's lag rather
/// than one batch paying for the whole queue.
pub(super) const SELF_APPLIED: usize = 8192;

/// How full the applier's queue is after a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Queued {
    /// At most [`MAX_QUEUED`] changes.
    Room,
    /// Past [`MAX_QUEUED`]: the writer applies some itself, unless the applier is merging.
    Over,
    /// Past [`MOST_QUEUED`]: the writer applies some itself, waiting for the applier.
    Full,
}

/// How long the applier waits before looking again when the first queued frame is not yet
/// known durable (a sync normally ends well within it).
const SYNC_POLL: Duration = Duration::from_millis(1);

/// How long the applier lets durable batches gather before applying them, unless
/// [`GATHER_CHANGES`] are queued: each application opens the store's tables in the
/// transaction and wakes the thread, so a store answering one small batch at a time applies
/// several per wake-up. (Readers are unaffected: the overlay answers for a batch until a redb
/// commit holds it.)
const GATHER: Duration = Duration::from_millis(25);

/// Queued changes that are applied at once, without waiting for [`GATHER`].
const GATHER_CHANGES: usize = 1024;

/// Applies queued batches to the open write transaction, on its own thread.
pub(crate) struct Applier {
    engine: Arc<Engine>,
    /// Tells which frames are durable: only those are applied.
    syncer: Arc<Syncer>,
    /// Whether frames are applied before they are durable (buffered durability, where a
    /// batch is answered before its sync anyway).
    apply_unsynced: bool,
    /// Whether ended windows are deleted where batches are applied (the background sweeper is
    /// on).
    drops_windows: bool,
    /// The last frame applied to a transaction.
    applied: AtomicU64,
    /// The last frame held by a redb commit the applier made itself, for the writer to forget
    /// ([`Writer::drain_committed`](super::Writer::drain_committed)).
    committed: AtomicU64,
    /// The last frame whose overlay entries may leave the overlay (the writer ended the epoch
    /// after the commit that holds it), and the last frame whose entries have left: the
    /// applier moves them to the record cache, off the writer.
    drain_to: AtomicU64,
    drained: AtomicU64,
    /// While a background checkpoint is to commit the frames up to this one (and no later),
    /// later frames wait in the queue (`u64::MAX`: none does).
    hold_after: AtomicU64,
    /// Whether the transaction is merging narrow windows (`Tables::merge_closed_windows`).
    merging: AtomicBool,
    /// Held while applying, committing, or reading when the transaction was opened. A batch is
    /// taken from `queue` only while holding it, so that a flush never misses one.
    pub(super) txn: Mutex<OpenTxn>,
    queue: Mutex<Backlog>,
    more: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Applier {
    pub(super) fn new(
        engine: Arc<Engine>,
        syncer: Arc<Syncer>,
        apply_unsynced: bool,
        drops_windows: bool,
    ) -> Applier {
        Applier {
            engine,
            syncer,
            apply_unsynced,
            drops_windows,
            applied: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            drain_to: AtomicU64::new(0),
            drained: AtomicU64::new(0),
            hold_after: AtomicU64::new(u64::MAX),
            merging: AtomicBool::new(false),
            txn: Mutex::new(None),
            queue: Mutex::new(Backlog::default()),
            more: Condvar::new(),
            thread: Mutex::new(None),
        }
    }

    /// Whether the applier holds no open transaction (and is not applying): ended windows are
    /// then the background sweeper's to delete.
    pub(super) fn is_idle(&self) -> bool {
        self.txn.try_lock().is_some_and(|txn| txn.is_none())
    }

    /// Starts the applier thread. Without it every batch is applied by the next flush.
    pub(super) fn start(self: &Arc<Applier>) -> Result<(), StorageError> {
        let applier = Arc::clone(self);
        let thread = thread::Builder::new()
            .name("idemstore-applier".into())
            .spawn(move || applier.run())
            .map_err(|e| StorageError::io("starting the applier thread", e))?;
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

    /// Queues a logged batch's changes for the applier thread. Returns how full the queue is:
    /// past [`MAX_QUEUED`], the caller applies some of it ([`apply_some`](Applier::apply_some)).
    pub(super) fn push(&self, batch: DeferredBatch) -> Queued {
        let mut queue = self.queue.lock();
        let before = queue.changes;
        queue.changes += batch.changes.len();
        queue.since.get_or_insert_with(Instant::now);
        queue.batches.push(batch);
        // The applier waits for the first batch, then for the batches to gather: wake it
        // when enough have (it would otherwise wait out the rest of `GATHER`).
        if queue.batches.len() == 1 || (before < GATHER_CHANGES && queue.changes >= GATHER_CHANGES)
        {
            self.more.notify_one();
        }
        match queue.changes {
            n if n > MOST_QUEUED => Queued::Full,
            n if n > MAX_QUEUED => Queued::Over,
            _ => Queued::Room,
        }
    }

    /// Whether the open transaction is merging narrow windows now.
    pub(super) fn merging(&self) -> bool {
        self.merging.load(Ordering::Acquire)
    }

    /// The last frame a redb commit of the applier's own holds (0: none yet).
    pub(super) fn committed(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// The last frame applied to a transaction (0: none yet).
    pub(super) fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }

    /// Asks the applier thread to move the overlay entries of frames up to `seq` to the record
    /// cache (the writer ended the epoch after the commit that holds them).
    pub(super) fn drain_overlay(&self, seq: u64) {
        self.drain_to.fetch_max(seq, Ordering::AcqRel);
        let _queue = self.queue.lock();
        self.more.notify_one();
    }

    /// Moves the overlay entries the writer allowed to the record cache.
    pub(super) fn drain_overlay_now(&self) {
        let to = self.drain_to.load(Ordering::Acquire);
        if to > self.drained.load(Ordering::Acquire) {
            self.engine.overlay.drain_through(to, &self.engine.cache);
            self.drained.store(to, Ordering::Release);
        }
    }

    /// Records that a commit (the writer's flush) holds every frame applied so far.
    pub(super) fn committed_all(&self) {
        self.committed.store(self.applied(), Ordering::Release);
    }

    /// The last frame that may be applied now: the last durable one (any, when frames are
    /// answered before their sync), and none after the frame a pending checkpoint covers.
    fn applicable(&self) -> u64 {
        let durable = if self.apply_unsynced {
            u64::MAX
        } else {
            self.syncer.synced_seq()
        };
        durable.min(self.hold_after.load(Ordering::Acquire))
    }

    /// Applies no frame after `seq` until [`release_hold`](Applier::release_hold): the
    /// background checkpoint covering the frames up to `seq` commits the applier's transaction
    /// with exactly those.
    pub(super) fn hold_after(&self, seq: u64) {
        self.hold_after.store(seq, Ordering::Release);
    }

    /// Ends [`hold_after`](Applier::hold_after).
    pub(super) fn release_hold(&self) {
        self.hold_after.store(u64::MAX, Ordering::Release);
        let _queue = self.queue.lock();
        self.more.notify_one();
    }

    fn run(&self) {
        loop {
            self.drain_overlay_now();
            let opened = self.txn.lock().as_ref().map(|(_, at)| *at);
            let durable = self.applicable();
            {
                let mut queue = self.queue.lock();
                if queue.shutdown {
                    return;
                }
                let durable_first = queue.batches.first().is_some_and(|b| b.seq <= durable);
                let gathered = queue.since.map_or(Duration::ZERO, |at| at.elapsed());
                let ready =
                    durable_first && (gathered >= GATHER || queue.changes >= GATHER_CHANGES);
                let due = opened.is_some_and(|at| at.elapsed() >= TXN_SPAN);
                let drain =
                    self.drain_to.load(Ordering::Acquire) > self.drained.load(Ordering::Acquire);
                if !ready && !due && !drain {
                    // Wait for a batch, for its frame's sync, for the batches to gather, or
                    // for the open transaction's commit to be due, whichever comes first.
                    let mut wait = opened.map(|at| TXN_SPAN.saturating_sub(at.elapsed()));
                    if !queue.batches.is_empty() {
                        let poll = if durable_first {
                            GATHER.saturating_sub(gathered)
                        } else {
                            SYNC_POLL
                        };
                        wait = Some(wait.map_or(poll, |w| w.min(poll)));
                    }
                    match wait {
                        Some(wait) => {
                            self.more.wait_for(&mut queue, wait);
                        }
                        None => self.more.wait(&mut queue),
                    }
                    continue;
                }
            }
            let mut txn = self.txn.lock();
            let done = self
                .apply_merging(&mut txn)
                .and_then(|()| self.commit_if_due(&mut txn));
            if let Err(error) = done {
                self.fail(&mut txn, &error);
            }
        }
    }

    /// Applies what is queued and commits the open transaction now, whatever its age: the
    /// applier's own commit, run as a test's background step (`Background::ApplierCommit`).
    #[cfg(feature = "__whitebox")]
    pub(super) fn commit_now(&self) -> Result<(), Error> {
        let mut txn = self.txn.lock();
        let done = self
            .apply_merging(&mut txn)
            .and_then(|()| self.commit_if(&mut txn, Duration::ZERO));
        if let Err(error) = &done {
            self.fail(&mut txn, error);
        }
        done
    }

    /// Commits the open transaction (non-durably) when it is [`TXN_SPAN`] old, and records
    /// the last frame it holds for the writer. The caller holds `txn`.
    fn commit_if_due(&self, txn: &mut OpenTxn) -> Result<(), Error> {
        self.commit_if(txn, TXN_SPAN)
    }

    /// Commits the open transaction (non-durably) when it is at least `age` old, and records
    /// the last frame it holds for the writer. The caller holds `txn`.
    fn commit_if(&self, txn: &mut OpenTxn, age: Duration) -> Result<(), Error> {
        if txn.as_ref().is_none_or(|(_, at)| at.elapsed() < age) {
            return Ok(());
        }
        let (open, _) = txn.take().expect("checked above");
        open.commit()
            .map_err(|e| StorageError::redb("committing a write transaction", e))?;
        self.engine.counters.add(Counter::Commits, 1);
        self.committed_all();
        Ok(())
    }

    /// Applies every queued batch to the open transaction (opening one if needed). The caller
    /// holds `txn`.
    ///
    /// Only batches whose frame is durable are taken (see the module docs); the rest stay
    /// queued for the next call.
    pub(super) fn apply_queued(&self, txn: &mut OpenTxn) -> Result<(), Error> {
        self.apply(txn, usize::MAX, Vec::new())
    }

    /// [`apply_queued`](Applier::apply_queued), then the merges of the closed narrow windows
    /// (`Tables::merge_closed_windows`): off the writer's thread (the applier's own, a
    /// background checkpoint's), since a merge at 10M live keys takes a second or more.
    pub(super) fn apply_merging(&self, txn: &mut OpenTxn) -> Result<(), Error> {
        // Told before the batches are applied, so a writer over the bound does not start
        // waiting for a transaction about to merge.
        let closed = if self.drops_windows {
            self.engine.windows.closed_narrow(self.engine.now())
        } else {
            Vec::new()
        };
        self.merging.store(!closed.is_empty(), Ordering::Release);
        let applied = self.apply(txn, usize::MAX, closed);
        self.merging.store(false, Ordering::Release);
        applied
    }

    /// [`apply_queued`](Applier::apply_queued) of the oldest batches only, up to about
    /// `limit` changes (at least one batch): the writer's share when the queue is long. Ended
    /// windows are left for a whole application.
    pub(super) fn apply_some(&self, txn: &mut OpenTxn, limit: usize) -> Result<(), Error> {
        self.apply(txn, limit, Vec::new())
    }

    /// Applies up to about `limit` changes of queued batches (`usize::MAX`: all, then the
    /// ended windows are deleted and the narrow windows of `closed` merged).
    fn apply(
        &self,
        txn: &mut OpenTxn,
        limit: usize,
        closed: Vec<(u64, Vec<u64>)>,
    ) -> Result<(), Error> {
        let durable = self.applicable();
        let batches = {
            let mut queue = self.queue.lock();
            let mut ready = queue.batches.partition_point(|b| b.seq <= durable);
            // The batches within `limit` changes, and at least one.
            let mut taken = 0usize;
            if let Some(over) = queue.batches[..ready].iter().position(|b| {
                taken = taken.saturating_add(b.changes.len());
                taken > limit
            }) {
                ready = over.max(1);
            }
            let batches: Vec<DeferredBatch> = queue.batches.drain(..ready).collect();
            queue.changes -= batches.iter().map(|b| b.changes.len()).sum::<usize>();
            queue.since = (!queue.batches.is_empty()).then(Instant::now);
            batches
        };
        if batches.is_empty() {
            return Ok(());
        }
        self.engine.poison.check()?;
        if txn.is_none() {
            let ctx = "starting a write transaction";
            let mut opened = self
                .engine
                .db
                .begin_write()
                .map_err(|e| StorageError::redb(ctx, e))?;
            opened
                .set_durability(redb::Durability::None)
                .map_err(|e| StorageError::redb(ctx, e))?;
            *txn = Some((opened, Instant::now()));
        }
        let (open, _) = txn.as_ref().expect("opened above");
        let mut tables = Tables::open(open, &self.engine.windows)?;
        let last = batches.last().map(|b| (b.seq, b.next_token));
        let mut encoded = Vec::new();
        for change in merged(batches) {
            let key = change.key.encoded();
            match change.new {
                Some(record) => {
                    encoded.clear();
                    record.encode_into(&mut encoded);
                    tables.put(key, change.old, &record, &encoded)?;
                }
                None => tables.delete(key, change.old)?,
            }
        }
        if let Some((seq, next_token)) = last {
            tables.set_wal_seq(seq)?;
            tables.set_next_token(next_token)?;
            self.applied.store(seq, Ordering::Release);
        }
        if self.drops_windows && limit == usize::MAX {
            // Ended windows leave with the batches: one table deletion each, in whichever
            // transaction applies them (the applier's, a checkpoint's, a flush's), off the
            // writer's batch path.
            let now = self.engine.now();
            let (windows, held) = tables.drop_ended_windows(now)?;
            self.engine.counters.add(Counter::WindowsDeleted, windows);
            self.engine.counters.add(Counter::Swept, held);
            if windows > 0 {
                super::sweep::forget_ended_windows(&self.engine, now);
            }
            let merged = tables.merge_closed_windows(closed)?;
            self.engine.counters.add(Counter::WindowsMerged, merged);
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
