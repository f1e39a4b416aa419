//! A load generator for people: runs the idempotency workload (durable insert-if-absent of a
//! ~24-byte key with a 32-byte fingerprint, completion with a 64-byte result) against
//! idemstore and the engines a user would pick instead, and prints throughput, latency
//! percentiles and ratios against plain redb and against the disk's own fdatasync.
//!
//! ```text
//! cargo run --release --example loadgen -- [--engines idemstore,redb,sqlite,fdatasync]
//!     [--threads 1,4,32] [--ops N | --seconds S]
//!     [--workload reserve|duplicate|mixed|complete|batch] [--batch 1000] [--prefill 10000]
//!     [--dir PATH] [--json]
//! ```
//!
//! It prints a table like this one (measured while other jobs kept the shared disk busy; a
//! progress bar runs on stderr meanwhile):
//!
//! ```text
//! workload reserve: durable reserve of a new key per op; 3 s per run; files under /tmp
//! engine     threads      ops/s        p50        p99   vs redb  vs fdatasync
//! idemstore        1        375    2.21 ms    9.60 ms     1.38x         0.81x
//! redb             1        272    3.99 ms    8.89 ms     1.00x         0.59x
//! sqlite           1        207    4.00 ms    14.3 ms     0.76x         0.45x
//! fdatasync        1        461    1.33 ms    9.13 ms     1.69x         1.00x
//! idemstore       32      7,909    1.86 ms    21.3 ms    23.76x        25.05x
//! redb            32        333    69.3 ms   557.3 ms     1.00x         1.05x
//! ...
//! ```
//!
//! `vs redb` is the engine's ops/s divided by plain redb's (one durable write transaction per
//! reserve, or per batch in the `batch` workload) at the same thread count in the same run;
//! `vs fdatasync` divides by one in-place 4 KiB write + fdatasync per op, the disk's limit for
//! a design without group commit. Percentiles are per operation (per batch for `batch`). With
//! `--json` the same figures go to stdout as JSON and the progress bar is hidden.
//!
//! Each engine and thread count runs on a fresh store in a new directory under `--dir`
//! (default: the system temp dir), which must be on the disk to be measured. The disk is shared
//! and noisy: compare the ratios within one run, not absolute figures across runs.
//! The engines are described in `benches/peers/mod.rs`.

#[path = "../benches/peers/mod.rs"]
mod peers;

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use peers::{prefill, BenchResult, Driver, Engine, Fresh, Kind, Visit, Workload};

/// Run the idempotency workload against idemstore, redb, SQLite and raw fdatasync.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Engines to run, comma-separated: idemstore, redb, sqlite, fdatasync; etcd with --features etcd.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "idemstore,redb,sqlite,fdatasync"
    )]
    engines: Vec<Kind>,

    /// Client thread counts, comma-separated; each engine runs once per count.
    #[arg(long, value_delimiter = ',', default_value = "1,4,32")]
    threads: Vec<usize>,

    /// Stop each run after this many operations (keys, for the batch workload).
    #[arg(long, conflicts_with = "seconds")]
    ops: Option<u64>,

    /// Stop each run after this many seconds [default: 5].
    #[arg(long)]
    seconds: Option<f64>,

    /// reserve: new keys; duplicate: stored keys; mixed: 90% duplicate, 10% new;
    /// complete: reserve + complete; batch: reserve_many of --batch new keys.
    #[arg(long, default_value = "reserve")]
    workload: Workload,

    /// Keys per reserve_many in the batch workload.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    batch: u64,

    /// Keys stored (completed) before a duplicate or mixed run.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    prefill: u64,

    /// Where the stores are created (in a fresh directory per run) [default: the temp dir].
    #[arg(long)]
    dir: Option<PathBuf>,

    /// Print JSON instead of the table, and no progress bar.
    #[arg(long)]
    json: bool,
}

/// When a run stops.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// After this many steps in total.
    Steps(u64),
    /// After this long.
    Time(Duration),
}

