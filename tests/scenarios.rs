//! The seed scenarios (the cases from the articles the project was conceived from, see
//! docs/DESIGN.md), each a small story on a manual clock. Written once against the
//! [`Reservations`] trait and run on both backends: each on its own local `Store` always, and
//! all of them on an etcd cluster under the `etcd` feature (one cluster, one key prefix per
//! scenario) and on PostgreSQL under the `postgres` feature (one server, one table per
//! scenario). The stories told on the local store alone, through its synchronous API and its
//! file (reopens, retentions per operation in one store, `get` of each state), are in
//! [`local`].

use std::time::{Duration, SystemTime};

use idemstore::{
    Error, Fingerprint, Key, Lease, LeaseLostReason, LiveLease, ManualClock, RecordClass,
    Reservation, Reservations, Resolution, Seen, Status,
};

use crate::common::{fp, key, LEASE, RETENTION};

/// What a scenario gets: a fresh store (nothing under its keys) and the clock it reads.
pub struct Ctx<'a, R> {
    pub store: &'a R,
    pub clock: &'a ManualClock,
}

impl<R: Reservations> Ctx<'_, R> {
    fn now(&self) -> SystemTime {
        self.clock.time()
    }

    fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    async fn acquire(&self, key: &Key, fingerprint: Fingerprint) -> Lease {
        match self.store.reserve(key, fingerprint).await.expect("reserve") {
            Reservation::Acquired(lease) => lease,
            other => panic!("expected to acquire {key}, got {other:?}"),
        }
    }

    async fn replayed(&self, key: &Key, fingerprint: Fingerprint) -> idemstore::Completed {
        match self.store.reserve(key, fingerprint).await.expect("reserve") {
            Reservation::Completed(done) => done,
            other => panic!("expected the stored result of {key}, got {other:?}"),
        }
    }

    async fn get(&self, key: &Key) -> Option<idemstore::Record> {
        self.store.get(key).await.expect("get")
    }

    /// What a request handler does: the work runs only for an acquisition.
    async fn handle(&self, key: &Key, body: &str, work: impl FnOnce() -> Vec<u8>) -> Vec<u8> {
        match self.store.reserve(key, fp(body)).await.expect("reserve") {
            Reservation::Acquired(lease) => {
                let result = work();
                self.store
                    .complete(&lease, result.clone())
                    .await
                    .expect("complete");
                result
            }
            Reservation::Completed(done) => done.result,
            other => panic!("unexpected outcome {other:?}"),
        }
    }
}

fn expect_lost<T: std::fmt::Debug>(result: Result<T, Error>, token: u64, reason: LeaseLostReason) {
    match result {
        Err(Error::LeaseLost {
            token: lost,
            reason: found,
            ..
        }) => {
            assert_eq!(lost, token);
            assert_eq!(found, reason);
        }
        other => panic!("expected LeaseLost ({reason}), got {other:?}"),
    }
}

pub async fn same_request_twice<R: Reservations>(c: Ctx<'_, R>) {
    let k = key("user-1", "POST /charges", "a1");
    let mut runs = 0;
    let first = c
        .handle(&k, "amount=100", || {
            runs += 1;
            b"charge #1".to_vec()
        })
        .await;
    let completed_at = c.now();
    c.advance(Duration::from_millis(10));
    let second = c
        .handle(&k, "amount=100", || {
            runs += 1;
            b"charge #2".to_vec()
        })
        .await;
    assert_eq!(runs, 1, "the work must run once");
    assert_eq!(second, first);
    let done = c.replayed(&k, fp("amount=100")).await;
    assert_eq!(done.result, b"charge #1");
    assert_eq!(done.attempt, 1);
    assert_eq!(done.completed_at, completed_at);
    assert_eq!(done.expires_at, completed_at + RETENTION);
}

pub async fn duplicate_while_in_progress<R: Reservations>(c: Ctx<'_, R>) {
    let k = key("user-1", "POST /charges", "a2");
    let lease = c.acquire(&k, fp("body")).await;
    assert_eq!((lease.attempt(), lease.is_retry()), (1, false));
    assert_eq!(lease.lease_until(), c.now() + LEASE);
    for step in [0, 300, 699] {
        c.advance(Duration::from_millis(step));
        let left = lease.lease_until().duration_since(c.now()).unwrap();
        match c.store.reserve(&k, fp("body")).await.unwrap() {
            Reservation::InProgress {
                retry_after,
                attempt,
            } => {
                assert_eq!((retry_after, attempt), (left, 1));
            }
            other => panic!("expected InProgress, got {other:?}"),
        }
    }
    c.store.complete(&lease, b"done".to_vec()).await.unwrap();
    assert_eq!(c.replayed(&k, fp("body")).await.result, b"done");
}

