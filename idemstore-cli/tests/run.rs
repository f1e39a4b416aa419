//! Running the `idemstore` binary as a user would, for every area of this suite; and the
//! fixture every store that lives elsewhere (etcd, PostgreSQL) is read against.

use std::process::{Command, Output};
#[cfg(any(feature = "etcd", feature = "postgres"))]
use std::time::{Duration, SystemTime};

#[cfg(any(feature = "etcd", feature = "postgres"))]
use idemstore::{Fingerprint, Key, ManualClock, Reservation, Reservations};
use serde_json::Value;

#[cfg(any(feature = "etcd", feature = "postgres"))]
use crate::common::{fp, key};

/// Runs `idemstore ARGS...` to the end.
pub fn idemstore(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idemstore"))
        .args(args)
        .output()
        .expect("run idemstore")
}

/// Runs the command, expects exit status `code`, and returns its stdout and stderr.
#[track_caller]
pub fn run(args: &[&str], code: i32) -> (String, String) {
    let output = idemstore(args);
    let (out, err) = (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    assert_eq!(
        output.status.code(),
        Some(code),
        "idemstore {args:?}\nstdout:\n{out}\nstderr:\n{err}"
    );
    (out, err)
}

/// [`run`], with its stdout read as JSON.
#[track_caller]
pub fn run_json(args: &[&str], code: i32) -> Value {
    let (text, _) = run(args, code);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

/// The ids of a JSON array of records.
pub fn ids(records: &Value) -> Vec<&str> {
    records
        .as_array()
        .expect("an array")
        .iter()
        .map(|r| r["id"].as_str().expect("an id"))
        .collect()
}

/// A runtime for the async stores' calls.
#[cfg(any(feature = "etcd", feature = "postgres"))]
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[cfg(any(feature = "etcd", feature = "postgres"))]
pub const HOUR: Duration = Duration::from_secs(3600);

/// Acquires `key`, which must be free.
#[cfg(any(feature = "etcd", feature = "postgres"))]
pub async fn acquire(
    store: &impl Reservations,
    key: &Key,
    fingerprint: Fingerprint,
) -> idemstore::Lease {
    match store.reserve(key, fingerprint).await.unwrap() {
        Reservation::Acquired(lease) => lease,
        other => panic!("expected to acquire {key}, got {other:?}"),
    }
}

/// One record in each state, as `tests/cli.rs` makes in a file, written to `store` (lease 1 h,
/// retention 24 h) through its `clock`, set in the past:
/// - `u1/charge/live`: reserved now, lease 1 h: pending;
/// - `u1/charge/stale`: reserved 2 h ago: stale for 1 h;
/// - `u1/charge/review`: reserved 2 h ago, marked for review;
/// - `u1/charge/done`: completed 30 min ago with `201 created`;
/// - `u2/refund/old`: completed 48 h ago: expired, not swept.
#[cfg(any(feature = "etcd", feature = "postgres"))]
pub async fn fill(store: &impl Reservations, clock: &ManualClock) {
    let now = SystemTime::now();
    clock.set(now - 48 * HOUR);
    let old = acquire(store, &key("u2", "refund", "old"), fp("r")).await;
    store
        .complete(&old, b"200 refunded".to_vec())
        .await
        .unwrap();
    clock.set(now - 2 * HOUR);
    acquire(store, &key("u1", "charge", "stale"), fp("s")).await;
    let review = acquire(store, &key("u1", "charge", "review"), fp("v")).await;
    store
        .mark_needs_review(&review, "gateway timed out")
        .await
        .unwrap();
    clock.set(now - HOUR / 2);
    let done = acquire(store, &key("u1", "charge", "done"), fp("d")).await;
    store
        .complete(&done, b"201 created".to_vec())
        .await
        .unwrap();
    clock.set(now);
    acquire(store, &key("u1", "charge", "live"), fp("l")).await;
}
