//! Requests and their answers: what a caller queues (operations of one kind), the slot its
//! answer is delivered to, and the future an async caller awaits.

use std::sync::Arc;
use std::task::Waker;
use std::thread::Thread;

use parking_lot::Mutex;

use super::apply::Target;
use super::{Writer, Written};
use crate::decide::Operation;
use crate::error::Error;
use crate::key::Key;
use crate::record::{Millis, Record};

/// One result per operation of a request.
pub(crate) type Outcomes<T> = Vec<Result<T, Error>>;

/// The answer to a request: one result per operation, or an error for the whole batch.
pub(crate) type Answer<T> = Result<Outcomes<T>, Error>;

/// The states a caller read for its operations (one per operation, in order: `None` for an
/// absent key) at the start of a writer epoch ([`Overlay::epoch`](crate::engine::cache::Overlay::epoch)).
/// The writer decides against them instead of reading the keys again, unless the epoch has
/// ended since or the key changed in it.
#[derive(Debug)]
pub(crate) struct Known {
    pub(crate) epoch: u64,
    pub(crate) states: Vec<Option<Record>>,
}

/// A request's operations and what its caller saw of their keys.
pub(super) struct Ops<O> {
    pub(super) ops: Vec<(Key, O)>,
    pub(super) seen: Option<Known>,
}

/// One caller's queued operations (all of one kind) and the slot their answer is delivered
/// to.
pub(crate) struct Request<O: Operation> {
    pub(super) ops: Mutex<Ops<O>>,
    /// Payload bytes of the operations, for the batch limit.
    pub(super) bytes: usize,
    /// The decided outcomes, held until the batch's frame is durable.
    pub(super) staged: Mutex<Option<Outcomes<O::Outcome>>>,
    pub(super) answer: Mutex<Option<Answer<O::Outcome>>>,
    pub(super) waiter: Waiter,
}

pub(crate) enum Waiter {
    Thread(Thread),
    Task(Mutex<Option<Waker>>),
}

/// A queued request of any kind, as the committer and the syncer see it.
pub(crate) trait Queued: Send + Sync {
    /// Payload bytes, for the batch limit.
    fn bytes(&self) -> usize;
    fn waiter(&self) -> &Waiter;
    fn is_answered(&self) -> bool;
    /// Decides and applies the operations; their outcomes are staged until
    /// [`publish`](Queued::publish). Returns how many operations there were.
    fn apply(
        &self,
        writer: &mut Writer,
        tables: &mut dyn Target,
        now: Millis,
        written: &mut Vec<Written>,
    ) -> Result<usize, Error>;
    /// Answers with the staged outcomes (the batch is durable) and wakes the caller.
    fn publish(&self);
    /// Answers with an error for the whole request and wakes the caller.
    fn fail(&self, error: Error);
}

impl Waiter {
    pub(super) fn is_thread(&self) -> bool {
        matches!(self, Waiter::Thread(_))
    }

    pub(super) fn wake(&self) {
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
    pub(super) fn new(
        ops: Vec<(Key, O)>,
        seen: Option<Known>,
        bytes: usize,
        waiter: Waiter,
    ) -> Arc<Request<O>> {
        Arc::new(Request {
            ops: Mutex::new(Ops { ops, seen }),
            bytes,
            staged: Mutex::new(None),
            answer: Mutex::new(None),
            waiter,
        })
    }

    /// Wakes `waker` when the answer arrives (an async caller's latest waker).
    pub(super) fn set_waker(&self, waker: &Waker) {
        if let Waiter::Task(slot) = &self.waiter {
            *slot.lock() = Some(waker.clone());
        }
    }

    pub(super) fn finish(&self, answer: Answer<O::Outcome>) {
        *self.answer.lock() = Some(answer);
        self.waiter.wake();
    }

    pub(super) fn take_answer(&self) -> Option<Answer<O::Outcome>> {
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
        tables: &mut dyn Target,
        now: Millis,
        written: &mut Vec<Written>,
    ) -> Result<usize, Error> {
        let Ops { ops, seen } = std::mem::replace(
            &mut *self.ops.lock(),
            Ops {
                ops: Vec::new(),
                seen: None,
            },
        );
        let count = ops.len();
        // What the caller read is the state still, unless the epoch ended since (the writer
        // committed to redb and forgot its own changes); a key changed within the epoch is in
        // the writer's `latest`, which `Target::load_seen` looks at first.
        let mut seen: Vec<Option<Option<Record>>> = match seen {
            Some(seen)
                if seen.epoch == writer.engine.overlay.epoch() && seen.states.len() == count =>
            {
                seen.states.into_iter().map(Some).collect()
            }
            _ => Vec::new(),
        };
        let mut seen_at = |index: usize| seen.get_mut(index).and_then(Option::take);
        if count <= 1 {
            let mut outcomes = Vec::with_capacity(count);
            for (index, (key, op)) in ops.into_iter().enumerate() {
                let seen = seen_at(index);
                outcomes.push(writer.apply_seen(tables, key, op, seen, now, written)?);
            }
            *self.staged.lock() = Some(outcomes);
            return Ok(count);
        }
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
            outcomes[index] = Some(writer.apply_seen(tables, key, op, seen, now, written)?);
        }
        let outcomes = outcomes
            .into_iter()
            .map(|o| o.expect("every index applied"))
            .collect();
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
