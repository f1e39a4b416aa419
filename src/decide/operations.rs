//! The operations, each its own type with its own outcome type ([`Operation::Outcome`]), and
//! their transitions: a reserve can only answer what a reserve answers.

use std::time::Duration;

use crate::error::LeaseLostReason;
use crate::fingerprint::Fingerprint;
use crate::record::{Millis, Progress, Record, RecordClass, State};

use super::{Change, Decision, LeaseOutcome, Operation, Policy};

/// `reserve(key, fingerprint)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserve {
    /// The fingerprint of the request.
    pub fingerprint: Fingerprint,
}

/// What a reserve answers, before the store adds the key to it.
///
/// It stays apart from the public [`Reservation`](crate::Reservation), variant for variant,
/// because deciding is pure: it knows no key (a [`Lease`](crate::Lease) carries one) and
/// counts time in [`Millis`] (the answers carry `SystemTime`). The store's mapping between
/// the two copies fields and converts times, nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserved {
    /// The caller owns the key now.
    Acquired {
        /// The fencing token handed out.
        token: u64,
        /// How many times the key has been acquired, this time included.
        attempt: u32,
        /// When the lease runs out.
        lease_until: Millis,
        /// The last recovery point of an earlier owner, inherited by a takeover.
        progress: Option<Progress>,
    },
    /// The key is completed: its result, to replay.
    Completed {
        /// The stored result.
        result: Vec<u8>,
        /// When it was completed.
        completed_at: Millis,
        /// When the record expires.
        expires_at: Millis,
        /// The attempt that completed it.
        attempt: u32,
    },
    /// Another caller's lease is live.
    InProgress {
        /// The time left on that lease.
        retry_after: Duration,
        /// That lease's attempt.
        attempt: u32,
    },
    /// The key is stored for another request (another fingerprint).
    Mismatch,
    /// The key is parked for a person.
    NeedsReview {
        /// The note left with it.
        note: String,
    },
}

impl Operation for Reserve {
    type Outcome = Reserved;

    fn outcome_with_token(outcome: Reserved, token: u64) -> Reserved {
        match outcome {
            Reserved::Acquired {
                attempt,
                lease_until,
                progress,
                ..
            } => Reserved::Acquired {
                token,
                attempt,
                lease_until,
                progress,
            },
            other => other,
        }
    }

    fn decide_live(
        self,
        current: Option<Record>,
        now: Millis,
        policy: Policy,
        next_token: u64,
    ) -> Decision<Reserved> {
        let fingerprint = self.fingerprint;
        let acquire = |attempt: u32, progress: Option<Progress>| {
            let lease_until = now.saturating_add(policy.lease);
            Decision {
                change: Change::Put(Record {
                    fingerprint,
                    token: next_token,
                    attempt,
                    expires_at: lease_until.saturating_add(policy.retention),
                    state: State::Pending {
                        lease_until,
                        progress: progress.clone(),
                    },
                }),
                outcome: Reserved::Acquired {
                    token: next_token,
                    attempt,
                    lease_until,
                    progress,
                },
                used_token: true,
            }
        };
        let Some(record) = current else {
            return acquire(1, None);
        };
        if record.fingerprint != fingerprint {
            return Decision::answer(Reserved::Mismatch);
        }
        let live = record.class(now, policy.floor) == RecordClass::Pending;
        match record.state {
            State::Completed {
                completed_at,
                result,
            } => Decision::answer(Reserved::Completed {
                result,
                completed_at,
                expires_at: record.expires_at,
                attempt: record.attempt,
            }),
            State::Pending { lease_until, .. } if live => Decision::answer(Reserved::InProgress {
                retry_after: Duration::from_millis(lease_until - now),
                attempt: record.attempt,
            }),
            // A takeover inherits the last recovery point, so the new owner resumes after it.
            State::Pending { progress, .. } => acquire(record.attempt.saturating_add(1), progress),
            State::NeedsReview { note, .. } => Decision::answer(Reserved::NeedsReview { note }),
        }
    }
}

/// `complete(lease, result)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Complete {
    /// The lease's fencing token.
    pub token: u64,
    /// The result to store.
    pub result: Vec<u8>,
}

/// A completion that took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// The result is stored.
    Stored,
    /// The same lease had already completed the key: the first result stays.
    AlreadyCompleted,
}

impl Operation for Complete {
    type Outcome = LeaseOutcome<Completion>;

