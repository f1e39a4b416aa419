//! Requests and their results: what a caller queues (operations of one kind), what it decided
//! of them, and the slot its result is delivered to.

use std::sync::Arc;
use std::task::Waker;
use std::thread::Thread;

use parking_lot::Mutex;

use crate::decide::expire::Expire;
use crate::decide::op::{
    Complete, Extend, MarkNeedsReview, Observe, RecordStep, Release, Reserve, Resolve,
    WithRetention,
};
use crate::decide::{Decision, Operation};
use crate::error::Error;
use crate::key::Key;
use crate::tree::tables::IndexEntries;

/// One result per operation of a request.
pub(crate) type Outcomes<T> = Vec<Result<T, Error>>;

/// What a request gets back: one result per operation, or an error for the whole batch.
pub(crate) type RequestResult<T> = Result<Outcomes<T>, Error>;

/// What a caller decided for its operations (one per operation, in order) against the states
/// it read at the start of a writer epoch ([`Overlay::epoch`](crate::state::overlay::Overlay::epoch)).
/// The writer takes these decisions, giving each the token it hands out, instead of reading
/// the keys and deciding again, unless the epoch has ended since or the key changed in it.
pub(crate) struct Known<O: Operation> {
    pub(crate) epoch: u64,
    pub(crate) decided: Vec<CallerDecision<O>>,
}

/// One operation as its caller decided it, against the state it read.
pub(crate) struct CallerDecision<O: Operation> {
    /// Where the record read was indexed (`None`: absent).
    pub(crate) old: Option<IndexEntries>,
    /// Decided with a placeholder token ([`with_token`](crate::decide::with_token)).
    pub(crate) decision: Decision<O::Outcome>,
}

/// A request's operations and what its caller decided of them.
pub(crate) struct Ops<O: Operation> {
    pub(crate) ops: Vec<(Key, O)>,
    pub(crate) seen: Option<Known<O>>,
}

/// One caller's queued operations (all of one kind) and the slot their answer is delivered
/// to.
pub(crate) struct Request<O: Operation> {
    pub(super) ops: Mutex<Ops<O>>,
    /// Payload bytes of the operations, for the batch limit.
    pub(super) bytes: usize,
    /// The decided outcomes, held until the batch's frame is durable.
    pub(super) staged: Mutex<Option<Outcomes<O::Outcome>>>,
    pub(super) result: Mutex<Option<RequestResult<O::Outcome>>>,
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
    /// Moves the operations out (once), with what the caller decided of them.
    fn take(&self) -> Taken;
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
    fn decide<O: Operation>(&mut self, ops: Ops<O>) -> Result<Outcomes<O::Outcome>, Error>;
}

/// One kind of operation a request can carry: how its operations and outcomes travel between
/// a [`Request`] and the writer without the writer knowing the request's type.
pub(crate) trait Kind: Operation + Sized {
    /// The operations, as the writer takes them (the same vector, not a copy).
    fn taken(ops: Ops<Self>) -> Taken;
    /// The outcomes, if `decided` is of this kind.
    fn outcomes(decided: Decided) -> Option<Outcomes<Self::Outcome>>;
}

macro_rules! kinds {
    ($($name:ident: $op:ty,)*) => {
        /// A request's operations, moved out for the writer: one variant per kind.
        pub(crate) enum Taken {
            $($name(Ops<$op>),)*
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
            fn taken(ops: Ops<Self>) -> Taken {
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
    pub(super) fn new(ops: Ops<O>, bytes: usize, waiter: Waiter) -> Arc<Request<O>> {
        Arc::new(Request {
            ops: Mutex::new(ops),
            bytes,
            staged: Mutex::new(None),
            result: Mutex::new(None),
            waiter,
        })
    }

    /// Wakes `waker` when the answer arrives (an async caller's latest waker).
    pub(super) fn set_waker(&self, waker: &Waker) {
        if let Waiter::Task(slot) = &self.waiter {
            *slot.lock() = Some(waker.clone());
        }
    }

    pub(super) fn finish(&self, result: RequestResult<O::Outcome>) {
        *self.result.lock() = Some(result);
        self.waiter.wake();
    }

    pub(super) fn take_result(&self) -> Option<RequestResult<O::Outcome>> {
        self.result.lock().take()
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
        self.result.lock().is_some()
    }

    fn take(&self) -> Taken {
        let ops = std::mem::replace(
            &mut *self.ops.lock(),
            Ops {
                ops: Vec::new(),
                seen: None,
            },
        );
        O::taken(ops)
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