pub async fn retry_after_retention<R: Reservations>(c: Ctx<'_, R>) {
    let k = key("user-1", "POST /charges", "a3");
    let first = c.acquire(&k, fp("body")).await;
    c.store.complete(&first, b"old".to_vec()).await.unwrap();
    c.advance(RETENTION - Duration::from_millis(1));
    assert_eq!(c.replayed(&k, fp("body")).await.result, b"old");
    c.advance(Duration::from_millis(1));
    assert_eq!(c.get(&k).await, None, "an expired key reads as absent");
    let second = c.acquire(&k, fp("body")).await;
    assert_eq!(second.attempt(), 1, "an expired key starts over");
    assert!(second.token() > first.token());
}

pub async fn same_key_other_body<R: Reservations>(c: Ctx<'_, R>) {
    let k = key("user-1", "POST /charges", "a4");
    let lease = c.acquire(&k, fp("amount=100")).await;
    let before = c.get(&k).await;
    assert_eq!(
        c.store.reserve(&k, fp("amount=999")).await.unwrap(),
        Reservation::Mismatch
    );
    c.advance(LEASE);
    // Stale: a mismatching request does not take the key over.
    assert_eq!(
        c.store.reserve(&k, fp("amount=999")).await.unwrap(),
        Reservation::Mismatch
    );
    assert_eq!(c.get(&k).await, before);
    c.store
        .complete(&lease, b"charged 100".to_vec())
        .await
        .unwrap();
    assert_eq!(
        c.store.reserve(&k, fp("amount=999")).await.unwrap(),
        Reservation::Mismatch
    );
    assert_eq!(
        c.replayed(&k, fp("amount=100")).await.result,
        b"charged 100"
    );
}

pub async fn released_failure_is_not_cached<R: Reservations>(c: Ctx<'_, R>) {
    let k = key("user-1", "POST /charges", "a5");
    let first = c.acquire(&k, fp("body")).await;
    assert!(c.store.release_if_pending(&first).await.unwrap());
    assert_eq!(c.get(&k).await, None);
    assert!(!c.store.release_if_pending(&first).await.unwrap());
    let retry = c.acquire(&k, fp("body")).await;
    assert_eq!(retry.attempt(), 1, "a released key starts over");
    assert!(retry.token() > first.token());
    let by_token = retry.token();
    expect_lost(
        c.store.release_if_pending(&first).await,
        first.token(),
        LeaseLostReason::TakenOver { by_token },
    );
    c.store
        .complete(&retry, b"second try".to_vec())
        .await
        .unwrap();
    assert_eq!(c.replayed(&k, fp("body")).await.result, b"second try");
}

pub async fn scopes_never_share<R: Reservations>(c: Ctx<'_, R>) {
    let keys = [
        key("user-a", "POST /charges", "k1"),
        key("user-b", "POST /charges", "k1"),
        key("user-a", "POST /refunds", "k1"),
        key("a:b", "c", "x"),
        key("a", "b:c", "x"),
    ];
    for k in &keys {
        let lease = c.acquire(k, fp("same body")).await;
        assert_eq!(lease.key(), k);
        c.store
            .complete(&lease, format!("result of {k}").into_bytes())
            .await
            .unwrap();
    }
    for k in &keys {
        let result = c.replayed(k, fp("same body")).await.result;
        assert_eq!(result, format!("result of {k}").into_bytes());
    }
}

pub async fn takeover_fences_the_old_owner<R: Reservations>(c: Ctx<'_, R>) {
    let k = key("user-1", "POST /charges", "a6");
    let old = c.acquire(&k, fp("body")).await;
    c.advance(LEASE);
    let new = c.acquire(&k, fp("body")).await;
    assert_eq!((new.attempt(), new.is_retry()), (2, true));
    assert!(new.token() > old.token());
    let before = c.get(&k).await;
    let taken = LeaseLostReason::TakenOver {
        by_token: new.token(),
    };
    expect_lost(
        c.store.complete(&old, b"late".to_vec()).await,
        old.token(),
        taken.clone(),
    );
    expect_lost(c.store.extend(&old).await, old.token(), taken.clone());
    expect_lost(
        c.store.release_if_pending(&old).await,
        old.token(),
        taken.clone(),
    );
    expect_lost(
        c.store.mark_needs_review(&old, "unsure").await,
        old.token(),
        taken,
    );
    assert_eq!(c.get(&k).await, before, "the old owner changed nothing");
    c.store
        .complete(&new, b"from attempt 2".to_vec())
        .await
        .unwrap();
    let done = c.replayed(&k, fp("body")).await;
    assert_eq!(
        (done.result.as_slice(), done.attempt),
        (&b"from attempt 2"[..], 2)
    );
    let completed = LeaseLostReason::Completed {
        by_token: new.token(),
    };
    expect_lost(
        c.store.complete(&old, b"late".to_vec()).await,
        old.token(),
        completed,
    );
}

