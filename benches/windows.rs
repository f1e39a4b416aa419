//! A mix of retentions (issue 41): a store of a 5-minute retention whose operation `long` keeps
//! its keys 7 days, 20,000 keys completed one at a time over a simulated week (one every
//! 30.24 s, nine in ten `long`, the tenth `short`). Prints the store's records tables and its file and log sizes once
//! built, then measures a `get` of an absent key and a clean reopen.
//!
//! ```text
//! cargo bench --bench windows                # the week is built once, ~1 minute
//! ```
//!
//! The store is built with buffered durability (what is measured is where its records are
//! kept, not the fsyncs of the week), under the system temp dir (`TMPDIR`).

use std::path::Path;
use std::time::{Duration, Instant, UNIX_EPOCH};

use criterion::{criterion_group, criterion_main, Criterion};
use idemstore::redb::{ReadableDatabase, TableHandle};
use idemstore::{Durability, Fingerprint, Key, ManualClock, Reservation, Store};

/// Keys over the week.
const KEYS: u64 = 20_000;

fn open(path: &Path, clock: &ManualClock) -> Store {
    Store::builder()
        .clock(clock.clone())
        .retention(Duration::from_secs(300))
        .retention_for("long", Duration::from_secs(7 * 24 * 3600))
        .durability(Durability::Buffered {
            flush_interval: Duration::from_secs(1),
        })
        .open(path)
        .expect("open the store")
}

/// The week of keys, written into a new store at `path`; the store is closed cleanly.
fn build(path: &Path, clock: &ManualClock) {
    let store = open(path, clock);
    for n in 0..KEYS {
        let op = if n % 10 == 9 { "short" } else { "long" };
        let id = format!("{n}");
        let items = [(
            Key::new("t", op, id.as_bytes()).expect("a valid key"),
            Fingerprint::of(id.as_bytes()),
        )];
        let leases: Vec<_> = store
            .reserve_many(&items)
            .expect("reserve")
            .into_iter()
            .map(|answer| match answer.expect("reserve") {
                Reservation::Acquired(lease) => (lease, b"done".to_vec()),
                other => panic!("{other:?}"),
            })
            .collect();
        let completions = leases.iter().map(|(lease, result)| (lease, result.clone()));
        for answer in store
            .complete_many(completions.collect())
            .expect("complete")
        {
            answer.expect("complete");
        }
        clock.advance(Duration::from_millis(30_240));
    }
}

fn week(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("week.idem");
    let clock = ManualClock::starting_at(UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    let started = Instant::now();
    build(&path, &clock);
    let built = started.elapsed();
    let tables = {
        let db = idemstore::open_redb_read_only(&path).expect("read the file");
        let txn = db.begin_read().expect("a read transaction");
        let names = txn.list_tables().expect("the tables");
        names
            .filter(|t| t.name().starts_with("idemstore.records."))
            .count()
    };
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    println!(
        "week of mixed retentions: built in {:.1} s; {tables} records tables; file {} bytes, \
         log {} bytes",
        built.as_secs_f64(),
        size(&path),
        size(&path.with_extension("idem.wal"))
    );

    let store = open(&path, &clock);
    let mut n = 0u64;
    c.bench_function("week/get_absent", |b| {
        b.iter(|| {
            n += 1;
            let key = Key::new("t", "short", format!("absent-{n}")).expect("a valid key");
            assert!(store.get(&key).expect("get").is_none());
        })
    });
    drop(store);

    let mut group = c.benchmark_group("week");
    group.sample_size(20);
    group.bench_function("clean_reopen", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let started = Instant::now();
                let store = open(&path, &clock);
                total += started.elapsed();
                drop(store);
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, week);
criterion_main!(benches);
