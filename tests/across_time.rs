//! Guarantees across time: whatever the engine's background work did between two calls on
//! the same key (the applier's commit, the writer forgetting what that commit holds, the
//! overlay moving to the record cache, a checkpoint, a window deletion, a clock step), a
//! completed key stays completed, and `release_if_pending`, `extend` and a second `complete`
//! never touch it.
//!
//! Each test opens a store whose background work runs only when the test asks
//! (`Builder::__manual_background`), and places one background step, or a sequence of them,
//! between the two calls: the same interleaving on every run, with no sleep.

use std::time::Duration;

use idemstore::whitebox::Background;
use idemstore::{
    Builder, Error, Fingerprint, Key, Lease, LeaseLostReason, ManualClock, Reservation, Status,
    Store,
};
use tempfile::TempDir;

/// Every sequence of background steps tried between the completion and the call after it:
/// each step alone, and the applier's commit followed by each other step (the moment the
/// reports from outside found: the applier has committed, the writer has not yet forgotten).
fn between() -> Vec<Vec<Background>> {
    use Background::*;
    let steps = Background::ALL;
    let mut all: Vec<Vec<Background>> = vec![vec![]];
    all.extend(steps.iter().map(|s| vec![*s]));
    all.extend(steps.iter().map(|s| vec![ApplierCommit, *s]));
    all.push(vec![ApplierCommit, WriterDrain, DrainOverlay]);
    all.push(vec![CheckpointStart, ApplierCommit, CheckpointFinish]);
    all
}

/// What comes before the key's reservation is completed: nothing, or a checkpoint (which puts
/// the pending record in the record cache: the stale copy the writer read).
#[derive(Debug, Clone, Copy)]
enum Before {
    Nothing,
    Checkpoint,
    Flush,
}

const BEFORE: [Before; 3] = [Before::Nothing, Before::Checkpoint, Before::Flush];

struct Fixture {
    _dir: TempDir,
    store: Store,
}

fn open(clock: &ManualClock) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = builder(clock).open(dir.path().join("s.idem")).unwrap();
    Fixture { _dir: dir, store }
}

fn builder(clock: &ManualClock) -> Builder {
    let mut builder = Store::builder();
    builder
        .clock(clock.clone())
        .lease(Duration::from_secs(60))
        .retention(Duration::from_secs(3600))
        .__manual_background();
    builder
}

fn key(i: usize) -> Key {
    Key::new("tenant", "POST /charges", format!("k{i}")).unwrap()
}

/// Reserves key `i` (acquired), runs `before`, completes it with `A`, runs `steps`.
fn completed_key(store: &Store, i: usize, before: Before, steps: &[Background]) -> Lease {
    let lease = match store.reserve(&key(i), Fingerprint::of(b"body")).unwrap() {
        Reservation::Acquired(lease) => lease,
        other => panic!("a new key was not acquired: {other:?}"),
    };
    match before {
        Before::Nothing => {}
        Before::Checkpoint => store.checkpoint().unwrap(),
        Before::Flush => store.__background(Background::Flush).unwrap(),
    }
    store.complete(&lease, b"A".to_vec()).unwrap();
    for step in steps {
        store.__background(*step).unwrap();
    }
    lease
}

/// The key still answers with the first result, to `get` and to a duplicate reserve.
fn assert_still_completed(store: &Store, i: usize, case: &str) {
    assert_still_completed_key(store, &key(i), case);
    let record = store
        .get(&key(i))
        .unwrap()
        .expect("the completed key is gone");
    assert!(
        matches!(record.status(), Status::Completed { result: b"A", .. }),
        "{case}: {record:?}"
    );
}

fn cases(mut check: impl FnMut(&Store, Lease, &str)) {
    let clock = ManualClock::new();
    let fx = open(&clock);
    let mut i = 0;
    for before in BEFORE {
        for steps in between() {
            let lease = completed_key(&fx.store, i, before, &steps);
            let case = format!("key {i}: {before:?}, complete, {steps:?}");
            check(&fx.store, lease, &case);
            assert_still_completed(&fx.store, i, &case);
            i += 1;
        }
    }
}

#[test]
fn release_if_pending_never_deletes_a_completed_key_whatever_ran_in_between() {
    cases(|store, lease, case| {
        assert!(
            !store.release_if_pending(&lease).unwrap(),
            "{case}: release_if_pending deleted a completed key"
        );
    });
}

#[test]
fn extend_never_reopens_a_completed_key_whatever_ran_in_between() {
    cases(|store, lease, case| match store.extend(&lease) {
        Err(Error::LeaseLost {
            reason: LeaseLostReason::Completed { .. },
            ..
        }) => {}
        other => panic!("{case}: extend of a completed key's lease gave {other:?}"),
    });
}

#[test]
fn a_second_complete_never_replaces_the_stored_result_whatever_ran_in_between() {
    // Completing again with the same lease is accepted and keeps the first result (the
    // method's doc); `assert_still_completed` checks the result is still the first.
    cases(|store, lease, case| {
        let second = store.complete(&lease, b"B".to_vec());
        assert!(second.is_ok(), "{case}: a second complete gave {second:?}");
    });
}

