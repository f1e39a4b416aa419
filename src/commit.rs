//! The commit path: every write goes through here.
//!
//! Callers queue a request (one or many key operations) and wait. One committer thread takes
//! everything queued, decides each operation against the current state with [`decide`],
//! applies the batch to a redb write transaction that stays open across batches, and appends
//! the resulting changes to the write-ahead log as one frame. The batch is then handed to the
//! [`Syncer`]: one fdatasync makes every frame written so far durable, after which the batch's
//! changes are published to the [`Overlay`] (what readers see before redb commits) and its
//! callers are answered. Nobody hears an answer before its batch is durable.
//!
//! The sync is run by one of the waiting callers (it is awake anyway), so the committer is
//! already deciding the next batch while the previous one syncs, and one sync covers every
//! frame written before it started. Only batches whose callers are all async are synced by the
//! committer itself.
//!
//! Every few milliseconds, once every written frame is synced, the open redb transaction is
//! committed (non-durably; the log is what makes it durable) and the overlay is emptied into
//! the record cache. Checkpoints, [`Store::complete_with`](crate::Store::complete_with) and
//! sweeps take the writer between batches.
//!
//! Any failure of a write poisons the store: the failing batches are answered with the error
//! and every later call is refused until the store is reopened.

use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use redb::{Database, WriteTransaction};

use crate::builder::Durability;
use crate::cache::{Overlay, RecordCache};
use crate::clock::{to_millis, Clock};
use crate::decide::{decide, Change, Operation, Policy};
use crate::error::Error;
use crate::key::Key;
use crate::record::{Millis, Record};
use crate::stats::{Counter, Counters};
use crate::tables::{IndexEntries, Tables};
use crate::wal::{LogFile, Wal};

/// How long the committer keeps one redb write transaction open across batches.
const TXN_SPAN: Duration = Duration::from_millis(20);

/// The first write failure, latched: once set, every call fails.
#[derive(Debug, Default)]
pub(crate) struct Poison(OnceLock<(String, Option<std::io::ErrorKind>)>);

impl Poison {
    pub(crate) fn check(&self) -> Result<(), Error> {
        match self.0.get() {
            None => Ok(()),
            Some((cause, io_kind)) => Err(Error::Poisoned {
                cause: cause.clone(),
                io_kind: *io_kind,
            }),
        }
    }

    fn set(&self, error: &Error) {
        if self.0.set((error.to_string(), error.io_kind())).is_ok() {
            #[cfg(feature = "tracing")]
            tracing::error!(%error, "idemstore poisoned: refusing all further work until reopened");
        }
    }
}

/// One result per operation of a request.
pub(crate) type Outcomes<T> = Vec<Result<T, Error>>;

/// The answer to a request: one result per operation, or an error for the whole batch.
pub(crate) type Answer<T> = Result<Outcomes<T>, Error>;

/// The most payload bytes (results, notes) one batch takes, so a log frame stays far below
/// its 4 GiB limit however large the configured results are.
const MAX_BATCH_BYTES: usize = 64 << 20;

/// One caller's queued operations (all of one kind) and the slot their answer is delivered
/// to.
pub(crate) struct Request<O: Operation> {
    ops: Mutex<Vec<(Key, O)>>,
    /// Payload bytes of the operations, for [`MAX_BATCH_BYTES`].
    bytes: usize,
    /// The decided outcomes, held until the batch's frame is durable.
    staged: Mutex<Option<Outcomes<O::Outcome>>>,
    answer: Mutex<Option<Answer<O::Outcome>>>,
    waiter: Waiter,
}

pub(crate) enum Waiter {
    Thread(Thread),
    Task(Mutex<Option<Waker>>),
}