pub async fn release_never_deletes_completed<R: Reservations>(c: Ctx<'_, R>) {
    let k = key("user-1", "POST /charges", "a7");
    let old = c.acquire(&k, fp("body")).await;
    c.advance(LEASE);
    let new = c.acquire(&k, fp("body")).await;
    c.store.complete(&new, b"kept".to_vec()).await.unwrap();
    let before = c.get(&k).await;
    assert!(!c.store.release_if_pending(&new).await.unwrap());
    assert!(!c.store.release_if_pending(&old).await.unwrap());
    assert_eq!(c.get(&k).await, before);
    // Completing again with the same lease keeps the first result.
    c.store.complete(&new, b"second".to_vec()).await.unwrap();
    assert_eq!(c.replayed(&k, fp("body")).await.result, b"kept");
}

pub async fn extend_keeps_the_key<R: Reservations>(c: Ctx<'_, R>) {
    let k = key("user-1", "export", "e1");
    let lease = c.acquire(&k, fp("body")).await;
    c.advance(LEASE - Duration::from_millis(1));
    let extended = c.store.extend(&lease).await.unwrap();
    assert_eq!(extended.token(), lease.token());
    assert_eq!(extended.lease_until(), c.now() + LEASE);
    c.advance(Duration::from_millis(500));
    assert!(matches!(
        c.store.reserve(&k, fp("body")).await.unwrap(),
        Reservation::InProgress { retry_after, attempt: 1 } if retry_after == Duration::from_millis(500)
    ));
}

pub async fn needs_review_until_resolved<R: Reservations>(c: Ctx<'_, R>) {
    let k = key("user-1", "POST /charges", "r1");
    let lease = c.acquire(&k, fp("body")).await;
    c.store
        .mark_needs_review(&lease, "gateway timed out")
        .await
        .unwrap();
    c.advance(RETENTION * 3);
    assert_eq!(
        c.store.reserve(&k, fp("body")).await.unwrap(),
        Reservation::NeedsReview {
            note: "gateway timed out".into()
        }
    );
    assert_eq!(
        c.store.sweep(100).await.unwrap(),
        0,
        "a key under review never expires"
    );
    c.store
        .resolve(&k, Resolution::Complete(b"refunded".to_vec()))
        .await
        .unwrap();
    let done = c.replayed(&k, fp("body")).await;
    assert_eq!(done.result, b"refunded");
    let token = c.get(&k).await.unwrap().token();
    assert!(
        token > lease.token(),
        "an operator's completion takes a new token"
    );
    match c.store.resolve(&k, Resolution::Release).await {
        Err(Error::NotResolvable { key: k2, .. }) => assert_eq!(k2, k),
        other => panic!("expected NotResolvable, got {other:?}"),
    }
}

pub async fn stale_lists_ran_out_leases<R: Reservations>(c: Ctx<'_, R>) {
    let ks: Vec<Key> = (0..4).map(|i| key("u", "op", &format!("s{i}"))).collect();
    let first = c.acquire(&ks[0], fp("b")).await;
    c.advance(Duration::from_millis(100));
    let _second = c.acquire(&ks[1], fp("b")).await;
    let done = c.acquire(&ks[2], fp("b")).await;
    c.store.complete(&done, b"ok".to_vec()).await.unwrap();
    assert!(
        c.store.stale(10).await.unwrap().is_empty(),
        "live leases are not stale"
    );
    c.advance(LEASE);
    let _live = c.acquire(&ks[3], fp("b")).await;
    let stale = c.store.stale(10).await.unwrap();
    let listed: Vec<&Key> = stale.iter().map(|(k, _)| k).collect();
    assert_eq!(
        listed,
        vec![&ks[0], &ks[1]],
        "oldest lease first, not completed or live"
    );
    assert!(matches!(stale[0].1.status(), Status::Pending { .. }));
    assert_eq!(c.store.stale(1).await.unwrap().len(), 1);
    c.store.resolve(&ks[0], Resolution::Release).await.unwrap();
    assert_eq!(c.get(&ks[0]).await, None);
    expect_lost(
        c.store.complete(&first, vec![]).await,
        first.token(),
        LeaseLostReason::Gone,
    );
    c.advance(RETENTION + LEASE);
    assert!(
        c.store.stale(10).await.unwrap().is_empty(),
        "expired keys are not stale"
    );
}

pub async fn sweep_is_bounded<R: Reservations>(c: Ctx<'_, R>) {
    let ks: Vec<Key> = (0..5).map(|i| key("u", "op", &format!("w{i}"))).collect();
    for k in &ks[..4] {
        let lease = c.acquire(k, fp("b")).await;
        c.store.complete(&lease, b"r".to_vec()).await.unwrap();
    }
    c.advance(RETENTION);
    let live = c.acquire(&ks[4], fp("b")).await;
    assert_eq!(c.store.sweep(3).await.unwrap(), 3);
    assert_eq!(c.store.sweep(3).await.unwrap(), 1);
    assert_eq!(c.store.sweep(3).await.unwrap(), 0);
    assert!(c.get(&ks[4]).await.is_some(), "a live key is never swept");
    for k in &ks[..4] {
        assert_eq!(c.get(k).await, None);
        let again = c.acquire(k, fp("b")).await;
        assert_eq!(again.attempt(), 1);
    }
    c.store.complete(&live, b"r".to_vec()).await.unwrap();
}