/// The same calls in async code and in batches go through the same read.
#[test]
fn batches_and_async_calls_never_touch_a_completed_key_whatever_ran_in_between() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    cases(|store, lease, case| {
        let released = runtime
            .block_on(store.release_if_pending_async(&lease))
            .unwrap();
        assert!(
            !released,
            "{case}: the async release deleted a completed key"
        );
        let many = store.release_if_pending_many(&[&lease]).unwrap();
        assert!(
            many.iter().all(|r| matches!(r, Ok(false))),
            "{case}: release_many gave {many:?}"
        );
    });
}

/// A clock stepped back holds the store's time: a key that expired stays expired, and a
/// lease that ran out stays out, until the clock passes where it was.
#[test]
fn a_clock_stepped_back_brings_back_no_expired_key_and_no_lease() {
    let clock = ManualClock::new();
    let fx = open(&clock);
    let store = &fx.store;
    let start = clock.time();
    let done = completed_key(store, 0, Before::Nothing, &[]);
    drop(done);
    let Reservation::Acquired(_) = store.reserve(&key(1), Fingerprint::of(b"body")).unwrap() else {
        panic!("key 1 was not acquired");
    };
    // Past the retention of key 0 and the lease of key 1.
    clock.advance(Duration::from_secs(3601));
    assert!(store.get(&key(0)).unwrap().is_none(), "key 0 expired");
    store.__background(Background::DropEndedWindows).unwrap();
    // An NTP correction steps the clock back to before both.
    clock.set(start);
    assert!(
        store.get(&key(0)).unwrap().is_none(),
        "an expired key came back when the clock stepped back"
    );
    match store.reserve(&key(1), Fingerprint::of(b"body")).unwrap() {
        Reservation::Acquired(lease) => assert_eq!(lease.attempt(), 2, "a takeover"),
        other => panic!("a lease that ran out came back: {other:?}"),
    }
    match store.reserve(&key(0), Fingerprint::of(b"body")).unwrap() {
        Reservation::Acquired(lease) => assert_eq!(lease.attempt(), 1),
        other => panic!("an expired key answered {other:?}"),
    }
}

/// The reports from outside, as they were made: a store on `Store::open`'s defaults with its
/// background threads running, 40 keys reserved, a checkpoint, each key completed, then the
/// call repeated on every key until the applier has committed the completions and the
/// writer's next batches ran (the moment it used to read a stale state), every answer
/// checked. Three runs per call under `cargo test`; `IDEMSTORE_LONG=1` runs 1,000 (in a
/// release build: RELIABILITY.md, "The state-machine test").
#[test]
fn the_reported_races_never_happen_with_the_background_threads_running() {
    let runs = if std::env::var_os("IDEMSTORE_LONG").is_some() {
        1000
    } else {
        3
    };
    for call in [Call::Release, Call::Extend, Call::CompleteAgain] {
        for run in 0..runs {
            race(call, run);
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Call {
    Release,
    Extend,
    CompleteAgain,
}

fn race(call: Call, run: usize) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::builder()
        .preallocate_log(false)
        .open(dir.path().join("s.idem"))
        .unwrap();
    let keys: Vec<Key> = (0..40)
        .map(|i| Key::new("tenant", "POST /charges", format!("r{run}-{i}")).unwrap())
        .collect();
    let leases: Vec<Lease> = keys
        .iter()
        .map(
            |k| match store.reserve(k, Fingerprint::of(b"body")).unwrap() {
                Reservation::Acquired(lease) => lease,
                other => panic!("{other:?}"),
            },
        )
        .collect();
    store.checkpoint().unwrap();
    for lease in &leases {
        store.complete(lease, b"A".to_vec()).unwrap();
    }
    let commits = store.stats().commits;
    let mut rounds = 0u64;
    let mut after_commit = 0;
    // Until the applier has committed the completions (a condition on the store's own
    // counter, not a time) and three rounds ran after that commit.
    while after_commit < 3 {
        if store.stats().commits > commits {
            after_commit += 1;
        }
        assert!(rounds < 1_000_000, "{call:?}: the applier never committed");
        for lease in &leases {
            let case = format!("{call:?}, run {run}, round {rounds}, {}", lease.key());
            match call {
                Call::Release => assert!(
                    !store.release_if_pending(lease).unwrap(),
                    "{case}: release_if_pending deleted a completed key"
                ),
                Call::Extend => match store.extend(lease) {
                    Err(Error::LeaseLost {
                        reason: LeaseLostReason::Completed { .. },
                        ..
                    }) => {}
                    other => panic!("{case}: extend of a completed key gave {other:?}"),
                },
                Call::CompleteAgain => store.complete(lease, b"B".to_vec()).unwrap(),
            }
        }
        rounds += 1;
    }
    for (i, key) in keys.iter().enumerate() {
        assert_still_completed_key(&store, key, &format!("{call:?}, run {run}, key {i}"));
    }
}

fn assert_still_completed_key(store: &Store, key: &Key, case: &str) {
    match store.reserve(key, Fingerprint::of(b"body")).unwrap() {
        Reservation::Completed(done) => {
            assert_eq!(done.result, b"A", "{case}: the stored result changed")
        }
        other => panic!("{case}: a completed key answered {other:?}: the work would run twice"),
    }
}