/// A queued request of any kind, as the committer and the syncer see it.
pub(crate) trait Queued: Send + Sync {
    /// Payload bytes, for [`MAX_BATCH_BYTES`].
    fn bytes(&self) -> usize;
    fn waiter(&self) -> &Waiter;
    fn is_answered(&self) -> bool;
    /// Decides and applies the operations; their outcomes are staged until
    /// [`publish`](Queued::publish). Returns how many operations there were.
    fn apply(
        &self,
        writer: &mut Writer,
        tables: &mut Tables<'_>,
        now: Millis,
        written: &mut Vec<Written>,
    ) -> Result<usize, Error>;
    /// Answers with the staged outcomes (the batch is durable) and wakes the caller.
    fn publish(&self);
    /// Answers with an error for the whole request and wakes the caller.
    fn fail(&self, error: Error);
}

impl Waiter {
    fn is_thread(&self) -> bool {
        matches!(self, Waiter::Thread(_))
    }

    fn wake(&self) {
        match self {
            Waiter::Thread(thread) => thread.unpark(),
            Waiter::Task(waker) => {
                if let Some(waker) = waker.lock().take() {
                    waker.wake();
                }
            }
        }
    }
}

impl<O: Operation> Request<O> {
    fn finish(&self, answer: Answer<O::Outcome>) {
        *self.answer.lock() = Some(answer);
        self.waiter.wake();
    }

    fn take_answer(&self) -> Option<Answer<O::Outcome>> {
        self.answer.lock().take()
    }
}

impl<O: Operation> Queued for Request<O> {
    fn bytes(&self) -> usize {
        self.bytes
    }

    fn waiter(&self) -> &Waiter {
        &self.waiter
    }

    fn is_answered(&self) -> bool {
        self.answer.lock().is_some()
    }

    fn apply(
        &self,
        writer: &mut Writer,
        tables: &mut Tables<'_>,
        now: Millis,
        written: &mut Vec<Written>,
    ) -> Result<usize, Error> {
        let ops = std::mem::take(&mut *self.ops.lock());
        let count = ops.len();
        let mut outcomes = Vec::with_capacity(count);
        for (key, op) in ops {
            outcomes.push(writer.apply(tables, &key, op, now, written)?);
        }
        *self.staged.lock() = Some(outcomes);
        Ok(count)
    }

    fn publish(&self) {
        let outcomes = self.staged.lock().take().unwrap_or_default();
        self.finish(Ok(outcomes));
    }

    fn fail(&self, error: Error) {
        self.finish(Err(error));
    }
}

/// A future that resolves when its request has been answered.
///
/// Dropping it does not withdraw the request: the operations may still be committed.
pub(crate) struct CommitFuture<O: Operation> {
    request: Arc<Request<O>>,
}

impl<O: Operation> Future for CommitFuture<O> {
    type Output = Answer<O::Outcome>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(answer) = self.request.take_answer() {
            return Poll::Ready(answer);
        }
        if let Waiter::Task(slot) = &self.request.waiter {
            *slot.lock() = Some(cx.waker().clone());
        }
        // The answer may have arrived between the first check and storing the waker.
        match self.request.take_answer() {
            Some(answer) => Poll::Ready(answer),
            None => Poll::Pending,
        }
    }
}

/// A batch written to the log, waiting for a sync before its callers are answered.
struct PendingBatch {
    seq: u64,
    requests: Vec<Arc<dyn Queued>>,
    changes: Vec<(Key, Option<Record>)>,
}

#[derive(Default)]
struct SyncState {
    /// The last frame fully written to the log.
    written_seq: u64,
    /// The last frame known durable.
    synced_seq: u64,
    /// A thread is running a sync now.
    syncing: bool,
    pending: VecDeque<PendingBatch>,
}

/// Makes written frames durable and answers their batches. See the module docs.
pub(crate) struct Syncer {
    file: Arc<dyn LogFile>,
    path: PathBuf,
    state: Mutex<SyncState>,
    /// Signalled whenever a sync ends (and `syncing` is cleared).
    idle: Condvar,
    poison: Arc<Poison>,
    overlay: Arc<Overlay>,
    counters: Arc<Counters>,
}

impl Syncer {
    fn new(
        wal: &Wal,
        poison: Arc<Poison>,
        overlay: Arc<Overlay>,
        counters: Arc<Counters>,
    ) -> Syncer {
        let last = wal.last_seq();
        Syncer {
            file: wal.file(),
            path: wal.path().to_path_buf(),
            state: Mutex::new(SyncState {
                written_seq: last,
                synced_seq: last,
                ..SyncState::default()
            }),
            idle: Condvar::new(),
            poison,
            overlay,
            counters,
        }
    }

