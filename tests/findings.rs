//! Reproductions of the findings of issue 8 that need the simulated disk or the engine's
//! internals; each failed on the code before its fix (the commit that fixed it says how).

use std::future::Future;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::sim::{Fate, Rng, SimDisk};
use idemstore::{Builder, Fingerprint, Key, ManualClock, Reservation, Status, Store};

fn builder(clock: &ManualClock) -> Builder {
    let mut builder = Store::builder();
    builder
        .clock(clock.clone())
        .lease(Duration::from_secs(3600))
        .checkpoint_interval(Duration::from_secs(3600));
    builder
}

fn key(id: &str) -> Key {
    Key::new("tenant", "op", id).unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of(b"request")
}

/// Waits until `done` holds, failing after a few seconds.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out: {what}"
        );
        thread::sleep(Duration::from_millis(1));
    }
}

/// Finding 2: group commit is pipelined, so a power loss can keep batch N+1's frame and lose
/// batch N's, neither acknowledged. The store must open (nothing acknowledged is missing) and
/// hold what was acknowledged, not refuse "to drop acknowledged batches".
///
/// The interleaving needs batch N's sync to run while batch N+1 is written. When the committer
/// thread takes batch N itself (it was awake as N came), it also runs N's sync and writes
/// nothing meanwhile (BENCHMARKS.md, "The committer writes the next batch while a caller's sync
/// runs"): such an attempt is let go (its syncs complete, its keys are acknowledged) and the
/// story is tried again with new keys.
#[test]
fn power_loss_keeping_a_later_unacknowledged_frame_still_opens() {
    let clock = ManualClock::new();
    let (db, log) = (SimDisk::new(), SimDisk::new());
    let store = builder(&clock)
        .open_with_storage(db.clone(), log.clone())
        .unwrap();
    assert!(matches!(
        store.reserve(&key("k1"), fp()).unwrap(),
        Reservation::Acquired(_)
    ));
    let mut acknowledged = vec![key("k1")];
    for attempt in 0..20 {
        let (n, next) = (
            key(&format!("n-{attempt}")),
            key(&format!("next-{attempt}")),
        );
        log.hold_syncs();
        let images = thread::scope(|s| {
            // A failed wait below lets the held sync go as it unwinds, so the scope's threads
            // end and the test fails instead of hanging.
            let _release = log.release_syncs_on_drop();
            let store = &store;
            let unsynced_before = log.unsynced_writes();
            s.spawn(|| store.reserve(&n, fp()));
            wait_until("batch N's sync is running", || log.syncs_waiting() == 1);
            s.spawn(|| store.reserve(&next, fp()));
            let start = Instant::now();
            while log.unsynced_writes() < unsynced_before + 2 {
                if start.elapsed() > Duration::from_secs(2) {
                    // Batch N+1 waits for N's sync: the committer runs it. Let both end.
                    return None;
                }
                thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(
                log.unsynced_writes(),
                unsynced_before + 2,
                "batch N and batch N+1, one write each"
            );
            // The power fails: batch N's frame is lost, batch N+1's kept; redb keeps what it
            // synced.
            let mut fates = vec![Fate::Lost; unsynced_before];
            fates.extend([Fate::Lost, Fate::Kept]);
            let mut rng = Rng(7);
            let log_image = log.after_power_loss_with(&fates, true, &mut rng);
            let db_image = db.after_power_loss_with(&[], false, &mut rng);
            Some((db_image, log_image))
        });
        log.release_syncs();
        let Some((db_image, log_image)) = images else {
            acknowledged.extend([n, next]);
            continue;
        };
        let reopened = builder(&clock)
            .open_with_storage(db_image, log_image)
            .expect("no acknowledged batch is missing, so the store opens");
        for key in &acknowledged {
            assert!(
                reopened.get(key).unwrap().is_some(),
                "the acknowledged reserve of {key:?} survives"
            );
        }
        for unacknowledged in [&n, &next] {
            assert!(
                reopened.get(unacknowledged).unwrap().is_none(),
                "{unacknowledged:?} was never acknowledged and is dropped with its frame"
            );
        }
        return;
    }
    panic!("in 20 attempts batch N+1 was never written while batch N synced");
}

/// Finding 3: the batch limit bounded how many requests join a batch, not one request, so one
/// `complete_many` with enough large results made a frame over the format's limit, hit the
/// encoder's `expect`, and the caught panic poisoned the store. Here the limits are scaled
/// down (a 1 MiB frame, 256 KiB batches) so that the input is megabytes, not gigabytes: eight
/// 200 KiB results in one call. No input from a caller may poison the store.
#[test]
fn one_oversized_request_never_poisons_the_store() {
    let clock = ManualClock::new();
    let mut b = builder(&clock);
    b.max_result_len(200 << 10);
    b.__batch_bytes(256 << 10);
    b.__frame_bytes(1 << 20);
    let (db, log) = (SimDisk::new(), SimDisk::new());
    let store = b.open_with_storage(db.clone(), log.clone()).unwrap();
    let leases: Vec<_> = (0..8)
        .map(
            |i| match store.reserve(&key(&format!("big-{i}")), fp()).unwrap() {
                Reservation::Acquired(lease) => lease,
                other => panic!("{other:?}"),
            },
        )
        .collect();
    let items = leases.iter().map(|l| (l, vec![7u8; 200 << 10])).collect();
    let results = store
        .complete_many(items)
        .expect("a large request is not an error of the store");
    for result in results {
        result.expect("each completion fits the limits on its own");
    }
    assert!(
        matches!(
            store.reserve(&key("after"), fp()),
            Ok(Reservation::Acquired(_))
        ),
        "the store still works"
    );
    for lease in &leases {
        let record = store.get(lease.key()).unwrap().unwrap();
        assert!(
            matches!(record.status(), idemstore::Status::Completed { result, .. } if result.len() == 200 << 10)
        );
    }
}

/// Runs `f` on another thread and fails if it does not return within a few seconds; `unblock`
/// runs then (so the stuck thread can finish) before the test fails.
fn returns_promptly<T: Send>(
    what: &str,
    f: impl FnOnce() -> T + Send,
    unblock: impl FnOnce(),
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    thread::scope(|s| {
        s.spawn(move || {
            let _ = tx.send(f());
        });
        match rx.recv_timeout(Duration::from_secs(3)) {
            Ok(value) => value,
            Err(_) => {
                unblock();
                panic!("{what} did not return within 3 s");
            }
        }
    })
}

/// How long an observed message counts as a duplicate, in the duplicate tests.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(60);

/// A store on simulated disks with 10 completed keys and one observed message (within
/// [`DUPLICATE_WINDOW`]): its log disk, the completed keys, the message's key.
fn with_duplicates(clock: &ManualClock) -> (Store, SimDisk, Vec<Key>, Key) {
    let (db, log) = (SimDisk::new(), SimDisk::new());
    let store = builder(clock)
        .open_with_storage(db.clone(), log.clone())
        .unwrap();
    let done: Vec<Key> = (0..10).map(|i| key(&format!("done-{i}"))).collect();
    for k in &done {
        let Reservation::Acquired(lease) = store.reserve(k, fp()).unwrap() else {
            panic!("a new key")
        };
        store.complete(&lease, b"ok".to_vec()).unwrap();
    }
    let seen = key("seen");
    assert_eq!(
        store.observe(&seen, DUPLICATE_WINDOW).unwrap(),
        idemstore::Seen::New
    );
    (store, log, done, seen)
}

/// Finding 4: `reserve_many`, `observe` and `observe_many` always went through the writer, so a
/// batch of duplicates waited for the fdatasync running for someone else's batch. Here that
/// sync never ends until the test lets it: duplicates must be answered anyway.
#[test]
fn a_batch_of_duplicates_never_waits_for_a_sync() {
    let clock = ManualClock::new();
    let (store, log, done, seen) = with_duplicates(&clock);
    let window = DUPLICATE_WINDOW;
    log.hold_syncs();
    thread::scope(|s| {
        let store = &store;
        s.spawn(move || store.reserve(&key("slow"), fp()));
        wait_until("another batch's sync is running", || {
            log.syncs_waiting() == 1
        });
        let items: Vec<_> = done.iter().map(|k| (k.clone(), fp())).collect();
        let answers = returns_promptly(
            "reserve_many of duplicates",
            || store.reserve_many(&items).unwrap(),
            || log.release_syncs(),
        );
        assert!(answers
            .iter()
            .all(|a| matches!(a, Ok(Reservation::Completed(_)))));
        let again = returns_promptly(
            "observe of a duplicate",
            || store.observe(&seen, window).unwrap(),
            || log.release_syncs(),
        );
        assert_eq!(again, idemstore::Seen::Duplicate);
        let many = returns_promptly(
            "observe_many of duplicates",
            || store.observe_many(&done, window).unwrap(),
            || log.release_syncs(),
        );
        assert!(many
            .iter()
            .all(|a| matches!(a, Ok(idemstore::Seen::Duplicate))));
        log.release_syncs();
    });
}

/// Duplicates don't queue behind writers: while a writer is held (a `complete_with` whose
/// closure has not returned holds the commit path and redb's write transaction), every read
/// of an existing key answers: `reserve` and `reserve_many` of completed keys, `get`,
/// `observe` and `observe_many` of a seen message. The keys are read from the file (checkpointed,
/// the cache cleared), not only from memory.
#[test]
fn duplicates_answer_while_a_writer_is_held() {
    let clock = ManualClock::new();
    let (store, _, done, seen) = with_duplicates(&clock);
    let window = DUPLICATE_WINDOW;
    store.checkpoint().unwrap();
    store.__clear_cache();
    let Reservation::Acquired(held) = store.reserve(&key("held"), fp()).unwrap() else {
        panic!("a new key")
    };
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel::<()>();
    thread::scope(|s| {
        let store = &store;
        let writer = s.spawn(move || {
            store.complete_with(&held, b"held".to_vec(), |_| {
                entered_tx.send(()).unwrap();
                let _ = release_rx.recv();
                Ok::<_, std::io::Error>(())
            })
        });
        entered
            .recv_timeout(Duration::from_secs(10))
            .expect("the writer's closure runs");
        let unblock = || {
            let _ = release.send(());
        };
        let one = returns_promptly(
            "reserve of a duplicate",
            || store.reserve(&done[0], fp()).unwrap(),
            unblock,
        );
        assert!(matches!(one, Reservation::Completed(_)), "{one:?}");
        let items: Vec<_> = done.iter().map(|k| (k.clone(), fp())).collect();
        let answers = returns_promptly(
            "reserve_many of duplicates",
            || store.reserve_many(&items).unwrap(),
            unblock,
        );
        assert!(answers
            .iter()
            .all(|a| matches!(a, Ok(Reservation::Completed(_)))));
        let record = returns_promptly("get", || store.get(&done[1]).unwrap(), unblock);
        assert!(record.is_some_and(|r| matches!(r.status(), Status::Completed { .. })));
        let again = returns_promptly(
            "observe of a duplicate",
            || store.observe(&seen, window).unwrap(),
            unblock,
        );
        assert_eq!(again, idemstore::Seen::Duplicate);
        let many = returns_promptly(
            "observe_many of duplicates",
            || store.observe_many(&done, window).unwrap(),
            unblock,
        );
        assert!(many
            .iter()
            .all(|a| matches!(a, Ok(idemstore::Seen::Duplicate))));
        assert!(!writer.is_finished(), "the writer was held throughout");
        release.send(()).unwrap();
        writer.join().unwrap().unwrap();
    });
}

/// Finding 5, reads: a read that checked the poison just before the store was poisoned found
/// the overlay and the cache emptied and fell back to redb, whose committed state can be older
/// than what was acknowledged. It must return the latest acknowledged state or `Poisoned`.
#[test]
fn a_read_racing_the_poisoning_never_returns_an_older_state() {
    let clock = ManualClock::new();
    let (db, log) = (SimDisk::new(), SimDisk::new());
    let store = std::sync::Arc::new(
        builder(&clock)
            .open_with_storage(db.clone(), log.clone())
            .unwrap(),
    );
    let k = key("k");
    let Reservation::Acquired(lease) = store.reserve(&k, fp()).unwrap() else {
        panic!("a new key")
    };
    // redb holds the pending record durably; the completion is acknowledged from the log and
    // the overlay, not yet committed to redb.
    store.checkpoint().unwrap();
    store.complete(&lease, b"done".to_vec()).unwrap();
    let poisoner = std::sync::Arc::clone(&store);
    let failing = log.clone();
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hook_ran = std::sync::Arc::clone(&ran);
    store.__before_next_read(move || {
        failing.fail_after(1);
        assert!(poisoner.reserve(&key("other"), fp()).is_err());
        hook_ran.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    let read = store.get(&k);
    assert!(
        ran.load(std::sync::atomic::Ordering::SeqCst),
        "the read did not run the hook that poisons the store first"
    );
    match read {
        Err(idemstore::Error::Storage(idemstore::StorageError::Poisoned { .. })) => {}
        Ok(Some(record)) => assert!(
            matches!(record.status(), idemstore::Status::Completed { .. }),
            "a read returned {:?}, older than the acknowledged completion",
            record.status()
        ),
        other => panic!("a read returned {other:?}, older than the acknowledged completion"),
    }
}

/// Finding 5, directory entry: the log's directory entry was synced only when the log file had
/// just been created. If a process created it and died before that sync, the next open found
/// the file (still in the page cache), acknowledged writes into it, and a power loss could then
/// take the whole log away. Every open makes the entry durable before the first answer.
#[test]
fn every_open_makes_the_logs_directory_entry_durable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dir-sync.idem");
    drop(Store::open(&path).unwrap());
    idemstore::whitebox::forget_synced(dir.path());
    let store = Store::open(&path).unwrap();
    assert!(
        idemstore::whitebox::synced_dirs()
            .iter()
            .any(|d| d == dir.path()),
        "reopening a store with an existing log did not sync the log's directory"
    );
    drop(store);
}

/// Polls `future` to the end on this thread.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(value) = future.as_mut().poll(&mut cx) {
            return value;
        }
        thread::park_timeout(Duration::from_millis(10));
    }
}

