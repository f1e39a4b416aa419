//! The commit path: every write goes through here.
//!
//! Callers queue a request (one or many key operations) and wait. One committer thread takes
//! everything queued, decides each operation against the current state with
//! [`decide`], applies the batch to redb in a non-durable transaction, appends the resulting
//! changes to the write-ahead log as one frame, syncs the log once, commits the redb
//! transaction, and only then answers every caller in the batch. So concurrent callers share
//! one fsync, and nobody hears an answer before its batch is durable. Between batches the
//! committer does background work: syncing a buffered log, and checkpoints.
//!
//! The writer is also taken directly, outside the queue, for work that is not a queued key
//! operation: [`Store::complete_with`](crate::Store::complete_with) (a durable redb commit that
//! carries the caller's own writes), sweeps, and checkpoints.
//!
//! Any failure of a write poisons the store: the failing batch is answered with the error and
//! every later call is refused until the store is reopened.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use redb::{Database, WriteTransaction};

use crate::builder::Durability;
use crate::cache::RecordCache;
use crate::clock::{to_millis, Clock};
use crate::decide::{decide, Change, Op, Outcome, Policy};
use crate::error::Error;
use crate::key::Key;
use crate::record::{Millis, Record};
use crate::tables::{IndexEntries, Tables};
use crate::wal::Wal;

/// The first write failure, latched: once set, every call fails.
#[derive(Debug, Default)]
pub(crate) struct Poison(OnceLock<String>);

impl Poison {
    pub(crate) fn check(&self) -> Result<(), Error> {
        match self.0.get() {
            None => Ok(()),
            Some(cause) => Err(Error::Poisoned {
                cause: cause.clone(),
            }),
        }
    }

    fn set(&self, error: &Error) {
        let _ = self.0.set(error.to_string());
    }
}

/// The answer to a request: one result per operation, or an error for the whole batch.
pub(crate) type Answer = Result<Vec<Result<Outcome, Error>>, Error>;

/// One caller's queued operations and the slot their answer is delivered to.
pub(crate) struct Request {
    ops: Mutex<Vec<(Key, Op)>>,
    answer: Mutex<Option<Answer>>,
    waiter: Waiter,
}

enum Waiter {
    Thread(Thread),
    Task(Mutex<Option<Waker>>),
}

impl Request {
    fn finish(&self, answer: Answer) {
        *self.answer.lock() = Some(answer);
        match &self.waiter {
            Waiter::Thread(thread) => thread.unpark(),
            Waiter::Task(waker) => {
                if let Some(waker) = waker.lock().take() {
                    waker.wake();
                }
            }
        }
    }

    fn take_answer(&self) -> Option<Answer> {
        self.answer.lock().take()
    }
}

/// A future that resolves when the committer has answered its request.
///
/// Dropping it does not withdraw the request: the operations may still be committed.
pub(crate) struct CommitFuture {
    request: Arc<Request>,
}

impl Future for CommitFuture {
    type Output = Answer;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        if let Some(answer) = self.request.take_answer() {
            return Poll::Ready(answer);
        }
        if let Waiter::Task(slot) = &self.request.waiter {
            *slot.lock() = Some(cx.waker().clone());
        }
        // The committer may have answered between the first check and storing the waker.
        match self.request.take_answer() {
            Some(answer) => Poll::Ready(answer),
            None => Poll::Pending,
        }
    }
}

struct Queue {
    requests: Vec<Arc<Request>>,
    /// The committer is waiting for work and must be notified.
    idle: bool,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    work: Condvar,
    writer: Mutex<Writer>,
}

/// Owns the committer thread.
pub(crate) struct Committer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Committer {
    pub(crate) fn start(writer: Writer) -> Result<Committer, Error> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                requests: Vec::new(),
                idle: false,
                shutdown: false,
            }),
            work: Condvar::new(),
            writer: Mutex::new(writer),
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

    fn enqueue(&self, ops: Vec<(Key, Op)>, waiter: Waiter) -> Arc<Request> {
        let request = Arc::new(Request {
            ops: Mutex::new(ops),
            answer: Mutex::new(None),
            waiter,
        });
        let mut queue = self.shared.queue.lock();
        queue.requests.push(Arc::clone(&request));
        if queue.idle {
            queue.idle = false;
            self.shared.work.notify_one();
        }
        request
    }

    /// Runs `ops` in the next batch and blocks until it committed.
    pub(crate) fn submit(&self, ops: Vec<(Key, Op)>) -> Answer {
        let request = self.enqueue(ops, Waiter::Thread(thread::current()));
        loop {
            if let Some(answer) = request.take_answer() {
                return answer;
            }
            thread::park();
        }
    }

    /// Runs one operation in the next batch and blocks until it committed.
    pub(crate) fn submit_one(&self, key: Key, op: Op) -> Result<Outcome, Error> {
        first(self.submit(vec![(key, op)]))
    }

    /// Queues `ops` for the next batch; the future resolves once it committed. No thread
    /// blocks while it waits.
    pub(crate) fn submit_async(&self, ops: Vec<(Key, Op)>) -> CommitFuture {
        CommitFuture {
            request: self.enqueue(ops, Waiter::Task(Mutex::new(None))),
        }
    }

    /// Runs `f` with the writer to itself.
    pub(crate) fn with_writer<R>(&self, f: impl FnOnce(&mut Writer) -> R) -> R {
        f(&mut self.shared.writer.lock())
    }
}

