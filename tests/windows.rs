//! Expiry windows (docs/format.md, "The redb tables"): records live in one table per window of
//! expiry time, a window's table goes whole once it has ended, and each window's filter is
//! saved by every durable commit, so a reopen finds every key without reading the tables.

use std::time::{Duration, Instant, UNIX_EPOCH};

use idemstore::redb::{ReadableDatabase, ReadableTableMetadata};
use idemstore::{ManualClock, Reservation, Store};

use crate::common::{fp, key, records_table, records_tables};

/// An 8 s retention: windows of 250 ms.
const RETENTION: Duration = Duration::from_secs(8);

/// A clock of its own, at a whole second (so at the start of a window): the windows' edges
/// fall at the same keys on any date.
fn clock() -> ManualClock {
    ManualClock::starting_at(UNIX_EPOCH + Duration::from_secs(1_800_000_000))
}

fn open(path: &std::path::Path, clock: &ManualClock, sweeper: bool) -> Store {
    Store::builder()
        .clock(clock.clone())
        .retention(RETENTION)
        .preallocate_log(false)
        .sweep_interval(sweeper.then_some(Duration::from_millis(10)))
        .open(path)
        .unwrap()
}

/// Completes `n` keys named `{prefix}-{i}`, moving the clock 100 ms every 10 keys. The 10
/// keys of one clock reading are reserved in one batch and completed in one (two syncs).
fn complete(store: &Store, clock: &ManualClock, prefix: &str, n: usize) {
    for first in (0..n).step_by(10) {
        let items: Vec<_> = (first..n.min(first + 10))
            .map(|i| (key("t", "op", &format!("{prefix}-{i}")), fp("r")))
            .collect();
        let leases: Vec<_> = (store.reserve_many(&items).unwrap().into_iter().zip(&items))
            .map(|(answer, (k, _))| match answer.unwrap() {
                Reservation::Acquired(lease) => (lease, b"done".to_vec()),
                other => panic!("{k}: {other:?}"),
            })
            .collect();
        let completions = leases.iter().map(|(lease, result)| (lease, result.clone()));
        for answer in store.complete_many(completions.collect()).unwrap() {
            answer.unwrap();
        }
        if items.len() == 10 {
            clock.advance(Duration::from_millis(100));
        }
    }
}

/// The store's records tables and the records in each (the store must be closed).
fn tables(path: &std::path::Path) -> Vec<(String, u64)> {
    let db = idemstore::open_redb(path).unwrap();
    let txn = db.begin_read().unwrap();
    records_tables(txn.list_tables().unwrap())
        .into_iter()
        .map(|name| {
            let len = txn.open_table(records_table(&name)).unwrap().len().unwrap();
            (name, len)
        })
        .collect()
}

/// Keys written over several seconds land in one table per 250 ms (a 32nd of the retention),
/// each key in one table; after a clean close and a reopen, and after a crash (the log
/// replayed, the filters of the windows written since the last durable commit built from
/// their keys), every key is found and `verify` finds every key in its window's filter.
#[test]
fn keys_are_kept_by_window_and_found_after_reopen_and_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.idem");
    let clock = clock();
    {
        let store = open(&path, &clock, false);
        complete(&store, &clock, "a", 400);
    }
    let found = tables(&path);
    assert!(
        found.len() >= 16,
        "4 s of keys in 250 ms windows: {found:?}"
    );
    assert_eq!(found.iter().map(|(_, n)| n).sum::<u64>(), 400, "{found:?}");
    let store = open(&path, &clock, false);
    for i in 0..400 {
        let k = key("t", "op", &format!("a-{i}"));
        assert!(
            store.get(&k).unwrap().is_some(),
            "{k} lost after a clean reopen"
        );
    }
    assert!(store.verify().unwrap().is_ok());
    // Written after the last durable commit, then the process dies (no clean close).
    complete(&store, &clock, "b", 300);
    let copy = dir.path().join("crashed.idem");
    std::fs::copy(&path, &copy).unwrap();
    std::fs::copy(
        dir.path().join("w.idem.wal"),
        dir.path().join("crashed.idem.wal"),
    )
    .unwrap();
    drop(store);
    let store = open(&copy, &clock, false);
    for (prefix, n) in [("a", 400), ("b", 300)] {
        for i in 0..n {
            let k = key("t", "op", &format!("{prefix}-{i}"));
            assert!(store.get(&k).unwrap().is_some(), "{k} lost after a crash");
        }
    }
    let report = store.verify().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

/// Once a window has ended, the background sweeper deletes its table whole (counted in
/// `Stats::windows_deleted`), never before: a key still in its retention is never deleted,
/// and an expired key waits at most for its window's end.
#[test]
fn ended_windows_go_whole_and_never_before() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.idem");
    let clock = clock();
    let store = open(&path, &clock, true);
    for turn in 0..3 {
        // 10 s of keys: more than a retention, so the first of them expire meanwhile.
        complete(&store, &clock, &format!("t{turn}"), 1_000);
        let deadline = Instant::now() + Duration::from_secs(20);
        let expired = |s: &Store| s.counts().map(|c| c.expired).unwrap_or(u64::MAX);
        // Every window that ended is deleted within a few sweeper intervals: what stays is
        // the window that has not ended (250 ms: 25 keys) and the one ending now.
        while expired(&store) > 50 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            expired(&store) <= 50,
            "turn {turn}: {} expired keys stored",
            expired(&store)
        );
    }
    // One more write, applied by the checkpoint's flush: applying a batch deletes the windows
    // that have ended, here and now rather than at the sweeper's next look.
    complete(&store, &clock, "last", 1);
    store.checkpoint().unwrap();
    let stats = store.stats();
    assert!(stats.windows_deleted >= 60, "{stats:?}");
    // No live key was deleted: every key of the last turn still in its retention is in the
    // file (keys 210 on; 0-209 expired by the turn's end), those of the window that ends
    // next among them. Read after a reopen: the record cache of the store that wrote them
    // would answer for keys the file no longer holds.
    drop(store);
    let store = open(&path, &clock, false);
    for i in 210..1_000 {
        let k = key("t", "op", &format!("t2-{i}"));
        assert!(
            store.get(&k).unwrap().is_some(),
            "{k} deleted within its retention"
        );
    }
    assert!(store.get(&key("t", "op", "t2-0")).unwrap().is_none());
}