    /// Queues a batch whose frame `seq` was written; returns the thread to wake so that it
    /// runs the sync, if no sync is running.
    fn push(&self, batch: PendingBatch) -> Option<Arc<dyn Queued>> {
        let mut state = self.state.lock();
        if batch.seq <= state.synced_seq {
            // It logged nothing and everything it saw is durable.
            self.answer(batch);
            return None;
        }
        state.written_seq = state.written_seq.max(batch.seq);
        let driver = batch
            .requests
            .iter()
            .find(|r| r.waiter().is_thread())
            .cloned();
        state.pending.push_back(batch);
        if state.syncing {
            None
        } else {
            driver
        }
    }

    /// Answers a batch without a sync (buffered durability).
    fn answer_now(&self, batch: PendingBatch) {
        let mut state = self.state.lock();
        state.written_seq = state.written_seq.max(batch.seq);
        self.answer(batch);
    }

    fn answer(&self, batch: PendingBatch) {
        self.overlay.publish(batch.changes);
        for request in &batch.requests {
            request.publish();
        }
    }

    /// Runs syncs until every written frame is durable, or until `own` (the calling waiter's
    /// request) is answered and another waiting thread can take over.
    pub(crate) fn drive(&self, own: Option<&dyn Queued>) {
        let mut state = self.state.lock();
        if state.syncing {
            return;
        }
        state.syncing = true;
        drop(state);
        self.run_syncs(own);
        self.idle.notify_all();
    }

    /// The body of [`drive`](Syncer::drive), entered with `syncing` set; clears it on return.
    fn run_syncs(&self, own: Option<&dyn Queued>) {
        let mut state = self.state.lock();
        loop {
            if let Err(error) = self.poison.check() {
                // Whatever failed, nothing still waiting will be synced: answer it now.
                for batch in state.pending.drain(..) {
                    for request in batch.requests {
                        request.fail(error_copy(&error));
                    }
                }
                state.syncing = false;
                return;
            }
            let target = state.written_seq;
            if state.synced_seq >= target {
                state.syncing = false;
                return;
            }
            drop(state);
            let result = self.file.sync_data();
            self.counters.add(Counter::Syncs, 1);
            state = self.state.lock();
            match result {
                Ok(()) => {
                    state.synced_seq = state.synced_seq.max(target);
                    while state.pending.front().is_some_and(|b| b.seq <= target) {
                        let batch = state.pending.pop_front().expect("checked front");
                        self.answer(batch);
                    }
                }
                Err(e) => {
                    let error = Error::io(format!("syncing log {}", self.path.display()), e);
                    self.poison.set(&error);
                    self.overlay.clear();
                    for batch in state.pending.drain(..) {
                        for request in batch.requests {
                            request.fail(error_copy(&error));
                        }
                    }
                    state.syncing = false;
                    return;
                }
            }
            let own_answered = own.is_some_and(|r| r.is_answered());
            if own_answered {
                let next = state
                    .pending
                    .front()
                    .and_then(|b| b.requests.iter().find(|r| r.waiter().is_thread()).cloned());
                if let Some(next) = next {
                    state.syncing = false;
                    drop(state);
                    next.waiter().wake();
                    return;
                }
            }
        }
    }

    /// Syncs until every written frame is durable and answered; fails if the store is poisoned.
    fn drive_all(&self) -> Result<(), Error> {
        loop {
            self.drive(None);
            let mut state = self.state.lock();
            self.poison.check()?;
            if state.synced_seq >= state.written_seq && state.pending.is_empty() {
                return Ok(());
            }
            if state.syncing {
                // A waiting caller is syncing: wait for it to finish, then go again.
                self.idle.wait_for(&mut state, Duration::from_millis(100));
            }
        }
    }
}

struct Queue {
    requests: Vec<Arc<dyn Queued>>,
    /// The committer is waiting for work and must be notified.
    idle: bool,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    work: Condvar,
    writer: Mutex<Writer>,
    syncer: Arc<Syncer>,
}

