//! The state machine: one pure function that every path uses.
//!
//! [`decide`] takes the stored record (if any), an operation and the current time and returns
//! the change to store and the outcome to answer. It performs no I/O, so the single-operation
//! path, batches, and log replay after a crash all apply exactly the same transitions, and
//! property tests check it against a plain reference model.

use std::time::Duration;

use crate::error::LeaseLostReason;
use crate::fingerprint::Fingerprint;
use crate::record::{Millis, Record, State};
use crate::reservation::Progress;

/// Times that shape every decision, fixed when the store is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    /// How long an acquisition owns a key before it goes stale.
    pub(crate) lease: Millis,
    /// How long a completed key (or an abandoned reservation past its lease) is kept.
    pub(crate) retention: Millis,
}

/// What a caller asks for. Each variant but `Reserve` and `Resolve` names the caller's token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    Reserve {
        fingerprint: Fingerprint,
    },
    Complete {
        token: u64,
        result: Vec<u8>,
    },
    Release {
        token: u64,
    },
    Extend {
        token: u64,
    },
    MarkNeedsReview {
        token: u64,
        note: String,
    },
    RecordStep {
        token: u64,
        progress: Progress,
    },
    Resolve(Resolution),
    /// Dedup window: record the key as seen for `window` if it is not stored.
    Observe {
        window: Millis,
    },
}

impl Op {
    /// The bytes this operation adds to a log frame, beyond its key and record header.
    pub(crate) fn payload_len(&self) -> usize {
        match self {
            Op::Complete { result, .. } => result.len(),
            Op::MarkNeedsReview { note, .. } => note.len(),
            Op::RecordStep { progress, .. } => progress.data.len(),
            Op::Resolve(Resolution::Complete(result)) => result.len(),
            _ => 0,
        }
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

/// What to do to the stored record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    Keep,
    Put(Record),
    Delete,
}

/// The answer for the caller, before the store adds the key to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Acquired {
        token: u64,
        attempt: u32,
        lease_until: Millis,
        progress: Option<Progress>,
    },
    Completed {
        result: Vec<u8>,
        completed_at: Millis,
        expires_at: Millis,
        attempt: u32,
    },
    InProgress {
        retry_after: Duration,
        attempt: u32,
    },
    Mismatch,
    NeedsReview {
        note: String,
    },
    /// `complete`, `mark_needs_review` or `resolve` took effect.
    Done,
    /// `complete` by a lease that had already completed the key: the first result stays.
    AlreadyCompleted,
    /// `extend` took effect; the new lease deadline.
    Extended {
        lease_until: Millis,
    },
    /// `release_if_pending`: whether a pending reservation was deleted.
    Released(bool),
    LeaseLost(LeaseLostReason),
    NotResolvable(&'static str),
    /// `observe`: whether the key was new.
    Observed {
        new: bool,
    },
}

/// The result of [`decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision {
    pub(crate) change: Change,
    pub(crate) outcome: Outcome,
    /// Whether `next_token` was used; the caller must then never hand it out again.
    pub(crate) used_token: bool,
}

impl Decision {
    fn answer(outcome: Outcome) -> Decision {
        Decision {
            change: Change::Keep,
            outcome,
            used_token: false,
        }
    }
}

