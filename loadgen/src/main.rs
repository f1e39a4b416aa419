//! A load generator for people: runs the idempotency workload (durable insert-if-absent of a
//! ~25-byte key with a request fingerprint, completion with a 64-byte result) against idemstore
//! and the engines a user would pick instead, and prints throughput, p50/p99 latency and
//! ratios against each peer measured in the same run.
//!
//! ```text
//! # Every scenario of the hot-path targets, every engine, 3 interleaved passes (~7 minutes):
//! cargo run --release -p idemstore-loadgen -- --scenario all --passes 3
//! # The same as JSON on stdout (per pass and medians), no progress bar:
//! cargo run --release -p idemstore-loadgen -- --scenario all --passes 3 --json > run.json
//! # The table on stdout and the JSON in a file:
//! cargo run --release -p idemstore-loadgen -- --scenario all --passes 3 --save run.json
//! # Some scenarios, some engines, shorter cells:
//! cargo run --release -p idemstore-loadgen -- --scenario reserve-32,cycle-32 \
//!     --engines idemstore,redis --seconds 2
//! # A custom workload at chosen thread counts (reserve, duplicate, mixed, complete, batch,
//! # batch-duplicate):
//! cargo run --release -p idemstore-loadgen -- --workload mixed --threads 1,4,32
//! ```
//!
//! Scenarios (`--scenario all` runs them in this order; engines: every one unless said):
//! - `reserve-1`, `reserve-32`: durable first-time reserves by 1 and 32 threads;
//! - `cycle-32`: the service cycle, reserve then complete with a 64-byte result (two durable
//!   writes; Redis: `SET NX` then `SET`), 32 threads;
//! - `batch-new`, `batch-duplicate`: `reserve_many` of 1000 new / 1000 stored keys, 1 thread
//!   (redb: 1000 keys per write transaction / one read transaction; Redis: a pipeline);
//! - `duplicate-1`: reserves of stored keys on one thread through the public API (`Key::new`,
//!   `Fingerprint::of`, `reserve`);
//! - `async-1000`: idemstore only, 1,000 tokio tasks each looping `reserve_async` then
//!   `complete_async`, on a runtime with one worker per core; `vs 32 thr` divides by the same
//!   engine's `cycle-32` figure of the same pass.
//!
//! Engines: `idemstore` (`Store::open` defaults), `idemstore-prealloc` (`preallocate_log(true)`),
//! `idemstore-nopages` (named only, never by default: the same defaults on a store file without
//! the page checksums, through a hidden benchmark-only builder knob, so that
//! `--engines idemstore,idemstore-nopages` measures the checksums' cost pass by pass),
//! `redis` (`appendfsync always`; a `redis-server` the run starts and stops itself, skipped
//! with a message when not installed: `apt-get install redis-server`), `redb`, `sqlite`,
//! `fdatasync`, `grouplog` (the ceiling for callers that block until durable: a bare
//! group-commit log with nothing else), `redb-ceiling` and `redb-ceiling-1g` (named only:
//! redb's inserts of a new key's record and deadline entry alone, not durable, with a 64 MiB
//! and a 1 GiB page cache: the bound of an engine that keeps every key in a redb B-tree);
//! `src/peers/mod.rs` says what each does.
//!
//! `CPU/op` is the CPU time (user + system, `getrusage(RUSAGE_SELF)` before and after the
//! clients run) of the whole process divided by the operations (keys, for batches): the
//! engine's threads and the clients' loop, for every in-process engine; `-` for Redis, whose
//! work is done in its own server process. Work an engine leaves to its background threads
//! after the last client returns (and its close) is not counted.
//!
//! Within a pass each scenario runs every engine back to back, on a fresh store in a new
//! directory under `--dir` (default: the temp dir, which must be on the disk to be measured);
//! the engine order rotates from pass to pass, so drift of the shared disk hits all alike. The
//! table shows medians over the passes; `vs X` is the median over passes of the engine's ops/s
//! divided by X's in the same scenario and pass. Percentiles are per operation (per batch for
//! batches, per reserve + complete for cycles). The disk is shared and noisy: compare ratios
//! within one run, not absolute figures across runs.

