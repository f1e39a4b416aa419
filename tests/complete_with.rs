//! `complete_with`: the caller's own redb table is written in the same transaction as the
//! completion; a failing closure rolls everything back and leaves the key pending; a lease
//! that no longer owns the key never runs the closure.

use std::cell::Cell;

use idemstore::redb::{self, ReadableDatabase, ReadableTable, TableDefinition};
use idemstore::{Error, LeaseLostReason, Reservation, Status};

use crate::common::{acquire, fp, key, replayed, Env, LEASE};

const ORDERS: TableDefinition<&str, u64> = TableDefinition::new("orders");

/// The rows of the caller's table, read with redb directly (the store must be closed).
fn orders(env: &Env) -> Vec<(String, u64)> {
    let db = idemstore::open_redb(&env.path).expect("open the file with redb");
    let txn = db.begin_read().unwrap();
    let table = match txn.open_table(ORDERS) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Vec::new(),
        Err(e) => panic!("opening the orders table: {e}"),
    };
    table
        .iter()
        .unwrap()
        .map(|row| {
            let (k, v) = row.unwrap();
            (k.value().to_string(), v.value())
        })
        .collect()
}

/// The closure's writes to the caller's own table and the completion commit together; the
/// closure's return value is passed back; both survive a reopen.
#[test]
fn callers_table_is_written_with_the_completion() {
    let env = Env::new();
    let k = key("user-1", "checkout", "c1");
    {
        let store = env.open();
        let lease = acquire(&store, &k, fp("cart"));
        let value = store
            .complete_with(&lease, b"order 1 placed".to_vec(), |txn| {
                let mut table = txn.open_table(ORDERS)?;
                table.insert("order 1", 1999)?;
                Ok::<_, redb::Error>(42)
            })
            .unwrap();
        assert_eq!(value, 42, "the closure's value is returned");
        assert_eq!(replayed(&store, &k, fp("cart")).result, b"order 1 placed");
    }
    assert_eq!(orders(&env), [("order 1".to_string(), 1999)]);
    let store = env.open();
    assert_eq!(replayed(&store, &k, fp("cart")).result, b"order 1 placed");
}

/// When the closure fails, nothing is written: neither its own writes nor the completion.
/// The key stays pending under the same lease, which can complete it later.
#[test]
fn failing_closure_writes_nothing_and_the_key_stays_pending() {
    let env = Env::new();
    let k = key("user-1", "checkout", "c2");
    let store = env.open();
    let lease = acquire(&store, &k, fp("cart"));
    let before = store.get(&k).unwrap();

    let err = store
        .complete_with(&lease, b"order 2 placed".to_vec(), |txn| {
            txn.open_table(ORDERS)?.insert("order 2 (rolled back)", 1)?;
            Err::<(), Box<dyn std::error::Error + Send + Sync>>("payment declined".into())
        })
        .unwrap_err();
    match &err {
        Error::Callback { source } => assert_eq!(source.to_string(), "payment declined"),
        other => panic!("expected Callback, got {other:?}"),
    }
    // The cause is the source, not repeated in the message.
    let source = std::error::Error::source(&err).map(ToString::to_string);
    assert_eq!(source.as_deref(), Some("payment declined"), "{err}");
    assert!(!err.to_string().contains("payment declined"), "{err}");

    assert_eq!(store.get(&k).unwrap(), before, "still pending, unchanged");
    assert!(matches!(
        store.get(&k).unwrap().unwrap().status(),
        Status::Pending { .. }
    ));
    assert!(matches!(
        store.reserve(&k, fp("cart")).unwrap(),
        Reservation::InProgress { attempt: 1, .. }
    ));

    // The same lease completes it later.
    store
        .complete_with(&lease, b"order 2 placed".to_vec(), |txn| {
            txn.open_table(ORDERS)?.insert("order 2", 2500)?;
            Ok::<_, redb::Error>(())
        })
        .unwrap();
    assert_eq!(replayed(&store, &k, fp("cart")).result, b"order 2 placed");
    drop(store);
    assert_eq!(orders(&env), [("order 2".to_string(), 2500)]);
}

