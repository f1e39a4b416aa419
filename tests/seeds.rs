//! The seed scenarios: the cases from the articles the project was conceived from (see
//! docs/DESIGN.md), each as one small story against a real store file and a manual clock.

use std::cell::Cell;
use std::time::Duration;

use idemstore::{Error, Fingerprint, Key, LeaseLostReason, Reservation, Resolution, Status, Store};

use crate::common::{acquire, fp, key, replayed, Env, LEASE, RETENTION};

/// What a request handler does with a reservation: the work runs only for an acquisition.
fn handle(store: &Store, key: &Key, body: &str, work: impl FnOnce() -> Vec<u8>) -> Vec<u8> {
    match store.reserve(key, fp(body)).expect("reserve") {
        Reservation::Acquired(lease) => {
            let result = work();
            store.complete(&lease, result.clone()).expect("complete");
            result
        }
        Reservation::Completed(done) => done.result,
        other => panic!("unexpected outcome {other:?}"),
    }
}

/// The operations of the per-operation variants: the store's default retention, one kept
/// longer and one much shorter ([`idemstore::Builder::retention_for`]).
const PER_OPERATION: [(&str, Duration); 3] = [
    ("POST /charges", RETENTION),
    ("POST /refunds", Duration::from_secs(7)),
    ("consume", Duration::from_secs(2)),
];

/// A store whose operations have the retentions of [`PER_OPERATION`].
fn open_per_operation(env: &Env) -> Store {
    let mut builder = env.builder();
    for (operation, retention) in PER_OPERATION.iter().skip(1) {
        builder.retention_for(operation, *retention);
    }
    builder.open(&env.path).expect("open the store")
}

/// The same request twice: the second gets the first's stored result and the work ran once.
#[test]
fn same_request_twice_replays_the_stored_result_and_runs_the_work_once() {
    let env = Env::new();
    same_request_twice(&env, &env.open(), "POST /charges", RETENTION);
}

/// The same story for operations with three different retentions in one store.
#[test]
fn same_request_twice_with_retentions_per_operation() {
    let env = Env::new();
    let store = open_per_operation(&env);
    for (operation, retention) in PER_OPERATION {
        same_request_twice(&env, &store, operation, retention);
    }
}

fn same_request_twice(env: &Env, store: &Store, operation: &str, retention: Duration) {
    let k = key("user-1", operation, "a1");
    let runs = Cell::new(0);
    let work = || {
        runs.set(runs.get() + 1);
        format!("charge #{} created", runs.get()).into_bytes()
    };

    let first = handle(store, &k, "amount=100", work);
    let completed_at = env.now();
    env.advance(Duration::from_millis(10));
    let second = handle(store, &k, "amount=100", work);

    assert_eq!(runs.get(), 1, "the work must run once");
    assert_eq!(first, b"charge #1 created");
    assert_eq!(second, first);

    let done = replayed(store, &k, fp("amount=100"));
    assert_eq!(done.result, first);
    assert_eq!(done.attempt, 1);
    assert_eq!(done.completed_at, completed_at);
    assert_eq!(done.expires_at, completed_at + retention, "{operation}");
}

/// A duplicate while the first request is still working: InProgress with the time left on
/// the holder's lease (never more than the lease), then the result once it completes.
#[test]
fn duplicate_while_in_progress_is_told_to_retry_within_the_lease() {
    let env = Env::new();
    let store = env.open();
    let k = key("user-1", "POST /charges", "a2");
    let lease = acquire(&store, &k, fp("body"));
    assert_eq!(lease.attempt(), 1);
    assert!(!lease.is_retry());
    assert_eq!(lease.lease_until(), env.now() + LEASE);

    // Checked at 0, 300 and 999 ms into the lease.
    for step_ms in [0, 300, 699] {
        env.advance(Duration::from_millis(step_ms));
        let left = lease.lease_until().duration_since(env.now()).unwrap();
        match store.reserve(&k, fp("body")).unwrap() {
            Reservation::InProgress {
                retry_after,
                attempt,
            } => {
                assert!(retry_after <= LEASE);
                assert_eq!(retry_after, left);
                assert_eq!(attempt, 1);
            }
            other => panic!("expected InProgress, got {other:?}"),
        }
    }
    assert_eq!(
        lease.lease_until().duration_since(env.now()).unwrap(),
        Duration::from_millis(1)
    );

    store.complete(&lease, b"done".to_vec()).unwrap();
    assert_eq!(replayed(&store, &k, fp("body")).result, b"done");
}