    fn decide_live(
        self,
        current: Option<Record>,
        now: Millis,
        policy: Policy,
        _next_token: u64,
    ) -> Decision<Self::Outcome> {
        match &current {
            Some(r) if r.token == self.token && matches!(r.state, State::Completed { .. }) => {
                Decision::answer(Ok(Completion::AlreadyCompleted))
            }
            _ => with_own_lease(current, self.token, |record| {
                Decision::change(
                    Change::Put(completed(record, None, self.result, now, policy)),
                    Ok(Completion::Stored),
                )
            }),
        }
    }

    fn payload_len(&self) -> usize {
        self.result.len()
    }
}

/// `release_if_pending(lease)`; answers whether a pending reservation was deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// The lease's fencing token.
    pub token: u64,
}

impl Operation for Release {
    type Outcome = LeaseOutcome<bool>;

    fn decide_live(
        self,
        current: Option<Record>,
        _now: Millis,
        _policy: Policy,
        _next_token: u64,
    ) -> Decision<Self::Outcome> {
        match current {
            None => Decision::answer(Ok(false)),
            Some(Record {
                state: State::Completed { .. },
                ..
            }) => Decision::answer(Ok(false)),
            other => with_own_lease(other, self.token, |_| {
                Decision::change(Change::Delete, Ok(true))
            }),
        }
    }
}

/// `extend(lease)`; answers the new lease deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extend {
    /// The lease's fencing token.
    pub token: u64,
}

impl Operation for Extend {
    type Outcome = LeaseOutcome<Millis>;

    fn decide_live(
        self,
        current: Option<Record>,
        now: Millis,
        policy: Policy,
        _next_token: u64,
    ) -> Decision<Self::Outcome> {
        with_own_lease(current, self.token, |record| {
            let lease_until = now.saturating_add(policy.lease);
            let progress = match record.state {
                State::Pending { progress, .. } => progress,
                _ => None,
            };
            Decision::change(
                Change::Put(Record {
                    expires_at: lease_until.saturating_add(policy.retention),
                    state: State::Pending {
                        lease_until,
                        progress,
                    },
                    ..record
                }),
                Ok(lease_until),
            )
        })
    }
}

/// `mark_needs_review(lease, note)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkNeedsReview {
    /// The lease's fencing token.
    pub token: u64,
    /// The note for the person who resolves it.
    pub note: String,
}

impl Operation for MarkNeedsReview {
    type Outcome = LeaseOutcome<()>;

    fn decide_live(
        self,
        current: Option<Record>,
        now: Millis,
        _policy: Policy,
        _next_token: u64,
    ) -> Decision<Self::Outcome> {
        with_own_lease(current, self.token, |record| {
            Decision::change(
                Change::Put(Record {
                    expires_at: Millis::MAX,
                    state: State::NeedsReview {
                        since: now,
                        note: self.note,
                    },
                    ..record
                }),
                Ok(()),
            )
        })
    }

    fn payload_len(&self) -> usize {
        self.note.len()
    }
}

/// `record_step(lease, step, data)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordStep {
    /// The lease's fencing token.
    pub token: u64,
    /// The recovery point to record.
    pub progress: Progress,
}

impl Operation for RecordStep {
    type Outcome = LeaseOutcome<()>;

    fn decide_live(
        self,
        current: Option<Record>,
        now: Millis,
        _policy: Policy,
        _next_token: u64,
    ) -> Decision<Self::Outcome> {
        with_own_lease(current, self.token, |record| {
            let lease_until = record.lease_until().unwrap_or(now);
            Decision::change(
                Change::Put(Record {
                    state: State::Pending {
                        lease_until,
                        progress: Some(self.progress),
                    },
                    ..record
                }),
                Ok(()),
            )
        })
    }

    fn payload_len(&self) -> usize {
        self.progress.data.len()
    }
}

/// How an operator resolves a key marked for review or a stale reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// Store this result, as if the work had completed with it.
    Complete(Vec<u8>),
    /// Delete the key, so that the next request acquires it afresh.
    Release,
}

/// `resolve(key, resolution)`: an operator's action. Answers why not when the key cannot be
/// resolved. A completion takes a new token, so the holder whose stale reservation was
/// resolved gets "lease lost" if it tries to complete later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolve(pub Resolution);

