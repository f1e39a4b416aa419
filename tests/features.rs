//! Recovery points, the dedup window, waiting instead of failing, the background sweeper,
//! batches, async calls and the stats counters, used as a service would use them.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use idemstore::{Fingerprint, Key, ManualClock, Reservation, Seen, Status, Store};

fn key(id: &str) -> Key {
    Key::new("tenant", "op", id).unwrap()
}

fn acquire(store: &Store, key: &Key, fp: Fingerprint) -> idemstore::Lease {
    match store.reserve(key, fp).unwrap() {
        Reservation::Acquired(lease) => lease,
        other => panic!("expected to acquire {key}, got {other:?}"),
    }
}

#[test]
fn recovery_point_survives_reopen_and_takeover_resumes_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("steps.idem");
    let clock = ManualClock::new();
    let open = || {
        Store::builder()
            .clock(clock.clone())
            .lease(Duration::from_secs(10))
            .open(&path)
            .unwrap()
    };
    let fp = Fingerprint::of(b"order 17");
    let store = open();
    let first = acquire(&store, &key("k"), fp);
    assert!(first.progress().is_none());
    store.record_step(&first, 1, b"reserved stock").unwrap();
    store.record_step(&first, 2, b"charged ch_9").unwrap();
    drop(store); // the worker dies
    let store = open();
    match store.get(&key("k")).unwrap().unwrap().status() {
        Status::Pending { progress, .. } => assert_eq!(progress.unwrap().step, 2),
        other => panic!("{other:?}"),
    }
    clock.advance(Duration::from_secs(11));
    let second = acquire(&store, &key("k"), fp);
    assert!(second.is_retry());
    let resume = second.progress().expect("recovery point inherited");
    assert_eq!(
        (resume.step, resume.data.as_slice()),
        (2, &b"charged ch_9"[..])
    );
    // The old holder can no longer record steps.
    assert!(store.record_step(&first, 3, b"late").is_err());
    store.complete(&second, b"done".to_vec()).unwrap();
}

#[test]
fn dedup_window_admits_each_event_once_per_window() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = Store::builder()
        .clock(clock.clone())
        .open(dir.path().join("events.idem"))
        .unwrap();
    let window = Duration::from_secs(300);
    let batch: Vec<Key> = ["a", "b", "a", "c"].iter().map(|id| key(id)).collect();
    let seen: Vec<Seen> = store
        .observe_many(&batch, window)
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
    // The repeated "a" inside one polled batch is caught too.
    assert_eq!(seen, [Seen::New, Seen::New, Seen::Duplicate, Seen::New]);
    assert_eq!(store.observe(&key("b"), window).unwrap(), Seen::Duplicate);
    clock.advance(window);
    assert_eq!(store.observe(&key("b"), window).unwrap(), Seen::New);
}

#[test]
fn reserve_or_wait_returns_the_result_when_the_holder_completes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path().join("wait.idem")).unwrap());
    let fp = Fingerprint::of(b"req");
    let lease = acquire(&store, &key("w"), fp);
    let waiter = {
        let store = Arc::clone(&store);
        thread::spawn(move || {
            let started = Instant::now();
            let got = store
                .reserve_or_wait(&key("w"), fp, Duration::from_secs(20))
                .unwrap();
            (got, started.elapsed())
        })
    };
    thread::sleep(Duration::from_millis(100));
    store.complete(&lease, b"receipt".to_vec()).unwrap();
    let (got, waited) = waiter.join().unwrap();
    match got {
        Reservation::Completed(done) => assert_eq!(done.result, b"receipt"),
        other => panic!("expected the stored result, got {other:?}"),
    }
    assert!(waited < Duration::from_secs(10), "woke only at the timeout");
    // With nobody completing, the timeout answers InProgress.
    let _other = acquire(&store, &key("x"), fp);
    let got = store
        .reserve_or_wait(&key("x"), fp, Duration::from_millis(50))
        .unwrap();
    assert!(matches!(got, Reservation::InProgress { .. }), "{got:?}");
}

/// `n` fresh keys named `prefix{i}`, reserved and completed in one batch each.
fn completed_keys(store: &Store, prefix: &str, n: usize) -> Vec<(Key, Fingerprint)> {
    let keys: Vec<(Key, Fingerprint)> = (0..n)
        .map(|i| (key(&format!("{prefix}{i}")), Fingerprint::of(b"x")))
        .collect();
    let leases: Vec<_> = store
        .reserve_many(&keys)
        .unwrap()
        .into_iter()
        .map(|r| match r.unwrap() {
            Reservation::Acquired(lease) => lease,
            other => panic!("{other:?}"),
        })
        .collect();
    let results = store
        .complete_many(leases.iter().map(|l| (l, b"ok".to_vec())).collect())
        .unwrap();
    assert!(results.iter().all(Result::is_ok));
    keys
}

