//! The requests the commit queue carries. A request is plain data: what a caller queues
//! (operations of one kind), what it decided of them, and the slot its result is delivered to.
//! The writer takes its operations out, decides them and stages their outcomes; the sync
//! publishes them and wakes the caller.

use std::sync::Arc;
use std::task::Waker;
use std::thread::Thread;

use parking_lot::Mutex;

use crate::decide::Expire;
use crate::decide::{
    Complete, Extend, MarkNeedsReview, Observe, RecordStep, Release, Reserve, Resolve,
    WithRetention,
};
use crate::decide::{Decision, Operation};
use crate::error::Error;
use crate::key::Key;
use crate::tree::IndexEntries;

/// One result per operation of a request.
pub(crate) type Outcomes<T> = Vec<Result<T, Error>>;

/// What a request gets back: one result per operation, or an error for the whole batch.
pub(crate) type RequestResult<T> = Result<Outcomes<T>, Error>;

/// What a caller decided for its operations (one per operation, in order) against the states
/// it read at the start of a writer epoch ([`Overlay::epoch`](crate::state::Overlay::epoch)).
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

/// One caller's queued operations and the slot their answer is delivered to: plain data.
/// The caller puts its operations in ([`Taken`], one variant per kind); the writer takes them
/// out ([`take`](Request::take)), decides them and stages the outcomes
/// ([`Decided`]); once the batch is durable the syncer publishes them and wakes the caller,
/// who takes its own kind of outcomes back ([`take_result`](Request::take_result)). Nothing
/// here calls the writer.
pub(crate) struct Request {
    ops: Mutex<Option<Taken>>,
    /// Payload bytes of the operations, for the batch limit.
    pub(super) bytes: usize,
    /// The decided outcomes, held until the batch's frame is durable.
    staged: Mutex<Option<Decided>>,
    /// The answer: the outcomes (`None`: the request had no operations), or an error for
    /// the whole request.
    result: Mutex<Option<Result<Option<Decided>, Error>>>,
    pub(super) waiter: Waiter,
}

pub(crate) enum Waiter {
    Thread(Thread),
    Task(Mutex<Option<Waker>>),
}

/// What decides the operations of a [`Taken`] request: the writer, for each kind of operation
/// in turn (`writer.rs`).
pub(crate) trait Decide {
    /// Decides `ops` in order; one outcome per operation, in the same order.
    fn decide<O: Operation>(&mut self, ops: Ops<O>) -> Result<Outcomes<O::Outcome>, Error>;
}

/// One kind of operation a request can carry: how its operations and outcomes travel in a
/// [`Request`], which holds every kind alike.
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

impl Request {
    pub(super) fn new<O: Kind>(ops: Ops<O>, bytes: usize, waiter: Waiter) -> Arc<Request> {
        Arc::new(Request {
            ops: Mutex::new(Some(O::taken(ops))),
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

    pub(super) fn is_answered(&self) -> bool {
        self.result.lock().is_some()
    }

    /// Moves the operations out (once), with what the caller decided of them.
    pub(super) fn take(&self) -> Option<Taken> {
        self.ops.lock().take()
    }

    /// Holds the writer's outcomes until [`publish`](Request::publish).
    pub(super) fn stage(&self, decided: Decided) {
        *self.staged.lock() = Some(decided);
    }

    /// Answers with the staged outcomes (the batch is durable) and wakes the caller.
    pub(super) fn publish(&self) {
        let staged = self.staged.lock().take();
        self.finish(Ok(staged));
    }

    /// Answers with an error for the whole request and wakes the caller.
    pub(super) fn fail(&self, error: Error) {
        self.finish(Err(error));
    }

    fn finish(&self, result: Result<Option<Decided>, Error>) {
        *self.result.lock() = Some(result);
        self.waiter.wake();
    }

    /// The answer, once there is one, as the outcomes of the request's kind `O`.
    pub(super) fn take_result<O: Kind>(&self) -> Option<RequestResult<O::Outcome>> {
        let result = self.result.lock().take()?;
        Some(result.map(|decided| {
            decided
                .map(|d| O::outcomes(d).expect("a request is answered in its own kind"))
                .unwrap_or_default()
        }))
    }
}