/// The single result of a one-operation answer.
pub(crate) fn first(answer: Answer) -> Result<Outcome, Error> {
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

/// The committer thread: batches until shut down, then a final checkpoint.
fn run(shared: &Shared) {
    let mut tick: Option<Duration> = None;
    loop {
        let batch = {
            let mut queue = shared.queue.lock();
            while queue.requests.is_empty() && !queue.shutdown {
                queue.idle = true;
                let timed_out = match tick {
                    Some(tick) => shared.work.wait_for(&mut queue, tick).timed_out(),
                    None => {
                        shared.work.wait(&mut queue);
                        false
                    }
                };
                queue.idle = false;
                if timed_out {
                    break;
                }
            }
            if queue.requests.is_empty() && queue.shutdown {
                break;
            }
            std::mem::take(&mut queue.requests)
        };
        let mut writer = shared.writer.lock();
        if !batch.is_empty() {
            writer.run_batch(&batch);
        }
        writer.background_work();
        tick = writer.next_tick();
    }
    shared.writer.lock().close();
}

/// A change made by a transaction, kept to log it and to update the cache after commit.
pub(crate) struct Written {
    key: Key,
    record: Option<Record>,
    encoded: Option<Vec<u8>>,
}

/// How a write transaction is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CommitKind {
    /// Changes go to the log (synced per the store's durability); redb commits non-durably.
    Logged,
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
}

/// The single writer: owns the database's write side, the log and the fencing-token counter.
pub(crate) struct Writer {
    db: Arc<Database>,
    wal: Wal,
    clock: Arc<dyn Clock>,
    policy: Policy,
    next_token: u64,
    poison: Arc<Poison>,
    cache: Arc<RecordCache>,
    schedule: Schedule,
    last_checkpoint: Instant,
    last_sync: Instant,
}