mod peers;
mod report;
mod steady;

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use idemstore::{Fingerprint, Key, Reservation, Store};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use peers::{prefill, BenchKey, BenchResult, Driver, Engine, Fresh, Kind, Visit, Workload};
use report::{
    add_ratios, latency_text, medians, page_costs, table, thousands, PageWork, Report, Row, Skipped,
};

/// Run the idempotency workload against idemstore, Redis, redb, SQLite, raw fdatasync and a
/// bare group-commit log.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Scenarios, comma-separated, or `all`: reserve-1, reserve-32, cycle-32, batch-new,
    /// batch-duplicate, duplicate-1, async-1000. Without it, --workload at --threads runs.
    /// `steady` (not in `all`, and run alone): idemstore, fjall and Redis at steady state
    /// (--keys, --turnovers).
    #[arg(long, value_delimiter = ',', conflicts_with = "workload")]
    scenario: Vec<String>,

    /// Engines to run (each scenario runs those of its engines listed here): idemstore,
    /// idemstore-prealloc, redis, redb, sqlite, fdatasync, grouplog [default: all];
    /// idemstore-nopages, redb-ceiling, redb-ceiling-1g (named only); etcd and etcd-bare with
    /// `--features etcd` (never in the default: it starts a cluster).
    #[arg(long, value_delimiter = ',')]
    engines: Option<Vec<Kind>>,

    /// Passes over all scenarios; the table shows medians.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    passes: u32,

    /// Without --scenario: reserve, duplicate, mixed, complete, batch, batch-duplicate.
    #[arg(long)]
    workload: Option<Workload>,

    /// Without --scenario: client thread counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,32")]
    threads: Vec<usize>,

    /// Stop each run after this many operations (keys, for batches).
    #[arg(long, conflicts_with = "seconds")]
    ops: Option<u64>,

    /// Stop each run after this many seconds [default: 3].
    #[arg(long)]
    seconds: Option<f64>,

    /// Keys per reserve_many in batches.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    batch: u64,

    /// Keys stored (completed) before a run of duplicates.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    prefill: u64,

    /// Concurrent tasks in the async scenario.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    tasks: u64,

    /// Where the stores are created (in a fresh directory per run) [default: the temp dir].
    #[arg(long)]
    dir: Option<PathBuf>,

    /// The `steady` scenario: keys in a retention window (a multiple of 1000, at least
    /// 10,000). The long mode is `--keys 10000000`.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(10_000..=1_000_000_000))]
    keys: u64,

    /// The `steady` scenario: windows written at steady state after the fill.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=100))]
    turnovers: u64,

    /// Print JSON instead of the table, and no progress bar.
    #[arg(long)]
    json: bool,

    /// Also write the JSON report to this file (the table still goes to stdout).
    #[arg(long)]
    save: Option<PathBuf>,
}

/// What a scenario runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// `threads` OS threads stepping the workload through an engine's handle.
    Threads(Workload),
    /// Tokio tasks doing `reserve_async` then `complete_async` (idemstore only).
    Async,
}

#[derive(Clone, Debug)]
struct Scenario {
    name: String,
    mode: Mode,
    /// Threads, or tasks for [`Mode::Async`].
    clients: usize,
    engines: Vec<Kind>,
}

impl Scenario {
    fn describe(&self) -> &'static str {
        match self.mode {
            Mode::Threads(workload) => workload.describe(),
            Mode::Async => "tokio tasks: reserve_async of a new key, then complete_async (one op)",
        }
    }

    fn workload(&self) -> Workload {
        match self.mode {
            Mode::Threads(workload) => workload,
            Mode::Async => Workload::Complete,
        }
    }
}

/// The scenarios `--scenario` names, in the order `all` runs them.
const SCENARIOS: [&str; 7] = [
    "reserve-1",
    "reserve-32",
    "cycle-32",
    "batch-new",
    "batch-duplicate",
    "duplicate-1",
    "async-1000",
];

