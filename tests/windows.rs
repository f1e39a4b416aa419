//! Expiry windows (docs/format.md, "The redb tables"): records live in one table per window of
//! expiry time, a window's table goes whole once it has ended, and each window's filter is
//! saved by every durable commit, so a reopen finds every key without reading the tables.

use std::time::{Duration, Instant, UNIX_EPOCH};

use idemstore::redb::{ReadableDatabase, ReadableTableMetadata};
use idemstore::whitebox::Background;
use idemstore::{Durability, ManualClock, Reservation, Store};

use crate::common::{fp, key, records_table, records_tables};

/// An 8 s retention: windows of 256 ms (the largest power of two at most a 16th of it).
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

/// Completes `n` keys named `{prefix}-{i}` of operation "op", moving the clock 100 ms every 10 keys. The 10
/// keys of one clock reading are reserved in one batch and completed in one (two syncs).
fn complete(store: &Store, clock: &ManualClock, prefix: &str, n: usize) {
    for first in (0..n).step_by(10) {
        let ids: Vec<String> = (first..n.min(first + 10))
            .map(|i| format!("{prefix}-{i}"))
            .collect();
        complete_ids(store, "op", &ids);
        if ids.len() == 10 {
            clock.advance(Duration::from_millis(100));
        }
    }
}

/// A copy of the store at `path` and its log (`crashed.idem` beside it), as a process that
/// dies now leaves them: taken while the store is open, so nothing is closed cleanly.
fn crash_copy(path: &std::path::Path) -> std::path::PathBuf {
    let copy = path.with_file_name("crashed.idem");
    std::fs::copy(path, &copy).unwrap();
    let mut wal = path.as_os_str().to_owned();
    wal.push(".wal");
    std::fs::copy(wal, path.with_file_name("crashed.idem.wal")).unwrap();
    copy
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

/// Keys written over several seconds land in one table per 256 ms (a 16th of the retention or less),
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
    let copy = crash_copy(&path);
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
        // the window that has not ended (256 ms: 25 keys) and the one ending now.
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

/// The time of `clock`, in milliseconds.
fn millis(clock: &ManualClock) -> u64 {
    use idemstore::Clock;
    idemstore::whitebox::to_millis(clock.now())
}

/// The most windows (records tables) a store keeps, whatever its mix of retentions.
const MOST_WINDOWS: usize = 64;
/// The windows from which a store is crowded (`src/tree/windows.rs`).
const CROWDED: usize = 48;

/// A store without fsyncs (what is checked is where records are kept, not their durability),
/// whose sweeper never looks during a test (an hour of real time): ended windows go when the
/// applier commits (each checkpoint's flush), not at the sweeper's pace.
fn open_mixed(path: &std::path::Path, clock: &ManualClock, retention: Duration) -> Store {
    Store::builder()
        .clock(clock.clone())
        .retention(retention)
        .retention_for("long", Duration::from_secs(7 * 24 * 3600))
        .durability(Durability::Buffered {
            flush_interval: Duration::from_secs(3600),
        })
        .preallocate_log(false)
        .sweep_interval(Some(Duration::from_secs(3600)))
        .open(path)
        .unwrap()
}

/// Reserves and completes `ids` of operation `op` in one batch each.
fn complete_ids(store: &Store, op: &str, ids: &[String]) {
    let items: Vec<_> = ids.iter().map(|id| (key("t", op, id), fp("r"))).collect();
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
}

/// Applies everything and deletes the windows that have ended (a checkpoint's flush), then
/// checks the store keeps at most [`MOST_WINDOWS`] windows, and that its file agrees once
/// closed.
fn windows_now(store: &Store, when: &str) -> usize {
    store.checkpoint().unwrap();
    let windows = store.__windows();
    assert!(
        windows <= MOST_WINDOWS,
        "{when}: {windows} windows, more than {MOST_WINDOWS}"
    );
    windows
}

/// A store of a 5-minute retention whose operation "long" keeps its keys 7 days: 20,000 keys
/// completed over a simulated week, one in ten of them long, in batches of 10 every 302.4 s.
/// It keeps at most 64 windows all along (a window per record would be 20,000 tables), every
/// key is found until it expires and is gone after, and a clean reopen finds every long key
/// still in its retention, with the file holding no more tables than that.
#[test]
fn a_week_of_mixed_retentions_keeps_at_most_64_windows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.idem");
    let clock = clock();
    let start = millis(&clock);
    let step = Duration::from_millis(302_400);
    let mut store = open_mixed(&path, &clock, Duration::from_secs(300));
    let mut most = 0;
    for batch in 0..2_000u64 {
        let op = if batch % 10 == 9 { "long" } else { "short" };
        let ids: Vec<String> = (0..10).map(|i| format!("{batch}-{i}")).collect();
        complete_ids(&store, op, &ids);
        for id in &ids {
            assert!(store.get(&key("t", op, id)).unwrap().is_some(), "{op} {id}");
        }
        if batch >= 1 && (batch - 1) % 10 != 9 {
            let gone = key("t", "short", &format!("{}-0", batch - 1));
            clock.advance(step);
            assert!(store.get(&gone).unwrap().is_none(), "{gone} after 302 s");
        } else {
            clock.advance(step);
        }
        if batch % 100 == 99 {
            most = most.max(windows_now(&store, &format!("batch {batch}")));
        }
        if batch == 999 {
            // Half way: a clean reopen keeps every long key.
            drop(store);
            store = open_mixed(&path, &clock, Duration::from_secs(300));
        }
    }
    assert!(most >= 2, "records were kept in windows: {most}");
    let now = millis(&clock);
    drop(store);
    let store = open_mixed(&path, &clock, Duration::from_secs(300));
    for batch in (9..2_000u64).step_by(10) {
        let written = start + batch * 302_400;
        let live = written + 7 * 24 * 3_600_000 > now;
        let k = key("t", "long", &format!("{batch}-3"));
        assert_eq!(store.get(&k).unwrap().is_some(), live, "{k}");
    }
    drop(store);
    assert!(tables(&path).len() <= MOST_WINDOWS, "{:?}", tables(&path));
}

