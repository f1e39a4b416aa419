//! The steady-state scenario: a store that holds a full retention window, where each new batch
//! of keys meets one old batch expiring.
//!
//! Shared by `examples/scale` (`cargo run --release --example scale -- steady`) and the load
//! generator's `steady` scenario (which includes this file with `#[path]` and adds the peers),
//! so both measure exactly the same code. It depends on the store, `libc` and `std` only.
//!
//! The run, for a window of `keys` keys (a multiple of [`BATCH`], at least 10 batches):
//! - the store opens with `Store::builder()` defaults, a [`ManualClock`] and the default
//!   retention `W` (24 h); the clock moves `W / (keys / BATCH)` before each batch, so the
//!   window fills exactly as the last batch of the fill is written, and from then on every
//!   new batch is written just as the batch written one window earlier expires;
//! - each batch is one `reserve_many` of [`BATCH`] new keys (16-byte ids, the fingerprint of
//!   the id) and one `complete_many` of their leases with [`RESULT_LEN`]-byte results;
//! - the fill (one window), then `turnovers` windows at steady state, each reported in
//!   segments of a tenth of a window ([`Segment`]);
//! - at steady state: duplicates of random live keys on one thread, then 32 threads reserving
//!   single new keys (the clock still moving one step per [`BATCH`] reserves); the same two
//!   on a second, empty store with the same settings for the ratio;
//! - writes stop, the clock moves a 16th of the retention on (the most the store's expiry
//!   windows are wide for it, so that every expired key's window has ended), and the time the background
//!   sweeper takes to delete what expired is measured; [`Store::counts`] (one scan) checks the expired count computed from the
//!   counters.

#![allow(
    dead_code,
    reason = "included by both `examples/scale` and the load generator, which each use a part"
)]

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use idemstore::{Fingerprint, Key, ManualClock, Reservation, Store};

