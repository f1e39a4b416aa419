//! Helpers shared by the integration test modules: a store in a temporary directory driven by
//! a [`ManualClock`], short policy times, and assertions that unwrap one expected outcome.

#[cfg(any(feature = "etcd", feature = "postgres"))]
pub mod fault;

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idemstore::redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use idemstore::{Builder, Completed, Fingerprint, Key, Lease, ManualClock, Reservation, Store};
use tempfile::TempDir;

/// Lease used by the tests: short, so that staleness is one clock step away.
pub const LEASE: Duration = Duration::from_secs(1);
/// Retention used by the tests.
pub const RETENTION: Duration = Duration::from_secs(5);

/// Whether `IDEMSTORE_LONG=1` asks for the long modes (RELIABILITY.md, "Long modes").
pub fn long_mode() -> bool {
    std::env::var_os("IDEMSTORE_LONG").is_some_and(|v| v != "0")
}

/// The count of a long loop (power cuts, kill rounds, crash-model cases, damaged copies) for
/// this run: `smoke` under `cargo test`, which builds the tests in debug; `full` in a release
/// build (CI's `release` step runs those suites there); `long` with `IDEMSTORE_LONG=1`, in
/// either build. So `cargo test` stays short and nothing is dropped from CI.
pub fn by_mode<T>(smoke: T, full: T, long: T) -> T {
    if long_mode() {
        long
    } else if cfg!(debug_assertions) {
        smoke
    } else {
        full
    }
}

/// The prefix of the store's records tables (one per expiry window, docs/format.md), for
/// tests that inspect or damage the file with redb directly.
pub const RECORDS_PREFIX: &str = "idemstore.records.";

/// The records table named `name`.
pub fn records_table(name: &str) -> TableDefinition<'_, &'static [u8], &'static [u8]> {
    TableDefinition::new(name)
}

/// The names of the store's records tables among `tables` (a transaction's `list_tables`).
pub fn records_tables(
    tables: impl Iterator<Item = idemstore::redb::UntypedTableHandle>,
) -> Vec<String> {
    use idemstore::redb::TableHandle;
    tables
        .map(|t| t.name().to_string())
        .filter(|name| name.starts_with(RECORDS_PREFIX))
        .collect()
}

/// Whether the store file's records hold `key` (encoded), with redb directly.
#[allow(dead_code)] // the CLI's tests use it
pub fn stored(txn: &idemstore::redb::ReadTransaction, key: &[u8]) -> bool {
    records_tables(txn.list_tables().unwrap())
        .iter()
        .any(|name| {
            let table = txn.open_table(records_table(name)).unwrap();
            table.get(key).unwrap().is_some()
        })
}

/// Changes the stored bytes of `key` (encoded) with `change`, with redb directly; panics if
/// no records table holds it.
pub fn change_stored(
    txn: &idemstore::redb::WriteTransaction,
    key: &[u8],
    change: impl FnOnce(&mut Vec<u8>),
) {
    for name in records_tables(txn.list_tables().unwrap()) {
        let mut table = txn.open_table(records_table(&name)).unwrap();
        let value = table.get(key).unwrap().map(|v| v.value().to_vec());
        if let Some(mut value) = value {
            change(&mut value);
            table.insert(key, value.as_slice()).unwrap();
            return;
        }
    }
    panic!("the record is stored under the documented key encoding");
}

/// A store file in its own temporary directory, with a manual clock shared by every open.
pub struct Env {
    /// Kept alive so the directory outlives the test's stores.
    pub dir: TempDir,
    pub path: PathBuf,
    pub clock: ManualClock,
}

impl Env {
    pub fn new() -> Env {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let path = dir.path().join("store.idem");
        Env {
            dir,
            path,
            // A fixed start, so that every run sees the same times.
            clock: ManualClock::starting_at(UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
        }
    }

    /// A builder with [`LEASE`], [`RETENTION`] and this environment's clock. The background
    /// sweeper is off, so that tests count what `Store::sweep` deletes; the log is not
    /// preallocated, so that the suite's many short-lived stores do not write 33 MiB each.
    pub fn builder(&self) -> Builder {
        let mut builder = Store::builder();
        builder
            .lease(LEASE)
            .retention(RETENTION)
            .clock(self.clock.clone())
            .sweep_interval(None)
            .preallocate_log(false);
        builder
    }

    /// Opens (or reopens) the store with [`Env::builder`].
    pub fn open(&self) -> Store {
        self.builder().open(&self.path).expect("open the store")
    }

    pub fn now(&self) -> SystemTime {
        self.clock.time()
    }

    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// How many records the file holds, expired or not (the store must be closed).
    pub fn raw_record_count(&self) -> u64 {
        let db = idemstore::open_redb(&self.path).expect("open the store file with redb");
        let txn = db.begin_read().expect("read transaction");
        records_tables(txn.list_tables().unwrap())
            .iter()
            .map(|name| {
                let table = txn.open_table(records_table(name)).expect("records table");
                table.len().expect("count records")
            })
            .sum()
    }
}

/// A key from three string parts.
pub fn key(scope: &str, operation: &str, id: &str) -> Key {
    Key::new(scope, operation, id).expect("valid key")
}

/// The fingerprint of a request body.
pub fn fp(body: &str) -> Fingerprint {
    Fingerprint::of(body)
}

/// The key's B-tree encoding as documented in `src/key.rs`: each part behind a one-byte length.
pub fn encoded(key: &Key) -> Vec<u8> {
    let mut out = Vec::new();
    for part in [key.scope(), key.operation(), key.id()] {
        out.push(u8::try_from(part.len()).expect("part fits the one-byte length"));
        out.extend_from_slice(part);
    }
    out
}

/// Reserves `key` and expects to acquire it.
#[track_caller]
pub fn acquire(store: &Store, key: &Key, fingerprint: Fingerprint) -> Lease {
    match store.reserve(key, fingerprint).expect("reserve") {
        Reservation::Acquired(lease) => lease,
        other => panic!("expected to acquire {key}, got {other:?}"),
    }
}

/// Reserves `key` and expects the stored result.
#[track_caller]
pub fn replayed(store: &Store, key: &Key, fingerprint: Fingerprint) -> Completed {
    match store.reserve(key, fingerprint).expect("reserve") {
        Reservation::Completed(done) => done,
        other => panic!("expected the stored result of {key}, got {other:?}"),
    }
}