/// A store created with a 1 s retention, then reopened with 24 h: each key's window comes from
/// its own horizon, not from the retention the store was created with, so a day of keys keeps
/// few windows, and every key is found until it expires.
#[test]
fn a_store_made_with_1_s_then_opened_with_24_h_keeps_at_most_64_windows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.idem");
    let clock = clock();
    let store = open_mixed(&path, &clock, Duration::from_secs(1));
    for batch in 0..200u64 {
        complete_ids(&store, "op", &[format!("s{batch}")]);
        clock.advance(Duration::from_millis(50));
        if batch % 50 == 49 {
            windows_now(&store, &format!("1 s: batch {batch}"));
        }
    }
    drop(store);
    let store = open_mixed(&path, &clock, Duration::from_secs(24 * 3600));
    let first = millis(&clock);
    // 2 days of keys, one batch every 3 minutes.
    for batch in 0..960u64 {
        let ids = vec![format!("d{batch}-a"), format!("d{batch}-b")];
        complete_ids(&store, "op", &ids);
        clock.advance(Duration::from_secs(180));
        if batch % 40 == 39 {
            windows_now(&store, &format!("24 h: batch {batch}"));
        }
    }
    let now = millis(&clock);
    for batch in (0..960u64).step_by(7) {
        let written = first + batch * 180_000;
        let k = key("t", "op", &format!("d{batch}-a"));
        let live = written + 24 * 3_600_000 > now;
        assert_eq!(store.get(&k).unwrap().is_some(), live, "{k}");
    }
    drop(store);
    assert!(tables(&path).len() <= MOST_WINDOWS, "{:?}", tables(&path));
}

