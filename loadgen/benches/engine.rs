//! idemstore against the engines a user would pick instead, on the idempotency workload:
//! durable insert-if-absent of a ~24-byte key with a 32-byte fingerprint, and completion with
//! a 64-byte result. The engines and what each operation does are in `src/peers/mod.rs`, shared
//! with the load generator (`src/main.rs`, which prints latency percentiles and ratios instead).
//! The store's own benchmarks, with no peer, are the library's `benches/store.rs`.
//!
//! ```text
//! cargo bench -p idemstore-loadgen --bench engine                    # everything, ~5 minutes on 2 cores
//! cargo bench -p idemstore-loadgen --bench engine -- reserve_new     # one group
//! cargo bench -p idemstore-loadgen --bench engine -- 'idemstore'     # one engine
//! IDEMSTORE_BENCH_LONG=1 cargo bench -p idemstore-loadgen --bench engine -- prefilled
//! ```
//!
//! `IDEMSTORE_BENCH_LONG=1` prefills the `prefilled` group's stores with 1,000,000 keys instead
//! of 10,000 (filling takes one to two minutes per engine; the group alone ~7 minutes).
//!
//! Every benchmark gets a fresh directory under the system temp dir (`TMPDIR`), which must be
//! on the disk being measured: on a tmpfs an fsync costs nothing and the numbers mean nothing.
//! Durable operations cost ~100–300 µs each here, so samples are few and short; compare
//! engines within one run, not across runs (the disk is shared and noisy).
//!
//! Engines: idemstore (`Store::open` defaults), Redis (`appendfsync always`, a `redis-server`
//! the bench starts on a loopback port and kills at the end; skipped with a message when not
//! installed), redb, SQLite, fdatasync (see `src/peers/mod.rs`). Percentiles, ratios per pass and
//! `idemstore-prealloc` are in the load generator (`src/main.rs`).
//!
//! Groups (throughput is keys per second):
//! - `reserve_new/{engine}/{threads}`: first-time reserves at 1 and 32 threads;
//! - `service_cycle`: a new reserve, then its completion with a 64-byte result (32 threads);
//! - `reserve_batch_1000`: `reserve_many` of 1,000 new keys (1 thread);
//! - `duplicate_batch_1000`: `reserve_many` of 1,000 stored keys (1 thread);
//! - `reserve_duplicate`: reserves of 1,000 stored, completed keys (1 thread);
//! - `async_cycle`: idemstore only, 1,000 tokio tasks doing `reserve_async` then
//!   `complete_async` (compare with `service_cycle/idemstore/32`);
//! - `prefilled_10k` (`prefilled_1m` when long): new, then duplicate reserves on a store that
//!   already holds the keys (1 thread); the two share one store per engine, filled once.

#[path = "../src/peers/mod.rs"]
mod peers;

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex, PoisonError};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, SamplingMode,
    Throughput,
};

use idemstore::{Fingerprint, Key, Reservation, Store};
use peers::{prefill, BenchKey, BenchResult, Driver, Engine, Fresh, Kind, Visit, Workload};

/// Prefilled keys for `reserve_duplicate` and `duplicate_batch_1000`.
const DUPLICATE_KEYS: u64 = 1_000;
/// Keys per `reserve_many` in the batch groups.
const BATCH: usize = 1_000;
/// Tasks in `async_cycle`.
const TASKS: u64 = 1_000;

fn long() -> bool {
    std::env::var_os("IDEMSTORE_BENCH_LONG").is_some_and(|v| v == "1")
}

/// One benchmark: a workload at a thread count on a store holding `prefill` keys.
#[derive(Clone, Copy)]
struct Case {
    workload: Workload,
    threads: usize,
    prefill: u64,
    batch: usize,
}

impl Case {
    fn new(workload: Workload, threads: usize) -> Case {
        Case {
            workload,
            threads,
            prefill: if workload.needs_prefill() {
                DUPLICATE_KEYS
            } else {
                0
            },
            batch: BATCH,
        }
    }
}

/// The value, or a panic naming the engine: a benchmark cannot go on after a failed operation.
fn or_die<E: Engine, T>(result: BenchResult<T>) -> T {
    result.unwrap_or_else(|e| panic!("{}: {e}", E::NAME))
}

