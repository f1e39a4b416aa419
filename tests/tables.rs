//! The store's tables below the commit path: the B-tree writes a record's put makes, and the
//! changes the applier writes for several queued batches.

use std::time::Duration;

use idemstore::whitebox::{from_millis, key_encoded, merged_changes, Tree};
use idemstore::{Fingerprint, Key, ManualClock, Record, Reservation, Store};

const HOUR: u64 = 3_600_000;

/// B-tree writes per new key and per completion, as the applier and log replay make them: a
/// new pending key is its record and its lease entry; a completion rewrites the record and
/// drops the entry, and moves the record when its expiry falls in another window (one more
/// removal).
#[test]
fn a_new_key_is_two_btree_writes_and_a_completion_two_or_three() {
    // The records as a store writes them: pending from time 0 with a 1 s lease, then
    // completed at `done_at`, each kept 24 hours.
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::starting_at(from_millis(0));
    let store = Store::builder()
        .clock(clock.clone())
        .lease(Duration::from_secs(1))
        .retention(Duration::from_millis(24 * HOUR))
        .sweep_interval(None)
        .open(dir.path().join("s.idem"))
        .unwrap();
    let records = |id: &str, done_at: u64| -> (Vec<u8>, Record, Record) {
        let key = Key::new("u", "op", id).unwrap();
        clock.set(from_millis(0));
        let Reservation::Acquired(lease) = store.reserve(&key, Fingerprint::of(b"r")).unwrap()
        else {
            panic!("a new key");
        };
        let pending = store.get(&key).unwrap().unwrap();
        clock.set(from_millis(done_at));
        store.complete(&lease, b"ok".to_vec()).unwrap();
        let done = store.get(&key).unwrap().unwrap();
        (key_encoded(&key), pending, done)
    };
    let tree = Tree::new(&clock).unwrap();
    for (id, done_at, moves) in [("a", 500, false), ("b", HOUR, true)] {
        let (key, pending, done) = records(id, done_at);
        let expiry = |record: &Record| {
            record
                .expires_at()
                .map(|at| at.duration_since(from_millis(0)).unwrap().as_millis() as u64)
                .unwrap()
        };
        assert_eq!(
            tree.put_record(&key, None, &pending).unwrap(),
            2,
            "a new key"
        );
        let writes = tree.put_record(&key, Some(&pending), &done).unwrap();
        assert_eq!(writes, 2 + u64::from(moves), "a completion");
        assert_eq!(tree.load(&key).unwrap(), Some(done.clone()));
        assert!(tree.window_holds(expiry(&done), &key).unwrap());
        assert_eq!(tree.windows_differ(expiry(&pending), expiry(&done)), moves);
        if moves {
            assert!(
                !tree.window_holds(expiry(&pending), &key).unwrap(),
                "left behind"
            );
        }
    }
    // No lease entry is left: the records are not pending.
    assert_eq!(tree.deadline_entries().unwrap(), 0);
}

/// A key changed in several queued batches (a reserve, then its completion, then another
/// change) is written once: its last state, unindexed where its first change found it. Keys
/// come out in key order, each once.
#[test]
fn each_key_is_written_once_with_its_last_state_where_it_was_first_indexed() {
    let key = |id: &str| Key::new("t", "op", id).unwrap();
    let index = |at| Some((None, at));
    let merged = merged_changes(vec![
        vec![(key("b"), None, Some(10)), (key("a"), Some(5), Some(11))],
        vec![(key("b"), Some(10), Some(20))],
        vec![(key("c"), None, Some(30)), (key("b"), Some(20), None)],
    ]);
    assert_eq!(
        merged,
        vec![
            (key("a"), index(5), index(11)),
            (key("b"), None, None),
            (key("c"), None, index(30)),
        ]
    );
}