/// Any mix of horizons, from 1 ms to 2 years, written at random times on the store's tables
/// alone: the store gets crowded (more than 64 windows without the rule for crowded stores),
/// yet its windows never number more than 64, and every key is found until it expires.
#[test]
fn any_mix_of_horizons_keeps_at_most_64_windows() {
    use idemstore::whitebox::Tree;
    let clock = clock();
    let tree = Tree::new(&clock).unwrap();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut live: Vec<(Vec<u8>, u64)> = Vec::new();
    let mut most = 0;
    for i in 0..6_000u64 {
        let now = millis(&clock);
        // Horizons spread evenly over the powers of two from 1 ms to about 2 years.
        let horizon = 1 + next() % (1u64 << (next() % 36));
        let k = format!("\x01t\x02op\x05k{i:04}").into_bytes();
        tree.put(&k, None, now + horizon).unwrap();
        live.push((k, now + horizon));
        clock.advance(Duration::from_millis(next() % 60_000));
        if i % 50 == 49 {
            let now = millis(&clock);
            tree.drop_ended_windows(now).unwrap();
            most = most.max(tree.windows());
            assert!(
                tree.windows() <= MOST_WINDOWS,
                "key {i}: {} windows",
                tree.windows()
            );
            assert_eq!(tree.tables().unwrap(), tree.windows());
            live.retain(|(_, expires)| *expires >= now);
            for (k, _) in live.iter().step_by(7) {
                assert!(tree.finds(k).unwrap(), "{k:?} lost before it expired");
            }
        }
    }
    assert!(most >= CROWDED, "the mix crowded the store: {most} windows");
}

/// A pending record's window (its expiry is a lease, 60 s, past the completed record's) is
/// deleted once every record in it moved on at completion, at the applier's next commit,
/// rather than staying empty until it ends: 2 s of keys of an 8 s retention keep only the
/// windows of their completed records (2 s over 256 ms: 8 or 9), not as many again of empty
/// ones, and a window holding a reservation not completed stays.
#[test]
fn a_window_every_record_left_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.idem");
    let clock = clock();
    let store = open_mixed(&path, &clock, Duration::from_secs(8));
    for batch in 0..20 {
        let items: Vec<_> = (0..10)
            .map(|i| (key("t", "op", &format!("{batch}-{i}")), fp("r")))
            .collect();
        let leases: Vec<_> = store
            .reserve_many(&items)
            .unwrap()
            .into_iter()
            .map(|answer| match answer.unwrap() {
                Reservation::Acquired(lease) => (lease, b"done".to_vec()),
                other => panic!("{other:?}"),
            })
            .collect();
        // The pending records reach the file (not merged with their completions).
        store.checkpoint().unwrap();
        let completions = leases.iter().map(|(lease, result)| (lease, result.clone()));
        for answer in store.complete_many(completions.collect()).unwrap() {
            answer.unwrap();
        }
        clock.advance(Duration::from_millis(100));
    }
    let windows = windows_now(&store, "completed");
    assert!((8..=10).contains(&windows), "{windows} windows");
    // A reservation not completed keeps its window.
    let Reservation::Acquired(_lease) = store.reserve(&key("t", "op", "held"), fp("r")).unwrap()
    else {
        panic!("held");
    };
    assert_eq!(windows_now(&store, "held"), windows + 1);
    drop(store);
    assert_eq!(tables(&path).len(), windows + 1, "{:?}", tables(&path));
}

/// `sweep(limit)` deletes the earliest expiries exactly, also where a narrow window nests in a
/// wide one and ends first while holding a later expiry: a 64 s key in a 2,048 ms window, then
/// a 1 s key expiring 100 ms after it, in a 32 ms window inside that span. `sweep(1)` deletes
/// the 64 s key (it expired first), not the 1 s one (whose window ended first).
#[test]
fn a_sweep_deletes_the_earliest_expiries_across_nested_windows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.idem");
    let clock = clock();
    let open = |clock: &ManualClock| {
        Store::builder()
            .clock(clock.clone())
            .retention(Duration::from_secs(1))
            .retention_for("long", Duration::from_secs(64))
            .preallocate_log(false)
            .sweep_interval(None)
            .open(&path)
            .unwrap()
    };
    let store = open(&clock);
    complete_ids(&store, "long", &["L".to_string()]);
    clock.advance(Duration::from_millis(63_100));
    complete_ids(&store, "short", &["S".to_string()]);
    clock.advance(Duration::from_millis(1_100));
    assert_eq!(store.sweep(1).unwrap(), 1);
    drop(store);
    let db = idemstore::open_redb(&path).unwrap();
    let txn = db.begin_read().unwrap();
    let long = crate::common::encoded(&key("t", "long", "L"));
    let short = crate::common::encoded(&key("t", "short", "S"));
    assert!(
        !crate::common::stored(&txn, &long),
        "the earliest expiry stayed"
    );
    assert!(
        crate::common::stored(&txn, &short),
        "a later expiry went first"
    );
}