/// A lease that lost the key (taken over, completed, released, under review) gets LeaseLost
/// and its closure never runs.
#[test]
fn lost_lease_does_not_run_the_closure() {
    let env = Env::new();
    let store = env.open();
    let try_complete = |lease: &idemstore::Lease, expected: LeaseLostReason| {
        let ran = Cell::new(false);
        let result = store.complete_with(lease, b"late".to_vec(), |txn| {
            ran.set(true);
            txn.open_table(ORDERS)?.insert("must not exist", 0)?;
            Ok::<_, redb::Error>(())
        });
        match result {
            Err(Error::LeaseLost { key, token, reason }) => {
                assert_eq!(&key, lease.key());
                assert_eq!(token, lease.token());
                assert_eq!(reason, expected);
            }
            other => panic!("expected LeaseLost({expected:?}), got {other:?}"),
        }
        assert!(
            !ran.get(),
            "the closure ran for a lost lease ({expected:?})"
        );
    };

    // Taken over after the lease ran out.
    let k = key("user-1", "checkout", "c3");
    let old = acquire(&store, &k, fp("cart"));
    env.advance(LEASE);
    let new = acquire(&store, &k, fp("cart"));
    let before = store.get(&k).unwrap();
    try_complete(
        &old,
        LeaseLostReason::TakenOver {
            by_token: new.token(),
        },
    );
    assert_eq!(store.get(&k).unwrap(), before);

    // Completed by the new owner: both the old and the new lease are refused.
    store
        .complete_with(&new, b"by the new owner".to_vec(), |txn| {
            txn.open_table(ORDERS)?.insert("order 3", 3)?;
            Ok::<_, redb::Error>(())
        })
        .unwrap();
    try_complete(
        &old,
        LeaseLostReason::Completed {
            by_token: new.token(),
        },
    );
    try_complete(
        &new,
        LeaseLostReason::Completed {
            by_token: new.token(),
        },
    );
    assert_eq!(replayed(&store, &k, fp("cart")).result, b"by the new owner");

    // Released.
    let released = key("user-1", "checkout", "c4");
    let lease = acquire(&store, &released, fp("cart"));
    assert!(store.release_if_pending(&lease).unwrap());
    try_complete(&lease, LeaseLostReason::Gone);
    assert_eq!(store.get(&released).unwrap(), None);

    // Under review.
    let review = key("user-1", "checkout", "c5");
    let lease = acquire(&store, &review, fp("cart"));
    store.mark_needs_review(&lease, "unknown").unwrap();
    try_complete(&lease, LeaseLostReason::NeedsReview);

    drop(store);
    assert_eq!(orders(&env), [("order 3".to_string(), 3)]);
}

/// Finding 5 of issue 8: calling the store from inside the closure hung forever (the closure
/// runs while the store's writer is held, and the writer lock is not re-entrant). A call that
/// needs the writer now fails at once with a clear error; reads still work.
#[test]
fn calling_the_store_inside_the_closure_errs_instead_of_hanging() {
    let env = Env::new();
    let store = std::sync::Arc::new(env.open());
    let done = key("u", "op", "done");
    let lease = acquire(&store, &done, fp("body"));
    store.complete(&lease, b"ok".to_vec()).unwrap();
    let k = key("u", "op", "k1");
    let lease = acquire(&store, &k, fp("body"));
    let (tx, rx) = std::sync::mpsc::channel();
    // Not a scoped thread: before the fix it never returned, and the test must still end.
    let inner = std::sync::Arc::clone(&store);
    std::thread::spawn(move || {
        let result = inner.complete_with(&lease, b"done".to_vec(), |_txn| {
            let read = inner.get(&done).map(|r| r.is_some());
            let write = inner.reserve(&key("u", "op", "new"), fp("body"));
            let checkpoint = inner.checkpoint();
            Ok::<_, Error>((read, write.map(|_| ()), checkpoint))
        });
        let _ = tx.send(result.map(|(read, write, checkpoint)| {
            (
                read.map_err(|e| e.to_string()),
                write.map_err(|e| e.to_string()),
                checkpoint.map_err(|e| e.to_string()),
            )
        }));
    });
    let (read, write, checkpoint) = rx
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("calling the store inside complete_with's closure did not return within 5 s")
        .expect("the completion itself succeeds");
    assert_eq!(read, Ok(true), "reads work inside the closure");
    for (what, result) in [("reserve", write), ("checkpoint", checkpoint)] {
        let message = result.expect_err(what);
        assert!(message.contains("complete_with"), "{what}: {message}");
    }
    assert!(replayed(&store, &k, fp("body")).result == b"done");
}
