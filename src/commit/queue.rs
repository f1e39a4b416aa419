//! The commit queue and the committer thread: callers queue requests; a lone caller leads its
//! own batch, and under load the committer thread takes everything queued, writes it as one
//! batch, syncs it and loops, like a bare group-commit log.
//! The requests it carries are in `request.rs`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::decide::Operation;
use crate::error::{Error, StorageError};
use crate::key::Key;
use crate::state::error_copy;
use crate::state::{Durability, Limits};

use super::request::{CallerDecision, Kind, Known, Ops, Request, RequestResult, Waiter};
use super::{Syncer, Writer};

struct Queue {
    requests: Vec<Arc<Request>>,
    /// How many of `requests` are async (a blocked thread is its own bound; tasks are not).
    tasks: usize,
    /// Async callers waiting for room in the queue.
    room: Vec<Waker>,
    /// The committer is waiting for work and must be notified.
    idle: bool,
    /// The committer is waiting for another thread's sync with nothing to write, and must be
    /// woken through the syncer when a request comes (`Syncer::drive_written`).
    sync_wait: bool,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    work: Condvar,
    writer: Mutex<Writer>,
    syncer: Arc<Syncer>,
    limits: Limits,
}

/// Owns the committer thread.
pub(crate) struct Committer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Committer {
    pub(crate) fn start(writer: Writer, limits: Limits) -> Result<Committer, StorageError> {
        let applier = Arc::clone(&writer.applier);
        if !writer.schedule.manual {
            applier.start()?;
        }
        let syncer = Arc::clone(&writer.syncer);
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                requests: Vec::new(),
                tasks: 0,
                room: Vec::new(),
                idle: false,
                sync_wait: false,
                shutdown: false,
            }),
            work: Condvar::new(),
            writer: Mutex::new(writer),
            syncer,
            limits,
        });
        let thread = thread::Builder::new()
            .name("idemstore-committer".into())
            .spawn({
                let shared = Arc::clone(&shared);
                move || run(&shared)
            })
            .map_err(|e| {
                applier.stop();
                StorageError::io("starting the committer thread", e)
            })?;
        Ok(Committer {
            shared,
            thread: Some(thread),
        })
    }

    /// Runs `ops` in the next batch and blocks until it is durable.
    ///
    /// A caller that is alone (the committer thread idle, nothing else queued, no sync
    /// running) leads when the writer is free: it runs the queued batch itself, then drives
    /// the sync, so a lone caller is answered without any hand-off between threads. Otherwise
    /// (callers overlap) it hands the queue to the committer thread, which then runs every
    /// batch and its sync until the queue is empty, while callers only wait:
    /// one wake-up per operation, and each sync covers everything queued while the previous
    /// one ran. (Callers leading every batch was measured slower under load: BENCHMARKS.md,
    /// "Who leads a batch".)
    pub(crate) fn submit<O: Kind>(&self, ops: Vec<(Key, O)>) -> RequestResult<O::Outcome> {
        self.submit_seen(ops, None)
    }

    /// [`submit`](Committer::submit) with what the caller decided of the operations (see
    /// [`Known`]).
    pub(crate) fn submit_seen<O: Kind>(
        &self,
        ops: Vec<(Key, O)>,
        seen: Option<Known<O>>,
    ) -> RequestResult<O::Outcome> {
        not_in_callback()?;
        let shared = &*self.shared;
        let requests = parts(ops, seen, shared.limits.batch_bytes, || {
            Waiter::Thread(thread::current())
        });
        let last = requests.last().expect("at least one request");
        let mut queued = false;
        let mut woken = false;
        loop {
            // Woken with the answer: return without touching the queue or the syncer.
            if queued && requests.iter().all(|r| r.is_answered()) {
                return collect::<O>(&requests);
            }
            let sync_busy = shared.syncer.is_busy();
            // One hold of the queue lock per round: queue (the first time), see whether the
            // caller is alone, and either take the batch to lead it or wake the committer.
            let mut queue = shared.queue.lock();
            if !queued {
                queued = true;
                for request in requests.iter() {
                    queue.requests.push(Arc::clone(request));
                }
            }
            // Alone (the committer idle, nothing else queued, no sync running): lead. Otherwise
            // the committer runs the batch and its sync.
            let alone = queue.idle && queue.requests.len() <= requests.len() && !sync_busy;
            match alone.then(|| shared.writer.try_lock()).flatten() {
                Some(mut writer) => {
                    let batch = take_batch(&mut queue, shared.limits.batch_bytes, &shared.syncer);
                    drop(queue);
                    if !batch.is_empty() {
                        run_guarded(shared, &mut writer, batch);
                    }
                    drop(writer);
                    shared.syncer.drive(Some(&**last));
                }
                None => {
                    wake_committer(shared, queue);
                    if woken {
                        // Woken unanswered: a sync that answered its own caller handed the
                        // next one to this thread (`Syncer::run_syncs`), and the committer
                        // syncs only the frames it wrote itself, so drive it here (a no-op
                        // when another thread syncs already).
                        shared.syncer.drive(Some(&**last));
                    }
                }
            }
            if requests.iter().all(|r| r.is_answered()) {
                return collect::<O>(&requests);
            }
            thread::park();
            woken = true;
        }
    }

    /// Runs one operation in the next batch and blocks until it is durable.
    pub(crate) fn submit_one<O: Kind>(&self, key: Key, op: O) -> Result<O::Outcome, Error> {
        first(self.submit(vec![(key, op)]))
    }

    /// [`submit_one`](Committer::submit_one) of an operation its caller decided as `decided`
    /// against the state it read at the start of `epoch` (see [`Known`]).
    pub(crate) fn submit_one_seen<O: Kind>(
        &self,
        key: Key,
        op: O,
        epoch: u64,
        decided: CallerDecision<O>,
    ) -> Result<O::Outcome, Error> {
        let seen = Known {
            epoch,
            decided: vec![decided],
        };
        first(self.submit_seen(vec![(key, op)], Some(seen)))
    }

    /// Queues `ops` for the next batch; the future resolves once it is durable. No thread
    /// blocks while it waits. When [`Limits::queued_async`] async requests are queued already,
    /// the future first waits for room (backpressure), so memory does not grow with the number
    /// of waiting tasks.
    pub(crate) fn submit_async<O: Kind>(&self, ops: Vec<(Key, O)>) -> CommitFuture<O> {
        self.submit_async_seen(ops, None)
    }

    /// [`submit_async`](Committer::submit_async) with what the caller decided of the
    /// operations (see [`Known`]).
    pub(crate) fn submit_async_seen<O: Kind>(
        &self,
        ops: Vec<(Key, O)>,
        seen: Option<Known<O>>,
    ) -> CommitFuture<O> {
        CommitFuture {
            shared: Arc::clone(&self.shared),
            state: FutureState::Waiting(Some(Ops { ops, seen })),
        }
    }

    /// How many async requests are queued now (the crate's tests, feature `__whitebox`).
    #[cfg(feature = "__whitebox")]
    pub(crate) fn queued_async(&self) -> usize {
        let queue = self.shared.queue.lock();
        queue
            .requests
            .iter()
            .filter(|r| !r.waiter.is_thread())
            .count()
    }

    /// Runs `f` with the writer to itself, after the open transaction is committed.
    pub(crate) fn with_writer<R>(
        &self,
        f: impl FnOnce(&mut Writer) -> Result<R, Error>,
    ) -> Result<R, Error> {
        not_in_callback()?;
        let mut writer = self.shared.writer.lock();
        writer.flush()?;
        f(&mut writer)
    }

    /// Runs `f` with the writer to itself, as it is between two batches (nothing flushed
    /// first): for a test's background steps.
    #[cfg(feature = "__whitebox")]
    pub(crate) fn with_writer_as_is<R>(
        &self,
        f: impl FnOnce(&mut Writer) -> Result<R, Error>,
    ) -> Result<R, Error> {
        not_in_callback()?;
        f(&mut self.shared.writer.lock())
    }

    /// Runs `f` (the closure of `complete_with`) marked as holding the writer, so that a call
    /// from inside it that needs the writer fails with [`Error::Reentrant`] instead of
    /// waiting for itself forever.
    pub(crate) fn in_callback<R>(f: impl FnOnce() -> R) -> R {
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                IN_CALLBACK.with(|flag| flag.set(false));
            }
        }
        IN_CALLBACK.with(|flag| flag.set(true));
        let _reset = Reset;
        f()
    }
}

