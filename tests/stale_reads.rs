//! The state a reserve reads is handed to the writer, which decides against it instead of
//! reading the key again (`commit/queue.rs`, `Known`). These tests make that state
//! go stale between the read and the writer's decision, each way the engine can change a key
//! behind a reader's back, and check that the writer does not trust it.

use std::sync::Arc;
use std::time::Duration;

use idemstore::{Builder, Fingerprint, Key, ManualClock, Reservation, Store};

fn builder(clock: &ManualClock) -> Builder {
    let mut builder = Store::builder();
    builder
        .clock(clock.clone())
        .lease(Duration::from_secs(3600))
        .checkpoint_interval(Duration::from_secs(3600))
        .sweep_interval(None);
    builder
}

fn key() -> Key {
    Key::new("tenant", "op", "k").unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of(b"request")
}

/// Reserves the key while `between` runs after this reserve read it (absent) and before the
/// writer decides it; returns what this reserve answered.
fn reserve_racing(
    store: &Arc<Store>,
    between: impl FnOnce(&Store) + Send + 'static,
) -> Reservation {
    let other = Arc::clone(store);
    store.__before_next_submit(move || between(&other));
    store.reserve(&key(), fp()).unwrap()
}

fn acquired(answer: Reservation) -> idemstore::Lease {
    match answer {
        Reservation::Acquired(lease) => lease,
        other => panic!("a new key answered {other:?}"),
    }
}

/// Another caller acquires the key and the writer commits it to redb (forgetting its own
/// record of the change) before the first caller's reserve, which read the key as absent, is
/// decided: the first must not acquire it too.
#[test]
fn a_key_acquired_and_committed_after_the_read_is_not_acquired_twice() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        builder(&ManualClock::new())
            .open(dir.path().join("seen.idem"))
            .unwrap(),
    );
    let answer = reserve_racing(&store, |other| {
        acquired(other.reserve(&key(), fp()).unwrap());
        // A checkpoint commits the writer's open transaction and forgets `latest`.
        other.checkpoint().unwrap();
    });
    assert!(
        matches!(answer, Reservation::InProgress { .. }),
        "a key acquired by another caller after this one read it was acquired again: {answer:?}"
    );
}

/// Same, without a commit in between: the writer still holds the other caller's change.
#[test]
fn a_key_acquired_after_the_read_is_not_acquired_twice() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        builder(&ManualClock::new())
            .open(dir.path().join("seen.idem"))
            .unwrap(),
    );
    let answer = reserve_racing(&store, |other| {
        acquired(other.reserve(&key(), fp()).unwrap());
    });
    assert!(
        matches!(answer, Reservation::InProgress { .. }),
        "a key acquired by another caller after this one read it was acquired again: {answer:?}"
    );
}

/// A key completed with `complete_with` (its own durable redb transaction, outside the batch
/// path) after the read: the reserve replays the result rather than acquiring.
#[test]
fn a_key_completed_outside_the_batch_path_after_the_read_is_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        builder(&ManualClock::new())
            .open(dir.path().join("seen.idem"))
            .unwrap(),
    );
    let answer = reserve_racing(&store, |other| {
        let lease = acquired(other.reserve(&key(), fp()).unwrap());
        other.checkpoint().unwrap();
        other
            .complete_with(&lease, b"done".to_vec(), |_| Ok::<(), std::io::Error>(()))
            .unwrap();
    });
    match answer {
        Reservation::Completed(done) => assert_eq!(done.result, b"done"),
        other => panic!("a key completed after the read answered {other:?}"),
    }
}

/// A new key with nothing racing it is acquired, by one write (the writer trusts the read).
#[test]
fn a_new_key_is_acquired() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        builder(&ManualClock::new())
            .open(dir.path().join("seen.idem"))
            .unwrap(),
    );
    acquired(reserve_racing(&store, |_| {}));
    assert!(matches!(
        store.reserve(&key(), fp()).unwrap(),
        Reservation::InProgress { .. }
    ));
}

/// The readers of one writer epoch share one redb snapshot of the records
/// (`state/overlay.rs`, `Overlay::committed`). Each way an epoch ends (the writer commits its
/// open transaction and forgets its changes; `complete_with` commits outside the batch path),
/// a read after it must not come from the snapshot of the epoch before, which lacks what the
/// commit added. The record cache is off, so every read that misses the writer's changes goes
/// to redb.
#[test]
fn a_read_after_a_commit_is_not_served_by_the_snapshot_of_the_epoch_before() {
    let dir = tempfile::tempdir().unwrap();
    let store = builder(&ManualClock::new())
        .cache_records(0)
        .open(dir.path().join("snapshot.idem"))
        .unwrap();
    let other = Key::new("tenant", "op", "other").unwrap();
    // Both reads miss: the epoch's snapshot is opened, without either key.
    acquired(store.reserve(&other, fp()).unwrap());
    let lease = acquired(store.reserve(&key(), fp()).unwrap());
    // The writer's commit ends the epoch and forgets its changes: redb alone holds the key.
    store.checkpoint().unwrap();
    let read = store.get(&key()).unwrap();
    assert_eq!(
        read.map(|record| record.token()),
        Some(lease.token()),
        "a key acquired before a commit read as absent after it"
    );
    assert!(
        matches!(
            store.reserve(&key(), fp()).unwrap(),
            Reservation::InProgress { .. }
        ),
        "a key acquired before a commit was acquired again after it"
    );
    // A completion committed outside the batch path (its own durable redb transaction).
    store
        .complete_with(&lease, b"done".to_vec(), |_| Ok::<(), std::io::Error>(()))
        .unwrap();
    match store.reserve(&key(), fp()).unwrap() {
        Reservation::Completed(done) => assert_eq!(done.result, b"done"),
        other => panic!("a key completed by complete_with then answered {other:?}"),
    }
}

/// Two readers of one writer epoch share one snapshot (one redb read transaction opened, not
/// one per reader); once the epoch ends, a reader gets a new snapshot that sees the commit,
/// while the old one still reads as it did.
#[test]
fn readers_of_one_epoch_share_a_snapshot_and_a_new_epoch_gets_a_new_one() {
    use idemstore::whitebox::{decode_record, Epochs, Tree};
    let tree = Tree::new(&idemstore::ManualClock::starting_at(
        idemstore::whitebox::from_millis(0),
    ))
    .unwrap();
    let expiry = |snapshot: &idemstore::whitebox::Snapshot| {
        let bytes = snapshot.stored(b"k").unwrap().expect("stored");
        decode_record(&bytes).unwrap().expires_at()
    };
    tree.put(b"k", None, 100).unwrap();
    let epochs = Epochs::default();
    let (first_epoch, first) = epochs.committed(&tree).unwrap();
    let (_, again) = epochs.committed(&tree).unwrap();
    assert!(first.is(&again), "two readers of one epoch did not share");
    assert_eq!(epochs.opened(), 1);
    // The writer commits, then ends the epoch.
    tree.put(b"k", Some(100), 200).unwrap();
    epochs.next_epoch();
    let (epoch, second) = epochs.committed(&tree).unwrap();
    assert!(epoch > first_epoch);
    assert_eq!(epochs.opened(), 2);
    assert_eq!(
        expiry(&second),
        Some(idemstore::whitebox::from_millis(200)),
        "a read in a new epoch was served by the snapshot of the epoch before"
    );
    assert_eq!(expiry(&first), Some(idemstore::whitebox::from_millis(100)));
}