/// The background sweeper deletes an expiry window only once it has ended. Two groups of
/// keys, 4 s apart (a window is at most a 16th of the 60 s retention: 2,048 ms): once the clock is at
/// the later group's expiry, the earlier group's window has ended and the later group's has
/// not. Waiting until the sweeper has deleted the earlier group (a condition, not a time)
/// means one of its passes looked at every window after the clock moved (a pass deletes every
/// ended window), and the later group is still there. Then the later group's window ends too, and it goes.
#[test]
fn background_sweeper_deletes_expired_records_by_whole_windows() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = Store::builder()
        .clock(clock.clone())
        .retention(Duration::from_secs(60))
        .sweep_interval(Some(Duration::from_millis(20)))
        .open(dir.path().join("sweep.idem"))
        .unwrap();
    completed_keys(&store, "a", 1_000);
    clock.advance(Duration::from_secs(4));
    completed_keys(&store, "b", 1_500);
    // Every completion in its window's table in the file (the applier may still hold some),
    // so each of the sweeper's passes sees both groups' windows.
    store.checkpoint().unwrap();
    assert_eq!(store.stats().swept, 0);
    // At the later group's expiry: its window has not ended, the earlier group's has.
    clock.advance(Duration::from_secs(60));
    let swept_at_least = |n: u64, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while store.stats().swept < n {
            assert!(
                Instant::now() < deadline,
                "{what}: swept {:?}",
                store.stats().swept
            );
            thread::sleep(Duration::from_millis(5));
        }
    };
    swept_at_least(1_000, "the earlier group's ended window");
    assert_eq!(store.stats().swept, 1_000, "a window went before it ended");
    clock.advance(Duration::from_secs(3));
    swept_at_least(2_500, "the later group's window, ended now");
    assert_eq!(store.stats().swept, 2_500);
}

/// A background sweep with nothing to delete commits nothing: it looks at the windows in
/// memory first, so it neither commits the applier's transaction nor holds the writer for it.
/// Stale reservations that have not expired are nothing to delete either. Once something
/// expires and its window ends, it is swept.
#[test]
fn a_background_sweep_with_nothing_expired_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = Store::builder()
        .clock(clock.clone())
        .lease(Duration::from_secs(30))
        .retention(Duration::from_secs(60))
        .sweep_interval(Some(Duration::from_millis(5)))
        .open(dir.path().join("idle.idem"))
        .unwrap();
    completed_keys(&store, "i", 40);
    // Ten left pending: their leases run out below, their records expire 60 s later.
    let pending: Vec<(Key, Fingerprint)> = (0..10)
        .map(|i| (key(&format!("p{i}")), Fingerprint::of(b"x")))
        .collect();
    for answer in store.reserve_many(&pending).unwrap() {
        assert!(matches!(answer.unwrap(), Reservation::Acquired(_)));
    }
    clock.advance(Duration::from_secs(31));
    // Let the applier commit what it holds (within 250 ms), then count over many sweep
    // intervals.
    thread::sleep(Duration::from_millis(700));
    let before = store.stats();
    thread::sleep(Duration::from_millis(300));
    let after = store.stats();
    assert_eq!(after.swept, 0);
    assert_eq!(
        after.commits, before.commits,
        "background sweeps with nothing expired committed"
    );
    // Expired, with their windows ended (a window is at most a 16th of the retention): the completed
    // keys now, the pending ones 30 s later.
    clock.advance(Duration::from_secs(32));
    let deadline = Instant::now() + Duration::from_secs(20);
    while store.stats().swept < 40 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(store.stats().swept, 40, "the completed keys expired");
    clock.advance(Duration::from_secs(31));
    let deadline = Instant::now() + Duration::from_secs(20);
    while store.stats().swept < 50 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(store.stats().swept, 50, "the stale reservations expired");
}