impl Writer {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        db: Arc<Database>,
        wal: Wal,
        clock: Arc<dyn Clock>,
        policy: Policy,
        next_token: u64,
        poison: Arc<Poison>,
        cache: Arc<RecordCache>,
        schedule: Schedule,
    ) -> Writer {
        Writer {
            db,
            wal,
            clock,
            policy,
            next_token,
            poison,
            cache,
            schedule,
            last_checkpoint: Instant::now(),
            last_sync: Instant::now(),
        }
    }

    /// Runs `f` in one write transaction, committed as `kind` says. `Ok(Ok(r))` commits;
    /// `Ok(Err(e))` rolls back and returns `e` (a refusal, such as a lost lease); an outer `Err`
    /// is a storage failure and poisons the store, as does a failed log write, sync or commit.
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
        self.poison.check()?;
        let token_before = self.next_token;
        match self.transact_inner(kind, f) {
            Ok(value) => Ok(value),
            Err(Failure::Refused(error)) => {
                self.next_token = token_before;
                Err(error)
            }
            Err(Failure::Fatal(error)) => Err(self.fail(error)),
        }
    }

    fn fail(&mut self, error: Error) -> Error {
        self.poison.set(&error);
        self.cache.clear();
        error
    }

    fn transact_inner<R>(
        &mut self,
        kind: CommitKind,
        f: impl FnOnce(
            &mut Writer,
            &WriteTransaction,
            Millis,
            &mut Vec<Written>,
        ) -> Result<Result<R, Error>, Error>,
    ) -> Result<R, Failure> {
        fn fatal<E: Into<redb::Error>>(context: &'static str) -> impl FnOnce(E) -> Failure {
            move |e| Failure::Fatal(Error::storage(context, e))
        }
        let mut txn = self
            .db
            .begin_write()
            .map_err(fatal("starting a write transaction"))?;
        let durability = match kind {
            CommitKind::Durable => redb::Durability::Immediate,
            CommitKind::Logged | CommitKind::Unlogged => redb::Durability::None,
        };
        txn.set_durability(durability)
            .map_err(fatal("setting the transaction durability"))?;
        let now = to_millis(self.clock.now());
        let token_before = self.next_token;
        let mut written = Vec::new();
        let value = match f(self, &txn, now, &mut written) {
            Ok(Ok(value)) => value,
            Ok(Err(refusal)) => {
                txn.abort().map_err(fatal("rolling back a transaction"))?;
                return Err(Failure::Refused(refusal));
            }
            Err(error) => return Err(Failure::Fatal(error)),
        };
        if kind == CommitKind::Logged && !written.is_empty() {
            let entries = written
                .iter()
                .map(|w| (w.key.encoded(), w.encoded.as_deref()));
            let seq = self
                .wal
                .append(self.next_token, entries)
                .map_err(Failure::Fatal)?;
            if self.schedule.durability == Durability::Immediate {
                self.wal.sync().map_err(Failure::Fatal)?;
                self.last_sync = Instant::now();
            }
            let mut tables = Tables::open(&txn).map_err(Failure::Fatal)?;
            tables.set_wal_seq(seq).map_err(Failure::Fatal)?;
            tables
                .set_next_token(self.next_token)
                .map_err(Failure::Fatal)?;
        } else if self.next_token != token_before {
            Tables::open(&txn)
                .and_then(|mut tables| tables.set_next_token(self.next_token))
                .map_err(Failure::Fatal)?;
        }
        txn.commit()
            .map_err(fatal("committing a write transaction"))?;
        if kind == CommitKind::Durable {
            // Every frame so far is now in the durable redb file.
            self.wal.rewind();
            self.last_checkpoint = Instant::now();
        }
        for w in written {
            self.cache.set(&w.key, w.record);
        }
        Ok(value)
    }

    /// Decides and applies one operation inside an open transaction, recording the change in
    /// `written`. The inner `Err` is an error for this operation alone (a corrupt record).
    pub(crate) fn apply(
        &mut self,
        tables: &mut Tables<'_>,
        key: &Key,
        op: Op,
        now: Millis,
        written: &mut Vec<Written>,
    ) -> Result<Result<Outcome, Error>, Error> {
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
                written.push(Written {
                    key: key.clone(),
                    record: None,
                    encoded: None,
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
            encoded: None,
        });
    }

    fn run_batch(&mut self, batch: &[Arc<Request>]) {
        let result = self.transact(CommitKind::Logged, |writer, txn, now, written| {
            let mut tables = Tables::open(txn)?;
            let mut answers = Vec::with_capacity(batch.len());
            for request in batch {
                let ops = std::mem::take(&mut *request.ops.lock());
                let mut outcomes = Vec::with_capacity(ops.len());
                for (key, op) in ops {
                    outcomes.push(writer.apply(&mut tables, &key, op, now, written)?);
                }
                answers.push(outcomes);
            }
            Ok(Ok(answers))
        });
        match result {
            Ok(answers) => {
                for (request, outcomes) in batch.iter().zip(answers) {
                    request.finish(Ok(outcomes));
                }
            }
            Err(error) => {
                let cause = error.to_string();
                for request in batch {
                    request.finish(Err(Error::Poisoned {
                        cause: cause.clone(),
                    }));
                }
            }
        }
    }

    /// A durable redb commit; the log is rewound after it.
    pub(crate) fn checkpoint(&mut self) -> Result<(), Error> {
        self.transact(CommitKind::Durable, |_, _, _, _| Ok(Ok(())))
    }

    /// Syncs a buffered log when its interval passed; checkpoints when the log is large or old.
    fn background_work(&mut self) {
        if self.poison.check().is_err() {
            return;
        }
        if let Durability::Buffered { flush_interval } = self.schedule.durability {
            if self.wal.is_unsynced() && self.last_sync.elapsed() >= flush_interval {
                if let Err(error) = self.wal.sync() {
                    self.fail(error);
                    return;
                }
                self.last_sync = Instant::now();
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
        if self.poison.check().is_err() || self.wal.len_since_rewind() == 0 {
            return None;
        }
        let checkpoint = self
            .schedule
            .checkpoint_interval
            .saturating_sub(self.last_checkpoint.elapsed());
        Some(
            match self.schedule.durability {
                Durability::Buffered { flush_interval } if self.wal.is_unsynced() => {
                    checkpoint.min(flush_interval.saturating_sub(self.last_sync.elapsed()))
                }
                _ => checkpoint,
            }
            .max(Duration::from_millis(1)),
        )
    }

    /// On shutdown: make everything durable in redb so the next open replays nothing.
    fn close(&mut self) {
        if self.poison.check().is_ok() && self.wal.len_since_rewind() > 0 {
            let _ = self.checkpoint();
        }
    }
}

/// Why a transaction did not commit.
enum Failure {
    /// The work refused (a lost lease, a failed callback): rolled back, store still healthy.
    Refused(Error),
    /// Storage failed: the store is poisoned.
    Fatal(Error),
}
