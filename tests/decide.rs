//! The state machine's transitions (`src/decide/`), decided on records made through the
//! public `Record::new`.

use std::time::Duration;

use idemstore::whitebox::decide::{
    class, decide, with_token, Change, Complete, Completion, Decision, Expire, Extend,
    MarkNeedsReview, Observe, Policy, RecordStep, Release, Reserve, Reserved, Resolve, TokenFloor,
    WithRetention,
};
use idemstore::whitebox::{from_millis, Millis};
use idemstore::{Fingerprint, LeaseLostReason, Progress, Record, RecordClass, Resolution, Status};

const POLICY: Policy = Policy {
    lease: 1_000,
    retention: 10_000,
    floor: TokenFloor::NONE,
};
const NOW: Millis = 50_000;

fn fp() -> Fingerprint {
    Fingerprint::of(b"request")
}

/// A record of [`fp`] under `token`, expiring at `expires_at` (`None`: never).
fn record(token: u64, attempt: u32, expires_at: Option<Millis>, status: Status<'_>) -> Record {
    Record::new(fp(), token, attempt, expires_at.map(from_millis), status)
}

/// A pending record whose lease runs until `lease_until`, expiring a retention after it.
fn pending(token: u64, attempt: u32, lease_until: Millis) -> Record {
    pending_until(token, attempt, lease_until, lease_until + POLICY.retention)
}

/// A pending record whose lease runs until `lease_until`, expiring at `expires_at`.
fn pending_until(token: u64, attempt: u32, lease_until: Millis, expires_at: Millis) -> Record {
    let status = Status::Pending {
        lease_until: from_millis(lease_until),
        progress: None,
    };
    record(token, attempt, Some(expires_at), status)
}

fn completed(token: u64, expires_at: Millis) -> Record {
    let status = Status::Completed {
        result: b"ok",
        completed_at: from_millis(expires_at - POLICY.retention),
    };
    record(token, 1, Some(expires_at), status)
}

fn review(token: u64) -> Record {
    let status = Status::NeedsReview {
        note: "charge unknown",
        since: from_millis(NOW - 1),
    };
    record(token, 1, None, status)
}

fn reserve(current: Option<Record>) -> Decision<Reserved> {
    decide(current, Reserve { fingerprint: fp() }, NOW, POLICY, 42)
}