/// `Store::open`'s defaults serve a service: the log is preallocated, and expired records are
/// swept in the background without anyone calling `sweep`, once their window has ended.
#[test]
fn a_default_store_sweeps_by_itself_and_preallocates_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let path = dir.path().join("defaults.idem");
    // Only the clock and the retention differ from `Store::open`.
    let store = Store::builder()
        .clock(clock.clone())
        .retention(Duration::from_secs(60))
        .open(&path)
        .unwrap();
    let log_len = std::fs::metadata(dir.path().join("defaults.idem.wal"))
        .unwrap()
        .len();
    // Preallocated to its first step, 256 KiB; it grows as it is used (docs/4, `preallocate_log`).
    assert_eq!(log_len, 256 << 10, "the new log's preallocated length");
    let n = 250;
    completed_keys(&store, "d", n);
    // Past the records' expiry and the end of their window (at most a 16th of the retention).
    clock
        .advance(Duration::from_secs(60) + Duration::from_secs(60) / 16 + Duration::from_millis(1));
    let deadline = Instant::now() + idemstore::Builder::DEFAULT_SWEEP_INTERVAL * 10;
    while store.stats().swept < n as u64 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        store.stats().swept,
        n as u64,
        "swept by the default sweeper"
    );
}

#[test]
fn batches_share_commits_and_stats_count_outcomes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("stats.idem")).unwrap();
    let items: Vec<(Key, Fingerprint)> = (0..100)
        .map(|i| (key(&format!("b{i}")), Fingerprint::of(b"x")))
        .collect();
    let first = store.reserve_many(&items).unwrap();
    assert!(first
        .iter()
        .all(|r| matches!(r, Ok(Reservation::Acquired(_)))));
    let second = store.reserve_many(&items).unwrap();
    assert!(second
        .iter()
        .all(|r| matches!(r, Ok(Reservation::InProgress { .. }))));
    let _ = store
        .reserve(&items[0].0, Fingerprint::of(b"other"))
        .unwrap();
    let stats = store.stats();
    assert_eq!(stats.acquired, 100);
    assert_eq!(stats.in_progress, 100);
    assert_eq!(stats.mismatches, 1);
    // The first reserve_many is one batch; the all-duplicate one is answered from what is
    // acknowledged, without the writer or a sync.
    assert_eq!(stats.batches, 1, "{stats:?}");
    assert_eq!(stats.max_batch, 100, "{stats:?}");
    assert_eq!(stats.syncs, 1, "{stats:?}");
}

#[test]
fn async_reserve_and_complete_work_on_any_executor() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("async.idem")).unwrap();
    let fp = Fingerprint::of(b"job");
    // A minimal executor: the futures are runtime-agnostic.
    let got = block_on(async {
        let lease = match store.reserve_async(&key("a"), fp).await.unwrap() {
            Reservation::Acquired(lease) => lease,
            other => panic!("{other:?}"),
        };
        store
            .complete_async(&lease, b"async result".to_vec())
            .await
            .unwrap();
        store.reserve_async(&key("a"), fp).await.unwrap()
    });
    match got {
        Reservation::Completed(done) => assert_eq!(done.result, b"async result"),
        other => panic!("{other:?}"),
    }
}