/// Runs `iters` steps of `case`, shared between its threads, and returns the wall time from
/// the moment all threads are ready until the last one is done. Opening handles (SQLite
/// connections) and closing them is not timed.
fn timed<E: Engine>(
    engine: &E,
    fresh: &Fresh,
    existing: &Range<u64>,
    case: Case,
    iters: u64,
) -> Duration {
    let threads = case.threads as u64;
    let ready = Barrier::new(case.threads + 1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let share = iters / threads + u64::from(t < iters % threads);
                let ready = &ready;
                scope.spawn(move || {
                    let handle = engine.handle();
                    let mut driver = Driver::new(
                        case.workload,
                        case.batch,
                        fresh,
                        existing.clone(),
                        t as usize,
                    );
                    // Past the barrier before failing, or the other threads would wait forever.
                    ready.wait();
                    let mut handle = or_die::<E, _>(handle);
                    for _ in 0..share {
                        or_die::<E, _>(driver.step(&mut handle));
                    }
                    handle
                })
            })
            .collect();
        ready.wait();
        let start = Instant::now();
        let handles: Vec<_> = workers
            .into_iter()
            .map(|w| w.join().expect("a benchmark thread panicked"))
            .collect();
        let elapsed = start.elapsed();
        drop(handles);
        elapsed
    })
}

/// Benchmarks `cases` on one engine, on one store in a fresh directory, prefilled once.
struct Bench<'g, 'c, 'a> {
    group: &'g mut BenchmarkGroup<'c, WallTime>,
    /// Each with the parameter shown after the engine's name in the benchmark id.
    cases: &'a [(Case, String)],
}

/// An open engine with its key numbers; the directory goes last, after the engine closed.
struct Opened<E> {
    engine: E,
    fresh: Fresh,
    existing: Range<u64>,
    _dir: tempfile::TempDir,
}

impl Visit for Bench<'_, '_, '_> {
    type Output = ();

    fn visit<E: Engine>(self) {
        let Bench { group, cases } = self;
        if let Err(reason) = E::available() {
            // Said once per engine, not once per benchmark.
            static SKIPPED: Mutex<Vec<&str>> = Mutex::new(Vec::new());
            let mut skipped = SKIPPED.lock().unwrap_or_else(PoisonError::into_inner);
            if !skipped.contains(&E::NAME) {
                skipped.push(E::NAME);
                eprintln!("skipping {}: {reason}", E::NAME);
            }
            return;
        }
        let keys = cases
            .iter()
            .map(|(case, _)| case.prefill)
            .max()
            .unwrap_or(0);
        // Opened and filled on first use: a benchmark left out by a filter costs nothing.
        let mut opened: Option<Opened<E>> = None;
        let mut open = || {
            let dir = tempfile::tempdir().expect("a temp dir for the benchmark");
            let engine = or_die::<E, _>(E::open(dir.path()));
            let fresh = Fresh::default();
            let existing = or_die::<E, _>(prefill(&engine, &fresh, keys, &|_| {}));
            Opened {
                engine,
                fresh,
                existing,
                _dir: dir,
            }
        };
        for (case, label) in cases {
            group.throughput(Throughput::Elements(match case.workload {
                Workload::Batch | Workload::BatchDuplicate => case.batch as u64,
                _ => 1,
            }));
            group.bench_function(BenchmarkId::new(E::NAME, label), |b| {
                let Opened {
                    engine,
                    fresh,
                    existing,
                    ..
                } = opened.get_or_insert_with(&mut open);
                b.iter_custom(|iters| timed(engine, fresh, existing, *case, iters));
            });
        }
    }
}