/// Every engine this build can run: [`Kind::ALL`], the engines run only when `--engines` names
/// them ([`Kind::BY_NAME`]), and etcd when built with its feature (also by name only: it starts
/// a cluster).
fn every_engine() -> Vec<Kind> {
    #[allow(unused_mut)]
    let mut engines = Kind::ALL.to_vec();
    engines.extend(Kind::BY_NAME);
    #[cfg(feature = "etcd")]
    engines.extend([Kind::Etcd, Kind::EtcdBare]);
    engines
}

fn scenario(name: &str, tasks: usize) -> Result<Scenario, String> {
    let threads = |workload, clients| (Mode::Threads(workload), clients, every_engine());
    let (mode, clients, engines) = match name {
        "reserve-1" => threads(Workload::Reserve, 1),
        "reserve-32" => threads(Workload::Reserve, 32),
        "cycle-32" => threads(Workload::Complete, 32),
        "batch-new" => threads(Workload::Batch, 1),
        "batch-duplicate" => threads(Workload::BatchDuplicate, 1),
        "duplicate-1" => threads(Workload::Duplicate, 1),
        "async-1000" => (
            Mode::Async,
            tasks,
            vec![Kind::Idemstore, Kind::IdemstorePrealloc],
        ),
        other => {
            return Err(format!(
                "unknown scenario {other:?}; expected all or one of {}",
                SCENARIOS.join(", ")
            ))
        }
    };
    Ok(Scenario {
        name: name.to_string(),
        mode,
        clients,
        engines,
    })
}

/// When a run stops.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// After this many steps in total.
    Steps(u64),
    /// After this long.
    Time(Duration),
}

/// What a run measured.
struct Measured {
    latency: Histogram<u64>,
    ops: u64,
    seconds: f64,
    /// CPU time (user + system) of this whole process while the clients ran: every thread of
    /// an in-process engine (its background threads too) and the clients' own loop.
    cpu: Duration,
    /// The page layer's work (`idemstore::whitebox::page_work`: 4 KiB blocks checksummed,
    /// sums blocks written) while the clients ran, and from their start through the store's
    /// close (whose checkpoint writes every key of the run, and of its prefill, into the B-tree).
    page_work: (u64, u64),
    page_work_close: (u64, u64),
}

/// The page layer's work since `before` (`idemstore::whitebox::page_work`).
fn page_work_since(before: (u64, u64)) -> (u64, u64) {
    let now = idemstore::whitebox::page_work();
    (now.0 - before.0, now.1 - before.1)
}

/// The CPU time of one page-layer checksum of a 4 KiB block, in µs: the median of 5 rounds
/// of 100,000 (`idemstore::whitebox::page_sum`, the function the layer runs).
fn crc_us_per_block() -> f64 {
    let block: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let mut rounds: Vec<f64> = (0..5)
        .map(|_| {
            let before = cpu_time();
            let mut acc = 0u32;
            for i in 0..100_000u64 {
                acc ^= idemstore::whitebox::page_sum(i, std::hint::black_box(&block));
            }
            std::hint::black_box(acc);
            cpu_time().saturating_sub(before).as_secs_f64() * 1e6 / 100_000.0
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[2]
}

/// CPU time (user + system) used by this process so far, from `getrusage(RUSAGE_SELF)`.
fn cpu_time() -> Duration {
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    // SAFETY: getrusage only writes the struct it is given, which is plain old data.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return Duration::ZERO;
        }
        usage
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Shared settings of every cell.
struct Cell<'a> {
    scenario: &'a Scenario,
    stop: Stop,
    batch: usize,
    prefill: u64,
    dir: &'a Path,
    bar: &'a ProgressBar,
}

fn histogram() -> BenchResult<Histogram<u64>> {
    Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3)
        .map_err(|e| format!("histogram: {e}").into())
}

