//! Requests and their answers: what a caller queues (operations of one kind), the slot its
//! answer is delivered to, and the future an async caller awaits.

use std::sync::Arc;
use std::task::Waker;
use std::thread::Thread;

use parking_lot::Mutex;

use crate::decide::expire::Expire;
use crate::decide::op::{
    Complete, Extend, MarkNeedsReview, Observe, RecordStep, Release, Reserve, Resolve,
    WithRetention,
};
use crate::decide::Operation;
use crate::error::Error;
use crate::key::Key;
use crate::record::Record;

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

/// A queued request of any kind, as the committer, the writer and the syncer see it. It holds
/// data only: the writer takes the operations out ([`take`](Queued::take)), decides them
/// itself, and hands the outcomes back ([`stage`](Queued::stage)); nothing here calls the
/// writer.
pub(crate) trait Queued: Send + Sync {
    /// Payload bytes, for the batch limit.
    fn bytes(&self) -> usize;
    fn waiter(&self) -> &Waiter;
    fn is_answered(&self) -> bool;
    /// Moves the operations out (once), with what the caller read of their keys.
    fn take(&self) -> (Taken, Option<Known>);
    /// Holds the writer's outcomes until [`publish`](Queued::publish).
    fn stage(&self, decided: Decided);
    /// Answers with the staged outcomes (the batch is durable) and wakes the caller.
    fn publish(&self);
    /// Answers with an error for the whole request and wakes the caller.
    fn fail(&self, error: Error);
}

/// What decides the operations of a [`Taken`] request: the writer, for each kind of operation
/// in turn (`writer.rs`).
pub(crate) trait Decide {
    /// Decides `ops` in order; one outcome per operation, in the same order.
    fn decide<O: Operation>(&mut self, ops: Vec<(Key, O)>) -> Result<Outcomes<O::Outcome>, Error>;
}

/// One kind of operation a request can carry: how its operations and outcomes travel between
/// a [`Request`] and the writer without the writer knowing the request's type.
pub(crate) trait Kind: Operation + Sized {
    /// The operations, as the writer takes them (the same vector, not a copy).
    fn taken(ops: Vec<(Key, Self)>) -> Taken;
    /// The outcomes, if `decided` is of this kind.
    fn outcomes(decided: Decided) -> Option<Outcomes<Self::Outcome>>;
}

macro_rules! kinds {
    ($($name:ident: $op:ty,)*) => {
        /// A request's operations, moved out for the writer: one variant per kind.
        pub(crate) enum Taken {
            $($name(Vec<(Key, $op)>),)*
        }

        /// The writer's outcomes for a request, one per operation, in the request's order.
        pub(crate) enum Decided {
            $($name(Outcomes<<$op as Operation>::Outcome>),)*
        }

        impl Taken {
            /// Decides every operation with `decider`.
            pub(crate) fn decide(self, decider: &mut impl Decide) -> Result<Decided, Error> {
                Ok(match self {
                    $(Taken::$name(ops) => Decided::$name(decider.decide(ops)?),)*
                })
            }
        }

        impl Decided {
            /// How many operations were decided.
            pub(crate) fn len(&self) -> usize {
                match self {
                    $(Decided::$name(outcomes) => outcomes.len(),)*
                }
            }
        }

        $(impl Kind for $op {
            fn taken(ops: Vec<(Key, Self)>) -> Taken {
                Taken::$name(ops)
            }
            fn outcomes(decided: Decided) -> Option<Outcomes<Self::Outcome>> {
                match decided {
                    Decided::$name(outcomes) => Some(outcomes),
                    #[allow(unreachable_patterns)]
                    _ => None,
                }
            }
        })*
    };
}

kinds! {
    Reserve: Reserve,
    Complete: Complete,
    Release: Release,
    Extend: Extend,
    MarkNeedsReview: MarkNeedsReview,
    RecordStep: RecordStep,
    Resolve: Resolve,
    Observe: Observe,
    Expire: Expire,
    CompleteRetained: WithRetention<Complete>,
    ResolveRetained: WithRetention<Resolve>,
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

impl<O: Kind> Request<O> {
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

impl<O: Kind> Queued for Request<O> {
    fn bytes(&self) -> usize {
        self.bytes
    }

    fn waiter(&self) -> &Waiter {
        &self.waiter
    }

    fn is_answered(&self) -> bool {
        self.answer.lock().is_some()
    }

    fn take(&self) -> (Taken, Option<Known>) {
        let Ops { ops, seen } = std::mem::replace(
            &mut *self.ops.lock(),
            Ops {
                ops: Vec::new(),
                seen: None,
            },
        );
        (O::taken(ops), seen)
    }

    fn stage(&self, decided: Decided) {
        *self.staged.lock() = O::outcomes(decided);
    }

    fn publish(&self) {
        let outcomes = self.staged.lock().take().unwrap_or_default();
        self.finish(Ok(outcomes));
    }

    fn fail(&self, error: Error) {
        self.finish(Err(error));
    }
}
