//! The state machine: one pure function per operation that every path uses.
//!
//! [`decide`] takes the stored record (if any), an operation and the current time and returns
//! the change to store and the outcome to answer. It performs no I/O, so the single-operation
//! path, batches, `complete_with`, and a backend on another engine all apply exactly the same
//! transitions, and property tests check them against a plain reference model.
//!
//! This door holds the decision itself. Each operation is its own type with its own outcome
//! type ([`Operation::Outcome`]), its transitions beside it (`operations.rs`): a reserve can
//! only answer what a reserve answers, so the mapping from an outcome to the public answer
//! ([`answer`], which every backend uses) is total, with no "never happens" branch a caller
//! could reach. Expiry ([`expire`]) and the per-operation lease and retention ([`policy`])
//! have files of their own.

pub(crate) mod answer;
mod expire;
mod operations;
mod policy;

pub use operations::Resolution;
pub use operations::{
    Complete, Completion, Extend, MarkNeedsReview, Observe, RecordStep, Release, Reserve, Reserved,
    Resolve, WithRetention,
};

use crate::error::LeaseLostReason;
use crate::record::{Millis, Record, TokenFloor};

/// Times that shape every decision, fixed when the store is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// How long an acquisition owns a key before it goes stale.
    pub lease: Millis,
    /// How long a completed key (or an abandoned reservation past its lease) is kept.
    pub retention: Millis,
    /// Pending records under a lower token belong to an earlier owner of the file and are
    /// stale whatever their lease time says.
    pub floor: TokenFloor,
}

/// What to do to the stored record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Leave it as it is.
    Keep,
    /// Store this record in its place.
    Put(Record),
    /// Delete it.
    Delete,
}

/// The result of deciding one operation: the change to store and the outcome to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision<O> {
    /// What to do to the stored record.
    pub change: Change,
    /// What the operation answers.
    pub outcome: O,
    /// Whether `next_token` was used; the caller must then never hand it out again.
    pub used_token: bool,
}

impl<O> Decision<O> {
    /// An answer that changes nothing.
    pub fn answer(outcome: O) -> Decision<O> {
        Decision {
            change: Change::Keep,
            outcome,
            used_token: false,
        }
    }

    /// A change that does not use a new token.
    pub fn change(change: Change, outcome: O) -> Decision<O> {
        Decision {
            change,
            outcome,
            used_token: false,
        }
    }
}

/// One kind of operation a caller can ask for, and what it answers.
pub trait Operation: Send + 'static {
    /// What deciding this operation answers.
    type Outcome: Send + 'static;

    /// Decides the operation against `current`, which is not expired at `now`. `next_token`
    /// is the fencing token to give a new acquisition.
    fn decide_live(
        self,
        current: Option<Record>,
        now: Millis,
        policy: Policy,
        next_token: u64,
    ) -> Decision<Self::Outcome>;

    /// The bytes this operation adds to a log frame, beyond its key and record header.
    fn payload_len(&self) -> usize {
        0
    }

    /// Whether [`decide_live`](Operation::decide_live) is also given a record past its
    /// expiry (which every other operation sees as absent).
    const SEES_EXPIRED: bool = false;

    /// `outcome` handing out `token` instead of the token it was decided with. Only an
    /// outcome that carries the token it hands out (an acquisition's lease) changes.
    fn outcome_with_token(outcome: Self::Outcome, token: u64) -> Self::Outcome {
        let _ = token;
        outcome
    }
}

/// Decides `op` against `current` at time `now`.
///
/// A record past its `expires_at` reads as absent, so sweeping is invisible to callers: it only
/// reclaims space. `next_token` is the fencing token to give a new acquisition.
pub fn decide<O: Operation>(
    current: Option<Record>,
    op: O,
    now: Millis,
    policy: Policy,
    next_token: u64,
) -> Decision<O::Outcome> {
    let current = if O::SEES_EXPIRED {
        current
    } else {
        current.filter(|record| !record.is_expired(now))
    };
    op.decide_live(current, now, policy, next_token)
}

/// A decision made before the fencing token it hands out was known (by a caller, against
/// the state it read, with any token), handing out `token` instead. Deciding with `token`
/// gives the same decision: the token an operation is given appears only in the record it
/// stores and in the outcome, never in the choice between outcomes.
pub fn with_token<O: Operation>(
    decision: Decision<O::Outcome>,
    token: u64,
) -> Decision<O::Outcome> {
    if !decision.used_token {
        return decision;
    }
    let Decision {
        change, outcome, ..
    } = decision;
    let change = match change {
        Change::Put(record) => Change::Put(Record { token, ..record }),
        other => other,
    };
    Decision {
        change,
        outcome: O::outcome_with_token(outcome, token),
        used_token: true,
    }
}

// The operations, each with its own outcome type, and their transitions.

/// What an operation that names a lease answers when the lease no longer owns the key.
pub(crate) type LeaseOutcome<T> = Result<T, LeaseLostReason>;

pub use expire::Expire;
pub(crate) use expire::Expired;
pub(crate) use policy::Policies;