impl Cell<'_> {
    /// The progress bar's length and the step budget.
    fn budget(&self, keys_per_step: u64) -> (u64, u64) {
        match self.stop {
            Stop::Steps(steps) => (steps * keys_per_step, steps),
            Stop::Time(time) => (time.as_millis() as u64, u64::MAX),
        }
    }

    fn deadline(&self, start: Instant) -> Option<Instant> {
        match self.stop {
            Stop::Time(time) => Some(start + time),
            Stop::Steps(_) => None,
        }
    }

    /// Shows progress until `finished`; `done` counts keys.
    fn watch(&self, done: &AtomicU64, finished: impl Fn() -> bool) {
        let start = Instant::now();
        while !finished() {
            std::thread::sleep(Duration::from_millis(100));
            let elapsed = start.elapsed();
            let keys = done.load(Ordering::Relaxed);
            self.bar.set_position(match self.stop {
                Stop::Steps(_) => keys,
                Stop::Time(_) => elapsed.as_millis() as u64,
            });
            self.bar.set_message(format!(
                "{} ops/s",
                thousands(keys as f64 / elapsed.as_secs_f64())
            ));
        }
    }

    fn reset_bar(&self, label: String, length: u64) {
        self.bar.reset();
        self.bar.set_length(length);
        self.bar.set_position(0);
        self.bar.set_prefix(label);
        self.bar.set_message("");
    }
}

impl Visit for &Cell<'_> {
    type Output = BenchResult<Measured>;

    fn visit<E: Engine>(self) -> BenchResult<Measured> {
        let workload = self.scenario.workload();
        let threads = self.scenario.clients;
        let label = format!("{} {}", self.scenario.name, E::NAME);
        let dir = tempfile::tempdir_in(self.dir)
            .map_err(|e| format!("creating a directory under {}: {e}", self.dir.display()))?;
        let engine = E::open(dir.path())?;
        let fresh = Fresh::default();
        let existing = if workload.needs_prefill() {
            self.reset_bar(format!("{label}: prefill"), self.prefill);
            prefill(&engine, &fresh, self.prefill, &|done| {
                self.bar.set_position(done)
            })?
        } else {
            0..0
        };
        let keys_per_step = Driver::new(workload, self.batch, &fresh, 0..0, 0).keys_per_step();
        let (length, steps) = self.budget(keys_per_step);
        self.reset_bar(label, length);

        let claimed = AtomicU64::new(0);
        let done = AtomicU64::new(0);
        let failed = AtomicBool::new(false);
        let ready = Barrier::new(threads + 1);
        let work_start = idemstore::whitebox::page_work();
        let measured = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let (engine, fresh, existing) = (&engine, &fresh, existing.clone());
                    let (claimed, done, failed, ready) = (&claimed, &done, &failed, &ready);
                    scope.spawn(move || -> BenchResult<(Histogram<u64>, Instant, Instant)> {
                        let setup = engine.handle().and_then(|h| Ok((h, histogram()?)));
                        // Every thread reaches the barrier, also one whose set-up failed, or
                        // the others would wait for it forever.
                        ready.wait();
                        let (mut handle, mut latency) = setup?;
                        let mut driver = Driver::new(workload, self.batch, fresh, existing, t);
                        let start = Instant::now();
                        let deadline = self.deadline(start);
                        let mut end = start;
                        while claimed.fetch_add(1, Ordering::Relaxed) < steps
                            && !failed.load(Ordering::Relaxed)
                            && deadline.is_none_or(|deadline| end < deadline)
                        {
                            let before = Instant::now();
                            if let Err(e) = driver.step(&mut handle) {
                                failed.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                            end = Instant::now();
                            latency.saturating_record((end - before).as_nanos() as u64);
                            done.fetch_add(keys_per_step, Ordering::Relaxed);
                        }
                        Ok((latency, start, end))
                    })
                })
                .collect();
            ready.wait();
            let cpu_before = cpu_time();
            let work_before = idemstore::whitebox::page_work();
            self.watch(&done, || workers.iter().all(|w| w.is_finished()));
            let measured = workers
                .into_iter()
                .map(|w| w.join().expect("a client thread panicked"))
                .collect::<BenchResult<Vec<_>>>();
            measured.map(|m| {
                (
                    m,
                    cpu_time().saturating_sub(cpu_before),
                    page_work_since(work_before),
                )
            })
        })?;
        let (measured, cpu, page_work) = measured;
        drop(engine);
        let page_work_close = page_work_since(work_start);

        let mut latency = histogram()?;
        for (histogram, _, _) in &measured {
            latency
                .add(histogram)
                .map_err(|e| format!("histogram: {e}"))?;
        }
        let start = measured.iter().map(|m| m.1).min().expect("a thread");
        let end = measured.iter().map(|m| m.2).max().expect("a thread");
        Ok(Measured {
            ops: latency.len() * keys_per_step,
            latency,
            seconds: (end - start).as_secs_f64(),
            cpu,
            page_work,
            page_work_close,
        })
    }
}

