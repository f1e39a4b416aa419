//! The commit path: every write goes through here.
//!
//! Callers queue their operation and then either become the leader (the one holding the
//! writer) or wait. The leader takes everything queued, decides each operation against the
//! current state with [`decide`], applies the whole batch in one redb write transaction,
//! commits it, and only then answers every caller in the batch. When it is done it promotes
//! the oldest waiting caller, which leads the next batch. So concurrent callers share one
//! commit (and one fsync), and a caller never hears an answer before its batch is durable.
//!
//! Any failure of a write transaction poisons the store: the failing batch is answered with
//! the error and every later call is refused until the store is reopened.

use std::sync::{Arc, OnceLock};

use parking_lot::{Condvar, Mutex};
use redb::{Database, WriteTransaction};

use crate::clock::{to_millis, Clock};
use crate::decide::{decide, Op, Outcome, Policy};
use crate::error::Error;
use crate::key::Key;
use crate::record::Millis;
use crate::tables::{IndexEntries, Tables};

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

/// One caller's queued operation and the slot its answer is delivered to.
struct Request {
    key: Key,
    op: Mutex<Option<Op>>,
    slot: Mutex<Slot>,
    ready: Condvar,
}

enum Slot {
    Waiting,
    /// The previous leader finished and this caller should try to lead.
    Promoted,
    Done(Result<Outcome, Error>),
}

impl Request {
    fn finish(&self, result: Result<Outcome, Error>) {
        *self.slot.lock() = Slot::Done(result);
        self.ready.notify_one();
    }

    fn promote(&self) {
        let mut slot = self.slot.lock();
        if matches!(*slot, Slot::Waiting) {
            *slot = Slot::Promoted;
            self.ready.notify_one();
        }
    }

    /// Waits until answered or promoted; returns the answer if there is one.
    fn wait(&self) -> Option<Result<Outcome, Error>> {
        let mut slot = self.slot.lock();
        while matches!(*slot, Slot::Waiting) {
            self.ready.wait(&mut slot);
        }
        match std::mem::replace(&mut *slot, Slot::Waiting) {
            Slot::Done(result) => Some(result),
            Slot::Promoted | Slot::Waiting => None,
        }
    }

    fn take_done(&self) -> Option<Result<Outcome, Error>> {
        let mut slot = self.slot.lock();
        match std::mem::replace(&mut *slot, Slot::Waiting) {
            Slot::Done(result) => Some(result),
            other => {
                *slot = other;
                None
            }
        }
    }
}

/// Gathers concurrent callers' operations into shared write transactions.
pub(crate) struct Committer {
    queue: Mutex<Vec<Arc<Request>>>,
    writer: Mutex<Writer>,
}

impl Committer {
    pub(crate) fn new(writer: Writer) -> Committer {
        Committer {
            queue: Mutex::new(Vec::new()),
            writer: Mutex::new(writer),
        }
    }

    /// Runs `op` on `key` in the next batch and returns its outcome once the batch committed.
    pub(crate) fn submit(&self, key: Key, op: Op) -> Result<Outcome, Error> {
        let request = Arc::new(Request {
            key,
            op: Mutex::new(Some(op)),
            slot: Mutex::new(Slot::Waiting),
            ready: Condvar::new(),
        });
        self.queue.lock().push(Arc::clone(&request));
        loop {
            if let Some(mut writer) = self.writer.try_lock() {
                let batch = std::mem::take(&mut *self.queue.lock());
                if !batch.is_empty() {
                    writer.run_batch(&batch);
                }
                drop(writer);
                self.promote_next();
                // Holding the writer means our request was in this batch or an earlier one,
                // whose leader answered it before letting go of the writer.
                if let Some(result) = request.take_done() {
                    return result;
                }
            } else if let Some(result) = request.wait() {
                return result;
            }
        }
    }

    /// Runs `f` with the writer to itself (for work that is not a queued key operation:
    /// sweeps, and completions that carry the caller's own writes).
    pub(crate) fn with_writer<R>(&self, f: impl FnOnce(&mut Writer) -> R) -> R {
        let result = f(&mut self.writer.lock());
        self.promote_next();
        result
    }

    /// Wakes the oldest waiting caller so that it leads the next batch.
    fn promote_next(&self) {
        if let Some(head) = self.queue.lock().first() {
            head.promote();
        }
    }
}

