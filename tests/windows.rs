//! Expiry windows (docs/format.md, "The redb tables"): records live in one table per window of
//! expiry time, a window's table goes whole once it has ended, and each window's filter is
//! saved by every durable commit, so a reopen finds every key without reading the tables.

use std::time::{Duration, Instant};

use idemstore::redb::{ReadableDatabase, ReadableTableMetadata};
use idemstore::{ManualClock, Reservation, Store};

use crate::common::{fp, key, records_table, records_tables};

/// A 32 s retention: windows of 1 s.
const RETENTION: Duration = Duration::from_secs(32);

fn open(path: &std::path::Path, clock: &ManualClock, sweeper: bool) -> Store {
    Store::builder()
        .clock(clock.clone())
        .retention(RETENTION)
        .preallocate_log(false)
        .sweep_interval(sweeper.then_some(Duration::from_millis(10)))
        .open(path)
        .unwrap()
}

/// Completes `n` keys named `{prefix}-{i}`, moving the clock 100 ms every 10 keys.
fn complete(store: &Store, clock: &ManualClock, prefix: &str, n: usize) {
    for i in 0..n {
        let k = key("t", "op", &format!("{prefix}-{i}"));
        match store.reserve(&k, fp("r")).unwrap() {
            Reservation::Acquired(lease) => store.complete(&lease, b"done".to_vec()).unwrap(),
            other => panic!("{k}: {other:?}"),
        }
        if i % 10 == 9 {
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

/// Keys written over several seconds land in one table per second (a 32nd of the retention),
/// each key in one table; after a clean close and a reopen, and after a crash (the log
/// replayed, the filters of the windows written since the last durable commit built from
/// their keys), every key is found and `verify` finds every key in its window's filter.
#[test]
fn keys_are_kept_by_window_and_found_after_reopen_and_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.idem");
    let clock = ManualClock::new();
    {
        let store = open(&path, &clock, false);
        complete(&store, &clock, "a", 400);
    }
    let found = tables(&path);
    assert!(found.len() >= 4, "4 s of keys in 1 s windows: {found:?}");
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
/// and an expired key waits at most for its window's end. The space comes back: writing the
/// same number of keys window after window, the file stops growing after the first turnover.
#[test]
fn ended_windows_go_whole_and_their_space_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.idem");
    let clock = ManualClock::new();
    let store = open(&path, &clock, true);
    let mut sizes = Vec::new();
    for turn in 0..6 {
        // 40 s of keys: more than a retention, so the first of them expire meanwhile.
        complete(&store, &clock, &format!("t{turn}"), 4_000);
        let deadline = Instant::now() + Duration::from_secs(20);
        // Every window that ended is deleted within a few sweeper intervals.
        let ended = |s: &Store| s.counts().map(|c| c.expired).unwrap_or(u64::MAX);
        while ended(&store) > 200 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        // At most the keys of the window that has not ended (1 s: 100 keys) and the one
        // ending now are expired and still stored.
        assert!(
            ended(&store) <= 200,
            "turn {turn}: {} expired keys stored",
            ended(&store)
        );
        store.checkpoint().unwrap();
        sizes.push(std::fs::metadata(&path).unwrap().len());
    }
    let stats = store.stats();
    assert!(stats.windows_deleted >= 100, "{stats:?}");
    // No live key was deleted: the last retention's keys are all there.
    for i in 4_000 - 3_000..4_000 {
        let k = key("t", "op", &format!("t5-{i}"));
        assert!(
            store.get(&k).unwrap().is_some(),
            "{k} deleted within its retention"
        );
    }
    let settled = sizes[1];
    assert!(
        sizes[2..].iter().all(|&s| s <= settled + settled / 5),
        "the file kept growing at steady state: {sizes:?}"
    );
}
