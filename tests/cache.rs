//! The bounded cache of committed records: it holds at most its count and its byte budget,
//! whatever the records, and forgets deletions.

use idemstore::whitebox::RecordCache;
use idemstore::{Fingerprint, Key, ManualClock, Record, Reservation, Store};

/// A pending record, and completed records with results of 4 KiB and of `large` bytes, as a
/// store writes them.
fn records(large: usize) -> (Record, Record, Record) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::builder()
        .clock(ManualClock::new())
        .sweep_interval(None)
        .preallocate_log(false)
        .max_result_len(large.max(4096))
        .open(dir.path().join("s.idem"))
        .unwrap();
    let acquire = |id: &str| {
        let key = Key::new("s", "op", id).unwrap();
        match store.reserve(&key, Fingerprint::of(b"x")).unwrap() {
            Reservation::Acquired(lease) => (key, lease),
            other => panic!("{other:?}"),
        }
    };
    let (pending, _) = acquire("pending");
    let completed = |id: &str, len: usize| {
        let (key, lease) = acquire(id);
        store.complete(&lease, vec![7; len]).unwrap();
        store.get(&key).unwrap().unwrap()
    };
    let small = completed("small", 4096);
    let large = completed("large", large);
    (store.get(&pending).unwrap().unwrap(), small, large)
}

fn keys(format: impl Fn(usize) -> String) -> Vec<Key> {
    (0..1000)
        .map(|i| Key::new("s", "op", format(i)).unwrap())
        .collect()
}

#[test]
fn holds_at_most_its_capacity_and_forgets_deletions() {
    let (pending, completed, _) = records(4096);
    let cache = RecordCache::new(32, usize::MAX);
    let keys = keys(|i| format!("{i}"));
    for key in &keys {
        cache.set(key, Some(pending.clone()));
    }
    let last = keys.last().unwrap();
    cache.set(last, Some(completed.clone()));
    let held = keys.iter().filter(|k| cache.get(k).is_some()).count();
    assert!(held <= 32 && held > 0, "{held}");
    assert_eq!(cache.get(last), Some(completed), "the newest state is held");
    cache.set(last, None);
    assert_eq!(cache.get(last), None);
    let disabled = RecordCache::new(0, usize::MAX);
    disabled.set(last, Some(pending));
    assert_eq!(disabled.get(last), None);
}

#[test]
fn holds_at_most_its_byte_budget_however_large_the_results() {
    let budget = 256 << 10;
    // A record larger than a shard's share of the budget (16 shards).
    let (pending, completed, large) = records(budget / 16 + 1);
    let cache = RecordCache::new(10_000, budget);
    let keys = keys(|i| format!("{i:04}"));
    for key in &keys {
        cache.set(key, Some(completed.clone()));
    }
    let held: Vec<&Key> = keys.iter().filter(|k| cache.get(k).is_some()).collect();
    let bytes: usize = held
        .iter()
        .map(|k| RecordCache::entry_bytes(k, &completed))
        .sum();
    assert!(!held.is_empty(), "the newest records stay");
    assert!(
        bytes <= budget,
        "{} records of {bytes} bytes held, over the {budget}-byte budget",
        held.len()
    );
    // Each shard's count follows its replacements and removals too.
    for key in &held {
        cache.set(key, Some(completed.clone()));
    }
    for key in &held {
        cache.set(key, None);
    }
    assert_eq!(cache.bytes(), 0);
    // A record larger than a shard's share is not kept.
    cache.set(&keys[0], Some(large));
    assert_eq!(cache.get(&keys[0]), None);
    // Small records: the count limit binds first.
    let small = RecordCache::new(32, budget);
    for key in &keys {
        small.set(key, Some(pending.clone()));
    }
    let held = keys.iter().filter(|k| small.get(k).is_some()).count();
    assert!(held <= 32 && held > 0, "{held}");
}