/// Owns the committer thread.
pub(crate) struct Committer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Committer {
    pub(crate) fn start(writer: Writer) -> Result<Committer, Error> {
        let syncer = Arc::clone(&writer.syncer);
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                requests: Vec::new(),
                idle: false,
                shutdown: false,
            }),
            work: Condvar::new(),
            writer: Mutex::new(writer),
            syncer,
        });
        let thread = thread::Builder::new()
            .name("idemstore-committer".into())
            .spawn({
                let shared = Arc::clone(&shared);
                move || run(&shared)
            })
            .map_err(|e| Error::io("starting the committer thread", e))?;
        Ok(Committer {
            shared,
            thread: Some(thread),
        })
    }

    fn enqueue<O: Operation>(&self, ops: Vec<(Key, O)>, waiter: Waiter) -> Arc<Request<O>> {
        let bytes = ops.iter().map(|(_, op)| op.payload_len()).sum();
        let request = Arc::new(Request {
            bytes,
            ops: Mutex::new(ops),
            staged: Mutex::new(None),
            answer: Mutex::new(None),
            waiter,
        });
        let is_task = !request.waiter.is_thread();
        let mut queue = self.shared.queue.lock();
        queue.requests.push(Arc::clone(&request) as Arc<dyn Queued>);
        // A blocked caller leads its own batch (see `submit`); only async requests need the
        // committer thread.
        if is_task && queue.idle {
            queue.idle = false;
            self.shared.work.notify_one();
        }
        request
    }

    /// Runs `ops` in the next batch and blocks until it is durable.
    ///
    /// The caller leads when the writer is free: it runs the queued batch (its own request
    /// and whatever else is queued) itself, then drives the sync, so a lone caller is answered
    /// without any hand-off between threads. Otherwise it waits to be answered, or to be woken
    /// to lead the next batch or run a sync.
    pub(crate) fn submit<O: Operation>(&self, ops: Vec<(Key, O)>) -> Answer<O::Outcome> {
        let request = self.enqueue(ops, Waiter::Thread(thread::current()));
        loop {
            if let Some(answer) = request.take_answer() {
                return answer;
            }
            if let Some(mut writer) = self.shared.writer.try_lock() {
                let batch = take_batch(&mut self.shared.queue.lock().requests);
                if !batch.is_empty() {
                    run_guarded(&self.shared, &mut writer, batch);
                }
                drop(writer);
                wake_next(&self.shared);
            }
            self.shared.syncer.drive(Some(&*request));
            if let Some(answer) = request.take_answer() {
                return answer;
            }
            thread::park();
        }
    }

    /// Runs one operation in the next batch and blocks until it is durable.
    pub(crate) fn submit_one<O: Operation>(&self, key: Key, op: O) -> Result<O::Outcome, Error> {
        first(self.submit(vec![(key, op)]))
    }

    /// Queues `ops` for the next batch; the future resolves once it is durable. No thread
    /// blocks while it waits.
    pub(crate) fn submit_async<O: Operation>(&self, ops: Vec<(Key, O)>) -> CommitFuture<O> {
        CommitFuture {
            request: self.enqueue(ops, Waiter::Task(Mutex::new(None))),
        }
    }

    /// Runs `f` with the writer to itself, after the open transaction is committed.
    pub(crate) fn with_writer<R>(
        &self,
        f: impl FnOnce(&mut Writer) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let mut writer = self.shared.writer.lock();
        writer.flush()?;
        f(&mut writer)
    }
}