pub async fn reserve_many_matches_single_reserves<R: Reservations>(c: Ctx<'_, R>) {
    let done = key("q", "orders", "done");
    let lease = c.acquire(&done, fp("m")).await;
    c.store.complete(&lease, b"old".to_vec()).await.unwrap();
    let mut items: Vec<(Key, Fingerprint)> = (0..60)
        .map(|i| (key("q", "orders", &format!("m{i}")), fp("m")))
        .collect();
    items.push((done.clone(), fp("m")));
    items.push((done.clone(), fp("other")));
    items.push((items[0].0.clone(), fp("m"))); // the same key twice in one batch
    let results = c.store.reserve_many(&items).await.unwrap();
    assert_eq!(results.len(), items.len());
    let mut tokens = Vec::new();
    for (i, result) in results[..60].iter().enumerate() {
        match result {
            Ok(Reservation::Acquired(lease)) => {
                assert_eq!(lease.key(), &items[i].0);
                tokens.push(lease.token());
            }
            other => panic!("item {i}: expected Acquired, got {other:?}"),
        }
    }
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 60, "every acquisition has its own token");
    assert!(tokens[0] > lease.token());
    assert!(matches!(&results[60], Ok(Reservation::Completed(d)) if d.result == b"old"));
    assert!(matches!(results[61], Ok(Reservation::Mismatch)));
    assert!(matches!(
        results[62],
        Ok(Reservation::InProgress { attempt: 1, .. })
    ));
    let Ok(Reservation::Acquired(first)) = &results[0] else {
        unreachable!()
    };
    c.store.complete(first, b"m0".to_vec()).await.unwrap();
    assert_eq!(c.replayed(&items[0].0, fp("m")).await.result, b"m0");
}

/// Expire: a live lease is refused (naming its end) unless forced; a forced expire fences the
/// holder; an expired key is acquired afresh with a higher token; every settled state goes,
/// also a record past its expiry that no sweep deleted yet.
pub async fn expire_fences_the_holder_and_frees_the_key<R: Reservations>(c: Ctx<'_, R>) {
    let k = key("user-1", "POST /charges", "e1");
    let first = c.acquire(&k, fp("a")).await;
    match c.store.expire(&k, LiveLease::Refuse).await {
        Err(Error::LeaseLive { key, lease_until }) => {
            assert_eq!(key, k);
            assert_eq!(lease_until, first.lease_until());
        }
        other => panic!("a live lease refuses a plain expire, got {other:?}"),
    }
    assert!(
        c.get(&k).await.is_some(),
        "a refused expire changes nothing"
    );
    let forced = c.store.expire(&k, LiveLease::Take).await.expect("expire");
    assert_eq!(forced, Some(RecordClass::Pending));
    assert!(c.get(&k).await.is_none());
    // The old holder is fenced: nothing of its lease is left.
    expect_lost(
        c.store.complete(&first, b"late".to_vec()).await,
        first.token(),
        LeaseLostReason::Gone,
    );
    assert!(!c.store.release_if_pending(&first).await.expect("release"));
    // Acquired afresh, first attempt, with a higher token; the old holder stays fenced.
    let second = c.acquire(&k, fp("b")).await;
    assert!(second.token() > first.token());
    assert_eq!(second.attempt(), 1);
    expect_lost(
        c.store.complete(&first, b"late".to_vec()).await,
        first.token(),
        LeaseLostReason::TakenOver {
            by_token: second.token(),
        },
    );
    c.store
        .complete(&second, b"wrong".to_vec())
        .await
        .expect("complete");
    // A wrong stored response goes; the next request does the work again.
    let gone = c.store.expire(&k, LiveLease::Refuse).await.expect("expire");
    assert_eq!(gone, Some(RecordClass::Completed));
    let third = c.acquire(&k, fp("b")).await;
    assert!(third.token() > second.token());
    c.store
        .complete(&third, b"right".to_vec())
        .await
        .expect("complete");
    assert_eq!(c.replayed(&k, fp("b")).await.result, b"right");
    // Past its expiry, not swept: it reads as absent, and expire deletes its bytes.
    c.advance(RETENTION + Duration::from_millis(1));
    assert!(c.get(&k).await.is_none());
    let swept_now = c.store.expire(&k, LiveLease::Refuse).await.expect("expire");
    assert_eq!(swept_now, Some(RecordClass::Expired));
    assert_eq!(
        c.store.sweep(10).await.expect("sweep"),
        0,
        "nothing left to sweep"
    );
    // Nothing stored: nothing removed.
    assert_eq!(
        c.store.expire(&k, LiveLease::Take).await.expect("expire"),
        None
    );
    // A stale reservation and one under review go too.
    let stale = c.acquire(&k, fp("c")).await;
    c.advance(LEASE + Duration::from_millis(1));
    assert_eq!(
        c.store.expire(&k, LiveLease::Refuse).await.expect("expire"),
        Some(RecordClass::Stale)
    );
    expect_lost(
        c.store.extend(&stale).await,
        stale.token(),
        LeaseLostReason::Gone,
    );
    let review = c.acquire(&k, fp("c")).await;
    c.store
        .mark_needs_review(&review, "check")
        .await
        .expect("review");
    assert_eq!(
        c.store.expire(&k, LiveLease::Refuse).await.expect("expire"),
        Some(RecordClass::NeedsReview)
    );
    let last = c.acquire(&k, fp("c")).await;
    assert!(last.token() > review.token());
}