/// A retry after the retention ran out: the key is gone and is acquired afresh (attempt 1,
/// a new token); until the last millisecond of retention the result is still replayed.
#[test]
fn retry_after_retention_expired_acquires_afresh() {
    let env = Env::new();
    retry_after_retention(&env, &env.open(), "POST /charges", RETENTION);
}

/// The same story for operations with three different retentions in one store.
#[test]
fn retry_after_retention_expired_with_retentions_per_operation() {
    let env = Env::new();
    let store = open_per_operation(&env);
    for (operation, retention) in PER_OPERATION {
        retry_after_retention(&env, &store, operation, retention);
    }
}

fn retry_after_retention(env: &Env, store: &Store, operation: &str, retention: Duration) {
    let k = key("user-1", operation, "a3");
    let first = acquire(store, &k, fp("body"));
    store.complete(&first, b"old".to_vec()).unwrap();

    env.advance(retention - Duration::from_millis(1));
    assert_eq!(replayed(store, &k, fp("body")).result, b"old");
    assert!(store.get(&k).unwrap().is_some());

    env.advance(Duration::from_millis(1));
    assert_eq!(
        store.get(&k).unwrap(),
        None,
        "an expired key of {operation} reads as absent"
    );
    let second = acquire(store, &k, fp("body"));
    assert_eq!(second.attempt(), 1, "an expired key starts over");
    assert!(second.token() > first.token());
    assert!(matches!(
        store.get(&k).unwrap().unwrap().status(),
        Status::Pending { .. }
    ));
}

/// The same key with a different body is a client bug: Mismatch in every state, nothing is
/// changed, and the original request still gets its result.
#[test]
fn same_key_with_a_different_body_is_a_mismatch_and_changes_nothing() {
    let env = Env::new();
    let store = env.open();
    let k = key("user-1", "POST /charges", "a4");
    let lease = acquire(&store, &k, fp("amount=100"));

    // While pending.
    let before = store.get(&k).unwrap();
    assert_eq!(
        store.reserve(&k, fp("amount=999")).unwrap(),
        Reservation::Mismatch
    );
    assert_eq!(store.get(&k).unwrap(), before);

    // While stale: a mismatching request does not take the key over.
    env.advance(LEASE);
    assert_eq!(
        store.reserve(&k, fp("amount=999")).unwrap(),
        Reservation::Mismatch
    );
    assert_eq!(store.get(&k).unwrap(), before);

    // While completed.
    store.complete(&lease, b"charged 100".to_vec()).unwrap();
    let before = store.get(&k).unwrap();
    assert_eq!(
        store.reserve(&k, fp("amount=999")).unwrap(),
        Reservation::Mismatch
    );
    assert_eq!(store.get(&k).unwrap(), before);
    let done = replayed(&store, &k, fp("amount=100"));
    assert_eq!(done.result, b"charged 100");
    assert_eq!(
        store.get(&k).unwrap().unwrap().fingerprint(),
        fp("amount=100")
    );
}

