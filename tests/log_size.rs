//! Small stores stay small: a preallocated log grows ahead of its frames as it is used, from
//! a small start, and `compact` cuts a cleanly closed store's log to its identity block.

use crate::common::{fp, key, replayed, Env};
use idemstore::{Reservation, Store};

/// The identity block every log starts with.
const IDENTITY: u64 = 32;
/// The first zero-filled length of a log, and the most it grows by at once.
const FIRST: u64 = 256 << 10;
const STEP_MAX: u64 = 4 << 20;

fn log_len(env: &Env) -> u64 {
    let mut log = env.path.clone().into_os_string();
    log.push(".wal");
    std::fs::metadata(log).expect("the log").len()
}

/// Reserves and completes keys `range` with a result of `result_len` bytes, one per batch.
fn complete(store: &Store, range: std::ops::Range<usize>, result_len: usize) {
    for i in range {
        let Reservation::Acquired(lease) = store
            .reserve(&key("t", "op", &format!("k{i}")), fp("body"))
            .expect("reserve")
        else {
            panic!("key {i} was not new");
        };
        store
            .complete(&lease, vec![b'r'; result_len])
            .expect("complete");
    }
}

fn check(store: &Store, range: std::ops::Range<usize>, result_len: usize) {
    for i in range {
        let done = replayed(store, &key("t", "op", &format!("k{i}")), fp("body"));
        assert_eq!(done.result.len(), result_len, "key {i}");
    }
}

#[test]
fn a_store_of_five_keys_has_a_small_log() {
    let env = Env::new();
    let store = env.builder().preallocate_log(true).open(&env.path).unwrap();
    complete(&store, 0..5, 100);
    drop(store);
    let len = log_len(&env);
    assert!(
        len <= FIRST,
        "a 5-key store's log is {len} bytes, more than {FIRST}"
    );
    check(&env.open(), 0..5, 100);
}

#[test]
fn a_preallocated_log_grows_ahead_of_its_frames_by_doubling() {
    let env = Env::new();
    let store = env.builder().preallocate_log(true).open(&env.path).unwrap();
    // Each length a preallocated log may have: it starts zero-filled to `FIRST` and doubles
    // (by at most `STEP_MAX`), so its frames never extend it one by one.
    let mut lengths = vec![FIRST];
    while *lengths.last().unwrap() < 64 << 20 {
        let last = *lengths.last().unwrap();
        lengths.push(last + last.min(STEP_MAX));
    }
    let mut seen = vec![log_len(&env)];
    for round in 0..12 {
        complete(&store, round * 100..(round + 1) * 100, 2_000);
        seen.push(log_len(&env));
    }
    for len in &seen {
        assert!(
            lengths.contains(len),
            "the log was {len} bytes, not a preallocated length (seen: {seen:?})"
        );
    }
    assert!(
        *seen.last().unwrap() > 2 * FIRST,
        "the log grew as it was used: {seen:?}"
    );
    drop(store);
    check(&env.open(), 0..1_200, 2_000);
}

#[test]
fn compact_cuts_a_cleanly_closed_stores_log_to_its_identity_block() {
    let env = Env::new();
    let store = env.builder().preallocate_log(true).open(&env.path).unwrap();
    complete(&store, 0..5, 100);
    drop(store);
    // A log as long as the checkpoint region, as every log was zero-filled to before.
    let mut log = env.path.clone().into_os_string();
    log.push(".wal");
    let file = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
    file.set_len(33 << 20).unwrap();
    drop(file);

    idemstore::compact(&env.path).expect("compact");
    assert_eq!(log_len(&env), IDENTITY);

    // The store opens (cleanly closed: its log is not needed), keeps every key, logs new
    // ones from the start of its log, and they survive the next open.
    let store = env.open();
    check(&store, 0..5, 100);
    complete(&store, 5..10, 100);
    drop(store);
    check(&env.open(), 0..10, 100);
}
