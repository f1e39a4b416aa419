//! The lease index and the expiry windows (docs/format.md, "The redb tables"): a pending
//! record has one lease entry, a record that is not pending none, and stale reservations that
//! expire later never stand in front of expired keys when a sweep looks for them.

use std::time::Duration;

use idemstore::{Builder, Fingerprint, Key, ManualClock, Reservation, Store};

fn builder(clock: &ManualClock) -> Builder {
    let mut builder = Store::builder();
    builder
        .clock(clock.clone())
        .lease(Duration::from_secs(1))
        .retention(Duration::from_secs(365 * 86_400))
        .retention_for("short", Duration::from_secs(60))
        .leases_survive_restart(true)
        .sweep_interval(None);
    builder
}

fn acquire(store: &Store, key: &Key) -> idemstore::Lease {
    match store.reserve(key, Fingerprint::of(b"r")).unwrap() {
        Reservation::Acquired(lease) => lease,
        other => panic!("{other:?}"),
    }
}

/// 300 stale reservations that expire in a year, whose leases ran out before 10 completed
/// keys expired: one sweep slice of 200 deletes the 10 expired keys at once, and the stale
/// reservations stay listed.
#[test]
fn stale_reservations_do_not_hold_up_the_sweep_of_expired_keys() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = builder(&clock).open(dir.path().join("d.idem")).unwrap();
    let stale: Vec<_> = (0..300)
        .map(|i| {
            acquire(
                &store,
                &Key::new("t", "long", format!("stale-{i}")).unwrap(),
            )
        })
        .collect();
    clock.advance(Duration::from_secs(2));
    for i in 0..10 {
        let key = Key::new("t", "short", format!("done-{i}")).unwrap();
        let lease = acquire(&store, &key);
        store.complete(&lease, b"ok".to_vec()).unwrap();
    }
    clock.advance(Duration::from_secs(120));
    assert_eq!(
        store.sweep(200).unwrap(),
        10,
        "the expired keys, in one slice"
    );
    assert_eq!(store.sweep(200).unwrap(), 0);
    assert_eq!(store.stale(1000).unwrap().len(), stale.len());
    let report = store.verify().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!(report.lease_entries, 300);
}

/// A reservation whose lease and retention both ran out is swept, `limit` records at a time,
/// its lease entry with it, and a live reservation is never touched.
#[test]
fn expired_reservations_are_swept_with_their_lease_entries() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let store = builder(&clock).open(dir.path().join("d.idem")).unwrap();
    for i in 0..5 {
        let _ = acquire(
            &store,
            &Key::new("t", "short", format!("gone-{i}")).unwrap(),
        );
    }
    clock.advance(Duration::from_secs(120));
    let live = acquire(&store, &Key::new("t", "short", "live").unwrap());
    assert_eq!(store.sweep(3).unwrap(), 3);
    assert_eq!(store.sweep(3).unwrap(), 2);
    assert_eq!(store.sweep(3).unwrap(), 0);
    let report = store.verify().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!((report.records, report.lease_entries), (1, 1));
    store.complete(&live, b"ok".to_vec()).unwrap();
    let report = store.verify().unwrap();
    assert_eq!((report.records, report.lease_entries), (1, 0));
}
