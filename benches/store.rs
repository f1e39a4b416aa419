//! The store's own hot paths, with `Store::open` defaults and no other engine: durable
//! reserves of new keys (1 and 32 threads), the service cycle (a reserve, then its completion),
//! duplicates of completed keys (single and batched), and `reserve_many` of 1,000 new keys.
//!
//! ```text
//! cargo bench --bench store                  # every group, ~2 minutes on 2 cores
//! cargo bench --bench store -- duplicate     # one group
//! ```
//!
//! The comparisons with the engines a user would pick instead (Redis, SQLite, redb, fjall, a
//! bare group-commit log) are the load generator's (`cargo run --release -p idemstore-loadgen`)
//! and its criterion twin (`cargo bench -p idemstore-loadgen --bench engine`).
//!
//! Every benchmark gets a fresh store under the system temp dir (`TMPDIR`), which must be on
//! the disk being measured: on a tmpfs an fsync costs nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use idemstore::{Fingerprint, Key, Reservation, Store};

/// Keys per batch, and completed keys the duplicate groups replay.
const BATCH: u64 = 1_000;
/// A completion's result: a status line and a small body.
const RESULT: &[u8; 64] = &[b'r'; 64];

/// A fresh store in its own directory (the directory lives as long as the store).
fn fresh() -> (tempfile::TempDir, Arc<Store>) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = Store::open(dir.path().join("bench.idem")).expect("open the store");
    (dir, Arc::new(store))
}

fn key(n: u64) -> Key {
    Key::new("bench", "charge", format!("{n:016x}")).expect("a valid key")
}

fn fingerprint(n: u64) -> Fingerprint {
    Fingerprint::of(n.to_le_bytes())
}

/// Reserves `n` new keys from `next` on `threads` threads, each waiting for its own
/// durability, and completes each when `complete`; returns the wall time.
fn reserve_new(
    store: &Arc<Store>,
    next: &Arc<AtomicU64>,
    n: u64,
    threads: u64,
    complete: bool,
) -> Duration {
    let barrier = Arc::new(Barrier::new(threads as usize + 1));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (store, next, barrier) = (store.clone(), next.clone(), barrier.clone());
            let share = n / threads + u64::from(t < n % threads);
            std::thread::spawn(move || {
                barrier.wait();
                for _ in 0..share {
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    match store.reserve(&key(id), fingerprint(id)).expect("reserve") {
                        Reservation::Acquired(lease) if complete => {
                            store.complete(&lease, &RESULT[..]).expect("complete")
                        }
                        Reservation::Acquired(_) => {}
                        other => panic!("a new key answered {other:?}"),
                    }
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for worker in workers {
        worker.join().expect("a bench thread panicked");
    }
    start.elapsed()
}

fn new_keys(c: &mut Criterion) {
    let mut group = c.benchmark_group("reserve_new");
    group.sample_size(10).throughput(Throughput::Elements(1));
    for threads in [1, 32] {
        let (_dir, store) = fresh();
        let next = Arc::new(AtomicU64::new(0));
        group.bench_function(BenchmarkId::from_parameter(threads), |b| {
            b.iter_custom(|n| reserve_new(&store, &next, n, threads, false))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("service_cycle");
    group.sample_size(10).throughput(Throughput::Elements(1));
    let (_dir, store) = fresh();
    let next = Arc::new(AtomicU64::new(0));
    group.bench_function(BenchmarkId::from_parameter(32), |b| {
        b.iter_custom(|n| reserve_new(&store, &next, n, 32, true))
    });
    group.finish();
}

fn batches(c: &mut Criterion) {
    let mut group = c.benchmark_group("reserve_many_new");
    group
        .sample_size(10)
        .throughput(Throughput::Elements(BATCH));
    let (_dir, store) = fresh();
    let mut next = 0;
    group.bench_function(BenchmarkId::from_parameter(BATCH), |b| {
        b.iter(|| {
            let batch: Vec<_> = (next..next + BATCH)
                .map(|id| (key(id), fingerprint(id)))
                .collect();
            next += BATCH;
            let answers = store.reserve_many(&batch).expect("reserve_many");
            assert!(matches!(answers[0], Ok(Reservation::Acquired(_))));
        })
    });
    group.finish();
}

fn duplicates(c: &mut Criterion) {
    let (_dir, store) = fresh();
    let stored: Vec<_> = (0..BATCH).map(|id| (key(id), fingerprint(id))).collect();
    for answer in store.reserve_many(&stored).expect("reserve_many") {
        match answer {
            Ok(Reservation::Acquired(lease)) => {
                store.complete(&lease, &RESULT[..]).expect("complete")
            }
            other => panic!("a new key answered {other:?}"),
        }
    }
    let mut group = c.benchmark_group("duplicate");
    group.throughput(Throughput::Elements(1));
    let mut i = 0;
    group.bench_function("single", |b| {
        b.iter(|| {
            let (key, fingerprint) = &stored[(i % BATCH) as usize];
            i += 1;
            let answer = store.reserve(key, *fingerprint).expect("reserve");
            assert!(matches!(answer, Reservation::Completed(_)));
        })
    });
    group.throughput(Throughput::Elements(BATCH));
    group.bench_function(BenchmarkId::new("batch", BATCH), |b| {
        b.iter(|| {
            let answers = store.reserve_many(&stored).expect("reserve_many");
            assert!(matches!(answers[0], Ok(Reservation::Completed(_))));
        })
    });
    group.finish();
}

criterion_group!(benches, new_keys, batches, duplicates);
criterion_main!(benches);