thread_local! {
    /// This thread runs a `complete_with` closure: it holds the writer.
    static IN_CALLBACK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Refuses a call that needs the writer from inside a `complete_with` closure.
fn not_in_callback() -> Result<(), Error> {
    if IN_CALLBACK.with(|flag| flag.get()) {
        return Err(Error::Reentrant);
    }
    Ok(())
}

/// The bytes an operation adds to a log frame, at most: its key, its record and the entry's
/// framing. Requests are split by this measure.
fn entry_bytes<O: Operation>(key: &Key, op: &O) -> usize {
    /// An entry's framing (kind, lengths) and a record's fixed fields and checksum, rounded up.
    const ENTRY_OVERHEAD: usize = 96;
    key.encoded().len() + ENTRY_OVERHEAD + op.payload_len()
}

/// The answers of a request's parts, in order, once every part is answered: one result per
/// operation, or the first error of a whole part.
fn collect<O: Kind>(requests: &[Arc<Request>]) -> RequestResult<O::Outcome> {
    if let [one] = requests {
        return one.take_result::<O>().expect("every part is answered");
    }
    let mut outcomes = Vec::new();
    let mut failed = None;
    for request in requests {
        match request.take_result::<O>().expect("every part is answered") {
            Ok(part) => outcomes.extend(part),
            Err(error) => {
                failed.get_or_insert(error);
            }
        }
    }
    match failed {
        Some(error) => Err(error),
        None => Ok(outcomes),
    }
}

/// The single result of a one-operation answer.
pub(crate) fn first<T>(answer: RequestResult<T>) -> Result<T, Error> {
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

/// Wakes the committer for the requests just queued (`queue` is the queue's guard, released
/// here): when it waits for work, or waits for another thread's sync with nothing to write.
fn wake_committer(shared: &Shared, mut queue: parking_lot::MutexGuard<'_, Queue>) {
    let sync_wait = std::mem::take(&mut queue.sync_wait);
    if queue.idle {
        queue.idle = false;
        shared.work.notify_one();
    }
    drop(queue);
    if sync_wait {
        // Outside the queue's lock: the committer looks at the queue holding the syncer's.
        shared.syncer.wake();
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
            queue.sync_wait = false;
            if queue.requests.is_empty() && !queue.shutdown {
                queue.idle = true;
                let _ = shared.work.wait_for(&mut queue, tick);
                queue.idle = false;
            }
            if queue.requests.is_empty() && queue.shutdown {
                break;
            }
            take_batch(&mut queue, shared.limits.batch_bytes, &shared.syncer)
        };
        let mut writer = shared.writer.lock();
        let written_before = writer.wal.last_seq();
        if !batch.is_empty() {
            run_guarded(shared, &mut writer, batch);
        }
        writer.background_work();
        // The committer syncs the frames it wrote in this round. A frame a lone caller wrote
        // is that caller's to sync (it drives the sync right after writing it): were the
        // committer to start that sync on its tick, a request queued meanwhile would wait
        // for the sync to end instead of being written while it runs.
        let sync = matches!(writer.schedule.durability, Durability::Immediate)
            && writer.wal.last_seq() != written_before;
        drop(writer);
        if sync {
            // Callers wait without driving syncs while the committer works: it syncs every
            // written frame (an error reaches the callers through their requests). When a
            // caller leads the sync, the committer waits for it only while nothing is queued:
            // a request queued meanwhile is written at once (its frame then synced after that
            // sync, by the committer's next round), so that batch N+1 is written while batch N
            // syncs instead of after it. Nobody is answered before their frame is durable.
            let _ = shared.syncer.drive_written(&|| {
                let mut queue = shared.queue.lock();
                let queued = !queue.requests.is_empty();
                queue.sync_wait = !queued;
                queued
            });
        }
    }
    let mut writer = shared.writer.lock();
    writer.close();
    writer.applier.stop();
}

/// Runs a batch; a panic (a bug, or inside redb) poisons the store and answers every caller
/// instead of leaving them waiting.
fn run_guarded(shared: &Shared, writer: &mut Writer, batch: Vec<Arc<Request>>) {
    let mut requests = std::mem::take(&mut writer.in_batch);
    requests.extend(batch.iter().cloned());
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| writer.run_batch(batch)));
    if run.is_err() {
        let error = writer.fail(
            StorageError::Poisoned {
                cause: "a thread panicked while committing a batch".into(),
                io_kind: None,
            }
            .into(),
        );
        for request in requests.drain(..) {
            if !request.is_answered() {
                request.fail(error_copy(&error));
            }
        }
        shared.syncer.drive(None);
    }
    requests.clear();
    writer.in_batch = requests;
}

