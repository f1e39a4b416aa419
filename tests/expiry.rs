//! `expire` by a caller, as the three situations it is for: a wrong stored response, a
//! data-deletion request, and reprocessing a message on purpose; and the settings of
//! per-operation retention.

use std::time::Duration;

use idemstore::{Error, LeaseLostReason, LiveLease, OpenError, RecordClass, Seen, Status};

use crate::common::{acquire, fp, key, replayed, Env, LEASE, RETENTION};

/// A wrong response was stored: expiring the key stops the replay, and the next request does
/// the work again under a newer token and stores the right one.
#[test]
fn a_wrong_stored_response_stops_being_replayed() {
    let env = Env::new();
    let store = env.open();
    let k = key("user-1", "POST /charges", "w1");
    let first = acquire(&store, &k, fp("amount=5"));
    store.complete(&first, b"500 oops".to_vec()).unwrap();
    assert_eq!(replayed(&store, &k, fp("amount=5")).result, b"500 oops");

    assert_eq!(store.expire(&k).unwrap(), Some(RecordClass::Completed));
    assert_eq!(store.get(&k).unwrap(), None);
    assert_eq!(store.expire(&k).unwrap(), None, "nothing left to expire");
    assert_eq!(store.stats().expired, 1, "one record expired");
    let second = acquire(&store, &k, fp("amount=5"));
    assert!(second.token() > first.token());
    assert_eq!(second.attempt(), 1, "a fresh acquisition, not a takeover");
    store.complete(&second, b"201 created".to_vec()).unwrap();
    drop(store);
    let store = env.open();
    assert_eq!(replayed(&store, &k, fp("amount=5")).result, b"201 created");
}

/// A live lease is refused with its end named (a worker is at it now); forced, the key is
/// taken from the holder, whose extend and complete answer `LeaseLost`, and whose release
/// deletes nothing (and answers `LeaseLost` once the key is acquired again).
#[test]
fn a_live_lease_is_refused_unless_forced_and_the_holder_is_fenced_off() {
    let env = Env::new();
    let store = env.open();
    let k = key("user-1", "POST /charges", "w2");
    let holder = acquire(&store, &k, fp("b"));

    let refused = store.expire(&k).unwrap_err();
    match &refused {
        Error::LeaseLive {
            key: got,
            lease_until,
        } => {
            assert_eq!(got, &k);
            assert_eq!(*lease_until, holder.lease_until());
        }
        other => panic!("expected LeaseLive, got {other:?}"),
    }
    let message = refused.to_string();
    assert!(message.contains("live lease until"), "{message}");
    assert!(message.contains("nothing was changed"), "{message}");
    assert!(matches!(
        store.get(&k).unwrap().unwrap().status(),
        Status::Pending { .. }
    ));

    assert_eq!(store.expire_forced(&k).unwrap(), Some(RecordClass::Pending));
    let gone = |result: Result<(), Error>| match result {
        Err(Error::LeaseLost { reason, .. }) => reason,
        other => panic!("expected LeaseLost, got {other:?}"),
    };
    assert_eq!(
        gone(store.extend(&holder).map(|_| ())),
        LeaseLostReason::Gone
    );
    // Release answers "nothing released" for an absent key, as after a sweep; it never
    // deletes anything but its own pending reservation.
    assert!(!store.release_if_pending(&holder).unwrap());
    let next = acquire(&store, &k, fp("b"));
    assert!(next.token() > holder.token());
    assert_eq!(
        gone(store.release_if_pending(&holder).map(|_| ())),
        LeaseLostReason::TakenOver {
            by_token: next.token()
        }
    );
    assert_eq!(
        gone(store.complete(&holder, b"late".to_vec())),
        LeaseLostReason::TakenOver {
            by_token: next.token()
        }
    );
    store.complete(&next, b"mine".to_vec()).unwrap();
    assert_eq!(replayed(&store, &k, fp("b")).result, b"mine");
}

