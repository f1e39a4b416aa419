//! Batches: `reserve_many` and `observe_many` read every key's latest state wherever it is
//! (acknowledged and not yet in redb, cached, or only in redb) and answer in the caller's
//! order, whatever order they are read in.

use idemstore::{Reservation, Seen};

use crate::common::{acquire, fp, key, Env};

/// Key names that do not sort in the order a batch names them: the batch below lists them in
/// a shuffled order, so an answer put back at its sorted position is caught.
fn name(kind: &str, i: usize) -> String {
    format!("{:03}-{kind}", (i * 37) % 1000)
}

#[test]
fn reserve_many_answers_each_key_from_its_latest_state_in_the_callers_order() {
    let env = Env::new();
    // A record cache of 160 records (10 per shard) and 200 stored keys: most stored keys are
    // read from redb, some from the cache, and the ones changed last from what the writer has
    // not committed yet (newer than what the cache holds for them).
    let store = env
        .builder()
        .cache_records(160)
        .open(&env.path)
        .expect("open");
    let mut expected = Vec::new();
    for i in 0..200 {
        let k = key("t", "op", &name("old", i));
        let lease = acquire(&store, &k, fp("a"));
        let result = format!("old result {i}").into_bytes();
        store.complete(&lease, result.clone()).expect("complete");
        expected.push((k, fp("a"), Some(result)));
    }
    store.checkpoint().expect("checkpoint");
    // Pending when committed (the cache holds them pending), completed since.
    let changed: Vec<_> = (0..10)
        .map(|i| {
            let k = key("t", "op", &name("changed", i));
            (k.clone(), acquire(&store, &k, fp("a")))
        })
        .collect();
    store.checkpoint().expect("checkpoint");
    for (i, (k, lease)) in changed.into_iter().enumerate() {
        let result = format!("changed result {i}").into_bytes();
        store.complete(&lease, result.clone()).expect("complete");
        expected.push((k, fp("a"), Some(result)));
    }
    for i in 0..10 {
        let k = key("t", "op", &name("fresh", i));
        let lease = acquire(&store, &k, fp("a"));
        let result = format!("fresh result {i}").into_bytes();
        store.complete(&lease, result.clone()).expect("complete");
        expected.push((k, fp("a"), Some(result)));
    }
    let mut pending = Vec::new();
    for i in 0..10 {
        let k = key("t", "op", &name("pending", i));
        acquire(&store, &k, fp("a"));
        pending.push(k);
    }
    // Shuffled: stored, pending, absent and mismatched keys interleaved.
    let mut items = Vec::new();
    let mut want = Vec::new();
    let changed_and_fresh = &expected[200..];
    for i in 0..120 {
        match i % 8 {
            0..=2 => {
                let (k, f, result) = expected[(i * 7) % expected.len()].clone();
                items.push((k, f));
                want.push(format!("completed {:?}", result.expect("completed")));
            }
            3 | 4 => {
                let (k, f, result) = changed_and_fresh[(i * 3) % changed_and_fresh.len()].clone();
                items.push((k, f));
                want.push(format!("completed {:?}", result.expect("completed")));
            }
            5 => {
                items.push((pending[(i / 8) % pending.len()].clone(), fp("a")));
                want.push("in progress".to_string());
            }
            6 => {
                items.push((key("t", "op", &name("absent", i)), fp("a")));
                want.push("acquired".to_string());
            }
            _ => {
                items.push((expected[(i * 11) % expected.len()].0.clone(), fp("other")));
                want.push("mismatch".to_string());
            }
        }
    }
    let results = store.reserve_many(&items).expect("reserve_many");
    assert_eq!(results.len(), items.len());
    for (i, (result, want)) in results.into_iter().zip(want).enumerate() {
        let got = match result.expect("no item fails") {
            Reservation::Completed(done) => format!("completed {:?}", done.result),
            Reservation::InProgress { .. } => "in progress".to_string(),
            Reservation::Acquired(lease) => {
                assert_eq!(
                    lease.key(),
                    &items[i].0,
                    "item {i}: the lease names its key"
                );
                "acquired".to_string()
            }
            Reservation::Mismatch => "mismatch".to_string(),
            other => format!("{other:?}"),
        };
        assert_eq!(got, want, "item {i} ({})", items[i].0);
    }
}

#[test]
fn observe_many_tells_stored_keys_from_new_ones_in_the_callers_order() {
    let env = Env::new();
    let store = env
        .builder()
        .cache_records(16)
        .open(&env.path)
        .expect("open");
    let window = std::time::Duration::from_secs(60);
    let stored: Vec<_> = (0..30)
        .map(|i| key("t", "seen", &name("stored", i)))
        .collect();
    for k in &stored[..20] {
        assert_eq!(store.observe(k, window).expect("observe"), Seen::New);
    }
    store.checkpoint().expect("checkpoint");
    for k in &stored[20..] {
        assert_eq!(store.observe(k, window).expect("observe"), Seen::New);
    }
    let mut keys = Vec::new();
    let mut want = Vec::new();
    for i in 0..45 {
        if i % 3 == 2 {
            keys.push(key("t", "seen", &name("new", i)));
            want.push(Seen::New);
        } else {
            keys.push(stored[(i * 13) % stored.len()].clone());
            want.push(Seen::Duplicate);
        }
    }
    let got: Vec<Seen> = store
        .observe_many(&keys, window)
        .expect("observe_many")
        .into_iter()
        .map(|seen| seen.expect("no item fails"))
        .collect();
    assert_eq!(got, want);
}