/// The async scenario: `tasks` tokio tasks on one store, each looping `reserve_async` of a new
/// key then `complete_async`, on a multi-thread runtime with one worker per core.
fn run_async(cell: &Cell<'_>, preallocate: bool, engine: &'static str) -> BenchResult<Measured> {
    let dir = tempfile::tempdir_in(cell.dir)
        .map_err(|e| format!("creating a directory under {}: {e}", cell.dir.display()))?;
    let path = dir.path().join("keys.idem");
    let store = Arc::new(if preallocate {
        Store::builder().preallocate_log(true).open(path)?
    } else {
        Store::open(path)?
    });
    let (length, steps) = cell.budget(1);
    cell.reset_bar(format!("{} {engine}", cell.scenario.name), length);
    let fresh = Arc::new(Fresh::default());
    let claimed = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let start = Instant::now();
    let cpu_before = cpu_time();
    let work_before = idemstore::whitebox::page_work();
    let deadline = cell.deadline(start);
    let tasks: Vec<_> = (0..cell.scenario.clients)
        .map(|_| {
            let (store, fresh) = (Arc::clone(&store), Arc::clone(&fresh));
            let (claimed, done, failed) =
                (Arc::clone(&claimed), Arc::clone(&done), Arc::clone(&failed));
            runtime.spawn(async move {
                let mut latency = histogram()?;
                while claimed.fetch_add(1, Ordering::Relaxed) < steps
                    && !failed.load(Ordering::Relaxed)
                    && deadline.is_none_or(|deadline| Instant::now() < deadline)
                {
                    let before = Instant::now();
                    let step = async {
                        let key = BenchKey::new(fresh.take(1).start);
                        let id = Key::new(key.scope(), BenchKey::OPERATION, key.id())?;
                        let lease = match store
                            .reserve_async(&id, Fingerprint::of(key.body()))
                            .await?
                        {
                            Reservation::Acquired(lease) => lease,
                            other => return Err(format!("new key {key} answered {other:?}").into()),
                        };
                        store.complete_async(&lease, &peers::RESULT[..]).await?;
                        BenchResult::Ok(())
                    };
                    if let Err(e) = step.await {
                        failed.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                    latency.saturating_record(before.elapsed().as_nanos() as u64);
                    done.fetch_add(1, Ordering::Relaxed);
                }
                BenchResult::Ok(latency)
            })
        })
        .collect();
    cell.watch(&done, || tasks.iter().all(|t| t.is_finished()));
    let seconds = start.elapsed().as_secs_f64();
    let cpu = cpu_time().saturating_sub(cpu_before);
    let page_work = page_work_since(work_before);
    let mut latency = histogram()?;
    for task in tasks {
        let histogram = runtime
            .block_on(task)
            .map_err(|e| format!("a task failed: {e}"))??;
        latency
            .add(&histogram)
            .map_err(|e| format!("histogram: {e}"))?;
    }
    drop(runtime);
    drop(store);
    let page_work_close = page_work_since(work_before);
    Ok(Measured {
        ops: latency.len(),
        latency,
        seconds,
        cpu,
        page_work,
        page_work_close,
    })
}

fn row(scenario: &Scenario, pass: u32, kind: Kind, m: &Measured) -> Row {
    let engine = kind.name();
    let micros = |ns: u64| ns as f64 / 1000.0;
    Row {
        scenario: scenario.name.clone(),
        pass,
        engine,
        clients: scenario.clients,
        ops: m.ops,
        seconds: m.seconds,
        ops_per_sec: m.ops as f64 / m.seconds,
        p50_us: micros(m.latency.value_at_quantile(0.50)),
        p99_us: micros(m.latency.value_at_quantile(0.99)),
        max_us: micros(m.latency.max()),
        // Out of process (a server), the engine's CPU is not this process's.
        cpu_us_per_op: (kind.in_process() && m.ops > 0)
            .then(|| m.cpu.as_secs_f64() * 1e6 / m.ops as f64),
        vs: Vec::new(),
        p50_vs_fdatasync: None,
        // The counters are the process's: only idemstore's engines have a page layer.
        page_work_per_op: (engine.starts_with("idemstore") && m.ops > 0).then(|| {
            let per_op = |n: u64| n as f64 / m.ops as f64;
            PageWork {
                summed: per_op(m.page_work.0),
                summed_through_close: per_op(m.page_work_close.0),
                sums_written_through_close: per_op(m.page_work_close.1),
            }
        }),
    }
}

fn scenarios(args: &Args) -> Result<Vec<Scenario>, String> {
    let tasks = args.tasks as usize;
    let mut list = if args.scenario.iter().any(|s| s == "all") {
        SCENARIOS
            .iter()
            .map(|name| scenario(name, tasks))
            .collect::<Result<Vec<_>, _>>()?
    } else if !args.scenario.is_empty() {
        let list = args.scenario.iter().map(|name| scenario(name, tasks));
        list.collect::<Result<Vec<_>, _>>()?
    } else {
        let workload = args.workload.unwrap_or(Workload::Reserve);
        if let Some(bad) = args.threads.iter().find(|&&t| t == 0 || t > 4096) {
            return Err(format!("--threads {bad}: each count must be 1 to 4096"));
        }
        args.threads
            .iter()
            .map(|&t| Scenario {
                name: format!("{workload}-{t}"),
                mode: Mode::Threads(workload),
                clients: t,
                engines: every_engine(),
            })
            .collect()
    };
    for s in &mut list {
        match &args.engines {
            Some(only) => s.engines.retain(|k| only.contains(k)),
            None => s.engines.retain(|k| Kind::ALL.contains(k)),
        }
    }
    Ok(list)
}

fn run(args: &Args) -> BenchResult<(Report, Vec<Scenario>)> {
    let mut scenarios = scenarios(args)?;
    let stop = match (args.ops, args.seconds) {
        (Some(0), _) => return Err("--ops must be at least 1".into()),
        (Some(ops), _) => Stop::Steps(ops),
        (None, seconds) => {
            let seconds = seconds.unwrap_or(3.0);
            if !(seconds > 0.0 && seconds <= 86_400.0) {
                return Err(
                    format!("--seconds {seconds}: must be above 0 and at most a day").into(),
                );
            }
            Stop::Time(Duration::from_secs_f64(seconds))
        }
    };
    let mut skipped = Vec::new();
    for kind in every_engine() {
        if !scenarios.iter().any(|s| s.engines.contains(&kind)) {
            continue;
        }
        if let Err(reason) = kind.available() {
            eprintln!("loadgen: skipping {kind}: {reason}");
            skipped.push(Skipped {
                engine: kind.name(),
                reason,
            });
            for s in &mut scenarios {
                s.engines.retain(|&k| k != kind);
            }
        }
    }
    let dir = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let bar = ProgressBar::with_draw_target(
        None,
        if args.json {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        },
    );
    bar.set_style(
        ProgressStyle::with_template("{prefix:>34} [{bar:30}] {msg}")
            .expect("a valid progress template")
            .progress_chars("=> "),
    );
    let mut runs = Vec::new();
    for pass in 1..=args.passes {
        for scenario in &scenarios {
            // Engines back to back, their order rotating from pass to pass.
            let mut engines = scenario.engines.clone();
            if !engines.is_empty() {
                let n = engines.len();
                engines.rotate_left((pass as usize - 1) % n);
            }
            for kind in engines {
                let steps = match (stop, scenario.workload()) {
                    (Stop::Steps(ops), Workload::Batch | Workload::BatchDuplicate) => {
                        Stop::Steps(ops.div_ceil(args.batch))
                    }
                    (stop, _) => stop,
                };
                let cell = Cell {
                    scenario,
                    stop: steps,
                    batch: args.batch as usize,
                    prefill: args.prefill.max(args.batch),
                    dir: &dir,
                    bar: &bar,
                };
                let measured = match scenario.mode {
                    Mode::Threads(_) => kind.visit(&cell),
                    Mode::Async => run_async(&cell, kind == Kind::IdemstorePrealloc, kind.name()),
                }
                .map_err(|e| format!("{} on {kind}, pass {pass}: {e}", scenario.name))?;
                let row = row(scenario, pass, kind, &measured);
                let line = format!(
                    "pass {pass} {:<16} {:>19} {:>11} ops/s  p50 {:>9}  p99 {:>9}  CPU/op {:>9}",
                    scenario.name,
                    row.engine,
                    thousands(row.ops_per_sec),
                    latency_text(row.p50_us),
                    latency_text(row.p99_us),
                    row.cpu_us_per_op.map_or("-".to_string(), latency_text)
                );
                // Progress on stderr also when it is not a terminal (the bar is then hidden).
                if bar.is_hidden() {
                    eprintln!("{line}");
                } else {
                    bar.println(line);
                }
                runs.push(row);
            }
        }
    }
    bar.finish_and_clear();
    add_ratios(&mut runs);
    let report = Report {
        stop: match stop {
            Stop::Time(time) => format!("{} s per run", time.as_secs_f64()),
            Stop::Steps(ops) => format!("{ops} ops per run"),
        },
        passes: args.passes,
        batch: args.batch,
        prefill: args.prefill.max(args.batch),
        dir,
        skipped,
        medians: medians(&runs),
        page_checksums: page_costs(&runs),
        crc_us_per_block: runs
            .iter()
            .any(|r| r.engine == Kind::IdemstoreNoPages.name())
            .then(crc_us_per_block),
        runs,
    };
    Ok((report, scenarios))
}

/// The `steady` scenario: idemstore, fjall and Redis (those of `--engines`, Redis when
/// installed) at steady state; the JSON has every engine's per-segment series.
fn run_steady(args: &Args) -> BenchResult<(String, String)> {
    use steady::SteadyEngine;
    if args.scenario.len() != 1 {
        return Err("the steady scenario runs alone: --scenario steady".into());
    }
    let wanted = |kind: Kind| {
        args.engines
            .as_ref()
            .is_none_or(|only| only.contains(&kind))
    };
    let mut engines = Vec::new();
    if wanted(Kind::Idemstore) {
        engines.push(SteadyEngine::Idemstore);
    }
    if wanted(Kind::Fjall) {
        engines.push(SteadyEngine::Fjall);
    }
    if wanted(Kind::Redis) {
        match Kind::Redis.available() {
            Ok(()) => engines.push(SteadyEngine::Redis),
            Err(reason) => eprintln!("loadgen: skipping redis: {reason}"),
        }
    }
    if engines.is_empty() {
        return Err("steady: no engine to run (it runs idemstore, fjall and redis)".into());
    }
    let dir = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let (report, lines) = steady::run(&dir, args.keys, args.turnovers, &engines)?;
    let json = serde_json::to_string_pretty(&report).expect("the report serializes") + "\n";
    Ok((json, lines.join("\n") + "\n"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.scenario.iter().any(|s| s == "steady") {
        let (json, table) = match run_steady(&args) {
            Ok(done) => done,
            Err(e) => {
                eprintln!("loadgen: {e}");
                return ExitCode::FAILURE;
            }
        };
        return emit(&args, &json, table);
    }
    let (report, scenarios) = match run(&args) {
        Ok(done) => done,
        Err(e) => {
            eprintln!("loadgen: {e}");
            return ExitCode::FAILURE;
        }
    };
    let json = serde_json::to_string_pretty(&report).expect("the report serializes") + "\n";
    let table = table(&report, &scenarios);
    emit(&args, &json, table)
}

/// Writes the JSON to `--save`, and the JSON (`--json`) or the table to stdout.
fn emit(args: &Args, json: &str, table: String) -> ExitCode {
    if let Some(path) = &args.save {
        if let Err(e) = std::fs::write(path, json) {
            eprintln!("loadgen: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    let text = if args.json { json.to_string() } else { table };
    let mut stdout = io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`| head`): not an error.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadgen: writing the report: {e}");
            ExitCode::FAILURE
        }
    }
}