/// The single writer: owns the database's write side and the fencing-token counter.
pub(crate) struct Writer {
    db: Arc<Database>,
    clock: Arc<dyn Clock>,
    policy: Policy,
    next_token: u64,
    poison: Arc<Poison>,
}

impl Writer {
    pub(crate) fn new(
        db: Arc<Database>,
        clock: Arc<dyn Clock>,
        policy: Policy,
        next_token: u64,
        poison: Arc<Poison>,
    ) -> Writer {
        Writer {
            db,
            clock,
            policy,
            next_token,
            poison,
        }
    }

    /// Runs `f` in one write transaction. `Ok(Ok(r))` commits; `Ok(Err(e))` rolls back and
    /// returns `e` (a refusal, such as a lost lease); an outer `Err` is a storage failure and
    /// poisons the store, as does a failed commit.
    pub(crate) fn transact<R>(
        &mut self,
        f: impl FnOnce(&mut Writer, &WriteTransaction, Millis) -> Result<Result<R, Error>, Error>,
    ) -> Result<R, Error> {
        self.poison.check()?;
        let token_before = self.next_token;
        match self.transact_inner(f) {
            Ok(value) => Ok(value),
            Err(Failure::Refused(error)) => {
                self.next_token = token_before;
                Err(error)
            }
            Err(Failure::Fatal(error)) => {
                self.poison.set(&error);
                Err(error)
            }
        }
    }

    fn transact_inner<R>(
        &mut self,
        f: impl FnOnce(&mut Writer, &WriteTransaction, Millis) -> Result<Result<R, Error>, Error>,
    ) -> Result<R, Failure> {
        let txn = self
            .db
            .begin_write()
            .map_err(|e| Failure::Fatal(Error::storage("starting a write transaction", e)))?;
        let now = to_millis(self.clock.now());
        let token_before = self.next_token;
        let value = match f(self, &txn, now) {
            Ok(Ok(value)) => value,
            Ok(Err(refusal)) => {
                txn.abort()
                    .map_err(|e| Failure::Fatal(Error::storage("rolling back a transaction", e)))?;
                return Err(Failure::Refused(refusal));
            }
            Err(fatal) => return Err(Failure::Fatal(fatal)),
        };
        if self.next_token != token_before {
            Tables::open(&txn)
                .and_then(|mut tables| tables.set_next_token(self.next_token))
                .map_err(Failure::Fatal)?;
        }
        txn.commit()
            .map_err(|e| Failure::Fatal(Error::storage("committing a write transaction", e)))?;
        Ok(value)
    }

    /// Decides and applies one operation inside an open transaction.
    ///
    /// The inner `Err` is an error for this operation alone (a corrupt record).
    pub(crate) fn apply(
        &mut self,
        tables: &mut Tables<'_>,
        key: &Key,
        op: Op,
        now: Millis,
    ) -> Result<Result<Outcome, Error>, Error> {
        let old = match tables.load(key.encoded())? {
            Ok(old) => old,
            Err(corrupt) => return Ok(Err(corrupt)),
        };
        let old_index = old.as_ref().map(IndexEntries::of);
        let decision = decide(old, op, now, self.policy, self.next_token);
        tables.apply(key.encoded(), old_index, &decision.change)?;
        if decision.used_token {
            self.next_token += 1;
        }
        Ok(Ok(decision.outcome))
    }

    fn run_batch(&mut self, batch: &[Arc<Request>]) {
        let result = self.transact(|writer, txn, now| {
            let mut tables = Tables::open(txn)?;
            let mut outcomes = Vec::with_capacity(batch.len());
            for request in batch {
                let op = request
                    .op
                    .lock()
                    .take()
                    .expect("a queued operation is taken by exactly one batch");
                outcomes.push(writer.apply(&mut tables, &request.key, op, now)?);
            }
            Ok(Ok(outcomes))
        });
        match result {
            Ok(outcomes) => {
                for (request, outcome) in batch.iter().zip(outcomes) {
                    request.finish(outcome);
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
}

/// Why a transaction did not commit.
enum Failure {
    /// The work refused (a lost lease, a failed callback): rolled back, store still healthy.
    Refused(Error),
    /// Storage failed: the store is poisoned.
    Fatal(Error),
}