impl Operation for Resolve {
    type Outcome = Result<(), &'static str>;

    fn decide_live(
        self,
        current: Option<Record>,
        now: Millis,
        policy: Policy,
        next_token: u64,
    ) -> Decision<Self::Outcome> {
        let record = match current {
            None => return Decision::answer(Err("the key is not stored")),
            Some(record) => record,
        };
        match record.class(now, policy.floor) {
            RecordClass::NeedsReview | RecordClass::Stale => {}
            RecordClass::Pending => {
                return Decision::answer(Err("its lease is live, the holder is still working"))
            }
            RecordClass::Completed => return Decision::answer(Err("the key is already completed")),
            // `decide` passes no expired record; one reads as absent.
            RecordClass::Expired => return Decision::answer(Err("the key is not stored")),
        }
        match self.0 {
            Resolution::Release => Decision::change(Change::Delete, Ok(())),
            Resolution::Complete(result) => Decision {
                change: Change::Put(completed(record, Some(next_token), result, now, policy)),
                outcome: Ok(()),
                used_token: true,
            },
        }
    }

    fn payload_len(&self) -> usize {
        match &self.0 {
            Resolution::Complete(result) => result.len(),
            Resolution::Release => 0,
        }
    }
}

/// `observe(key, window)`, the dedup window: records the key as seen for `window` if it is
/// not stored. Answers whether the key was new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observe {
    /// How long a new key is kept.
    pub window: Millis,
}

impl Operation for Observe {
    type Outcome = bool;

    fn decide_live(
        self,
        current: Option<Record>,
        now: Millis,
        _policy: Policy,
        next_token: u64,
    ) -> Decision<bool> {
        match current {
            Some(_) => Decision::answer(false),
            None => Decision {
                change: Change::Put(Record {
                    fingerprint: Fingerprint::default(),
                    token: next_token,
                    attempt: 1,
                    expires_at: now.saturating_add(self.window),
                    state: State::Completed {
                        completed_at: now,
                        result: Vec::new(),
                    },
                }),
                outcome: true,
                used_token: true,
            },
        }
    }
}

/// `record` completed with `result` at `now`, kept for the retention; under a new token when
/// one is given (an operator's resolution), else under the record's own.
fn completed(
    record: Record,
    token: Option<u64>,
    result: Vec<u8>,
    now: Millis,
    policy: Policy,
) -> Record {
    Record {
        token: token.unwrap_or(record.token),
        expires_at: now.saturating_add(policy.retention),
        state: State::Completed {
            completed_at: now,
            result,
        },
        ..record
    }
}

/// Runs `f` when `current` is pending under `token`; otherwise answers why the lease is lost.
fn with_own_lease<T>(
    current: Option<Record>,
    token: u64,
    f: impl FnOnce(Record) -> Decision<LeaseOutcome<T>>,
) -> Decision<LeaseOutcome<T>> {
    let reason = match current {
        None => LeaseLostReason::Gone,
        Some(record) => match record.state {
            State::Pending { .. } if record.token == token => return f(record),
            State::Pending { .. } => LeaseLostReason::TakenOver {
                by_token: record.token,
            },
            State::Completed { .. } => LeaseLostReason::Completed {
                by_token: record.token,
            },
            State::NeedsReview { .. } => LeaseLostReason::NeedsReview,
        },
    };
    Decision::answer(Err(reason))
}

/// Any operation, decided with its own retention instead of the key's (a per-call override:
/// [`Store::complete_with_retention`](crate::Store::complete_with_retention), an operator's
/// resolve with a retention).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WithRetention<O> {
    /// The operation.
    pub op: O,
    /// The retention it is decided with.
    pub retention: Millis,
}

impl<O: Operation> Operation for WithRetention<O> {
    type Outcome = O::Outcome;

    const SEES_EXPIRED: bool = O::SEES_EXPIRED;

    fn decide_live(
        self,
        current: Option<Record>,
        now: Millis,
        policy: Policy,
        next_token: u64,
    ) -> Decision<Self::Outcome> {
        let policy = Policy {
            retention: self.retention,
            ..policy
        };
        self.op.decide_live(current, now, policy, next_token)
    }

    fn payload_len(&self) -> usize {
        self.op.payload_len()
    }

    fn outcome_with_token(outcome: Self::Outcome, token: u64) -> Self::Outcome {
        O::outcome_with_token(outcome, token)
    }
}