/// The single result of a one-operation answer.
pub(crate) fn first<T>(answer: Answer<T>) -> Result<T, Error> {
    answer?
        .into_iter()
        .next()
        .expect("one answer per operation")
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.shared.queue.lock().shutdown = true;
        self.shared.work.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The longest the committer thread sleeps: callers lead their own batches, so it wakes this
/// often to commit their open transaction and run background work.
const IDLE_TICK: Duration = Duration::from_millis(10);

/// The committer thread: async batches and background work until shut down, then a final
/// checkpoint.
fn run(shared: &Shared) {
    loop {
        let tick = shared
            .writer
            .lock()
            .next_tick()
            .map_or(IDLE_TICK, |t| t.min(IDLE_TICK));
        let batch = {
            let mut queue = shared.queue.lock();
            if queue.requests.is_empty() && !queue.shutdown {
                queue.idle = true;
                let _ = shared.work.wait_for(&mut queue, tick);
                queue.idle = false;
            }
            if queue.requests.is_empty() && queue.shutdown {
                break;
            }
            take_batch(&mut queue.requests)
        };
        let mut writer = shared.writer.lock();
        if !batch.is_empty() {
            run_guarded(shared, &mut writer, batch);
        }
        writer.background_work();
        drop(writer);
        wake_next(shared);
    }
    shared.writer.lock().close();
}

/// Runs a batch; a panic (a bug, or inside redb) poisons the store and answers every caller
/// instead of leaving them waiting.
fn run_guarded(shared: &Shared, writer: &mut Writer, batch: Vec<Arc<dyn Queued>>) {
    let requests = batch.clone();
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| writer.run_batch(batch)));
    if run.is_err() {
        let error = writer.fail(Error::Poisoned {
            cause: "a thread panicked while committing a batch".into(),
            io_kind: None,
        });
        for request in requests {
            if !request.is_answered() {
                request.fail(error_copy(&error));
            }
        }
        shared.syncer.drive(None);
    }
}

/// After a batch, wakes whoever should lead the next one: the oldest queued blocked caller,
/// or the committer thread for async requests.
fn wake_next(shared: &Shared) {
    let mut queue = shared.queue.lock();
    let Some(first) = queue.requests.first() else {
        return;
    };
    match first.waiter() {
        Waiter::Thread(thread) => thread.unpark(),
        Waiter::Task(_) => {
            if queue.idle {
                queue.idle = false;
                shared.work.notify_one();
            }
        }
    }
}

/// Takes the oldest queued requests, up to [`MAX_BATCH_BYTES`] of payload (at least one).
fn take_batch(queue: &mut Vec<Arc<dyn Queued>>) -> Vec<Arc<dyn Queued>> {
    let mut bytes = 0;
    let count = queue
        .iter()
        .take_while(|r| {
            bytes += r.bytes();
            bytes <= MAX_BATCH_BYTES
        })
        .count()
        .max(1)
        .min(queue.len());
    if count == queue.len() {
        std::mem::take(queue)
    } else {
        queue.drain(..count).collect()
    }
}

/// A change made by a transaction: for the log, the overlay and the cache.
pub(crate) struct Written {
    key: Key,
    record: Option<Record>,
    encoded: Option<Vec<u8>>,
}

/// How a transaction outside the batch path is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CommitKind {
    /// A durable redb commit, which also checkpoints the log. Changes are not logged.
    Durable,
    /// Neither logged nor durable: only for changes that may be lost in a crash without
    /// changing any answer (sweeping expired records).
    Unlogged,
}

/// Background-work settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    pub(crate) durability: Durability,
    pub(crate) checkpoint_bytes: u64,
    pub(crate) checkpoint_interval: Duration,
    /// Sweep expired records in the background this often (`None`: only when asked).
    pub(crate) sweep_interval: Option<Duration>,
}

/// The most records one background sweep slice deletes, so it holds the writer only briefly:
/// 200 kept reserves at p99 2.7 ms while 200k expired keys were swept (examples/sweep_load.rs),
/// where slices of 1 000 made the p50 10 ms.
pub(crate) const SWEEP_SLICE: usize = 200;

/// The single writer: owns the database's write side, the log and the fencing-token counter.
pub(crate) struct Writer {
    db: Arc<Database>,
    wal: Wal,
    syncer: Arc<Syncer>,
    /// The write transaction kept open across batches, and when it was opened.
    txn: Option<(WriteTransaction, Instant)>,
    clock: Arc<dyn Clock>,
    policy: Policy,
    next_token: u64,
    poison: Arc<Poison>,
    cache: Arc<RecordCache>,
    overlay: Arc<Overlay>,
    counters: Arc<Counters>,
    schedule: Schedule,
    last_checkpoint: Instant,
    last_sync: Instant,
    last_sweep: Instant,
    /// The last background sweep slice was full: more expired records are waiting.
    sweep_backlog: bool,
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
        policy: Policy,
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