/// A data-deletion request: every key of a user goes whatever its state (completed, in
/// progress, under review, stale, expired but not swept), in one commit, and stays gone after
/// a reopen; the file no longer holds the records.
#[test]
fn a_data_deletion_request_removes_every_state_durably() {
    let env = Env::new();
    let store = env.open();
    let user = |id: &str| key("user-9", "POST /charges", id);
    let review = acquire(&store, &user("review"), fp("b"));
    store.mark_needs_review(&review, "gateway timeout").unwrap();
    let old = acquire(&store, &user("old"), fp("b"));
    store.complete(&old, b"card 1111".to_vec()).unwrap();
    let _stale = acquire(&store, &user("stale"), fp("b"));
    env.advance(RETENTION); // "old" expires, unswept; "stale" lease ran out
    let _live = acquire(&store, &user("live"), fp("b"));
    let done = acquire(&store, &user("done"), fp("b"));
    store.complete(&done, b"card 4242".to_vec()).unwrap();
    let other = acquire(&store, &key("user-1", "POST /charges", "done"), fp("b"));
    store.complete(&other, b"keep".to_vec()).unwrap();

    let ids = ["done", "review", "old", "stale", "live", "never"];
    let keys: Vec<_> = ids.iter().map(|id| user(id)).collect();
    let answers = store.expire_many(&keys, LiveLease::Take).unwrap();
    let classes: Vec<_> = answers.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        classes,
        [
            Some(RecordClass::Completed),
            Some(RecordClass::NeedsReview),
            Some(RecordClass::Expired),
            Some(RecordClass::Stale),
            Some(RecordClass::Pending),
            None,
        ]
    );
    store.checkpoint().unwrap();
    drop(store);
    assert_eq!(
        env.raw_record_count(),
        1,
        "only the other user's key is left in the file"
    );
    let store = env.open();
    for k in &keys {
        assert_eq!(store.get(k).unwrap(), None);
    }
    assert_eq!(
        store
            .get(&key("user-1", "POST /charges", "done"))
            .unwrap()
            .unwrap()
            .token(),
        other.token()
    );
}

/// A batch refusing live leases answers each key alone: the live one is refused, the others
/// go in the same commit.
#[test]
fn expire_many_refuses_only_the_live_lease() {
    let env = Env::new();
    let store = env.open();
    let a = key("s", "op", "a");
    let b = key("s", "op", "b");
    let lease = acquire(&store, &a, fp("x"));
    store.complete(&lease, b"r".to_vec()).unwrap();
    let _live = acquire(&store, &b, fp("x"));
    let answers = store
        .expire_many(&[a.clone(), b.clone()], LiveLease::Refuse)
        .unwrap();
    assert!(matches!(answers[0], Ok(Some(RecordClass::Completed))));
    assert!(matches!(answers[1], Err(Error::LeaseLive { ref key, .. }) if *key == b));
    assert_eq!(store.get(&a).unwrap(), None);
    assert!(store.get(&b).unwrap().is_some());
    env.advance(LEASE);
    // Once the lease ran out the reservation is stale, and a plain expire removes it.
    assert_eq!(store.expire(&b).unwrap(), Some(RecordClass::Stale));
}

/// Reprocessing on purpose: a queue consumer's dedup entry is dropped, so the redelivered
/// message is new again; the async form from a tokio task.
#[test]
fn reprocessing_a_message_on_purpose() {
    let env = Env::new();
    let store = env.open();
    let message = key("orders-queue", "consume", "msg-7");
    let window = Duration::from_secs(300);
    assert_eq!(store.observe(&message, window).unwrap(), Seen::New);
    assert_eq!(store.observe(&message, window).unwrap(), Seen::Duplicate);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let removed = runtime
        .block_on(store.expire_async(&message, LiveLease::Refuse))
        .unwrap();
    assert_eq!(removed, Some(RecordClass::Completed));
    assert_eq!(store.observe(&message, window).unwrap(), Seen::New);
}

/// A per-call retention overrides the operation's; a bad per-operation setting is refused at
/// open with the operation named.
#[test]
fn retention_settings_per_operation_and_per_call() {
    let env = Env::new();
    let store = env
        .builder()
        .retention_for("export", Duration::from_secs(60))
        .open(&env.path)
        .unwrap();
    let k = key("s", "export", "e1");
    let lease = acquire(&store, &k, fp("x"));
    let done_at = env.now();
    store
        .complete_with_retention(&lease, b"link".to_vec(), Duration::from_secs(2))
        .unwrap();
    assert_eq!(
        replayed(&store, &k, fp("x")).expires_at,
        done_at + Duration::from_secs(2)
    );
    let k2 = key("s", "export", "e2");
    let lease = acquire(&store, &k2, fp("x"));
    store.complete(&lease, b"link".to_vec()).unwrap();
    assert_eq!(
        replayed(&store, &k2, fp("x")).expires_at,
        done_at + Duration::from_secs(60)
    );
    drop(store);

    for (operation, retention, needle) in [
        ("", Duration::from_secs(1), "1 to 255 bytes"),
        ("export", Duration::ZERO, "at least 1 ms"),
    ] {
        let err = env
            .builder()
            .retention_for(operation, retention)
            .open(&env.path)
            .unwrap_err();
        assert!(
            matches!(
                err,
                OpenError::InvalidConfig {
                    setting: "retention_for",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains(needle), "{err}");
    }
}