/// Every lease operation has an async form that answers as its sync form does, and the batch
/// forms answer each item on its own.
#[test]
fn every_lease_operation_has_an_async_form() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = Store::builder()
        .clock(clock.clone())
        .lease(Duration::from_secs(10))
        .open(dir.path().join("async-all.idem"))
        .unwrap();
    let fp = Fingerprint::of(b"job");
    block_on(async {
        let items: Vec<(Key, Fingerprint)> = (0..4).map(|i| (key(&format!("a{i}")), fp)).collect();
        let leases: Vec<idemstore::Lease> = store
            .reserve_many_async(&items)
            .await
            .unwrap()
            .into_iter()
            .map(|r| match r.unwrap() {
                Reservation::Acquired(lease) => lease,
                other => panic!("{other:?}"),
            })
            .collect();
        clock.advance(Duration::from_secs(5));
        let renewed = store.extend_async(&leases[0]).await.unwrap();
        assert_eq!(
            renewed.lease_until(),
            clock.time() + Duration::from_secs(10),
            "extended from now"
        );
        let renewed_many = store
            .extend_many_async(&[&leases[1], &leases[2]])
            .await
            .unwrap();
        for lease in renewed_many {
            assert_eq!(
                lease.unwrap().lease_until(),
                clock.time() + Duration::from_secs(10)
            );
        }
        store
            .record_step_async(&leases[0], 2, b"charged ch_9")
            .await
            .unwrap();
        let record = store.get(&key("a0")).unwrap().unwrap();
        match record.status() {
            Status::Pending { progress, .. } => {
                let progress = progress.expect("the recovery point is stored");
                assert_eq!(
                    (progress.step, progress.data.as_slice()),
                    (2, &b"charged ch_9"[..])
                );
            }
            other => panic!("{other:?}"),
        }
        store
            .mark_needs_review_async(&leases[0], "gateway timed out")
            .await
            .unwrap();
        assert!(matches!(
            store.reserve_async(&key("a0"), fp).await.unwrap(),
            Reservation::NeedsReview { .. }
        ));
        // The marked lease no longer owns its key.
        assert!(matches!(
            store.extend_async(&leases[0]).await,
            Err(idemstore::Error::LeaseLost { .. })
        ));
        store
            .resolve_async(
                &key("a0"),
                idemstore::Resolution::Complete(b"settled".to_vec()),
            )
            .await
            .unwrap();
        match store.reserve_async(&key("a0"), fp).await.unwrap() {
            Reservation::Completed(done) => assert_eq!(done.result, b"settled"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            store
                .resolve_async(&key("a0"), idemstore::Resolution::Release)
                .await,
            Err(idemstore::Error::NotResolvable { .. })
        ));
        let completed = store
            .complete_many_async(vec![
                (&leases[1], b"one".to_vec()),
                (&leases[0], b"x".to_vec()),
            ])
            .await
            .unwrap();
        assert!(completed[0].is_ok());
        assert!(matches!(
            completed[1],
            Err(idemstore::Error::LeaseLost { .. })
        ));
        let released = store
            .release_if_pending_many_async(&[&leases[2], &leases[1]])
            .await
            .unwrap();
        assert_eq!(released[0].as_ref().ok(), Some(&true), "pending: released");
        assert_eq!(released[1].as_ref().ok(), Some(&false), "completed: kept");
        assert_eq!(
            store.release_if_pending_many(&[&leases[3]]).unwrap()[0]
                .as_ref()
                .ok(),
            Some(&true)
        );
        assert!(store.get(&key("a2")).unwrap().is_none());
        assert!(store.get(&key("a3")).unwrap().is_none());
        assert!(
            store.extend_many(&[&leases[3]]).unwrap()[0].is_err(),
            "released: lost"
        );
    });
}

/// Generic code over the `Reservations` trait reaches every lease operation of the local store
/// through its async form.
#[test]
fn the_reservations_trait_runs_every_lease_operation() {
    use idemstore::{Reservations, Resolution};

    async fn exercise<R: Reservations>(store: &R, clock: &ManualClock) -> Vec<u8> {
        let fp = Fingerprint::of(b"trait");
        let items = vec![(key("t1"), fp), (key("t2"), fp)];
        let mut leases: Vec<idemstore::Lease> = store
            .reserve_many(&items)
            .await
            .unwrap()
            .into_iter()
            .map(|r| match r.unwrap() {
                Reservation::Acquired(lease) => lease,
                other => panic!("{other:?}"),
            })
            .collect();
        clock.advance(Duration::from_secs(3));
        let renewed = store.extend(&leases[0]).await.unwrap();
        assert!(renewed.lease_until() > leases[0].lease_until(), "renewed");
        leases[0] = renewed;
        store
            .mark_needs_review(&leases[0], "unknown outcome")
            .await
            .unwrap();
        assert!(
            store.extend(&leases[0]).await.is_err(),
            "a marked key is not held"
        );
        store
            .resolve(&key("t1"), Resolution::Complete(b"by hand".to_vec()))
            .await
            .unwrap();
        assert!(store.release_if_pending(&leases[1]).await.unwrap());
        match store.reserve(&key("t1"), fp).await.unwrap() {
            Reservation::Completed(done) => done.result,
            other => panic!("{other:?}"),
        }
    }

    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = Store::builder()
        .clock(clock.clone())
        .lease(Duration::from_secs(10))
        .open(dir.path().join("trait.idem"))
        .unwrap();
    assert_eq!(block_on(exercise(&store, &clock)), b"by hand");
    assert!(store.get(&key("t2")).unwrap().is_none(), "released");
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(value) => return value,
            Poll::Pending => thread::park(),
        }
    }
}

/// The store's counters reach the `metrics` facade (feature `metrics`): acquisitions as a
/// counter, a batch's operations as a counter.
#[cfg(feature = "metrics")]
#[test]
fn counters_reach_the_metrics_facade() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        idemstore::whitebox::count_for_metrics(3, 5);
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let found = |name: &str| {
        snapshot
            .iter()
            .find(|(key, ..)| key.key().name() == name)
            .map(|(.., value)| value)
    };
    assert_eq!(
        found("idemstore_acquired_total"),
        Some(&DebugValue::Counter(3))
    );
    assert_eq!(
        found("idemstore_batched_ops_total"),
        Some(&DebugValue::Counter(5))
    );
}
