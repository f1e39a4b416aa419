//! Unit tests of inspection.

use std::time::Duration;

use super::*;
use crate::answers::Reservation;
use crate::clock::ManualClock;
use crate::fingerprint::Fingerprint;
use crate::tree::tables::Tables;

fn store(dir: &tempfile::TempDir, clock: &ManualClock) -> Store {
    // These tests count expired records: no background sweeper deleting them meanwhile.
    Store::builder()
        .lease(Duration::from_secs(10))
        .retention(Duration::from_secs(100))
        .clock(clock.clone())
        .sweep_interval(None)
        .open(dir.path().join("s.idem"))
        .unwrap()
}

fn acquire(store: &Store, id: &str) -> crate::Lease {
    let key = Key::new("u", "op", id).unwrap();
    match store.reserve(&key, Fingerprint::of(id)).unwrap() {
        Reservation::Acquired(lease) => lease,
        other => panic!("{other:?}"),
    }
}

#[test]
fn classes_counts_and_scans_follow_the_clock() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = store(&dir, &clock);
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

#[test]
fn verify_reports_damage_and_index_mismatches_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = store(&dir, &clock);
    let a = acquire(&store, "a");
    store.complete(&a, b"ok".to_vec()).unwrap();
    let _b = acquire(&store, "b");
    let _c = acquire(&store, "c");
    let d = acquire(&store, "d");
    store.complete(&d, b"ok".to_vec()).unwrap();
    let key = |id: &str| Key::new("u", "op", id).unwrap();
    store
        .committer
        .with_writer(|writer| {
            writer.transact(crate::commit::CommitKind::Durable, |_, txn, _, _| {
                let windows = store.windows();
                let mut tables = Tables::open(txn, windows)?;
                let ctx = "damaging";
                // a: flip a byte of the stored record.
                let window = |tables: &mut Tables<'_>, id: &str| -> Result<u64, Error> {
                    let record = tables.load(key(id).encoded())?.unwrap().unwrap();
                    let holding = windows.holding(record.expires_at);
                    Ok(holding
                        .iter()
                        .map(|(w, _)| *w)
                        .find(|w| {
                            let table = tables.window(*w);
                            table.is_ok_and(|t| t.get(key(id).encoded()).is_ok_and(|v| v.is_some()))
                        })
                        .expect("a window holds the record"))
                };
                let wa = window(&mut tables, "a")?;
                let mut bytes = tables
                    .window(wa)?
                    .get(key("a").encoded())
                    .map_err(|e| Error::storage(ctx, e))?
                    .unwrap()
                    .value()
                    .to_vec();
                bytes[5] ^= 0xff;
                tables
                    .window(wa)?
                    .insert(key("a").encoded(), bytes.as_slice())
                    .map_err(|e| Error::storage(ctx, e))?;
                // c: kept in the window after its own.
                let wc = window(&mut tables, "c")?;
                let bytes = tables
                    .window(wc)?
                    .remove(key("c").encoded())
                    .map_err(|e| Error::storage(ctx, e))?
                    .unwrap()
                    .value()
                    .to_vec();
                let (next, filter) = windows.place(Windows::end(wc), Windows::end(wc));
                filter.insert(windows.hash(key("c").encoded()));
                tables
                    .window(next)?
                    .insert(key("c").encoded(), bytes.as_slice())
                    .map_err(|e| Error::storage(ctx, e))?;
                // b: drop its lease index entry and add a stray one.
                let record = tables.load(key("b").encoded())?.unwrap().unwrap();
                let lease = record.lease_until().unwrap();
                tables
                    .deadlines
                    .remove((LEASE, lease, key("b").encoded()))
                    .map_err(|e| Error::storage(ctx, e))?;
                tables
                    .deadlines
                    .insert((LEASE, lease + 1, key("b").encoded()), ())
                    .map_err(|e| Error::storage(ctx, e))?;
                // d: completed, with its expiry entry, and a second entry (a lease one):
                // at most one entry per key.
                tables
                    .deadlines
                    .insert((LEASE, lease + 2, key("d").encoded()), ())
                    .map_err(|e| Error::storage(ctx, e))?;
                Ok(Ok(()))
            })
        })
        .unwrap();
    store.__clear_cache();
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