/// Takes the oldest queued requests, up to `limit` bytes of payload (at least one), and lets
/// waiting async callers in when that made room.
fn take_batch(queue: &mut Queue, limit: usize, syncer: &Syncer) -> Vec<Arc<Request>> {
    let mut bytes = 0;
    let requests = &mut queue.requests;
    let count = requests
        .iter()
        .take_while(|r| {
            bytes += r.bytes;
            bytes <= limit
        })
        .count()
        .max(1)
        .min(requests.len());
    let batch: Vec<_> = if count == requests.len() {
        std::mem::replace(requests, syncer.spare_requests())
    } else {
        requests.drain(..count).collect()
    };
    let tasks = batch.iter().filter(|r| !r.waiter.is_thread()).count();
    if tasks > 0 {
        queue.tasks -= tasks;
        for waker in queue.room.drain(..) {
            waker.wake();
        }
    }
    batch
}

/// Splits `ops` into requests, in order: each holds at most `limit` bytes of log entries (or
/// one operation), so that no request, however large, makes a frame over the format's limit.
/// Always at least one request, so an empty one is answered too.
/// What the caller decided of the operations is split alongside.
fn parts<O: Kind>(
    ops: Vec<(Key, O)>,
    seen: Option<Known<O>>,
    limit: usize,
    waiter: impl Fn() -> Waiter,
) -> Parts {
    let total: usize = ops.iter().map(|(key, op)| entry_bytes(key, op)).sum();
    if total <= limit {
        // The common case: one request, no copies.
        return Parts::One(Request::new(Ops { ops, seen }, total, waiter()));
    }
    let (epoch, mut decided) = match seen {
        Some(seen) if seen.decided.len() == ops.len() => {
            (seen.epoch, Some(seen.decided.into_iter()))
        }
        _ => (0, None),
    };
    let mut requests = Vec::new();
    let mut chunk = Vec::new();
    let mut chunk_decided = Vec::new();
    let mut bytes = 0;
    let has_seen = decided.is_some();
    let mut close =
        |chunk: &mut Vec<(Key, O)>, chunk_decided: &mut Vec<CallerDecision<O>>, bytes| {
            let seen = has_seen.then(|| Known {
                epoch,
                decided: std::mem::take(chunk_decided),
            });
            let ops = Ops {
                ops: std::mem::take(chunk),
                seen,
            };
            requests.push(Request::new(ops, bytes, waiter()));
        };
    for (key, op) in ops {
        let size = entry_bytes(&key, &op);
        if !chunk.is_empty() && bytes + size > limit {
            close(&mut chunk, &mut chunk_decided, bytes);
            bytes = 0;
        }
        bytes += size;
        chunk.push((key, op));
        if let Some(one) = decided.as_mut().and_then(Iterator::next) {
            chunk_decided.push(one);
        }
    }
    close(&mut chunk, &mut chunk_decided, bytes);
    Parts::Many(requests)
}

