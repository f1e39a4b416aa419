//! Read-only inspection of a local store: counts and scans by class as the clock moves, and
//! verification naming each damaged record and index mismatch by its key.

use std::time::Duration;

use idemstore::redb::{ReadableTable, TableDefinition};
use idemstore::whitebox::key_encoded;
use idemstore::{
    Fingerprint, Key, Lease, ManualClock, ProblemKind, RecordClass, Reservation, ScanFilter, Store,
};

use crate::common::{records_table, records_tables, RECORDS_PREFIX};

/// The lease and expiry index (docs/format.md): (kind, deadline, key).
const DEADLINES: TableDefinition<(u8, u64, &[u8]), ()> =
    TableDefinition::new("idemstore.deadlines");
/// The index kind of a lease's deadline.
const LEASE: u8 = 1;

fn open(path: &std::path::Path, clock: &ManualClock) -> Store {
    // These tests count expired records: no background sweeper deleting them meanwhile.
    Store::builder()
        .lease(Duration::from_secs(10))
        .retention(Duration::from_secs(100))
        .clock(clock.clone())
        .sweep_interval(None)
        .preallocate_log(false)
        .open(path)
        .unwrap()
}

fn key(id: &str) -> Key {
    Key::new("u", "op", id).unwrap()
}

fn acquire(store: &Store, id: &str) -> Lease {
    match store.reserve(&key(id), Fingerprint::of(id)).unwrap() {
        Reservation::Acquired(lease) => lease,
        other => panic!("{other:?}"),
    }
}

#[test]
fn classes_counts_and_scans_follow_the_clock() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = open(&dir.path().join("s.idem"), &clock);
    let done = acquire(&store, "done");
    store.complete(&done, b"ok".to_vec()).unwrap();
    let review = acquire(&store, "review");
    store.mark_needs_review(&review, "unknown").unwrap();
    let _stale = acquire(&store, "stale");
    clock.advance(Duration::from_secs(20));
    let _live = acquire(&store, "live");
    let counts = store.counts().unwrap();
    assert_eq!(
        (
            counts.pending,
            counts.stale,
            counts.needs_review,
            counts.completed
        ),
        (1, 1, 1, 1)
    );
    assert_eq!(counts.oldest_pending.unwrap().0.id(), b"stale");
    let stale = store.scan(&ScanFilter::of(RecordClass::Stale), 10).unwrap();
    assert_eq!(stale.len(), 1);
    let old = ScanFilter::of(RecordClass::Stale).older_than(Duration::from_secs(11));
    assert!(store.scan(&old, 10).unwrap().is_empty());
    let old = ScanFilter::of(RecordClass::Stale).older_than(Duration::from_secs(10));
    assert_eq!(store.scan(&old, 10).unwrap().len(), 1);
    assert_eq!(store.scan(&ScanFilter::any(), 10).unwrap().len(), 4);
    assert_eq!(store.scan(&ScanFilter::any(), 2).unwrap().len(), 2);
    clock.advance(Duration::from_secs(200));
    let counts = store.counts().unwrap();
    assert_eq!((counts.expired, counts.needs_review), (3, 1));
    let expired = store
        .scan(&ScanFilter::of(RecordClass::Expired), 10)
        .unwrap();
    assert_eq!(expired.len(), 3);
    assert!(store.verify().unwrap().is_ok());
}

/// The file is damaged with redb directly between two opens: a record's byte flipped (a), a
/// lease entry dropped and a stray one added (b), a record moved to the window after its own
/// (c), a second index entry for a completed key (d).
#[test]
fn verify_reports_damage_and_index_mismatches_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.idem");
    let clock = ManualClock::new();
    let store = open(&path, &clock);
    let a = acquire(&store, "a");
    store.complete(&a, b"ok".to_vec()).unwrap();
    let _b = acquire(&store, "b");
    let _c = acquire(&store, "c");
    let d = acquire(&store, "d");
    store.complete(&d, b"ok".to_vec()).unwrap();
    drop(store);
    {
        let db = idemstore::open_redb(&path).unwrap();
        let txn = db.begin_write().unwrap();
        let holder = |id: &str| {
            records_tables(txn.list_tables().unwrap())
                .into_iter()
                .find(|name| {
                    let table = txn.open_table(records_table(name)).unwrap();
                    let found = table.get(key_encoded(&key(id)).as_slice()).unwrap();
                    found.is_some()
                })
                .unwrap()
        };
        // a: flip a byte of the stored record.
        crate::common::change_stored(&txn, &key_encoded(&key("a")), |bytes| bytes[5] ^= 0xff);
        // c: kept in the window after its own.
        let own = holder("c");
        let window = u64::from_str_radix(&own[RECORDS_PREFIX.len()..], 16).unwrap();
        let next = format!("{RECORDS_PREFIX}{:016x}", window + 1);
        let c = key_encoded(&key("c"));
        let bytes = {
            let mut table = txn.open_table(records_table(&own)).unwrap();
            let removed = table.remove(c.as_slice()).unwrap().unwrap();
            removed.value().to_vec()
        };
        txn.open_table(records_table(&next))
            .unwrap()
            .insert(c.as_slice(), bytes.as_slice())
            .unwrap();
        {
            let mut deadlines = txn.open_table(DEADLINES).unwrap();
            // b: drop its lease index entry and add a stray one.
            let b = key_encoded(&key("b"));
            let lease = deadlines
                .iter()
                .unwrap()
                .find_map(|entry| {
                    let (entry, _) = entry.unwrap();
                    let (kind, at, key) = entry.value();
                    (kind == LEASE && key == b.as_slice()).then_some(at)
                })
                .expect("b's lease entry");
            assert!(deadlines
                .remove((LEASE, lease, b.as_slice()))
                .unwrap()
                .is_some());
            deadlines
                .insert((LEASE, lease + 1, b.as_slice()), ())
                .unwrap();
            // d: completed, with its expiry entry, and a second entry (a lease one): at most
            // one entry per key.
            let d = key_encoded(&key("d"));
            deadlines
                .insert((LEASE, lease + 2, d.as_slice()), ())
                .unwrap();
        }
        txn.commit().unwrap();
    }
    let store = open(&path, &clock);
    let report = store.verify().unwrap();
    let kinds: Vec<_> = report
        .problems
        .iter()
        .map(|p| (p.kind, p.key.as_ref().map(|k| k.id().to_vec())))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (ProblemKind::DamagedRecord, Some(b"a".to_vec())),
            (ProblemKind::MissingIndexEntry, Some(b"b".to_vec())),
            (ProblemKind::MisplacedRecord, Some(b"c".to_vec())),
            (ProblemKind::StrayIndexEntry, Some(b"b".to_vec())),
            (ProblemKind::StrayIndexEntry, Some(b"d".to_vec())),
        ],
        "{:#?}",
        report.problems
    );
    assert!(report.problems[0].to_string().contains("u/op/a"));
    assert!(report.problems[0].to_string().contains("checksum"));
    assert_eq!(store.counts().unwrap().damaged, 1);
    // Scans skip the damaged record instead of failing.
    assert_eq!(store.scan(&ScanFilter::any(), 10).unwrap().len(), 3);
}