    fn begin(&self, durability: redb::Durability) -> Result<WriteTransaction, Error> {
        let ctx = "starting a write transaction";
        let mut txn = self.db.begin_write().map_err(|e| Error::storage(ctx, e))?;
        txn.set_durability(durability)
            .map_err(|e| Error::storage(ctx, e))?;
        Ok(txn)
    }

    /// Decides, applies and logs one batch; hands it to the syncer.
    fn run_batch(&mut self, batch: Vec<Arc<dyn Queued>>) {
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
                let seq = self.wal.append(self.next_token, entries)?;
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
        let decision = decide(old, op, now, self.policy, self.next_token);
        if decision.used_token {
            self.next_token += 1;
        }
        match decision.change {
            Change::Keep => {}
            Change::Put(record) => {
                let encoded = record.encode();
                tables.write(
                    key.encoded(),
                    old_index,
                    Some((&encoded, IndexEntries::of(&record))),
                )?;
                written.push(Written {
                    key: key.clone(),
                    record: Some(record),
                    encoded: Some(encoded),
                });
            }
            Change::Delete => {
                tables.write(key.encoded(), old_index, None)?;
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

    /// Runs `f` in its own write transaction (after [`flush`](Writer::flush)), committed as
    /// `kind` says. `Ok(Ok(r))` commits; `Ok(Err(e))` rolls back and returns `e` (a refusal,
    /// such as a lost lease); an outer `Err` is a storage failure and poisons the store.
    pub(crate) fn transact<R>(
        &mut self,
        kind: CommitKind,
        f: impl FnOnce(
            &mut Writer,
            &WriteTransaction,
            Millis,
            &mut Vec<Written>,
        ) -> Result<Result<R, Error>, Error>,
    ) -> Result<R, Error> {
        self.flush()?;
        let token_before = self.next_token;
        let durability = match kind {
            CommitKind::Durable => redb::Durability::Immediate,
            CommitKind::Unlogged => redb::Durability::None,
        };
        let txn = match self.begin(durability) {
            Ok(txn) => txn,
            Err(error) => return Err(self.fail(error)),
        };
        let now = to_millis(self.clock.now());
        let mut written = Vec::new();
        let value = match f(self, &txn, now, &mut written) {
            Ok(Ok(value)) => value,
            Ok(Err(refusal)) => {
                self.next_token = token_before;
                if let Err(e) = txn.abort() {
                    return Err(self.fail(Error::storage("rolling back a transaction", e)));
                }
                return Err(refusal);
            }
            Err(error) => return Err(self.fail(error)),
        };
        let new_salt = crate::wal::new_salt();
        if self.next_token != token_before || kind == CommitKind::Durable {
            let saved = Tables::open(&txn).and_then(|mut t| {
                t.set_next_token(self.next_token)?;
                if kind == CommitKind::Durable {
                    // Frames after this checkpoint use a new salt, so no frame from before it
                    // (nor bytes shaped like one) can pass as current after the rewind.
                    t.set_log_salt(new_salt)?;
                }
                Ok(())
            });
            if let Err(error) = saved {
                return Err(self.fail(error));
            }
        }
        if let Err(e) = txn.commit() {
            return Err(self.fail(Error::storage("committing a write transaction", e)));
        }
        self.counters.add(Counter::Commits, 1);
        if kind == CommitKind::Durable {
            self.counters.add(Counter::Checkpoints, 1);
            #[cfg(feature = "tracing")]
            tracing::debug!(
                log_bytes = self.wal.len_since_rewind(),
                "idemstore checkpoint: durable redb commit, log rewound"
            );
            // Every frame so far is now in the durable redb file.
            self.wal.rewind(new_salt);
            self.last_checkpoint = Instant::now();
        }
        self.overlay.waiters.notify(written.iter().map(|w| &w.key));
        for w in written {
            self.cache.set(&w.key, w.record);
        }
        Ok(value)
    }

    /// Deletes up to `limit` expired records in one unlogged transaction; returns how many.
    pub(crate) fn sweep(&mut self, limit: usize) -> Result<usize, Error> {
        let counters = Arc::clone(&self.counters);
        self.transact(CommitKind::Unlogged, |_, txn, now, written| {
            let mut tables = Tables::open(txn)?;
            let deleted = crate::sweep::sweep_expired(&mut tables, now, limit)?;
            let count = deleted.len();
            counters.add(Counter::Swept, count as u64);
            for key in deleted {
                Writer::deleted(written, key);
            }
            Ok(Ok(count))
        })
    }

    /// A durable redb commit; the log is rewound after it.
    pub(crate) fn checkpoint(&mut self) -> Result<(), Error> {
        self.transact(CommitKind::Durable, |_, _, _, _| Ok(Ok(())))
    }

    /// Commits the open transaction when it is old, syncs a buffered log when its interval
    /// passed, and checkpoints when the log is large or old.
    fn background_work(&mut self) {
        if self.poison.check().is_err() {
            return;
        }
        let txn_due = self
            .txn
            .as_ref()
            .is_some_and(|(_, since)| since.elapsed() >= TXN_SPAN);
        let sync_due = match self.schedule.durability {
            Durability::Buffered { flush_interval } => self.last_sync.elapsed() >= flush_interval,
            Durability::Immediate => false,
        };
        if txn_due || sync_due {
            let _ = self.flush();
        }
        if let Some(interval) = self.schedule.sweep_interval {
            if self.sweep_backlog || self.last_sweep.elapsed() >= interval {
                self.last_sweep = Instant::now();
                self.sweep_backlog = matches!(self.sweep(SWEEP_SLICE), Ok(n) if n == SWEEP_SLICE);
            }
        }
        let logged = self.wal.len_since_rewind();
        if logged >= self.schedule.checkpoint_bytes
            || (logged > 0 && self.last_checkpoint.elapsed() >= self.schedule.checkpoint_interval)
        {
            let _ = self.checkpoint();
        }
    }

    /// How long the committer may sleep before background work is due; `None` when none is.
    fn next_tick(&self) -> Option<Duration> {
        if self.poison.check().is_err() {
            return None;
        }
        let mut due: Option<Duration> = None;
        let mut at = |d: Duration| due = Some(due.map_or(d, |x| x.min(d)));
        if let Some((_, since)) = &self.txn {
            at(TXN_SPAN.saturating_sub(since.elapsed()));
        }
        if let Some(interval) = self.schedule.sweep_interval {
            at(if self.sweep_backlog {
                Duration::ZERO
            } else {
                interval.saturating_sub(self.last_sweep.elapsed())
            });
        }
        if self.wal.len_since_rewind() > 0 {
            at(self
                .schedule
                .checkpoint_interval
                .saturating_sub(self.last_checkpoint.elapsed()));
            if let Durability::Buffered { flush_interval } = self.schedule.durability {
                at(flush_interval.saturating_sub(self.last_sync.elapsed()));
            }
        }
        due.map(|d| d.max(Duration::from_millis(1)))
    }

    /// On shutdown: make everything durable in redb so the next open replays nothing.
    fn close(&mut self) {
        if self.poison.check().is_ok() {
            let _ = self.flush();
            if self.wal.len_since_rewind() > 0 {
                let _ = self.checkpoint();
            }
        }
    }
}

/// Errors are not `Clone`: every caller of a failed batch gets `Poisoned` with the failure's
/// message and I/O error kind (so a full disk is recognizable with [`Error::io_kind`]).
fn error_copy(error: &Error) -> Error {
    match error {
        Error::Poisoned { cause, io_kind } => Error::Poisoned {
            cause: cause.clone(),
            io_kind: *io_kind,
        },
        other => Error::Poisoned {
            cause: other.to_string(),
            io_kind: other.io_kind(),
        },
    }
}