/// Runs `cases` on every engine as group `name`. Each case gets a fresh store per engine,
/// unless `share_store`: then an engine's cases run one after the other on one store (so a
/// large prefill is paid once).
fn group(c: &mut Criterion, name: &str, cases: &[(Case, String)], share_store: bool) {
    let mut group = c.benchmark_group(name);
    // Durable operations are slow and iterations cost the same: one flat pass of samples.
    group.sampling_mode(SamplingMode::Flat);
    if share_store {
        for kind in Kind::BENCH {
            kind.visit(Bench {
                group: &mut group,
                cases,
            });
        }
    } else {
        for case in cases {
            for kind in Kind::BENCH {
                kind.visit(Bench {
                    group: &mut group,
                    cases: std::slice::from_ref(case),
                });
            }
        }
    }
    group.finish();
}

fn by_threads(workload: Workload, threads: &[usize]) -> Vec<(Case, String)> {
    threads
        .iter()
        .map(|&t| (Case::new(workload, t), format!("{t}")))
        .collect()
}

fn reserve_new(c: &mut Criterion) {
    group(
        c,
        "reserve_new",
        &by_threads(Workload::Reserve, &[1, 32]),
        false,
    );
}

fn reserve_duplicate(c: &mut Criterion) {
    group(
        c,
        "reserve_duplicate",
        &by_threads(Workload::Duplicate, &[1]),
        false,
    );
}

fn service_cycle(c: &mut Criterion) {
    group(
        c,
        "service_cycle",
        &by_threads(Workload::Complete, &[32]),
        false,
    );
}

fn reserve_batch(c: &mut Criterion) {
    group(
        c,
        "reserve_batch_1000",
        &by_threads(Workload::Batch, &[1]),
        false,
    );
}

fn duplicate_batch(c: &mut Criterion) {
    group(
        c,
        "duplicate_batch_1000",
        &by_threads(Workload::BatchDuplicate, &[1]),
        false,
    );
}

/// `iters` cycles of `reserve_async` of a new key then `complete_async`, shared by [`TASKS`]
/// tasks on `runtime`; the wall time from the first spawn until the last task is done.
fn async_cycles(
    runtime: &tokio::runtime::Runtime,
    store: &Arc<Store>,
    fresh: &Arc<Fresh>,
    iters: u64,
) -> Duration {
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..TASKS.min(iters))
        .map(|_| {
            let (store, fresh, next) = (Arc::clone(store), Arc::clone(fresh), Arc::clone(&next));
            runtime.spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < iters {
                    let key = BenchKey::new(fresh.take(1).start);
                    let id = Key::new(key.scope(), BenchKey::OPERATION, key.id())
                        .unwrap_or_else(|e| panic!("idemstore: key {key}: {e}"));
                    let fingerprint = Fingerprint::of(key.body());
                    let lease = match store.reserve_async(&id, fingerprint).await {
                        Ok(Reservation::Acquired(lease)) => lease,
                        other => panic!("idemstore: new key {key} answered {other:?}"),
                    };
                    store
                        .complete_async(&lease, &peers::RESULT[..])
                        .await
                        .unwrap_or_else(|e| panic!("idemstore: complete_async of {key}: {e}"));
                }
            })
        })
        .collect();
    for task in tasks {
        runtime
            .block_on(task)
            .expect("an async benchmark task panicked");
    }
    start.elapsed()
}

fn async_cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("async_cycle");
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Elements(1));
    let dir = tempfile::tempdir().expect("a temp dir for the benchmark");
    let store = Arc::new(Store::open(dir.path().join("keys.idem")).expect("idemstore: open"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let fresh = Arc::new(Fresh::default());
    group.bench_function(BenchmarkId::new("idemstore", TASKS), |b| {
        b.iter_custom(|iters| async_cycles(&runtime, &store, &fresh, iters));
    });
    group.finish();
}

fn prefilled(c: &mut Criterion) {
    let (name, keys) = if long() {
        ("prefilled_1m", 1_000_000)
    } else {
        ("prefilled_10k", 10_000)
    };
    let cases: Vec<_> = [Workload::Reserve, Workload::Duplicate]
        .into_iter()
        .map(|workload| {
            let case = Case {
                prefill: keys,
                ..Case::new(workload, 1)
            };
            (case, workload.name().to_string())
        })
        .collect();
    group(c, name, &cases, true);
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = reserve_new, service_cycle, reserve_batch, duplicate_batch, reserve_duplicate,
        async_cycle, prefilled
}
criterion_main!(benches);