/// Decides `op` against `current` at time `now`.
///
/// A record past its `expires_at` reads as absent, so sweeping is invisible to callers: it only
/// reclaims space. `next_token` is the fencing token to give a new acquisition.
pub(crate) fn decide(
    current: Option<Record>,
    op: Op,
    now: Millis,
    policy: Policy,
    next_token: u64,
) -> Decision {
    let current = current.filter(|record| !record.is_expired(now));
    match op {
        Op::Reserve { fingerprint } => reserve(current, fingerprint, now, policy, next_token),
        Op::Complete { token, result } => match &current {
            Some(r) if r.token == token && matches!(r.state, State::Completed { .. }) => {
                Decision::answer(Outcome::AlreadyCompleted)
            }
            _ => with_own_lease(current, token, |record| Decision {
                change: Change::Put(completed(record, None, result, now, policy)),
                outcome: Outcome::Done,
                used_token: false,
            }),
        },
        Op::Release { token } => match current {
            None => Decision::answer(Outcome::Released(false)),
            Some(Record {
                state: State::Completed { .. },
                ..
            }) => Decision::answer(Outcome::Released(false)),
            other => with_own_lease(other, token, |_| Decision {
                change: Change::Delete,
                outcome: Outcome::Released(true),
                used_token: false,
            }),
        },
        Op::Extend { token } => with_own_lease(current, token, |record| {
            let lease_until = now.saturating_add(policy.lease);
            let progress = match record.state {
                State::Pending { progress, .. } => progress,
                _ => None,
            };
            Decision {
                change: Change::Put(Record {
                    expires_at: lease_until.saturating_add(policy.retention),
                    state: State::Pending {
                        lease_until,
                        progress,
                    },
                    ..record
                }),
                outcome: Outcome::Extended { lease_until },
                used_token: false,
            }
        }),
        Op::MarkNeedsReview { token, note } => with_own_lease(current, token, |record| Decision {
            change: Change::Put(Record {
                expires_at: Millis::MAX,
                state: State::NeedsReview { since: now, note },
                ..record
            }),
            outcome: Outcome::Done,
            used_token: false,
        }),
        Op::RecordStep { token, progress } => with_own_lease(current, token, |record| {
            let lease_until = record.lease_until().unwrap_or(now);
            Decision {
                change: Change::Put(Record {
                    state: State::Pending {
                        lease_until,
                        progress: Some(progress),
                    },
                    ..record
                }),
                outcome: Outcome::Done,
                used_token: false,
            }
        }),
        Op::Resolve(resolution) => resolve(current, resolution, now, policy, next_token),
        Op::Observe { window } => match current {
            Some(_) => Decision::answer(Outcome::Observed { new: false }),
            None => Decision {
                change: Change::Put(Record {
                    fingerprint: Fingerprint::default(),
                    token: next_token,
                    attempt: 1,
                    expires_at: now.saturating_add(window),
                    state: State::Completed {
                        completed_at: now,
                        result: Vec::new(),
                    },
                }),
                outcome: Outcome::Observed { new: true },
                used_token: true,
            },
        },
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

fn reserve(
    current: Option<Record>,
    fingerprint: Fingerprint,
    now: Millis,
    policy: Policy,
    next_token: u64,
) -> Decision {
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
            outcome: Outcome::Acquired {
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
        return Decision::answer(Outcome::Mismatch);
    }
    match record.state {
        State::Completed {
            completed_at,
            result,
        } => Decision::answer(Outcome::Completed {
            result,
            completed_at,
            expires_at: record.expires_at,
            attempt: record.attempt,
        }),
        State::Pending { lease_until, .. } if now < lease_until => {
            Decision::answer(Outcome::InProgress {
                retry_after: Duration::from_millis(lease_until - now),
                attempt: record.attempt,
            })
        }
        // A takeover inherits the last recovery point, so the new owner resumes after it.
        State::Pending { progress, .. } => acquire(record.attempt.saturating_add(1), progress),
        State::NeedsReview { note, .. } => Decision::answer(Outcome::NeedsReview { note }),
    }
}

/// Runs `f` when `current` is pending under `token`; otherwise answers why the lease is lost.
fn with_own_lease(
    current: Option<Record>,
    token: u64,
    f: impl FnOnce(Record) -> Decision,
) -> Decision {
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
    Decision::answer(Outcome::LeaseLost(reason))
}

/// An operator's resolution. A completion takes a new token, so the holder whose stale
/// reservation was resolved gets "lease lost" if it tries to complete later.
fn resolve(
    current: Option<Record>,
    resolution: Resolution,
    now: Millis,
    policy: Policy,
    next_token: u64,
) -> Decision {
    let record = match current {
        None => return Decision::answer(Outcome::NotResolvable("the key is not stored")),
        Some(record) => record,
    };
    match record.state {
        State::NeedsReview { .. } => {}
        State::Pending { lease_until, .. } if lease_until <= now => {}
        State::Pending { .. } => {
            return Decision::answer(Outcome::NotResolvable(
                "its lease is live, the holder is still working",
            ))
        }
        State::Completed { .. } => {
            return Decision::answer(Outcome::NotResolvable("the key is already completed"))
        }
    }
    match resolution {
        Resolution::Release => Decision {
            change: Change::Delete,
            outcome: Outcome::Done,
            used_token: false,
        },
        Resolution::Complete(result) => Decision {
            change: Change::Put(completed(record, Some(next_token), result, now, policy)),
            outcome: Outcome::Done,
            used_token: true,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: Policy = Policy {
        lease: 1_000,
        retention: 10_000,
    };
    const NOW: Millis = 50_000;

    fn fp() -> Fingerprint {
        Fingerprint::of(b"request")
    }

    fn pending(token: u64, attempt: u32, lease_until: Millis) -> Record {
        Record {
            fingerprint: fp(),
            token,
            attempt,
            expires_at: lease_until + POLICY.retention,
            state: State::Pending {
                lease_until,
                progress: None,
            },
        }
    }

    fn completed(token: u64, expires_at: Millis) -> Record {
        Record {
            fingerprint: fp(),
            token,
            attempt: 1,
            expires_at,
            state: State::Completed {
                completed_at: expires_at - POLICY.retention,
                result: b"ok".to_vec(),
            },
        }
    }

    fn review(token: u64) -> Record {
        Record {
            fingerprint: fp(),
            token,
            attempt: 1,
            expires_at: Millis::MAX,
            state: State::NeedsReview {
                since: NOW - 1,
                note: "charge unknown".into(),
            },
        }
    }

    fn reserve(current: Option<Record>) -> Decision {
        decide(current, Op::Reserve { fingerprint: fp() }, NOW, POLICY, 42)
    }

    #[test]
    fn absent_key_is_acquired_with_a_new_token() {
        let d = reserve(None);
        assert!(d.used_token);
        assert_eq!(
            d.outcome,
            Outcome::Acquired {
                token: 42,
                attempt: 1,
                lease_until: NOW + 1_000,
                progress: None,
            }
        );
        assert_eq!(d.change, Change::Put(pending(42, 1, NOW + 1_000)));
    }

    #[test]
    fn completed_past_retention_is_acquired_afresh() {
        let d = reserve(Some(completed(7, NOW)));
        assert!(matches!(
            d.outcome,
            Outcome::Acquired {
                token: 42,
                attempt: 1,
                ..
            }
        ));
    }

    #[test]
    fn fingerprint_mismatch_changes_nothing_in_any_state() {
        for record in [
            pending(7, 1, NOW + 5),
            pending(7, 1, NOW - 5),
            completed(7, NOW + 5),
            review(7),
        ] {
            let d = decide(
                Some(record),
                Op::Reserve {
                    fingerprint: Fingerprint::of(b"other body"),
                },
                NOW,
                POLICY,
                42,
            );
            assert_eq!(d, Decision::answer(Outcome::Mismatch));
        }
    }

    #[test]
    fn completed_within_retention_replays_the_result() {
        let d = reserve(Some(completed(7, NOW + 1)));
        assert_eq!(d.change, Change::Keep);
        assert!(!d.used_token);
        assert!(matches!(d.outcome, Outcome::Completed { ref result, .. } if result == b"ok"));
    }

    #[test]
    fn live_lease_is_in_progress_with_time_left() {
        let d = reserve(Some(pending(7, 1, NOW + 300)));
        assert_eq!(
            d,
            Decision::answer(Outcome::InProgress {
                retry_after: Duration::from_millis(300),
                attempt: 1
            })
        );
    }

    #[test]
    fn stale_lease_is_taken_over_with_next_attempt() {
        let d = reserve(Some(pending(7, 3, NOW)));
        assert!(d.used_token);
        assert_eq!(
            d.outcome,
            Outcome::Acquired {
                token: 42,
                attempt: 4,
                lease_until: NOW + 1_000,
                progress: None,
            }
        );
    }

    #[test]
    fn abandoned_pending_past_retention_reads_as_absent() {
        let record = pending(7, 3, NOW - POLICY.retention);
        let d = reserve(Some(record));
        assert!(matches!(d.outcome, Outcome::Acquired { attempt: 1, .. }));
    }

    #[test]
    fn needs_review_stays_until_resolved() {
        let d = reserve(Some(review(7)));
        assert_eq!(
            d,
            Decision::answer(Outcome::NeedsReview {
                note: "charge unknown".into()
            })
        );
    }

    #[test]
    fn complete_by_owner_stores_result_for_retention() {
        let d = decide(
            Some(pending(7, 2, NOW + 10)),
            Op::Complete {
                token: 7,
                result: b"done".to_vec(),
            },
            NOW,
            POLICY,
            42,
        );
        assert_eq!(d.outcome, Outcome::Done);
        let Change::Put(record) = d.change else {
            panic!("expected a put")
        };
        assert_eq!(record.expires_at, NOW + POLICY.retention);
        assert_eq!(record.attempt, 2);
        assert_eq!(
            record.state,
            State::Completed {
                completed_at: NOW,
                result: b"done".to_vec()
            }
        );
    }

    #[test]
    fn complete_after_own_lease_ran_out_but_not_taken_over_is_accepted() {
        let d = decide(
            Some(pending(7, 1, NOW - 1)),
            Op::Complete {
                token: 7,
                result: vec![],
            },
            NOW,
            POLICY,
            42,
        );
        assert_eq!(d.outcome, Outcome::Done);
    }

    #[test]
    fn old_owner_after_takeover_loses_every_operation() {
        let now_held = pending(9, 2, NOW + 10);
        let ops = [
            Op::Complete {
                token: 7,
                result: vec![],
            },
            Op::Release { token: 7 },
            Op::Extend { token: 7 },
            Op::MarkNeedsReview {
                token: 7,
                note: String::new(),
            },
        ];
        for op in ops {
            let d = decide(Some(now_held.clone()), op, NOW, POLICY, 42);
            assert_eq!(
                d,
                Decision::answer(Outcome::LeaseLost(LeaseLostReason::TakenOver {
                    by_token: 9
                }))
            );
        }
    }

    #[test]
    fn repeated_completion_by_same_lease_keeps_first_result() {
        let d = decide(
            Some(completed(7, NOW + 5)),
            Op::Complete {
                token: 7,
                result: b"second".to_vec(),
            },
            NOW,
            POLICY,
            42,
        );
        assert_eq!(d, Decision::answer(Outcome::AlreadyCompleted));
        let extend = decide(
            Some(completed(7, NOW + 5)),
            Op::Extend { token: 7 },
            NOW,
            POLICY,
            42,
        );
        assert_eq!(
            extend.outcome,
            Outcome::LeaseLost(LeaseLostReason::Completed { by_token: 7 })
        );
    }

    #[test]
    fn release_never_deletes_a_completed_key() {
        for token in [7, 8] {
            let d = decide(
                Some(completed(7, NOW + 5)),
                Op::Release { token },
                NOW,
                POLICY,
                42,
            );
            assert_eq!(d, Decision::answer(Outcome::Released(false)));
        }
        let gone = decide(None, Op::Release { token: 7 }, NOW, POLICY, 42);
        assert_eq!(gone, Decision::answer(Outcome::Released(false)));
    }

    #[test]
    fn release_by_owner_deletes_pending() {
        let d = decide(
            Some(pending(7, 1, NOW + 5)),
            Op::Release { token: 7 },
            NOW,
            POLICY,
            42,
        );
        assert_eq!(d.change, Change::Delete);
        assert_eq!(d.outcome, Outcome::Released(true));
    }

    #[test]
    fn extend_moves_lease_and_expiry() {
        let d = decide(
            Some(pending(7, 1, NOW + 5)),
            Op::Extend { token: 7 },
            NOW,
            POLICY,
            42,
        );
        assert_eq!(
            d.outcome,
            Outcome::Extended {
                lease_until: NOW + 1_000
            }
        );
        assert_eq!(d.change, Change::Put(pending(7, 1, NOW + 1_000)));
    }

    #[test]
    fn mark_needs_review_parks_the_key_forever() {
        let d = decide(
            Some(pending(7, 1, NOW + 5)),
            Op::MarkNeedsReview {
                token: 7,
                note: "x".into(),
            },
            NOW,
            POLICY,
            42,
        );
        let Change::Put(record) = d.change else {
            panic!("expected a put")
        };
        assert_eq!(record.expires_at, Millis::MAX);
        assert!(!record.is_expired(Millis::MAX - 1));
    }

    #[test]
    fn recovery_point_is_kept_by_extend_and_inherited_by_a_takeover() {
        let progress = Progress {
            step: 2,
            data: b"ch_1".to_vec(),
        };
        let d = decide(
            Some(pending(7, 1, NOW + 5)),
            Op::RecordStep {
                token: 7,
                progress: progress.clone(),
            },
            NOW,
            POLICY,
            42,
        );
        let Change::Put(record) = d.change else {
            panic!("expected a put")
        };
        let Change::Put(extended) =
            decide(Some(record), Op::Extend { token: 7 }, NOW, POLICY, 42).change
        else {
            panic!("expected a put")
        };
        let stale_at = NOW + POLICY.lease;
        let takeover = decide(
            Some(extended),
            Op::Reserve { fingerprint: fp() },
            stale_at,
            POLICY,
            43,
        );
        assert_eq!(
            takeover.outcome,
            Outcome::Acquired {
                token: 43,
                attempt: 2,
                lease_until: stale_at + POLICY.lease,
                progress: Some(progress),
            }
        );
        let lost = decide(
            Some(pending(9, 1, NOW + 5)),
            Op::RecordStep {
                token: 7,
                progress: Progress {
                    step: 1,
                    data: vec![],
                },
            },
            NOW,
            POLICY,
            42,
        );
        assert!(matches!(lost.outcome, Outcome::LeaseLost(_)));
    }

    #[test]
    fn observe_records_new_keys_for_the_window_only() {
        let first = decide(None, Op::Observe { window: 300 }, NOW, POLICY, 42);
        assert_eq!(first.outcome, Outcome::Observed { new: true });
        let Change::Put(record) = first.change else {
            panic!("expected a put")
        };
        assert_eq!(record.expires_at, NOW + 300);
        let again = decide(
            Some(record.clone()),
            Op::Observe { window: 300 },
            NOW + 299,
            POLICY,
            43,
        );
        assert_eq!(again, Decision::answer(Outcome::Observed { new: false }));
        let later = decide(
            Some(record),
            Op::Observe { window: 300 },
            NOW + 300,
            POLICY,
            43,
        );
        assert_eq!(later.outcome, Outcome::Observed { new: true });
    }

    #[test]
    fn resolve_applies_only_to_review_or_stale() {
        let release = |record| decide(record, Op::Resolve(Resolution::Release), NOW, POLICY, 42);
        assert_eq!(release(Some(review(7))).change, Change::Delete);
        assert_eq!(release(Some(pending(7, 1, NOW))).change, Change::Delete);
        assert!(matches!(
            release(Some(pending(7, 1, NOW + 1))).outcome,
            Outcome::NotResolvable(_)
        ));
        assert!(matches!(
            release(Some(completed(7, NOW + 1))).outcome,
            Outcome::NotResolvable(_)
        ));
        assert!(matches!(release(None).outcome, Outcome::NotResolvable(_)));
        let d = decide(
            Some(review(7)),
            Op::Resolve(Resolution::Complete(b"refunded".to_vec())),
            NOW,
            POLICY,
            42,
        );
        assert!(matches!(
            d.change,
            Change::Put(Record {
                state: State::Completed { .. },
                ..
            })
        ));
    }
}