#[test]
fn absent_key_is_acquired_with_a_new_token() {
    let d = reserve(None);
    assert!(d.used_token);
    assert_eq!(
        d.outcome,
        Reserved::Acquired {
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
        Reserved::Acquired {
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
            Reserve {
                fingerprint: Fingerprint::of(b"other body"),
            },
            NOW,
            POLICY,
            42,
        );
        assert_eq!(d, Decision::answer(Reserved::Mismatch));
    }
}

#[test]
fn completed_within_retention_replays_the_result() {
    let d = reserve(Some(completed(7, NOW + 1)));
    assert_eq!(d.change, Change::Keep);
    assert!(!d.used_token);
    assert!(matches!(d.outcome, Reserved::Completed { ref result, .. } if result == b"ok"));
}

#[test]
fn live_lease_is_in_progress_with_time_left() {
    let d = reserve(Some(pending(7, 1, NOW + 300)));
    assert_eq!(
        d,
        Decision::answer(Reserved::InProgress {
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
        Reserved::Acquired {
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
    assert!(matches!(d.outcome, Reserved::Acquired { attempt: 1, .. }));
}

#[test]
fn needs_review_stays_until_resolved() {
    let d = reserve(Some(review(7)));
    assert_eq!(
        d,
        Decision::answer(Reserved::NeedsReview {
            note: "charge unknown".into()
        })
    );
}

#[test]
fn complete_by_owner_stores_result_for_retention() {
    let d = decide(
        Some(pending(7, 2, NOW + 10)),
        Complete {
            token: 7,
            result: b"done".to_vec(),
        },
        NOW,
        POLICY,
        42,
    );
    assert_eq!(d.outcome, Ok(Completion::Stored));
    let Change::Put(record) = d.change else {
        panic!("expected a put")
    };
    assert_eq!(
        record.expires_at(),
        Some(from_millis(NOW + POLICY.retention))
    );
    assert_eq!(record.attempt(), 2);
    assert_eq!(
        record.status(),
        Status::Completed {
            result: b"done",
            completed_at: from_millis(NOW),
        }
    );
}

#[test]
fn complete_after_own_lease_ran_out_but_not_taken_over_is_accepted() {
    let d = decide(
        Some(pending(7, 1, NOW - 1)),
        Complete {
            token: 7,
            result: vec![],
        },
        NOW,
        POLICY,
        42,
    );
    assert_eq!(d.outcome, Ok(Completion::Stored));
}

#[test]
fn old_owner_after_takeover_loses_every_operation() {
    let now_held = pending(9, 2, NOW + 10);
    let lost = LeaseLostReason::TakenOver { by_token: 9 };
    let held = || Some(now_held.clone());
    let complete = Complete {
        token: 7,
        result: vec![],
    };
    assert_eq!(
        decide(held(), complete, NOW, POLICY, 42),
        Decision::answer(Err(lost.clone()))
    );
    assert_eq!(
        decide(held(), Release { token: 7 }, NOW, POLICY, 42),
        Decision::answer(Err(lost.clone()))
    );
    assert_eq!(
        decide(held(), Extend { token: 7 }, NOW, POLICY, 42),
        Decision::answer(Err(lost.clone()))
    );
    let review = MarkNeedsReview {
        token: 7,
        note: String::new(),
    };
    assert_eq!(
        decide(held(), review, NOW, POLICY, 42),
        Decision::answer(Err(lost.clone()))
    );
}

#[test]
fn repeated_completion_by_same_lease_keeps_first_result() {
    let d = decide(
        Some(completed(7, NOW + 5)),
        Complete {
            token: 7,
            result: b"second".to_vec(),
        },
        NOW,
        POLICY,
        42,
    );
    assert_eq!(d, Decision::answer(Ok(Completion::AlreadyCompleted)));
    let extend = decide(
        Some(completed(7, NOW + 5)),
        Extend { token: 7 },
        NOW,
        POLICY,
        42,
    );
    assert_eq!(
        extend.outcome,
        Err(LeaseLostReason::Completed { by_token: 7 })
    );
}

#[test]
fn release_never_deletes_a_completed_key() {
    for token in [7, 8] {
        let d = decide(
            Some(completed(7, NOW + 5)),
            Release { token },
            NOW,
            POLICY,
            42,
        );
        assert_eq!(d, Decision::answer(Ok(false)));
    }
    let gone = decide(None, Release { token: 7 }, NOW, POLICY, 42);
    assert_eq!(gone, Decision::answer(Ok(false)));
}

#[test]
fn release_by_owner_deletes_pending() {
    let d = decide(
        Some(pending(7, 1, NOW + 5)),
        Release { token: 7 },
        NOW,
        POLICY,
        42,
    );
    assert_eq!(d.change, Change::Delete);
    assert_eq!(d.outcome, Ok(true));
}

#[test]
fn extend_moves_lease_and_expiry() {
    let d = decide(
        Some(pending(7, 1, NOW + 5)),
        Extend { token: 7 },
        NOW,
        POLICY,
        42,
    );
    assert_eq!(d.outcome, Ok(NOW + 1_000));
    assert_eq!(d.change, Change::Put(pending(7, 1, NOW + 1_000)));
}

#[test]
fn mark_needs_review_parks_the_key_forever() {
    let d = decide(
        Some(pending(7, 1, NOW + 5)),
        MarkNeedsReview {
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
    assert_eq!(record.expires_at(), None, "never");
    assert_eq!(
        class(&record, Millis::MAX - 1, POLICY.floor),
        RecordClass::NeedsReview
    );
}

#[test]
fn recovery_point_is_kept_by_extend_and_inherited_by_a_takeover() {
    let progress = Progress {
        step: 2,
        data: b"ch_1".to_vec(),
    };
    let d = decide(
        Some(pending(7, 1, NOW + 5)),
        RecordStep {
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
    let Change::Put(extended) = decide(Some(record), Extend { token: 7 }, NOW, POLICY, 42).change
    else {
        panic!("expected a put")
    };
    let stale_at = NOW + POLICY.lease;
    let takeover = decide(
        Some(extended),
        Reserve { fingerprint: fp() },
        stale_at,
        POLICY,
        43,
    );
    assert_eq!(
        takeover.outcome,
        Reserved::Acquired {
            token: 43,
            attempt: 2,
            lease_until: stale_at + POLICY.lease,
            progress: Some(progress),
        }
    );
    let lost = decide(
        Some(pending(9, 1, NOW + 5)),
        RecordStep {
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
    assert!(lost.outcome.is_err());
}

#[test]
fn observe_records_new_keys_for_the_window_only() {
    let first = decide(None, Observe { window: 300 }, NOW, POLICY, 42);
    assert!(first.outcome);
    let Change::Put(record) = first.change else {
        panic!("expected a put")
    };
    assert_eq!(record.expires_at(), Some(from_millis(NOW + 300)));
    let again = decide(
        Some(record.clone()),
        Observe { window: 300 },
        NOW + 299,
        POLICY,
        43,
    );
    assert_eq!(again, Decision::answer(false));
    let later = decide(Some(record), Observe { window: 300 }, NOW + 300, POLICY, 43);
    assert!(later.outcome);
}

#[test]
fn resolve_applies_only_to_review_or_stale() {
    let release = |record| decide(record, Resolve(Resolution::Release), NOW, POLICY, 42);
    assert_eq!(release(Some(review(7))).change, Change::Delete);
    assert_eq!(release(Some(pending(7, 1, NOW))).change, Change::Delete);
    assert!(release(Some(pending(7, 1, NOW + 1))).outcome.is_err());
    assert!(release(Some(completed(7, NOW + 1))).outcome.is_err());
    assert!(release(None).outcome.is_err());
    let d = decide(
        Some(review(7)),
        Resolve(Resolution::Complete(b"refunded".to_vec())),
        NOW,
        POLICY,
        42,
    );
    assert!(matches!(
        d.change,
        Change::Put(ref record) if matches!(record.status(), Status::Completed { .. })
    ));
}

#[test]
fn expire_deletes_every_settled_state_and_refuses_a_live_lease() {
    let plain = Expire { force: false };
    let cases = [
        (completed(7, NOW + 5), RecordClass::Completed),
        (review(7), RecordClass::NeedsReview),
        (pending(7, 1, NOW - 5), RecordClass::Stale),
        // Past its expiry but not swept: the bytes are deleted too.
        (completed(7, NOW), RecordClass::Expired),
    ];
    for (record, phase) in cases {
        let d = decide(Some(record), plain, NOW, POLICY, 42);
        assert_eq!(d, Decision::change(Change::Delete, Ok(Some(phase))));
    }
    assert_eq!(
        decide(None, plain, NOW, POLICY, 42),
        Decision::answer(Ok(None))
    );
    let live = pending(7, 1, NOW + 300);
    assert_eq!(
        decide(Some(live.clone()), plain, NOW, POLICY, 42),
        Decision::answer(Err(NOW + 300))
    );
    let forced = decide(Some(live), Expire { force: true }, NOW, POLICY, 42);
    assert_eq!(
        forced,
        Decision::change(Change::Delete, Ok(Some(RecordClass::Pending)))
    );
    assert!(!forced.used_token);
}

#[test]
fn the_holder_of_a_forced_expiry_has_lost_its_lease() {
    // After the delete, the old holder's token finds nothing, or a newer owner.
    let complete = Complete {
        token: 7,
        result: b"late".to_vec(),
    };
    let d = decide(None, complete.clone(), NOW, POLICY, 42);
    assert_eq!(d, Decision::answer(Err(LeaseLostReason::Gone)));
    let d = decide(Some(pending(42, 1, NOW + 300)), complete, NOW, POLICY, 43);
    assert_eq!(
        d,
        Decision::answer(Err(LeaseLostReason::TakenOver { by_token: 42 }))
    );
}

#[test]
fn a_retention_override_sets_the_completed_deadline() {
    let op = WithRetention {
        op: Complete {
            token: 7,
            result: b"ok".to_vec(),
        },
        retention: 123,
    };
    let d = decide(Some(pending(7, 1, NOW + 300)), op, NOW, POLICY, 42);
    let Change::Put(record) = d.change else {
        panic!("a completion is stored, got {:?}", d.change)
    };
    assert_eq!(record.expires_at(), Some(from_millis(NOW + 123)));
}

/// A store reopened after token 41 was handed out: tokens below 42 belong to a dead owner.
const REOPENED: Policy = Policy {
    floor: TokenFloor(42),
    ..POLICY
};

#[test]
fn a_lease_of_an_earlier_owner_is_stale_whatever_its_time() {
    let earlier = pending(41, 1, NOW + 300);
    let d = decide(
        Some(earlier.clone()),
        Reserve { fingerprint: fp() },
        NOW,
        REOPENED,
        42,
    );
    assert!(d.used_token);
    assert_eq!(
        d.outcome,
        Reserved::Acquired {
            token: 42,
            attempt: 2,
            lease_until: NOW + 1_000,
            progress: None,
        }
    );
    assert_eq!(class(&earlier, NOW, REOPENED.floor), RecordClass::Stale);
    let released = decide(
        Some(earlier.clone()),
        Resolve(Resolution::Release),
        NOW,
        REOPENED,
        43,
    );
    assert_eq!(released.change, Change::Delete);
    let expired = decide(Some(earlier), Expire { force: false }, NOW, REOPENED, 43);
    assert_eq!(expired.outcome, Ok(Some(RecordClass::Stale)));
}

#[test]
fn a_lease_of_the_current_owner_stays_live_above_the_floor() {
    let own = pending(42, 1, NOW + 300);
    assert_eq!(class(&own, NOW, REOPENED.floor), RecordClass::Pending);
    let d = decide(Some(own), Reserve { fingerprint: fp() }, NOW, REOPENED, 43);
    assert_eq!(
        d,
        Decision::answer(Reserved::InProgress {
            retry_after: Duration::from_millis(300),
            attempt: 1
        })
    );
}

#[test]
fn the_floor_leaves_settled_records_alone() {
    let reserve_at = |record| {
        decide(
            Some(record),
            Reserve { fingerprint: fp() },
            NOW,
            REOPENED,
            42,
        )
    };
    assert!(matches!(
        reserve_at(completed(3, NOW + 5)).outcome,
        Reserved::Completed { .. }
    ));
    assert!(matches!(
        reserve_at(review(3)).outcome,
        Reserved::NeedsReview { .. }
    ));
    // An earlier owner's token still fences: it cannot complete a key taken over since.
    let lost = decide(
        Some(pending(42, 2, NOW + 300)),
        Complete {
            token: 41,
            result: vec![],
        },
        NOW,
        REOPENED,
        43,
    );
    assert_eq!(
        lost.outcome,
        Err(LeaseLostReason::TakenOver { by_token: 42 })
    );
}

/// A caller decides a reserve or an observe before the writer knows the token it will hand
/// out; the writer then gives the decision its token ([`with_token`]) instead of deciding
/// again. That is the decision the writer would have made: on every kind of record, at every
/// moment around its lease and expiry, with the same and another fingerprint.
#[test]
fn a_decision_given_its_token_later_is_the_decision_made_with_it() {
    let mut records = vec![None];
    for at in [NOW - 2_000, NOW - 1, NOW, NOW + 1, NOW + 2_000] {
        records.push(Some(pending(7, 1, at)));
        records.push(Some(completed(7, at)));
        records.push(Some(pending_until(7, 2, at - POLICY.retention, at)));
    }
    records.push(Some(review(7)));
    // Token 7 is below the floor of a store reopened since (REOPENED): its lease is stale.
    for policy in [POLICY, REOPENED] {
        for record in &records {
            for fingerprint in [fp(), Fingerprint::of(b"another request")] {
                let op = Reserve { fingerprint };
                let early = decide(record.clone(), op, NOW, policy, 0);
                let late = with_token::<Reserve>(early, 42);
                assert_eq!(
                    late,
                    decide(record.clone(), op, NOW, policy, 42),
                    "{record:?}"
                );
            }
            let op = Observe { window: 5_000 };
            let early = decide(record.clone(), op, NOW, policy, 0);
            let late = with_token::<Observe>(early, 42);
            assert_eq!(
                late,
                decide(record.clone(), op, NOW, policy, 42),
                "{record:?}"
            );
        }
    }
}
