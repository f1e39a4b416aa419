//! What a reserve answers: the outcomes and the lease an acquisition hands out.

use std::fmt;
use std::time::{Duration, SystemTime};

use crate::key::Key;
use crate::record::Progress;

/// Ownership of a reserved key, returned by [`Reservation::Acquired`].
///
/// Pass it to [`complete`](crate::Store::complete), [`release_if_pending`](crate::Store::release_if_pending),
/// [`extend`](crate::Store::extend) or [`mark_needs_review`](crate::Store::mark_needs_review).
/// Each checks the lease's fencing token, so a holder whose reservation went stale and was
/// taken over can no longer change the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub(crate) key: Key,
    pub(crate) token: u64,
    pub(crate) attempt: u32,
    pub(crate) lease_until: SystemTime,
    pub(crate) progress: Option<Progress>,
}

impl Lease {
    /// The reserved key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The fencing token: it increases with every acquisition in the store and is never
    /// reused, also across restarts. Pass it to external systems that can reject stale writers.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// How many times this key has been acquired, this one included.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// True when an earlier attempt held this key and may have had side effects (its
    /// reservation went stale and was taken over). Check external systems before redoing work.
    pub fn is_retry(&self) -> bool {
        self.attempt > 1
    }

    /// When the lease runs out unless [`extend`](crate::Store::extend)ed.
    pub fn lease_until(&self) -> SystemTime {
        self.lease_until
    }

    /// The last recovery point recorded for this key, by this lease or by an earlier attempt
    /// whose reservation was taken over: resume the work after it.
    pub fn progress(&self) -> Option<&Progress> {
        self.progress.as_ref()
    }
}

/// A stored result, replayed to a duplicate request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Completed {
    /// The result stored by [`complete`](crate::Store::complete).
    pub result: Vec<u8>,
    /// When the key was completed.
    pub completed_at: SystemTime,
    /// When the result stops being replayed.
    pub expires_at: SystemTime,
    /// The attempt that completed it.
    pub attempt: u32,
}

/// The outcome of [`Store::reserve`](crate::Store::reserve). None of these are errors.
#[must_use = "a reservation says whether to do the work, replay a result or refuse"]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reservation {
    /// The caller owns the key and must do the work, then complete or release it.
    Acquired(Lease),
    /// The work was done before: replay this result (HTTP: the stored response).
    Completed(Completed),
    /// Another caller holds a live lease (HTTP 409 with `Retry-After`).
    InProgress {
        /// Time left on the holder's lease.
        retry_after: Duration,
        /// The holder's attempt number.
        attempt: u32,
    },
    /// The key was first used with a different request fingerprint: a client bug, not a
    /// retry (HTTP 422). Nothing was changed.
    Mismatch,
    /// The key is parked for a person; refused until resolved with
    /// [`Store::resolve`](crate::Store::resolve).
    NeedsReview {
        /// The note left when it was marked.
        note: String,
    },
}

/// The answer of [`Store::observe`](crate::Store::observe) (dedup window mode).
#[must_use = "a duplicate event must be skipped"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// First time within the window: process the event.
    New,
    /// Already seen within the window: skip it.
    Duplicate,
}

/// What [`Store::expire_many`](crate::Store::expire_many) and [`Store::expire_async`](crate::Store::expire_async) do with a key that a live lease
/// holds (a worker is doing the work now).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveLease {
    /// Leave it: the key's answer is [`Error::LeaseLive`](crate::Error::LeaseLive) naming the lease's end.
    Refuse,
    /// Take the key from the holder: its later complete and extend fail with
    /// [`Error::LeaseLost`](crate::Error::LeaseLost), and its fencing token is never handed out again.
    Take,
}

/// What a lease holder found in place of its own pending reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseLostReason {
    /// Another caller took the stale reservation over with a newer token.
    TakenOver {
        /// The token that now holds the key.
        by_token: u64,
    },
    /// The key is already completed (by this lease or another).
    Completed {
        /// The token of the lease that completed it.
        by_token: u64,
    },
    /// The key is parked for review.
    NeedsReview,
    /// The key is no longer stored: released, or expired and swept.
    Gone,
}

impl fmt::Display for LeaseLostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseLostReason::TakenOver { by_token } => {
                write!(f, "the reservation was taken over by token {by_token}")
            }
            LeaseLostReason::Completed { by_token } => {
                write!(f, "the key was already completed by token {by_token}")
            }
            LeaseLostReason::NeedsReview => f.write_str("the key is marked for review"),
            LeaseLostReason::Gone => f.write_str("the key is no longer reserved"),
        }
    }
}