/// One engine at one thread count.
#[derive(Serialize, Debug)]
struct Row {
    engine: &'static str,
    threads: usize,
    /// Operations done (keys, for the batch workload).
    ops: u64,
    seconds: f64,
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    /// ops/s divided by redb's at the same thread count, if redb ran.
    vs_redb: Option<f64>,
    /// ops/s divided by fdatasync's at the same thread count, if fdatasync ran.
    vs_fdatasync: Option<f64>,
}

#[derive(Serialize, Debug)]
struct Report {
    workload: &'static str,
    description: &'static str,
    batch: Option<u64>,
    prefill: Option<u64>,
    stop: String,
    dir: PathBuf,
    runs: Vec<Row>,
}

/// Runs one engine at one thread count.
struct Run<'a> {
    args: &'a Args,
    threads: usize,
    stop: Stop,
    dir: &'a std::path::Path,
    bar: &'a ProgressBar,
}

/// What one client thread measured.
struct Measured {
    latency: Histogram<u64>,
    start: Instant,
    end: Instant,
}

impl Visit for Run<'_> {
    type Output = BenchResult<Row>;

    fn visit<E: Engine>(self) -> BenchResult<Row> {
        let Run {
            args,
            threads,
            stop,
            dir,
            bar,
        } = self;
        let label = format!("{} × {threads}", E::NAME);
        let dir = tempfile::tempdir_in(dir)
            .map_err(|e| format!("creating a directory under {}: {e}", dir.display()))?;
        let engine = E::open(dir.path())?;
        let fresh = Fresh::default();
        let existing = if args.workload.needs_prefill() {
            bar.reset();
            bar.set_length(args.prefill);
            bar.set_prefix(format!("{label}: prefill"));
            bar.set_message(format!("{} keys", args.prefill));
            prefill(&engine, &fresh, args.prefill, &|done| {
                bar.set_position(done)
            })?
        } else {
            0..0
        };

        let batch = args.batch as usize;
        let keys_per_step = Driver::new(args.workload, batch, &fresh, 0..0, 0).keys_per_step();
        let (length, steps) = match stop {
            Stop::Steps(steps) => (steps * keys_per_step, steps),
            Stop::Time(time) => (time.as_millis() as u64, u64::MAX),
        };
        bar.reset();
        bar.set_length(length);
        bar.set_position(0);
        bar.set_prefix(label);
        bar.set_message("");

        let claimed = AtomicU64::new(0);
        let done = AtomicU64::new(0);
        let failed = AtomicBool::new(false);
        let ready = Barrier::new(threads + 1);
        let measured = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let (engine, fresh, existing) = (&engine, &fresh, existing.clone());
                    let (claimed, done, failed, ready) = (&claimed, &done, &failed, &ready);
                    scope.spawn(move || -> BenchResult<Measured> {
                        let result = client(ClientCtx {
                            engine,
                            args,
                            batch,
                            fresh,
                            existing,
                            thread: t,
                            stop,
                            steps,
                            keys_per_step,
                            claimed,
                            done,
                            failed,
                            ready,
                        });
                        if result.is_err() {
                            failed.store(true, Ordering::Relaxed);
                        }
                        result
                    })
                })
                .collect();
            ready.wait();
            let start = Instant::now();
            while !workers.iter().all(|w| w.is_finished()) {
                std::thread::sleep(Duration::from_millis(100));
                let elapsed = start.elapsed();
                let keys = done.load(Ordering::Relaxed);
                bar.set_position(match stop {
                    Stop::Steps(_) => keys,
                    Stop::Time(_) => elapsed.as_millis() as u64,
                });
                bar.set_message(format!(
                    "{} ops/s",
                    thousands(keys as f64 / elapsed.as_secs_f64())
                ));
            }
            workers
                .into_iter()
                .map(|w| w.join().expect("a client thread panicked"))
                .collect::<BenchResult<Vec<_>>>()
        })?;
        drop(engine);

        let mut latency = Histogram::<u64>::new(3).expect("a histogram with 3 digits");
        for m in &measured {
            latency
                .add(&m.latency)
                .map_err(|e| format!("histogram: {e}"))?;
        }
        let start = measured.iter().map(|m| m.start).min().expect("a thread");
        let end = measured.iter().map(|m| m.end).max().expect("a thread");
        let seconds = (end - start).as_secs_f64();
        let ops = latency.len() * keys_per_step;
        let micros = |ns: u64| ns as f64 / 1000.0;
        let row = Row {
            engine: E::NAME,
            threads,
            ops,
            seconds,
            ops_per_sec: ops as f64 / seconds,
            p50_us: micros(latency.value_at_quantile(0.50)),
            p99_us: micros(latency.value_at_quantile(0.99)),
            max_us: micros(latency.max()),
            vs_redb: None,
            vs_fdatasync: None,
        };
        bar.println(format!(
            "{:>9} × {:<3} {:>10} ops/s  p50 {:>9}  p99 {:>9}",
            row.engine,
            row.threads,
            thousands(row.ops_per_sec),
            latency_text(row.p50_us),
            latency_text(row.p99_us)
        ));
        Ok(row)
    }
}