/// Keys per `reserve_many` / `complete_many`.
pub const BATCH: u64 = 1000;
/// The length of each stored result, in bytes.
pub const RESULT_LEN: usize = 16;
/// Threads of the single-key reserve runs.
pub const THREADS: usize = 32;
/// Reserves per thread in those runs.
pub const PER_THREAD: u64 = 600;
/// How long the duplicate runs last.
pub const DUPLICATE_TIME: Duration = Duration::from_secs(3);
/// The longest wait for the sweeper to delete what expired once writes stop.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(600);
/// Payload per key in bytes: the key's parts behind a length byte each (`tenant`, `op`, a
/// 16-byte id: 27), the fingerprint (32), the result ([`RESULT_LEN`]) and two deadlines (16).
pub const PAYLOAD: u64 = 27 + 32 + RESULT_LEN as u64 + 16;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The id of key number `n`: 16 hex digits of a bijection of `n`, so consecutive keys land all
/// over the B-tree, as client-generated keys do, and distinct numbers never collide.
pub fn id(n: u64) -> String {
    format!("{:016x}", n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// Key number `n` (scope `tenant`, operation `op`, [`id`]).
pub fn key(n: u64) -> Result<Key, idemstore::KeyError> {
    Key::new("tenant", "op", id(n))
}

/// CPU time (user + system) used by this process so far (`getrusage(RUSAGE_SELF)`).
pub fn cpu_time() -> Duration {
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

/// This process's resident memory in bytes (`/proc/self/statm`, Linux; 0 elsewhere).
pub fn rss_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf only reads a system setting.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

/// The one-minute load average (`/proc/loadavg`; NaN where missing).
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The `q` quantile (0..=1) of `values`, which it sorts; 0 when empty.
pub fn quantile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((values.len() as f64 * q).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// A small deterministic generator (splitmix64) for the random live keys.
pub struct Random(u64);

impl Random {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Random {
        Random(seed)
    }

    /// The next number below `bound` (> 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % bound
    }
}

/// One segment of a run (a tenth of a window of batches), as any engine reports it.
#[derive(Debug, Clone, Default)]
pub struct Segment {
    /// `fill` (the store filling its first window) or `steady` (each new batch meets one
    /// expiring batch).
    pub phase: &'static str,
    /// Windows written when the segment ends (1.0 = the fill is done, 3.0 = two turnovers).
    pub windows: f64,
    /// Keys written when the segment ends.
    pub keys_written: u64,
    /// Keys within their retention when the segment ends.
    pub live: u64,
    /// Records stored (live or expired) when the segment ends.
    pub stored: u64,
    /// Expired records still stored when the segment ends (`stored - live`).
    pub expired_present: u64,
    /// Keys of the segment.
    pub keys: u64,
    /// Wall-clock seconds of the segment.
    pub seconds: f64,
    /// Keys per second.
    pub keys_per_sec: f64,
    /// CPU per key in µs: this process's, plus a server's where the engine has one.
    pub cpu_us_per_key: f64,
    /// Batch (reserve + complete of [`BATCH`] keys) latency in ms.
    pub p50_ms: f64,
    /// 99th percentile of the batches' latency, ms.
    pub p99_ms: f64,
    /// Slowest batch, ms.
    pub max_ms: f64,
    /// Records the engine's expiry deleted during the segment (idemstore: `Stats::swept`).
    pub expired_deleted: u64,
    /// idemstore: background sweep slices seen during the segment (changes of
    /// `Stats::swept`, polled every millisecond).
    pub sweep_slices: u64,
    /// Bytes of the store's file (idemstore), its files (fjall) or its append-only file
    /// (Redis) when the segment ends.
    pub file_bytes: u64,
    /// Bytes of the log (idemstore) or journal (fjall).
    pub log_bytes: u64,
    /// Resident memory in bytes: this process (idemstore, fjall), the server (Redis).
    pub rss_bytes: u64,
    /// The one-minute load average when the segment ends.
    pub load: f64,
}

impl Segment {
    /// File and log bytes per live key.
    pub fn disk_per_key(&self) -> f64 {
        (self.file_bytes + self.log_bytes) as f64 / self.live.max(1) as f64
    }

    /// One line for people.
    pub fn line(&self) -> String {
        format!(
            "{:>6} {:>5.2} {:>9} live {:>9} expired-stored {:>8.0} keys/s {:>6.1} µs/key \
             p50/p99/max {:>6.1}/{:>6.1}/{:>7.1} ms swept {:>7} in {:>5} slices \
             file+log {:>6.0} B/key rss {:>5.0} MiB load {:.1}",
            self.phase,
            self.windows,
            self.live,
            self.expired_present,
            self.keys_per_sec,
            self.cpu_us_per_key,
            self.p50_ms,
            self.p99_ms,
            self.max_ms,
            self.expired_deleted,
            self.sweep_slices,
            self.disk_per_key(),
            self.rss_bytes as f64 / (1 << 20) as f64,
            self.load
        )
    }
}

/// Fills a segment's rate and latency fields from its batches' latencies in seconds, its
/// wall-clock `seconds` and its `cpu`.
pub fn fill_segment(segment: &mut Segment, latency: &[f64], seconds: f64, cpu: Duration) {
    let keys = latency.len() as u64 * BATCH;
    let mut ms: Vec<f64> = latency.iter().map(|s| s * 1000.0).collect();
    segment.keys = keys;
    segment.seconds = seconds;
    segment.keys_per_sec = keys as f64 / seconds;
    segment.cpu_us_per_key = cpu.as_secs_f64() * 1e6 / keys.max(1) as f64;
    segment.p50_ms = quantile(&mut ms, 0.50);
    segment.p99_ms = quantile(&mut ms, 0.99);
    segment.max_ms = quantile(&mut ms, 1.0);
}

/// Single-key reserves of new keys by [`THREADS`] threads, or duplicates on one thread.
#[derive(Debug, Clone, Default)]
pub struct Rate {
    /// Operations per second.
    pub per_sec: f64,
    /// CPU per operation, µs.
    pub cpu_us: f64,
    /// Operations run.
    pub ops: u64,
}

/// What [`run_store`] measured.
#[derive(Debug, Clone, Default)]
pub struct StoreRun {
    /// Keys in a window.
    pub window: u64,
    /// The fill's and the steady state's segments, in order.
    pub segments: Vec<Segment>,
    /// The first `min(100,000, window / 10)` keys of the fill: the store when empty.
    pub empty: Segment,
    /// Every steady-state segment together.
    pub steady: Segment,
    /// [`THREADS`] threads reserving single new keys: on an empty store with the same
    /// settings, and on the store at steady state.
    pub reserve32_empty: Rate,
    /// See [`StoreRun::reserve32_empty`].
    pub reserve32_steady: Rate,
    /// Duplicates of random completed keys on one thread: on a store holding 10,000 keys, and
    /// of random live keys at steady state.
    pub duplicates_empty: Rate,
    /// See [`StoreRun::duplicates_empty`].
    pub duplicates_steady: Rate,
    /// Duplicates of random keys written in the last minute (of the store's clock) at steady
    /// state, on one thread.
    pub duplicates_recent: Rate,
    /// The expired records [`Store::counts`] found after the last segment, against the
    /// count computed from the counters at that moment (they should agree within what the
    /// sweeper deleted in between).
    pub counted_expired: u64,
    /// See [`StoreRun::counted_expired`].
    pub computed_expired: u64,
    /// Seconds the sweeper took to delete every expired record once writes stopped (None:
    /// not within [`DRAIN_LIMIT`]).
    pub drain_seconds: Option<f64>,
    /// Sweep slices over the whole run and the records they deleted.
    pub sweep_slices: u64,
    /// See [`StoreRun::sweep_slices`].
    pub swept: u64,
    /// File and log bytes after the drain, and the resident memory then.
    pub file_bytes_drained: u64,
    /// See [`StoreRun::file_bytes_drained`].
    pub log_bytes_drained: u64,
    /// See [`StoreRun::file_bytes_drained`].
    pub rss_bytes_drained: u64,
    /// The peak resident memory sampled at segment ends.
    pub rss_peak: u64,
}

/// Watches `Stats::swept` every millisecond: each change is one deletion of ended windows.
struct SweepWatch {
    slices: AtomicU64,
    stop: AtomicBool,
}

impl SweepWatch {
    fn run(&self, store: &Store) {
        let mut last = store.stats().swept;
        while !self.stop.load(Ordering::Relaxed) {
            thread::sleep(Duration::from_millis(1));
            let now = store.stats().swept;
            if now != last {
                // One deletion seen: a whole window (or several at once).
                self.slices.fetch_add(1, Ordering::Relaxed);
                last = now;
            }
        }
    }
}

/// The store of the run: a manual clock, the default retention, every other setting default.
pub fn open_store(path: &Path, clock: &ManualClock) -> Result<Store, idemstore::OpenError> {
    Store::builder().clock(clock.clone()).open(path)
}

/// Writes batch number `b` (keys `b * BATCH ..`): reserve_many of new keys, then
/// complete_many.
pub fn write_batch(store: &Store, b: u64) -> Result<(), BoxError> {
    let items = (b * BATCH..(b + 1) * BATCH)
        .map(|n| Ok((key(n)?, Fingerprint::of(id(n).as_bytes()))))
        .collect::<Result<Vec<_>, idemstore::Error>>()?;
    let mut leases = Vec::with_capacity(items.len());
    for (got, (key, _)) in store.reserve_many(&items)?.into_iter().zip(&items) {
        match got? {
            Reservation::Acquired(lease) => leases.push(lease),
            other => return Err(format!("new key {key:?} answered {other:?}").into()),
        }
    }
    let result = [b'r'; RESULT_LEN];
    let done = store.complete_many(leases.iter().map(|l| (l, result.to_vec())).collect())?;
    for got in done {
        got?;
    }
    Ok(())
}

/// [`THREADS`] threads reserving [`PER_THREAD`] single new keys each (numbers from `first`),
/// the clock moving `step` every [`BATCH`] reserves.
pub fn reserve32(
    store: &Arc<Store>,
    clock: &ManualClock,
    first: u64,
    step: Duration,
) -> Result<Rate, BoxError> {
    let done = Arc::new(AtomicU64::new(0));
    let cpu = cpu_time();
    let started = Instant::now();
    let threads: Vec<_> = (0..THREADS as u64)
        .map(|t| {
            let (store, clock, done) = (Arc::clone(store), clock.clone(), Arc::clone(&done));
            thread::spawn(move || -> Result<(), BoxError> {
                for i in 0..PER_THREAD {
                    let n = first + t * PER_THREAD + i;
                    let got = store.reserve(&key(n)?, Fingerprint::of(id(n).as_bytes()))?;
                    if !matches!(got, Reservation::Acquired(_)) {
                        return Err(format!("new key {n} answered {got:?}").into());
                    }
                    if (done.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(BATCH) {
                        clock.advance(step);
                    }
                }
                Ok(())
            })
        })
        .collect();
    for thread in threads {
        thread.join().map_err(|_| "a reserving thread panicked")??;
    }
    let ops = THREADS as u64 * PER_THREAD;
    Ok(Rate {
        per_sec: ops as f64 / started.elapsed().as_secs_f64(),
        cpu_us: cpu_time().saturating_sub(cpu).as_secs_f64() * 1e6 / ops as f64,
        ops,
    })
}

/// Duplicates on one thread for [`DUPLICATE_TIME`]: reserves of key numbers drawn from
/// `live` (batch numbers), each of which must answer with its stored result.
pub fn duplicates(store: &Store, live: std::ops::Range<u64>) -> Result<Rate, BoxError> {
    let mut random = Random::new(0x5EED);
    let span = (live.end - live.start) * BATCH;
    let cpu = cpu_time();
    let started = Instant::now();
    let mut ops = 0;
    while started.elapsed() < DUPLICATE_TIME {
        for _ in 0..1000 {
            let n = live.start * BATCH + random.below(span);
            let got = store.reserve(&key(n)?, Fingerprint::of(id(n).as_bytes()))?;
            if !matches!(got, Reservation::Completed(_)) {
                return Err(format!("live key {n} answered {got:?}").into());
            }
        }
        ops += 1000;
    }
    Ok(Rate {
        per_sec: ops as f64 / started.elapsed().as_secs_f64(),
        cpu_us: cpu_time().saturating_sub(cpu).as_secs_f64() * 1e6 / ops as f64,
        ops,
    })
}

/// The baseline store: [`reserve32`] on it empty, then 10 batches and duplicates of them.
fn empty_baseline(dir: &Path, run: &mut StoreRun) -> Result<(), BoxError> {
    let clock = ManualClock::new();
    let store = Arc::new(open_store(&dir.join("empty.idem"), &clock)?);
    run.reserve32_empty = reserve32(&store, &clock, 1 << 40, Duration::ZERO)?;
    for b in 0..10 {
        write_batch(&store, b)?;
    }
    run.duplicates_empty = duplicates(&store, 0..10)?;
    drop(store);
    std::fs::remove_file(dir.join("empty.idem"))?;
    std::fs::remove_file(dir.join("empty.idem.wal"))?;
    Ok(())
}

/// Runs the scenario on a store in `dir`: a window of `window` keys, `turnovers` windows at
/// steady state (in tenths: 0.2 is two segments); `report` sees each segment as it ends.
pub fn run_store(
    dir: &Path,
    window: u64,
    turnovers: f64,
    report: &mut dyn FnMut(&Segment),
) -> Result<StoreRun, BoxError> {
    if !window.is_multiple_of(BATCH) || window < 10 * BATCH {
        return Err(format!(
            "a window of {window} keys: it must be a multiple of {BATCH} and at least {}",
            10 * BATCH
        )
        .into());
    }
    let mut run = StoreRun {
        window,
        ..StoreRun::default()
    };
    empty_baseline(dir, &mut run)?;

    let per_window = window / BATCH;
    let step = idemstore::Builder::DEFAULT_RETENTION / u32::try_from(per_window)?;
    let per_segment = per_window / 10;
    let empty_batches = (100_000 / BATCH).min(per_segment);
    let clock = ManualClock::new();
    let path = dir.join("steady.idem");
    let store = Arc::new(open_store(&path, &clock)?);
    let watch = Arc::new(SweepWatch {
        slices: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let watcher = {
        let (store, watch) = (Arc::clone(&store), Arc::clone(&watch));
        thread::spawn(move || watch.run(&store))
    };
    let steady_batches = (turnovers * 10.0).round() as u64 * per_segment;
    if steady_batches == 0 {
        return Err(format!("{turnovers} turnovers: at least 0.1 are needed").into());
    }
    let total = per_window + steady_batches;
    let mut latency = Vec::with_capacity(total as usize);
    let mut steady_cpu = Duration::ZERO;
    let mut steady_seconds = 0.0;
    let (mut empty_cpu, mut empty_seconds) = (Duration::ZERO, 0.0);
    let mut b = 0;
    while b < total {
        let (cpu, started) = (cpu_time(), Instant::now());
        let (swept, slices) = (store.stats().swept, watch.slices.load(Ordering::Relaxed));
        let end = (b + per_segment).min(total);
        let first = b;
        while b < end {
            clock.advance(step);
            let before = Instant::now();
            write_batch(&store, b)?;
            latency.push(before.elapsed().as_secs_f64());
            b += 1;
            if b == empty_batches {
                (empty_cpu, empty_seconds) = (
                    cpu_time().saturating_sub(cpu),
                    started.elapsed().as_secs_f64(),
                );
            }
        }
        let (seconds, cpu) = (
            started.elapsed().as_secs_f64(),
            cpu_time().saturating_sub(cpu),
        );
        let info = store.file_info()?;
        let stats = store.stats();
        // Batch `i` was written at step `i + 1` and expires at step `i + 1 + per_window`:
        // with `b` batches written (the clock at step `b`), those from `b - per_window` on
        // are live.
        let live = b.min(per_window) * BATCH;
        let stored = b * BATCH - stats.swept;
        let mut segment = Segment {
            phase: if first < per_window { "fill" } else { "steady" },
            windows: b as f64 / per_window as f64,
            keys_written: b * BATCH,
            live,
            stored,
            expired_present: stored.saturating_sub(live),
            expired_deleted: stats.swept - swept,
            sweep_slices: watch.slices.load(Ordering::Relaxed) - slices,
            file_bytes: info.file_bytes,
            log_bytes: info.log_bytes,
            rss_bytes: rss_bytes(),
            load: load_average(),
            ..Segment::default()
        };
        fill_segment(&mut segment, &latency[first as usize..], seconds, cpu);
        run.rss_peak = run.rss_peak.max(segment.rss_bytes);
        if first >= per_window {
            steady_cpu += cpu;
            steady_seconds += seconds;
        }
        report(&segment);
        run.segments.push(segment);
    }
    let computed_expired = b * BATCH - store.stats().swept - per_window * BATCH;
    run.counted_expired = store.counts()?.expired;
    run.computed_expired = computed_expired;

    run.empty = Segment {
        phase: "empty",
        windows: empty_batches as f64 / per_window as f64,
        keys_written: empty_batches * BATCH,
        live: empty_batches * BATCH,
        stored: empty_batches * BATCH,
        ..run.segments[0].clone()
    };
    fill_segment(
        &mut run.empty,
        &latency[..empty_batches as usize],
        empty_seconds,
        empty_cpu,
    );
    let last = run.segments.last().cloned().unwrap_or_default();
    run.steady = Segment {
        phase: "steady",
        windows: turnovers,
        ..last
    };
    fill_segment(
        &mut run.steady,
        &latency[per_window as usize..],
        steady_seconds,
        steady_cpu,
    );
    run.steady.expired_deleted = run
        .segments
        .iter()
        .filter(|s| s.phase == "steady")
        .map(|s| s.expired_deleted)
        .sum();
    run.steady.sweep_slices = run
        .segments
        .iter()
        .filter(|s| s.phase == "steady")
        .map(|s| s.sweep_slices)
        .sum();

    // At steady state: duplicates of the live batches, then single keys from 32 threads
    // (numbers past every batch's).
    // Duplicates first: the reserves move the clock, and the oldest live batches expire.
    run.duplicates_steady = duplicates(&store, b - per_window + 1..b)?;
    // The batches of the last minute: a batch is written every `step` of the clock.
    let minute = (Duration::from_secs(60).as_nanos() / step.as_nanos().max(1)).max(1) as u64;
    run.duplicates_recent = duplicates(&store, b - minute.min(per_window - 1)..b)?;
    run.reserve32_steady = reserve32(&store, &clock, 1 << 41, step)?;

    // Writes stop: how long the sweeper takes to delete every expired batch key. The store
    // deletes a window of expiry time (at most a 16th of the retention) once it has ended: the
    // clock moves one window on, so that the window holding the last expired keys has ended.
    let written_steps = b + (THREADS as u64 * PER_THREAD) / BATCH;
    let expired_batches = written_steps.saturating_sub(per_window).min(b);
    let target = expired_batches * BATCH;
    clock.advance(idemstore::Builder::DEFAULT_RETENTION / 16);
    let started = Instant::now();
    while store.stats().swept < target && started.elapsed() < DRAIN_LIMIT {
        thread::sleep(Duration::from_millis(20));
    }
    run.drain_seconds = (store.stats().swept >= target).then(|| started.elapsed().as_secs_f64());
    watch.stop.store(true, Ordering::Relaxed);
    watcher.join().map_err(|_| "the sweep watcher panicked")?;
    run.sweep_slices = watch.slices.load(Ordering::Relaxed);
    run.swept = store.stats().swept;
    let info = store.file_info()?;
    run.file_bytes_drained = info.file_bytes;
    run.log_bytes_drained = info.log_bytes;
    run.rss_bytes_drained = rss_bytes();
    Ok(run)
}

/// The summary lines of a run, for people.
pub fn summary(run: &StoreRun) -> Vec<String> {
    let (e, s) = (&run.empty, &run.steady);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    vec![
        format!(
            "batches of {BATCH}: empty (first {} keys) {:.0} keys/s, {:.1} µs CPU/key, p50/p99 \
             {:.1}/{:.1} ms; steady state {:.0} keys/s ({:.2}x), {:.1} µs CPU/key ({:.2}x), \
             p50/p99/max {:.1}/{:.1}/{:.1} ms (p99/p50 {:.1})",
            e.keys,
            e.keys_per_sec,
            e.cpu_us_per_key,
            e.p50_ms,
            e.p99_ms,
            s.keys_per_sec,
            s.keys_per_sec / e.keys_per_sec,
            s.cpu_us_per_key,
            s.cpu_us_per_key / e.cpu_us_per_key,
            s.p50_ms,
            s.p99_ms,
            s.max_ms,
            s.p99_ms / s.p50_ms
        ),
        format!(
            "{THREADS} threads, single new keys: empty {:.0}/s ({:.1} µs CPU), steady {:.0}/s \
             ({:.1} µs CPU), {:.2}x",
            run.reserve32_empty.per_sec,
            run.reserve32_empty.cpu_us,
            run.reserve32_steady.per_sec,
            run.reserve32_steady.cpu_us,
            run.reserve32_steady.per_sec / run.reserve32_empty.per_sec
        ),
        format!(
            "duplicates on one thread: 10,000-key store {:.0}/s ({:.2} µs CPU), random live keys \
             at steady state {:.0}/s ({:.2} µs CPU), keys of the last minute {:.0}/s ({:.2} µs \
             CPU)",
            run.duplicates_empty.per_sec,
            run.duplicates_empty.cpu_us,
            run.duplicates_steady.per_sec,
            run.duplicates_steady.cpu_us,
            run.duplicates_recent.per_sec,
            run.duplicates_recent.cpu_us
        ),
        format!(
            "sweeper at steady state: {} deleted in {} slices ({:.0} per slice) while {} keys \
             were written ({:.0} deleted per 1000 new); expired but stored after the last \
             segment: {} computed, {} counted (Store::counts)",
            s.expired_deleted,
            s.sweep_slices,
            s.expired_deleted as f64 / s.sweep_slices.max(1) as f64,
            (run.segments.len() as u64 - 10) * run.window / 10,
            s.expired_deleted as f64 * 1000.0
                / ((run.segments.len() as u64 - 10) * run.window / 10).max(1) as f64,
            run.computed_expired,
            run.counted_expired
        ),
        format!(
            "after the writes: the sweeper deleted the rest in {}; {} deletions in the whole run; \
             file {:.0} MiB + log {:.0} MiB for {} live keys ({:.0} B/key, payload {PAYLOAD} \
             B); resident {:.0} MiB (peak at segment ends {:.0} MiB)",
            run.drain_seconds.map_or(
                format!("more than {} s", DRAIN_LIMIT.as_secs()),
                |s| format!("{s:.1} s")
            ),
            run.sweep_slices,
            mib(run.file_bytes_drained),
            mib(run.log_bytes_drained),
            run.window,
            (run.file_bytes_drained + run.log_bytes_drained) as f64 / run.window as f64,
            mib(run.rss_bytes_drained),
            mib(run.rss_peak)
        ),
    ]
}