/// The retention of the operation `SHORT_OP`, set on both backends' builders.
pub const SHORT: Duration = Duration::from_millis(1500);
/// An operation kept for [`SHORT`] instead of [`RETENTION`].
pub const SHORT_OP: &str = "consume";

pub async fn recovery_points_reach_the_next_owner<R: Reservations>(c: Ctx<'_, R>) {
    let k = key("user-7", "checkout", "p1");
    let first = c.acquire(&k, fp("cart")).await;
    assert!(first.progress().is_none());
    c.store
        .record_step(&first, 1, b"charge ch_42")
        .await
        .expect("step 1");
    c.store
        .record_step(&first, 2, b"ship sh_7")
        .await
        .expect("step 2");
    assert!(
        matches!(
            c.store.reserve(&k, fp("cart")).await.unwrap(),
            Reservation::InProgress { .. }
        ),
        "a recovery point keeps the lease"
    );
    c.advance(LEASE);
    let second = c.acquire(&k, fp("cart")).await;
    assert_eq!(second.attempt(), 2);
    let resume = second
        .progress()
        .expect("the recovery point reaches the next owner");
    assert_eq!(
        (resume.step, resume.data.as_slice()),
        (2, &b"ship sh_7"[..])
    );
    let taken = LeaseLostReason::TakenOver {
        by_token: second.token(),
    };
    expect_lost(
        c.store.record_step(&first, 3, b"late").await,
        first.token(),
        taken,
    );
    let resume = c.get(&k).await.unwrap();
    match resume.status() {
        Status::Pending { progress, .. } => {
            assert_eq!(
                progress.map(|p| p.step),
                Some(2),
                "the old owner's step is refused"
            )
        }
        other => panic!("expected pending, got {other:?}"),
    }
    c.store.complete(&second, b"done".to_vec()).await.unwrap();
    expect_lost(
        c.store.record_step(&second, 3, b"after").await,
        second.token(),
        LeaseLostReason::Completed {
            by_token: second.token(),
        },
    );
}

pub async fn observe_keeps_a_window<R: Reservations>(c: Ctx<'_, R>) {
    let window = Duration::from_secs(300);
    let m1 = key("orders-queue", "consume", "msg-1");
    assert_eq!(c.store.observe(&m1, window).await.unwrap(), Seen::New);
    assert_eq!(c.store.observe(&m1, window).await.unwrap(), Seen::Duplicate);
    c.advance(window - Duration::from_millis(1));
    assert_eq!(c.store.observe(&m1, window).await.unwrap(), Seen::Duplicate);
    c.advance(Duration::from_millis(1));
    assert_eq!(c.get(&m1).await, None, "the window is over");
    assert_eq!(
        c.store.observe(&m1, window).await.unwrap(),
        Seen::New,
        "seen again after its window"
    );
    // A batch: new, already seen, a key reserved as a request, and one key named twice.
    let held = key("orders-queue", "consume", "msg-held");
    let _lease = c.acquire(&held, fp("b")).await;
    let batch = [
        key("orders-queue", "consume", "msg-2"),
        m1.clone(),
        held.clone(),
        key("orders-queue", "consume", "msg-3"),
        key("orders-queue", "consume", "msg-2"),
    ];
    let seen: Vec<Seen> = c
        .store
        .observe_many(&batch, window)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.expect("no item fails"))
        .collect();
    assert_eq!(
        seen,
        vec![
            Seen::New,
            Seen::Duplicate,
            Seen::Duplicate,
            Seen::New,
            Seen::Duplicate
        ]
    );
    assert_eq!(
        c.store.reserve(&batch[0], fp("b")).await.unwrap(),
        Reservation::Mismatch,
        "an observed key is not a request's key"
    );
    // Sweeping reclaims the window's records once it is over, and only then.
    c.advance(window);
    let m3 = &batch[3];
    assert_eq!(c.get(m3).await, None);
    assert!(c.store.sweep(100).await.unwrap() >= 3);
    assert_eq!(c.store.observe(m3, window).await.unwrap(), Seen::New);
}