/// A failed first attempt releases its key with `release_if_pending`: the failure is not
/// cached and the retry acquires the key again.
#[test]
fn failure_released_if_pending_is_not_cached() {
    let env = Env::new();
    let store = env.open();
    let k = key("user-1", "POST /charges", "a5");
    let first = acquire(&store, &k, fp("body"));
    assert!(store.release_if_pending(&first).unwrap());
    assert_eq!(store.get(&k).unwrap(), None);
    // Releasing again finds nothing to release.
    assert!(!store.release_if_pending(&first).unwrap());

    let retry = acquire(&store, &k, fp("body"));
    assert_eq!(retry.attempt(), 1, "a released key starts over");
    assert!(retry.token() > first.token());

    // The first lease no longer owns the key it released.
    match store.release_if_pending(&first) {
        Err(Error::LeaseLost { token, reason, .. }) => {
            assert_eq!(token, first.token());
            assert_eq!(
                reason,
                LeaseLostReason::TakenOver {
                    by_token: retry.token()
                }
            );
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    store
        .complete(&retry, b"second try worked".to_vec())
        .unwrap();
    assert_eq!(
        replayed(&store, &k, fp("body")).result,
        b"second try worked"
    );
}

/// Keys that differ only in scope (or operation, or where the part boundaries fall) never
/// share a reservation or a result: user A never gets user B's result.
#[test]
fn keys_differing_in_scope_never_share_results() {
    let env = Env::new();
    let store = env.open();
    let body = fp("same body");
    let keys = [
        key("user-a", "POST /charges", "k1"),
        key("user-b", "POST /charges", "k1"),
        key("user-a", "POST /refunds", "k1"),
        // Same concatenated bytes, different boundaries.
        key("a:b", "c", "x"),
        key("a", "b:c", "x"),
    ];
    let leases: Vec<_> = keys.iter().map(|k| acquire(&store, k, body)).collect();
    for (k, lease) in keys.iter().zip(&leases) {
        assert_eq!(lease.key(), k);
        store
            .complete(lease, format!("result of {k}").into_bytes())
            .unwrap();
    }
    for k in &keys {
        assert_eq!(
            replayed(&store, k, body).result,
            format!("result of {k}").into_bytes()
        );
    }
}

/// A stale lease is taken over (attempt 2, a bigger token) and the old owner's complete,
/// extend, release and mark_needs_review all fail with LeaseLost and change nothing.
#[test]
fn stale_lease_is_taken_over_and_the_old_owner_is_fenced_off() {
    let env = Env::new();
    let store = env.open();
    let k = key("user-1", "POST /charges", "a6");
    let old = acquire(&store, &k, fp("body"));
    env.advance(LEASE);
    let new = acquire(&store, &k, fp("body"));
    assert_eq!(new.attempt(), 2);
    assert!(new.is_retry());
    assert!(new.token() > old.token());
    assert_eq!(new.lease_until(), env.now() + LEASE);

    let before = store.get(&k).unwrap();
    let expect_lost = |result: Result<(), Error>, what: &str| match result {
        Err(
            ref err @ Error::LeaseLost {
                key: ref lost_key,
                token,
                ref reason,
            },
        ) => {
            assert_eq!(lost_key, &k, "{what}");
            assert_eq!(token, old.token(), "{what}");
            assert_eq!(
                reason,
                &LeaseLostReason::TakenOver {
                    by_token: new.token()
                },
                "{what}"
            );
            let message = err.to_string();
            assert!(message.contains(&k.to_string()), "{what}: {message}");
            assert!(
                message.contains(&new.token().to_string()),
                "{what}: {message}"
            );
        }
        other => panic!("{what}: expected LeaseLost, got {other:?}"),
    };
    expect_lost(store.complete(&old, b"late".to_vec()), "complete");
    expect_lost(store.extend(&old).map(drop), "extend");
    expect_lost(store.release_if_pending(&old).map(drop), "release");
    expect_lost(store.mark_needs_review(&old, "unsure"), "mark_needs_review");
    assert_eq!(
        store.get(&k).unwrap(),
        before,
        "the old owner changed nothing"
    );

    store.complete(&new, b"from attempt 2".to_vec()).unwrap();
    let done = replayed(&store, &k, fp("body"));
    assert_eq!(done.result, b"from attempt 2");
    assert_eq!(done.attempt, 2);
    expect_lost_completed(&store, &old, new.token());
}

fn expect_lost_completed(store: &Store, old: &idemstore::Lease, by: u64) {
    match store.complete(old, b"late".to_vec()) {
        Err(Error::LeaseLost { reason, .. }) => {
            assert_eq!(reason, LeaseLostReason::Completed { by_token: by })
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
}

/// An extended lease stays live past its first deadline; a lease that ran out but was not
/// taken over can still complete.
#[test]
fn extend_keeps_the_key_and_a_late_but_untaken_lease_still_completes() {
    let env = Env::new();
    let store = env.open();
    let k = key("user-1", "export", "e1");
    let lease = acquire(&store, &k, fp("body"));
    env.advance(LEASE - Duration::from_millis(1));
    let extended = store.extend(&lease).unwrap();
    assert_eq!(extended.token(), lease.token());
    assert_eq!(extended.lease_until(), env.now() + LEASE);
    env.advance(Duration::from_millis(500));
    assert!(matches!(
        store.reserve(&k, fp("body")).unwrap(),
        Reservation::InProgress { retry_after, attempt: 1 } if retry_after == Duration::from_millis(500)
    ));

    env.advance(LEASE);
    store.complete(&lease, b"late but fine".to_vec()).unwrap();
    assert_eq!(replayed(&store, &k, fp("body")).result, b"late but fine");
}

/// Release never deletes a completed key, whoever asks: the completion may have landed even
/// though its caller saw an error.
#[test]
fn release_never_deletes_a_completed_key() {
    let env = Env::new();
    let store = env.open();
    let k = key("user-1", "POST /charges", "a7");
    let old = acquire(&store, &k, fp("body"));
    env.advance(LEASE);
    let new = acquire(&store, &k, fp("body"));
    store.complete(&new, b"kept".to_vec()).unwrap();
    let before = store.get(&k).unwrap();

    assert!(!store.release_if_pending(&new).unwrap());
    assert!(!store.release_if_pending(&old).unwrap());
    assert_eq!(store.get(&k).unwrap(), before);
    assert_eq!(replayed(&store, &k, fp("body")).result, b"kept");

    // Completing again with the same lease is accepted and keeps the first result.
    store.complete(&new, b"second".to_vec()).unwrap();
    assert_eq!(replayed(&store, &k, fp("body")).result, b"kept");
}

/// A key marked for review refuses duplicates (and never expires) until an operator resolves
/// it, with a result or by releasing it.
#[test]
fn needs_review_refuses_duplicates_until_resolved() {
    let env = Env::new();
    let store = env.open();
    let paid = key("user-1", "POST /charges", "r1");
    let dropped = key("user-1", "POST /charges", "r2");
    for k in [&paid, &dropped] {
        let lease = acquire(&store, k, fp("body"));
        store
            .mark_needs_review(&lease, "gateway timed out")
            .unwrap();
        // The lease no longer owns the key.
        match store.complete(&lease, b"x".to_vec()) {
            Err(Error::LeaseLost { reason, .. }) => {
                assert_eq!(reason, LeaseLostReason::NeedsReview)
            }
            other => panic!("expected LeaseLost, got {other:?}"),
        }
    }
    env.advance(RETENTION * 10);
    for k in [&paid, &dropped] {
        assert_eq!(
            store.reserve(k, fp("body")).unwrap(),
            Reservation::NeedsReview {
                note: "gateway timed out".into()
            }
        );
        let record = store
            .get(k)
            .unwrap()
            .expect("a key under review never expires");
        assert_eq!(record.expires_at(), None);
        assert!(matches!(
            record.status(),
            Status::NeedsReview {
                note: "gateway timed out",
                ..
            }
        ));
    }
    assert_eq!(store.sweep(100).unwrap(), 0, "review keys are never swept");

    store
        .resolve(
            &paid,
            Resolution::Complete(b"charged, confirmed by hand".to_vec()),
        )
        .unwrap();
    let done = replayed(&store, &paid, fp("body"));
    assert_eq!(done.result, b"charged, confirmed by hand");
    assert_eq!(done.completed_at, env.now());

    store.resolve(&dropped, Resolution::Release).unwrap();
    assert_eq!(store.get(&dropped).unwrap(), None);
    let lease = acquire(&store, &dropped, fp("body"));
    assert_eq!(lease.attempt(), 1);

    // Neither a completed key, a live lease nor an absent key can be resolved.
    for (k, what) in [
        (&paid, "completed"),
        (&dropped, "live lease"),
        (&key("user-1", "POST /charges", "none"), "absent"),
    ] {
        let before = store.get(k).unwrap();
        match store.resolve(k, Resolution::Release) {
            Err(Error::NotResolvable { key: got, .. }) => assert_eq!(&got, k, "{what}"),
            other => panic!("{what}: expected NotResolvable, got {other:?}"),
        }
        assert_eq!(store.get(k).unwrap(), before, "{what}");
    }
}

/// `stale(limit)` lists the pending keys whose lease ran out (oldest lease first, at most
/// `limit`), not live, completed, reviewed or expired ones; a stale key can be resolved.
#[test]
fn stale_lists_pending_keys_whose_lease_ran_out() {
    let env = Env::new();
    let store = env.open();
    let oldest = key("s", "op", "oldest");
    let older = key("s", "op", "older");
    let done = key("s", "op", "done");
    let review = key("s", "op", "review");
    let live = key("s", "op", "live");

    let oldest_lease = acquire(&store, &oldest, fp("b"));
    env.advance(Duration::from_millis(100));
    acquire(&store, &older, fp("b"));
    let d = acquire(&store, &done, fp("b"));
    store.complete(&d, b"ok".to_vec()).unwrap();
    let r = acquire(&store, &review, fp("b"));
    store.mark_needs_review(&r, "?").unwrap();
    env.advance(LEASE - Duration::from_millis(100));
    assert_eq!(
        store
            .stale(10)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect::<Vec<_>>(),
        vec![oldest.clone()],
        "only the first lease has run out"
    );
    env.advance(Duration::from_millis(100));
    acquire(&store, &live, fp("b"));

    let stale = store.stale(10).unwrap();
    let keys: Vec<_> = stale.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(keys, vec![oldest.clone(), older.clone()]);
    let (_, record) = &stale[0];
    assert_eq!(record.token(), oldest_lease.token());
    assert_eq!(record.attempt(), 1);
    assert_eq!(
        record.status(),
        Status::Pending {
            lease_until: oldest_lease.lease_until(),
            progress: None,
        }
    );
    assert_eq!(store.stale(1).unwrap().len(), 1, "bounded by the limit");
    assert!(store.stale(0).unwrap().is_empty());

    // Recovering: one stale key completed by an operator, the other released.
    store
        .resolve(
            &oldest,
            Resolution::Complete(b"found at the gateway".to_vec()),
        )
        .unwrap();
    store.resolve(&older, Resolution::Release).unwrap();
    assert!(store.stale(10).unwrap().is_empty());
    assert_eq!(
        replayed(&store, &oldest, fp("b")).result,
        b"found at the gateway"
    );
    assert_eq!(acquire(&store, &older, fp("b")).attempt(), 1);

    // A reservation abandoned past lease + retention has expired and is no longer stale.
    env.advance(LEASE + RETENTION);
    assert!(store.stale(10).unwrap().is_empty());
}

/// `stale` lists a reservation as soon as its lease has run out, however recently it was
/// acknowledged (the commit path may not have flushed it to redb yet).
#[test]
fn stale_sees_a_reservation_just_acknowledged() {
    let env = Env::new();
    let store = env.open();
    let k = key("s", "op", "k");
    acquire(&store, &k, fp("b"));
    env.advance(LEASE);
    let listed: Vec<_> = store
        .stale(10)
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(listed, vec![k]);
}

/// `stale` does not list a key that was just released (a recovery worker would act on a key
/// that is no longer pending), even before the commit path has flushed the release to redb.
#[test]
fn stale_does_not_list_a_key_just_released() {
    let env = Env::new();
    let store = env.open();
    let k = key("s", "op", "k");
    let lease = acquire(&store, &k, fp("b"));
    // Let the committer flush the reservation to redb.
    std::thread::sleep(Duration::from_millis(50));
    env.advance(LEASE);
    assert!(store.release_if_pending(&lease).unwrap());
    let listed: Vec<_> = store
        .stale(10)
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(listed, vec![]);
}

/// `sweep(limit)` deletes expired keys, at most `limit` per call, never live ones; `get`
/// returns none of them and the file no longer holds them.
#[test]
fn sweep_deletes_expired_keys_bounded_by_limit() {
    let env = Env::new();
    let store = env.open();
    let expiring: Vec<Key> = (0..5)
        .map(|i| key("s", "op", &format!("old-{i}")))
        .collect();
    for k in &expiring {
        let lease = acquire(&store, k, fp("b"));
        store.complete(&lease, b"r".to_vec()).unwrap();
    }
    // An abandoned reservation expires at lease + retention.
    let abandoned = key("s", "op", "abandoned");
    acquire(&store, &abandoned, fp("b"));
    env.advance(RETENTION - Duration::from_millis(1));
    let fresh = key("s", "op", "fresh");
    let lease = acquire(&store, &fresh, fp("b"));
    store.complete(&lease, b"r".to_vec()).unwrap();
    assert_eq!(store.sweep(100).unwrap(), 0, "nothing has expired yet");

    env.advance(Duration::from_millis(1));
    for k in &expiring {
        assert_eq!(store.get(k).unwrap(), None);
    }
    assert_eq!(store.sweep(2).unwrap(), 2);
    assert_eq!(store.sweep(2).unwrap(), 2);
    assert_eq!(store.sweep(2).unwrap(), 1);
    assert_eq!(store.sweep(2).unwrap(), 0);
    assert!(store.get(&abandoned).unwrap().is_some());
    assert!(store.get(&fresh).unwrap().is_some());

    env.advance(LEASE);
    assert_eq!(store.get(&abandoned).unwrap(), None);
    assert_eq!(store.sweep(0).unwrap(), 0, "a zero limit deletes nothing");
    assert_eq!(store.sweep(10).unwrap(), 1);
    for k in expiring.iter().chain([&abandoned]) {
        assert_eq!(store.get(k).unwrap(), None);
    }
    assert_eq!(replayed(&store, &fresh, fp("b")).result, b"r");
    drop(store);
    assert_eq!(
        env.raw_record_count(),
        1,
        "only the fresh key is left in the file"
    );

    // A swept key is acquired afresh.
    let store = env.open();
    assert_eq!(acquire(&store, &expiring[0], fp("b")).attempt(), 1);
}

/// Keys of operations with different retentions, completed at the same moment, each expire at
/// their own deadline: `get`, `counts`, listing expired records and `sweep` all follow it.
#[test]
fn sweep_counts_and_listing_follow_each_keys_own_deadline() {
    let env = Env::new();
    let store = open_per_operation(&env);
    for (operation, _) in PER_OPERATION {
        let lease = acquire(&store, &key("s", operation, "k"), fp("b"));
        store.complete(&lease, b"r".to_vec()).unwrap();
    }
    let mut by_deadline = PER_OPERATION.to_vec();
    by_deadline.sort_by_key(|&(_, retention)| retention);
    let mut elapsed = Duration::ZERO;
    for (expired, (operation, retention)) in by_deadline.iter().enumerate() {
        env.advance(*retention - elapsed - Duration::from_millis(1));
        let counts = store.counts().unwrap();
        assert_eq!(
            counts.expired, expired as u64,
            "just before {operation} expires"
        );
        assert!(store.get(&key("s", operation, "k")).unwrap().is_some());
        env.advance(Duration::from_millis(1));
        elapsed = *retention;
        assert_eq!(store.get(&key("s", operation, "k")).unwrap(), None);
        let listed = store
            .scan(
                &idemstore::ScanFilter::of(idemstore::RecordClass::Expired),
                10,
            )
            .unwrap();
        let listed: Vec<&[u8]> = listed.iter().map(|(k, _)| k.operation()).collect();
        assert_eq!(listed.last(), Some(&operation.as_bytes()), "oldest first");
        assert_eq!(listed.len(), expired + 1);
    }
    assert_eq!(store.sweep(10).unwrap(), 3);
    assert_eq!(store.counts().unwrap().total(), 0);
}

/// Fencing tokens strictly increase with every acquisition, also across closing and
/// reopening the store, and also for takeovers and re-acquisitions of released keys.
#[test]
fn fencing_tokens_strictly_increase_across_reopen() {
    let env = Env::new();
    let mut tokens = Vec::new();
    let k = key("s", "op", "k");
    for round in 0..4 {
        let store = env.open();
        tokens.push(acquire(&store, &key("s", "op", &format!("r{round}")), fp("b")).token());
        // A takeover, a release and re-acquire on the same key.
        let first = match store.reserve(&k, fp("b")).unwrap() {
            Reservation::Acquired(lease) => lease,
            other => panic!("round {round}: expected to acquire, got {other:?}"),
        };
        tokens.push(first.token());
        env.advance(LEASE);
        let second = acquire(&store, &k, fp("b"));
        tokens.push(second.token());
        assert!(store.release_if_pending(&second).unwrap());
        drop(store);
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly increase: {tokens:?}"
    );
}

/// The stored record shows the fingerprint, token, attempt and expiry of each state.
#[test]
fn get_shows_the_record_of_each_state() {
    let env = Env::new();
    let store = env.open();
    let k = key("s", "op", "k");
    let body = Fingerprint::from_bytes([9; 32]);
    assert_eq!(store.get(&k).unwrap(), None);
    let lease = acquire(&store, &k, body);
    let record = store.get(&k).unwrap().unwrap();
    assert_eq!(record.fingerprint(), body);
    assert_eq!(record.token(), lease.token());
    assert_eq!(record.attempt(), 1);
    assert_eq!(record.expires_at(), Some(lease.lease_until() + RETENTION));
    env.advance(Duration::from_millis(20));
    store.complete(&lease, b"res".to_vec()).unwrap();
    let record = store.get(&k).unwrap().unwrap();
    assert_eq!(record.token(), lease.token());
    assert_eq!(record.expires_at(), Some(env.now() + RETENTION));
    assert_eq!(
        record.status(),
        Status::Completed {
            result: b"res",
            completed_at: env.now()
        }
    );
}

/// A worker's lease goes stale and an operator settles the key with `resolve(Complete)`: the
/// operator's result is stored under a new token, so when the slow worker then calls
/// `complete` it gets LeaseLost naming that token, and is not told that its result was
/// stored. The operator's result stays.
#[test]
fn complete_after_an_operator_resolved_the_key_is_lease_lost() {
    let env = Env::new();
    let store = env.open();
    let k = key("user-1", "charge", "slow");
    let lease = acquire(&store, &k, fp("b"));
    env.advance(LEASE);
    store
        .resolve(&k, Resolution::Complete(b"refunded by hand".to_vec()))
        .unwrap();
    let resolved = store.get(&k).unwrap().expect("stored").token();
    assert!(
        resolved > lease.token(),
        "the operator's result takes a new token"
    );
    let before = store.get(&k).unwrap();
    for (what, result) in [
        ("complete", store.complete(&lease, b"charged".to_vec())),
        ("extend", store.extend(&lease).map(drop)),
        ("mark_needs_review", store.mark_needs_review(&lease, "?")),
    ] {
        match result {
            Err(Error::LeaseLost { token, reason, .. }) => {
                assert_eq!(token, lease.token(), "{what}");
                assert_eq!(
                    reason,
                    LeaseLostReason::Completed { by_token: resolved },
                    "{what}"
                );
            }
            other => panic!("{what}: expected LeaseLost, got {other:?}"),
        }
    }
    // Releasing never deletes a completed key.
    assert!(!store.release_if_pending(&lease).unwrap());
    assert_eq!(store.get(&k).unwrap(), before);
    assert_eq!(replayed(&store, &k, fp("b")).result, b"refunded by hand");
}