/// What a client thread needs.
struct ClientCtx<'a, E> {
    engine: &'a E,
    args: &'a Args,
    batch: usize,
    fresh: &'a Fresh,
    existing: std::ops::Range<u64>,
    thread: usize,
    stop: Stop,
    steps: u64,
    keys_per_step: u64,
    claimed: &'a AtomicU64,
    done: &'a AtomicU64,
    failed: &'a AtomicBool,
    ready: &'a Barrier,
}

/// One client thread: opens its handle, waits for the others, then steps until the run stops
/// and records each step's latency.
fn client<E: Engine>(ctx: ClientCtx<'_, E>) -> BenchResult<Measured> {
    let setup = ctx.engine.handle().and_then(|handle| {
        let latency = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3)
            .map_err(|e| format!("histogram: {e}"))?;
        Ok((handle, latency))
    });
    // Every thread reaches the barrier, also one whose set-up failed, or the others would wait
    // for it forever.
    ctx.ready.wait();
    let (mut handle, mut latency) = setup?;
    let mut driver = Driver::new(
        ctx.args.workload,
        ctx.batch,
        ctx.fresh,
        ctx.existing,
        ctx.thread,
    );
    let start = Instant::now();
    let deadline = match ctx.stop {
        Stop::Time(time) => Some(start + time),
        Stop::Steps(_) => None,
    };
    let mut end = start;
    while ctx.claimed.fetch_add(1, Ordering::Relaxed) < ctx.steps
        && !ctx.failed.load(Ordering::Relaxed)
        && deadline.is_none_or(|deadline| end < deadline)
    {
        let before = Instant::now();
        driver.step(&mut handle)?;
        end = Instant::now();
        latency.saturating_record((end - before).as_nanos() as u64);
        ctx.done.fetch_add(ctx.keys_per_step, Ordering::Relaxed);
    }
    Ok(Measured {
        latency,
        start,
        end,
    })
}

/// `1234567.8` as `1,234,568`.
fn thousands(value: f64) -> String {
    if !value.is_finite() {
        return "-".to_string();
    }
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A latency in µs, in the unit that reads best.
fn latency_text(micros: f64) -> String {
    if micros < 10.0 {
        format!("{micros:.1} µs")
    } else if micros < 1000.0 {
        format!("{micros:.0} µs")
    } else if micros < 10_000.0 {
        format!("{:.2} ms", micros / 1000.0)
    } else {
        format!("{:.1} ms", micros / 1000.0)
    }
}

fn ratio_text(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "-".to_string(), |r| format!("{r:.2}x"))
}

