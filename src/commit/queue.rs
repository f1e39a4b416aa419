//! The commit queue and the committer thread: callers queue requests, the first free
//! caller (or the committer thread, for async callers) leads the next batch.

use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::decide::Operation;
use crate::error::Error;
use crate::key::Key;

use super::request::{Answer, CommitFuture, Queued, Request, Waiter};
use super::{Syncer, Writer};
use crate::poison::error_copy;

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
    /// The most payload bytes one batch takes (see [`Limits`](crate::builder::Limits)).
    batch_bytes: usize,
}

/// Owns the committer thread.
pub(crate) struct Committer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Committer {
    pub(crate) fn start(writer: Writer, batch_bytes: usize) -> Result<Committer, Error> {
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
            batch_bytes,
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

    /// Queues `ops` as one or more requests, in order: each holds at most the batch limit of
    /// log entries (or one operation), so that no request, however large, makes a frame over
    /// the format's limit. Always at least one request, so an empty one is answered too.
    fn enqueue<O: Operation>(
        &self,
        ops: Vec<(Key, O)>,
        waiter: impl Fn() -> Waiter,
    ) -> Vec<Arc<Request<O>>> {
        let limit = self.shared.batch_bytes;
        let mut chunks = Vec::new();
        let mut chunk = Vec::new();
        let mut bytes = 0;
        for (key, op) in ops {
            let size = entry_bytes(&key, &op);
            if !chunk.is_empty() && bytes + size > limit {
                chunks.push((std::mem::take(&mut chunk), bytes));
                bytes = 0;
            }
            bytes += size;
            chunk.push((key, op));
        }
        chunks.push((chunk, bytes));
        let requests: Vec<_> = chunks
            .into_iter()
            .map(|(ops, bytes)| {
                Arc::new(Request {
                    bytes,
                    ops: Mutex::new(ops),
                    staged: Mutex::new(None),
                    answer: Mutex::new(None),
                    waiter: waiter(),
                })
            })
            .collect();
        let is_task = !requests[0].waiter.is_thread();
        let mut queue = self.shared.queue.lock();
        for request in &requests {
            queue.requests.push(Arc::clone(request) as Arc<dyn Queued>);
        }
        // A blocked caller leads its own batch (see `submit`); only async requests need the
        // committer thread.
        if is_task && queue.idle {
            queue.idle = false;
            self.shared.work.notify_one();
        }
        requests
    }

    /// Runs `ops` in the next batch and blocks until it is durable.
    ///
    /// The caller leads when the writer is free: it runs the queued batch (its own request
    /// and whatever else is queued) itself, then drives the sync, so a lone caller is answered
    /// without any hand-off between threads. Otherwise it waits to be answered, or to be woken
    /// to lead the next batch or run a sync.
    pub(crate) fn submit<O: Operation>(&self, ops: Vec<(Key, O)>) -> Answer<O::Outcome> {
        not_in_callback()?;
        let requests = self.enqueue(ops, || Waiter::Thread(thread::current()));
        let last = requests.last().expect("at least one request");
        loop {
            if requests.iter().all(|r| r.is_answered()) {
                return collect(&requests);
            }
            if let Some(mut writer) = self.shared.writer.try_lock() {
                let batch = take_batch(
                    &mut self.shared.queue.lock().requests,
                    self.shared.batch_bytes,
                );
                if !batch.is_empty() {
                    run_guarded(&self.shared, &mut writer, batch);
                }
                drop(writer);
                wake_next(&self.shared);
            }
            self.shared.syncer.drive(Some(&**last));
            if requests.iter().all(|r| r.is_answered()) {
                return collect(&requests);
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
            requests: self.enqueue(ops, || Waiter::Task(Mutex::new(None))),
        }
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
pub(super) fn collect<O: Operation>(requests: &[Arc<Request<O>>]) -> Answer<O::Outcome> {
    let mut outcomes = Vec::new();
    let mut failed = None;
    for request in requests {
        match request.take_answer().expect("every part is answered") {
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
            take_batch(&mut queue.requests, shared.batch_bytes)
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

/// Takes the oldest queued requests, up to `limit` bytes of payload (at least one).
fn take_batch(queue: &mut Vec<Arc<dyn Queued>>, limit: usize) -> Vec<Arc<dyn Queued>> {
    let mut bytes = 0;
    let count = queue
        .iter()
        .take_while(|r| {
            bytes += r.bytes();
            bytes <= limit
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
