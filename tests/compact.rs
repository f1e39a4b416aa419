//! `idemstore::compact`: a closed store's free pages given back, everything it holds kept, an
//! open store and a file that is not a store refused.

use crate::common::{fp, key, replayed, Env};
use idemstore::{Key, OpenError, Reservation};

const KEYS: usize = 10_000;

fn spread_key(i: usize) -> Key {
    let spread = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    key("tenant", "op", &format!("key-{spread:016x}"))
}

fn result_of(i: usize) -> Vec<u8> {
    format!("result-{i:058}").into_bytes()
}

/// Fills the store with `KEYS` completed keys spread over the key space, 1,000 per batch (as
/// the space example does), committing each batch durably, and closes it.
fn fill(env: &Env) {
    let store = env.open();
    for batch in 0..KEYS / 1000 {
        let items: Vec<_> = (batch * 1000..(batch + 1) * 1000)
            .map(|i| (spread_key(i), fp("fill")))
            .collect();
        let leases: Vec<_> = store
            .reserve_many(&items)
            .expect("reserve a batch")
            .into_iter()
            .map(|r| match r {
                Ok(Reservation::Acquired(lease)) => lease,
                other => panic!("expected to acquire, got {other:?}"),
            })
            .collect();
        let results: Vec<_> = leases
            .iter()
            .zip(batch * 1000..)
            .map(|(lease, i)| (lease, result_of(i)))
            .collect();
        store.complete_many(results).expect("complete a batch");
        // A commit per batch (not left to the applier's timing): each leaves the pages it
        // copied free.
        store.checkpoint().expect("checkpoint");
    }
}

#[test]
fn compacting_a_closed_store_shrinks_its_file_and_keeps_every_key() {
    let env = Env::new();
    fill(&env);
    let size = env.path.metadata().expect("store file").len();
    let (before, after) = idemstore::compact(&env.path).expect("compact");
    assert_eq!(before, size);
    assert_eq!(after, env.path.metadata().expect("store file").len());
    // Random keys leave about half of the file free (copy-on-write pages since the last
    // durable commit); compaction gives most of it back.
    assert!(
        after * 4 < before * 3,
        "compaction left {after} of {before} bytes"
    );
    let (again, still) = idemstore::compact(&env.path).expect("compact again");
    assert_eq!(
        (again, still),
        (after, after),
        "a second compaction changes nothing"
    );

    let store = env.open();
    for i in 0..KEYS {
        let done = replayed(&store, &spread_key(i), fp("fill"));
        assert_eq!(done.result, result_of(i), "key {i}");
    }
    let new = key("tenant", "op", "after-compaction");
    assert!(matches!(
        store.reserve(&new, fp("new")).expect("reserve"),
        Reservation::Acquired(_)
    ));
}

#[test]
fn an_open_store_is_not_compacted() {
    let env = Env::new();
    let store = env.open();
    let lease = crate::common::acquire(&store, &key("u", "op", "k"), fp("a"));
    store.complete(&lease, b"done".to_vec()).expect("complete");
    // A durable commit now, so the open store has nothing left to write while it is measured.
    store.checkpoint().expect("checkpoint");
    let before = env.path.metadata().expect("store file").len();
    match idemstore::compact(&env.path) {
        Err(OpenError::AlreadyOpen { path }) => assert_eq!(path, env.path),
        other => panic!("expected AlreadyOpen, got {other:?}"),
    }
    assert_eq!(env.path.metadata().expect("store file").len(), before);
    assert_eq!(
        replayed(&store, &key("u", "op", "k"), fp("a")).result,
        b"done"
    );
}

#[test]
fn a_file_that_is_not_a_store_is_refused_and_left_alone() {
    let env = Env::new();
    std::fs::write(&env.path, vec![7u8; 8192]).expect("write a file");
    match idemstore::compact(&env.path) {
        Err(OpenError::NotAStore { path, .. }) => assert_eq!(path, env.path),
        other => panic!("expected NotAStore, got {other:?}"),
    }
    assert_eq!(std::fs::read(&env.path).expect("read"), vec![7u8; 8192]);

    let missing = env.dir.path().join("missing.idem");
    let error = idemstore::compact(&missing).expect_err("a missing file");
    assert!(
        error.to_string().contains("missing.idem"),
        "the error names the file: {error}"
    );
}

/// A store as a kill leaves it (its file and log copied while it is open, with completions in
/// the log since the last checkpoint): compacted, it opens and replays its log as before.
#[test]
fn a_store_that_was_not_closed_cleanly_keeps_its_log_through_compaction() {
    let env = Env::new();
    let store = env.open();
    let done = |range: std::ops::Range<usize>| {
        for i in range {
            let lease = crate::common::acquire(&store, &spread_key(i), fp("fill"));
            store.complete(&lease, result_of(i)).expect("complete");
        }
    };
    done(0..300);
    store.checkpoint().expect("checkpoint");
    done(300..400);
    let killed = Env::new();
    std::fs::copy(&env.path, &killed.path).expect("copy the store file");
    let log = |p: &std::path::Path| {
        let mut name = p.as_os_str().to_owned();
        name.push(".wal");
        std::path::PathBuf::from(name)
    };
    std::fs::copy(log(&env.path), log(&killed.path)).expect("copy the log");
    drop(store);

    idemstore::compact(&killed.path).expect("compact");
    let store = killed.open();
    for i in 0..400 {
        assert_eq!(
            replayed(&store, &spread_key(i), fp("fill")).result,
            result_of(i),
            "key {i}"
        );
    }
}