pub async fn reserve_or_wait_wakes_on_completion<R: Reservations>(c: Ctx<'_, R>) {
    let k = key("user-1", "POST /charges", "w1");
    let lease = c.acquire(&k, fp("body")).await;
    // No one completes: the wait ends at the timeout with InProgress (the lease, 1 s on the
    // manual clock, does not run out meanwhile).
    let started = std::time::Instant::now();
    let waited = c
        .store
        .reserve_or_wait(&k, fp("body"), Duration::from_millis(150))
        .await
        .unwrap();
    assert!(
        matches!(waited, Reservation::InProgress { attempt: 1, .. }),
        "{waited:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(150));
    // The holder completes 200 ms into the wait: the waiter gets the result at once, not
    // when the lease (1 s) would have run out.
    let started = std::time::Instant::now();
    let holder = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        c.store.complete(&lease, b"paid".to_vec()).await.unwrap();
    };
    let waiter = c
        .store
        .reserve_or_wait(&k, fp("body"), Duration::from_secs(10));
    let ((), waited) = tokio::join!(holder, waiter);
    let took = started.elapsed();
    match waited.unwrap() {
        Reservation::Completed(done) => assert_eq!(done.result, b"paid"),
        other => panic!("expected the stored result, got {other:?}"),
    }
    assert!(
        took < Duration::from_millis(800),
        "the waiter was woken by the completion, not a poll or the lease: {took:?}"
    );
    // A released key is acquired by the waiter.
    let k2 = key("user-1", "POST /charges", "w2");
    let lease = c.acquire(&k2, fp("body")).await;
    let holder = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(c.store.release_if_pending(&lease).await.unwrap());
    };
    let waiter = c
        .store
        .reserve_or_wait(&k2, fp("body"), Duration::from_secs(10));
    let ((), waited) = tokio::join!(holder, waiter);
    match waited.unwrap() {
        Reservation::Acquired(next) => assert!(next.token() > lease.token()),
        other => panic!("expected to acquire the released key, got {other:?}"),
    }
    // A free key is acquired without waiting.
    let k3 = key("user-1", "POST /charges", "w3");
    assert!(matches!(
        c.store
            .reserve_or_wait(&k3, fp("body"), Duration::from_secs(10))
            .await
            .unwrap(),
        Reservation::Acquired(_)
    ));
}

pub async fn lease_batches_answer_each_item<R: Reservations>(c: Ctx<'_, R>) {
    let ks: Vec<Key> = (0..4)
        .map(|i| key("u", "batch", &format!("b{i}")))
        .collect();
    let mut leases = Vec::new();
    for k in &ks {
        leases.push(c.acquire(k, fp("b")).await);
    }
    // ks[3] is taken over: its old lease fails alone in every batch.
    c.advance(LEASE - Duration::from_millis(100));
    let refs: Vec<&Lease> = leases[..3].iter().collect();
    let extended = c.store.extend_many(&refs).await.unwrap();
    for (lease, renewed) in leases.iter().zip(&extended) {
        assert_eq!(renewed.as_ref().unwrap().lease_until(), c.now() + LEASE);
        assert_eq!(renewed.as_ref().unwrap().token(), lease.token());
    }
    c.advance(Duration::from_millis(100));
    let new = c.acquire(&ks[3], fp("b")).await;
    let taken = LeaseLostReason::TakenOver {
        by_token: new.token(),
    };
    let done = c
        .store
        .complete_many(vec![
            (&leases[0], b"r0".to_vec()),
            (&leases[3], b"late".to_vec()),
            (&leases[1], b"r1".to_vec()),
        ])
        .await
        .unwrap();
    assert!(done[0].is_ok() && done[2].is_ok(), "{done:?}");
    let mut done = done;
    expect_lost(done.remove(1), leases[3].token(), taken.clone());
    assert_eq!(c.replayed(&ks[0], fp("b")).await.result, b"r0");
    assert_eq!(c.replayed(&ks[1], fp("b")).await.result, b"r1");
    // Completing twice with the same lease keeps the first result, as for one completion.
    let again = c
        .store
        .complete_many(vec![(&leases[0], b"other".to_vec())])
        .await
        .unwrap();
    assert!(again[0].is_ok());
    assert_eq!(c.replayed(&ks[0], fp("b")).await.result, b"r0");
    let released = c
        .store
        .release_if_pending_many(&[&leases[2], &leases[0], &leases[3]])
        .await
        .unwrap();
    assert_eq!(released[0].as_ref().ok(), Some(&true));
    assert_eq!(
        released[1].as_ref().ok(),
        Some(&false),
        "a completed key stays"
    );
    let mut released = released;
    expect_lost(released.remove(2), leases[3].token(), taken);
    assert_eq!(c.get(&ks[2]).await, None);
    assert!(c.get(&ks[3]).await.is_some());
}