/// The level of the window a records table named `name` holds (its id's top 6 bits).
fn level(name: &str) -> u64 {
    let hex = name.rsplit('.').next().unwrap();
    u64::from_str_radix(hex, 16).unwrap() >> 58
}

/// A day's retention, whose own windows are 2^22 ms (70 min) wide: each record is first written
/// to a window 8 times narrower (2^19 ms, 8.7 min), so the window taking new keys stays small
/// however large the store. Once no record of that horizon can be written to a narrow
/// window's enclosing window any more, the applier moves its records there and deletes
/// it: every key is found all along, after a crash (the log replayed into narrow windows) and
/// after a clean close, where the file holds them in windows of their own horizon.
#[test]
fn records_written_narrow_move_into_their_horizons_window_once_it_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("n.idem");
    let clock = clock();
    let open = |path: &std::path::Path| {
        Store::builder()
            .clock(clock.clone())
            .retention(Duration::from_secs(86_400))
            .preallocate_log(false)
            .__manual_background()
            .open(path)
            .unwrap()
    };
    let store = open(&path);
    // 40 minutes of keys, 50 every 4 minutes: about 5 narrow windows.
    let mut ids = Vec::new();
    for batch in 0..10 {
        let batch_ids: Vec<String> = (0..50).map(|i| format!("{batch}-{i}")).collect();
        complete_ids(&store, "op", &batch_ids);
        ids.extend(batch_ids);
        clock.advance(Duration::from_secs(240));
    }
    store.__background(Background::Flush).unwrap();
    store.__background(Background::DropEndedWindows).unwrap();
    assert_eq!(store.stats().windows_merged, 0, "no window is closed yet");
    let before = store.__windows();
    assert!(before >= 4, "40 minutes in windows of 8.7: {before}");
    // Past the end of the last enclosing window that holds them, and a narrow window more: a
    // key written now expires after it.
    clock.advance(Duration::from_secs(80 * 60));
    complete_ids(&store, "op", &["late".to_string()]);
    store.__background(Background::Flush).unwrap();
    store.__background(Background::DropEndedWindows).unwrap();
    assert_eq!(
        store.stats().windows_merged,
        0,
        "merged on the writer's thread"
    );
    // The applier merges, when it applies batches.
    complete_ids(&store, "op", &["later".to_string()]);
    store.__background(Background::ApplierCommit).unwrap();
    let merged = store.stats().windows_merged;
    assert!(merged >= 4, "{merged} windows merged of {before}");
    assert!(
        store.__windows() <= 3,
        "{} windows after the merge",
        store.__windows()
    );
    ids.push("late".to_string());
    ids.push("later".to_string());
    for id in &ids {
        let k = key("t", "op", id);
        assert!(store.get(&k).unwrap().is_some(), "{k} lost in the merge");
    }
    let report = store.verify().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    // The process dies: the copy has the log, whose frames replay into narrow windows.
    let copy = crash_copy(&path);
    drop(store);
    let crashed = open(&copy);
    for id in &ids {
        let k = key("t", "op", id);
        assert!(crashed.get(&k).unwrap().is_some(), "{k} lost after a crash");
    }
    let report = crashed.verify().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    drop(crashed);
    // Closed cleanly: the 500 keys are in windows of their horizon, the late ones narrow.
    let found = tables(&path);
    let total: u64 = found.iter().map(|(_, n)| n).sum();
    assert_eq!(total, 502, "{found:?}");
    for (name, n) in &found {
        let expected = if *n <= 2 { 19 } else { 22 };
        assert_eq!(level(name), expected, "{name} holds {n}: {found:?}");
    }
}