/// Finding 5, async queue: async requests were queued without bound, so while the disk was
/// slow memory grew with every new task. Here syncs are held and 40 tasks each start an async
/// reserve with the queue bounded at 8: at most 8 may wait in the queue, the rest wait to be
/// let in (backpressure), and every one completes once syncs resume.
#[test]
fn the_async_queue_is_bounded_and_callers_wait() {
    let clock = ManualClock::new();
    let mut b = builder(&clock);
    b.__queued_async(8);
    let (db, log) = (SimDisk::new(), SimDisk::new());
    let store = b.open_with_storage(db.clone(), log.clone()).unwrap();
    log.hold_syncs();
    let keys: Vec<Key> = (0..40).map(|i| key(&format!("async-{i}"))).collect();
    let mut futures: Vec<_> = keys
        .iter()
        .map(|k| Box::pin(store.reserve_async(k, fp())))
        .collect();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(futures[0].as_mut().poll(&mut cx).is_pending());
    wait_until("the first batch's sync is running", || {
        log.syncs_waiting() == 1
    });
    for future in &mut futures[1..] {
        assert!(future.as_mut().poll(&mut cx).is_pending());
    }
    let queued = store.__queued_async();
    log.release_syncs();
    // 39 callers asked while the committer waited at the first batch's sync: the queue is
    // full (the bound is reached, not only respected, and the count is real), and no more.
    assert_eq!(
        queued, 8,
        "{queued} async requests queued while the bound is 8 and 39 callers asked"
    );
    for future in futures {
        assert!(matches!(block_on(future), Ok(Reservation::Acquired(_))));
    }
}