pub async fn expire_many_answers_each_key<R: Reservations>(c: Ctx<'_, R>) {
    let done = key("u", "exp", "done");
    let live = key("u", "exp", "live");
    let absent = key("u", "exp", "absent");
    let lease = c.acquire(&done, fp("b")).await;
    c.store.complete(&lease, b"r".to_vec()).await.unwrap();
    let holder = c.acquire(&live, fp("b")).await;
    let keys = [done.clone(), live.clone(), absent.clone()];
    let first = c.store.expire_many(&keys, LiveLease::Refuse).await.unwrap();
    assert_eq!(first[0].as_ref().ok(), Some(&Some(RecordClass::Completed)));
    match &first[1] {
        Err(Error::LeaseLive { key: k, .. }) => assert_eq!(k, &live),
        other => panic!("expected LeaseLive, got {other:?}"),
    }
    assert_eq!(first[2].as_ref().ok(), Some(&None));
    assert_eq!(c.get(&done).await, None);
    assert!(c.get(&live).await.is_some(), "a refused key is kept");
    let forced = c.store.expire_many(&keys, LiveLease::Take).await.unwrap();
    assert_eq!(forced[0].as_ref().ok(), Some(&None));
    assert_eq!(forced[1].as_ref().ok(), Some(&Some(RecordClass::Pending)));
    expect_lost(
        c.store.complete(&holder, b"late".to_vec()).await,
        holder.token(),
        LeaseLostReason::Gone,
    );
    let next = c.acquire(&done, fp("b")).await;
    assert!(next.token() > lease.token() && next.attempt() == 1);
}

/// How long a replayed result is kept.
fn kept(done: &idemstore::Completed) -> Duration {
    done.expires_at.duration_since(done.completed_at).unwrap()
}