/// The requests a caller's operations were split into: almost always one.
enum Parts {
    One(Arc<Request>),
    Many(Vec<Arc<Request>>),
}

impl std::ops::Deref for Parts {
    type Target = [Arc<Request>];

    fn deref(&self) -> &Self::Target {
        match self {
            Parts::One(one) => std::slice::from_ref(one),
            Parts::Many(many) => many,
        }
    }
}

/// A future that resolves when its request has been answered.
///
/// Dropping it does not withdraw a request already queued: the operations may still be
/// committed.
pub(crate) struct CommitFuture<O: Kind> {
    shared: Arc<Shared>,
    state: FutureState<O>,
}

enum FutureState<O: Kind> {
    /// Waiting for room in the queue.
    Waiting(Option<Ops<O>>),
    /// Queued: the request's parts.
    Queued(Parts),
}

// Nothing of the future is pinned structurally: it only holds `Arc`s and the operations
// until they are queued.
impl<O: Kind> Unpin for CommitFuture<O> {}

impl<O: Kind + Unpin> Future for CommitFuture<O> {
    type Output = RequestResult<O::Outcome>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let FutureState::Waiting(ops) = &mut this.state {
            let mut queue = this.shared.queue.lock();
            if queue.tasks > 0 && queue.tasks >= this.shared.limits.queued_async {
                queue.room.push(cx.waker().clone());
                return Poll::Pending;
            }
            let Ops { ops, seen } = ops.take().unwrap_or(Ops {
                ops: Vec::new(),
                seen: None,
            });
            let requests = parts(ops, seen, this.shared.limits.batch_bytes, || {
                Waiter::Task(Mutex::new(Some(cx.waker().clone())))
            });
            queue.tasks += requests.len();
            for request in requests.iter() {
                queue.requests.push(Arc::clone(request));
            }
            wake_committer(&this.shared, queue);
            this.state = FutureState::Queued(requests);
        }
        let FutureState::Queued(requests) = &this.state else {
            return Poll::Pending;
        };
        let all_answered = |requests: &[Arc<Request>]| requests.iter().all(|r| r.is_answered());
        if all_answered(requests) {
            return Poll::Ready(collect::<O>(requests));
        }
        for request in requests.iter() {
            request.set_waker(cx.waker());
        }
        // An answer may have arrived between the first check and storing the waker.
        if all_answered(requests) {
            Poll::Ready(collect::<O>(requests))
        } else {
            Poll::Pending
        }
    }
}