fn table(report: &Report) -> String {
    let mut out = format!(
        "workload {}: {}; {}; files under {}\n",
        report.workload,
        report.description,
        report.stop,
        report.dir.display()
    );
    out.push_str(&format!(
        "{:<10} {:>7} {:>10} {:>10} {:>10} {:>9} {:>13}\n",
        "engine", "threads", "ops/s", "p50", "p99", "vs redb", "vs fdatasync"
    ));
    for row in &report.runs {
        out.push_str(&format!(
            "{:<10} {:>7} {:>10} {:>10} {:>10} {:>9} {:>13}\n",
            row.engine,
            row.threads,
            thousands(row.ops_per_sec),
            latency_text(row.p50_us),
            latency_text(row.p99_us),
            ratio_text(row.vs_redb),
            ratio_text(row.vs_fdatasync),
        ));
    }
    out
}

/// Fills in each row's ratios against the redb and fdatasync rows of its thread count.
fn add_ratios(runs: &mut [Row]) {
    let rate = |runs: &[Row], engine: &str, threads: usize| {
        runs.iter()
            .find(|row| row.engine == engine && row.threads == threads)
            .map(|row| row.ops_per_sec)
    };
    for i in 0..runs.len() {
        let (ops, threads) = (runs[i].ops_per_sec, runs[i].threads);
        runs[i].vs_redb = rate(runs, Kind::Redb.name(), threads).map(|base| ops / base);
        runs[i].vs_fdatasync = rate(runs, Kind::Fdatasync.name(), threads).map(|base| ops / base);
    }
}

fn run(args: &Args) -> BenchResult<Report> {
    if let Some(bad) = args.threads.iter().find(|&&t| t == 0 || t > 4096) {
        return Err(format!("--threads {bad}: each count must be 1 to 4096").into());
    }
    let stop = match (args.ops, args.seconds) {
        (Some(0), _) => return Err("--ops must be at least 1".into()),
        (Some(ops), _) => {
            let keys_per_step = match args.workload {
                Workload::Batch => args.batch,
                _ => 1,
            };
            Stop::Steps(ops.div_ceil(keys_per_step))
        }
        (None, seconds) => {
            let seconds = seconds.unwrap_or(5.0);
            if !(seconds > 0.0 && seconds <= 86_400.0) {
                return Err(
                    format!("--seconds {seconds}: must be above 0 and at most a day").into(),
                );
            }
            Stop::Time(Duration::from_secs_f64(seconds))
        }
    };
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
        ProgressStyle::with_template("{prefix:>24} [{bar:30}] {msg}")
            .expect("a valid progress template")
            .progress_chars("=> "),
    );
    let mut runs = Vec::new();
    // Engines alternate within a thread count, so drift of the shared disk hits them alike.
    for &threads in &args.threads {
        for &kind in &args.engines {
            let row = kind
                .visit(Run {
                    args,
                    threads,
                    stop,
                    dir: &dir,
                    bar: &bar,
                })
                .map_err(|e| {
                    let plural = if threads == 1 { "" } else { "s" };
                    format!("{kind} with {threads} thread{plural}: {e}")
                })?;
            runs.push(row);
        }
    }
    bar.finish_and_clear();
    add_ratios(&mut runs);
    Ok(Report {
        workload: args.workload.name(),
        description: args.workload.describe(),
        batch: (args.workload == Workload::Batch).then_some(args.batch),
        prefill: args.workload.needs_prefill().then_some(args.prefill),
        stop: match (stop, args.ops) {
            (Stop::Time(time), _) => format!("{} s per run", time.as_secs_f64()),
            (Stop::Steps(_), ops) => format!("{} ops per run", ops.unwrap_or(0)),
        },
        dir,
        runs,
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    let report = match run(&args) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("loadgen: {e}");
            return ExitCode::FAILURE;
        }
    };
    let text = if args.json {
        serde_json::to_string_pretty(&report).expect("the report serializes") + "\n"
    } else {
        table(&report)
    };
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