pub async fn retention_per_operation_and_per_call<R: Reservations>(c: Ctx<'_, R>) {
    // Per operation: `SHORT_OP` keys are kept for SHORT, others for RETENTION.
    let short = key("u", SHORT_OP, "k1");
    let long = key("u", "POST /charges", "k1");
    for k in [&short, &long] {
        let lease = c.acquire(k, fp("b")).await;
        c.store.complete(&lease, b"r".to_vec()).await.unwrap();
    }
    assert_eq!(kept(&c.replayed(&short, fp("b")).await), SHORT);
    assert_eq!(kept(&c.replayed(&long, fp("b")).await), RETENTION);
    // Per call: a completion and an operator's resolution with their own retention.
    let custom = key("u", "POST /charges", "k2");
    let lease = c.acquire(&custom, fp("b")).await;
    c.store
        .complete_with_retention(&lease, b"link".to_vec(), Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(
        kept(&c.replayed(&custom, fp("b")).await),
        Duration::from_secs(2)
    );
    let stale = key("u", "POST /charges", "k3");
    let _abandoned = c.acquire(&stale, fp("b")).await;
    c.advance(LEASE);
    c.store
        .resolve_with_retention(
            &stale,
            Resolution::Complete(b"settled".to_vec()),
            Duration::from_secs(3),
        )
        .await
        .unwrap();
    let done = c.replayed(&stale, fp("b")).await;
    assert_eq!(
        (done.result.as_slice(), kept(&done)),
        (&b"settled"[..], Duration::from_secs(3))
    );
    // The deadlines hold: SHORT (1.5 s) and 2 s are over after 2 s, the others are not.
    c.advance(Duration::from_secs(2) - LEASE);
    assert_eq!(c.get(&short).await, None);
    assert_eq!(c.get(&custom).await, None, "the per-call retention is over");
    assert!(c.get(&long).await.is_some());
    assert!(c.get(&stale).await.is_some());
    c.advance(Duration::from_secs(3));
    assert_eq!(c.get(&stale).await, None);
    // A zero retention stores the completion and lets the key read as absent at once.
    let zero = key("u", "POST /charges", "k4");
    let lease = c.acquire(&zero, fp("b")).await;
    c.store
        .complete_with_retention(&lease, b"gone".to_vec(), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(c.get(&zero).await, None);
}

/// The stored record shows the fingerprint, token, attempt and expiry of each state.
pub async fn get_shows_the_record_of_each_state<R: Reservations>(c: Ctx<'_, R>) {
    let k = key("s", "op", "k");
    let body = Fingerprint::from_bytes([9; 32]);
    assert_eq!(c.get(&k).await, None);
    let lease = c.acquire(&k, body).await;
    let record = c.get(&k).await.unwrap();
    assert_eq!(record.fingerprint(), body);
    assert_eq!(record.token(), lease.token());
    assert_eq!(record.attempt(), 1);
    assert_eq!(record.expires_at(), Some(lease.lease_until() + RETENTION));
    c.advance(Duration::from_millis(20));
    c.store.complete(&lease, b"res".to_vec()).await.unwrap();
    let record = c.get(&k).await.unwrap();
    assert_eq!(record.token(), lease.token());
    assert_eq!(record.expires_at(), Some(c.now() + RETENTION));
    assert_eq!(
        record.status(),
        Status::Completed {
            result: b"res",
            completed_at: c.now()
        }
    );
}

/// A worker's lease goes stale and an operator settles the key with `resolve(Complete)`: the
/// operator's result is stored under a new token, so when the slow worker then calls
/// `complete` it gets LeaseLost naming that token, and is not told that its result was
/// stored. The operator's result stays.
pub async fn complete_after_an_operator_resolved_the_key_is_lease_lost<R: Reservations>(
    c: Ctx<'_, R>,
) {
    let k = key("user-1", "charge", "slow");
    let lease = c.acquire(&k, fp("b")).await;
    c.advance(LEASE);
    c.store
        .resolve(&k, Resolution::Complete(b"refunded by hand".to_vec()))
        .await
        .unwrap();
    let resolved = c.get(&k).await.expect("stored").token();
    assert!(
        resolved > lease.token(),
        "the operator's result takes a new token"
    );
    let before = c.get(&k).await;
    for (what, result) in [
        (
            "complete",
            c.store.complete(&lease, b"charged".to_vec()).await,
        ),
        ("extend", c.store.extend(&lease).await.map(drop)),
        (
            "mark_needs_review",
            c.store.mark_needs_review(&lease, "?").await,
        ),
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
    assert!(!c.store.release_if_pending(&lease).await.unwrap());
    assert_eq!(c.get(&k).await, before);
    assert_eq!(c.replayed(&k, fp("b")).await.result, b"refunded by hand");
}

/// Runs each scenario on its own local store.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod on_store {
            $(
                #[test]
                fn $name() {
                    let env = crate::common::Env::new();
                    let store = env
                        .builder()
                        .retention_for(super::SHORT_OP, super::SHORT)
                        .open(&env.path)
                        .expect("open the store");
                    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                    runtime.block_on(super::$name(super::Ctx { store: &store, clock: &env.clock }));
                }
            )*
        }

        /// Every scenario on one etcd cluster, each under its own prefix.
        #[cfg(feature = "etcd")]
        #[test]
        fn all_on_etcd() {
            let cluster = crate::etcd::cluster::Cluster::start();
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                $(
                    let clock = crate::common::Env::new().clock;
                    let store = idemstore::EtcdStore::builder()
                        .prefix(concat!("scenario/", stringify!($name), "/"))
                        .lease(LEASE)
                        .retention(RETENTION)
                        .retention_for(SHORT_OP, SHORT)
                        .clock(clock.clone())
                        .connect(&cluster.endpoints())
                        .await
                        .expect("connect to the test cluster");
                    eprintln!("scenario {} on etcd", stringify!($name));
                    $name(Ctx { store: &store, clock: &clock }).await;
                )*
            });
        }

        /// Every scenario on one throwaway PostgreSQL server, each in its own table.
        #[cfg(feature = "postgres")]
        #[test]
        fn all_on_postgres() {
            let server = crate::postgres::server::Server::start();
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                $(
                    let clock = crate::common::Env::new().clock;
                    // PostgreSQL names are short: the scenario's name cut to 40 bytes.
                    let name = stringify!($name);
                    let store = idemstore::PgStore::builder()
                        .table(format!("scenario_{}", &name[..name.len().min(40)]))
                        .lease(LEASE)
                        .retention(RETENTION)
                        .retention_for(SHORT_OP, SHORT)
                        .clock(clock.clone())
                        .connect(&server.config())
                        .await
                        .expect("connect to the test server");
                    eprintln!("scenario {} on PostgreSQL", stringify!($name));
                    $name(Ctx { store: &store, clock: &clock }).await;
                )*
            });
        }
    };
}

on_both_backends!(
    same_request_twice,
    duplicate_while_in_progress,
    retry_after_retention,
    same_key_other_body,
    released_failure_is_not_cached,
    scopes_never_share,
    takeover_fences_the_old_owner,
    release_never_deletes_completed,
    extend_keeps_the_key,
    needs_review_until_resolved,
    stale_lists_ran_out_leases,
    sweep_is_bounded,
    reserve_many_matches_single_reserves,
    expire_fences_the_holder_and_frees_the_key,
    recovery_points_reach_the_next_owner,
    observe_keeps_a_window,
    reserve_or_wait_wakes_on_completion,
    lease_batches_answer_each_item,
    expire_many_answers_each_key,
    retention_per_operation_and_per_call,
    get_shows_the_record_of_each_state,
    complete_after_an_operator_resolved_the_key_is_lease_lost,
);

/// The seed stories on the local store alone, each against a real store file: its synchronous
/// API, its reopens and its retentions per operation.
mod local {
    use std::cell::Cell;
    use std::time::Duration;

    use idemstore::{Error, Key, LeaseLostReason, Reservation, Resolution, Status, Store};

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
        // The reservation in the file (a checkpoint commits what the applier holds), so a
        // listing that read the file alone would find it pending there after the release.
        store.checkpoint().unwrap();
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
}
