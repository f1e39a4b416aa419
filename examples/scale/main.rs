//! Does the hot path hold up on a big store, and what does it cost in memory?
//!
//! Fills one store with `N` completed keys (default 1,000,000; pass another count as the only
//! argument) and a second one with 10,000, then measures durable first-time reserves from 32
//! threads on each, in 5 interleaved rounds, and prints each round's ratio, their median, this
//! process's resident memory (both stores open) beside the caches configured for the two
//! stores, and the big store's bytes per key on disk.
//!
//! Memory is printed after the fill and after the rounds as resident (`VmRSS`), what the
//! allocator hands out (`in use`: glibc's `mallinfo2`, live heap objects) and what it holds
//! freed without returning it (`retained`), then resident again after `malloc_trim(0)` gives
//! that back: what is left beyond the caches and the allocator's retention is the engine's.
//!
//! ```text
//! cargo run --release --example scale              # 1M keys: about 1 minute, 0.6 GB of disk
//! cargo run --release --example scale -- 1000000 16 8192  # caches of 16 MiB and 8,192 records
//! cargo run --release --example scale -- 50000 64 65536 8192  # 8 KiB results
//! cargo run --release --example scale -- 10000000  # long mode: about 17 minutes, 4.2 GB
//! cargo run --release --example scale -- 100000000 # 100M: hours, ~45 GB (steady mode below instead)
//! ```
//!
//! Steady state (`steady.rs`, shared with the load generator's `steady` scenario): a store with
//! a `ManualClock` fills one retention window with `N` keys in batches of 1,000 (reserve_many,
//! then complete_many), then runs `T` more windows (default 2) with each new batch meeting one
//! expiring batch, and prints each tenth of a window: keys/s, CPU per key, batch p50/p99/max,
//! expired records still stored, file + log bytes per live key, resident memory; then 32
//! threads and duplicates at steady state against an empty store, and how long the sweeper
//! takes to catch up once writes stop:
//!
//! ```text
//! cargo run --release --example scale -- steady            # 1M keys, 2 turnovers: ~5 minutes
//! cargo run --release --example scale -- steady 100000     # quick: ~20 s
//! cargo run --release --example scale -- steady 10000000 1 # long mode: 10M live keys, ~5 min
//! cargo run --release --example scale -- steady 100000000 0.2 DIR  # 100M, kept in DIR: ~1.5 h, 20 GB
//! ```
//!
//! Arguments: the key count, then each store's `Builder::cache_size` in MiB (default 64),
//! `Builder::cache_records` (default 65,536), the results' length in bytes (default 2) and
//! `Builder::cache_record_bytes` in MiB (default 64). Run it on the disk being measured (the stores go
//! to the system temp dir, `TMPDIR`); `MALLOC_ARENA_MAX=2` in the environment limits glibc's
//! per-thread arenas, to tell their retention from the engine's memory.

use std::sync::Arc;
use std::thread;
use std::time::Instant;

use idemstore::{Fingerprint, Key, Reservation, Store};

mod steady;

const THREADS: usize = 32;
const PER_THREAD: usize = 600;
const ROUNDS: usize = 5;
/// Bytes one record cache entry is counted for besides its key and result, as the store counts
/// it (measured: BENCHMARKS.md, "Memory").
const RECORD_CACHE_ENTRY: usize = 320;

/// This process's resident memory in MiB (Linux).
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmRSS"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

/// The allocator's live bytes and the free bytes it retains, in MiB (glibc's `mallinfo2`).
fn heap_mib() -> (f64, f64) {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    let info = unsafe { libc::mallinfo2() };
    let mib = |bytes: usize| bytes as f64 / (1 << 20) as f64;
    (mib(info.uordblks + info.hblkhd), mib(info.fordblks))
}

/// One line on this process's memory, then the resident memory once the allocator returned
/// what it retains (which it does not do by itself on every free).
fn memory(when: &str, configured_mib: f64) -> String {
    let (rss, (in_use, retained)) = (rss_mib(), heap_mib());
    // SAFETY: malloc_trim only returns free allocator memory to the system.
    unsafe { libc::malloc_trim(0) };
    format!(
        "{when}: resident {rss:.0} MiB (allocator: {in_use:.0} MiB in use, {retained:.0} MiB \
         retained free), {:.0} MiB after malloc_trim; configured caches {configured_mib:.0} MiB",
        rss_mib()
    )
}

/// Stores `n` completed keys with results of `result_len` bytes, 1,000 per batch.
fn fill(store: &Store, n: usize, result_len: usize) -> Result<(), idemstore::Error> {
    let fp = Fingerprint::of(b"fill");
    for batch in 0..n.div_ceil(1000) {
        let items = (0..1000.min(n - batch * 1000))
            .map(|i| {
                let spread = ((batch * 1000 + i) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                Ok((Key::new("tenant", "op", format!("fill-{spread:016x}"))?, fp))
            })
            .collect::<Result<Vec<_>, idemstore::Error>>()?;
        let leases: Vec<_> = store
            .reserve_many(&items)?
            .into_iter()
            .filter_map(|r| match r {
                Ok(Reservation::Acquired(lease)) => Some(lease),
                _ => None,
            })
            .collect();
        store.complete_many(leases.iter().map(|l| (l, vec![b'k'; result_len])).collect())?;
    }
    store.checkpoint()
}

/// First-time reserves per second from `THREADS` threads.
fn reserve_rate(store: &Arc<Store>, tag: &str) -> f64 {
    let started = Instant::now();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = Arc::clone(store);
            let tag = format!("{tag}-{t}");
            thread::spawn(move || {
                for i in 0..PER_THREAD {
                    let key = Key::new("tenant", "op", format!("{tag}-{i}")).expect("valid key");
                    let got = store
                        .reserve(&key, Fingerprint::of(b"new"))
                        .expect("reserve");
                    assert!(matches!(got, Reservation::Acquired(_)), "{got:?}");
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("reserving thread");
    }
    (THREADS * PER_THREAD) as f64 / started.elapsed().as_secs_f64()
}

/// `steady [KEYS] [TURNOVERS] [DIR]`: the steady-state scenario (TURNOVERS in tenths; a store
/// made in DIR is kept there, to time its reopening with `open_time`).
fn steady_main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().collect();
    let window = args.get(2).map_or(Ok(1_000_000), |a| a.parse::<u64>())?;
    let turnovers = args.get(3).map_or(Ok(2.0), |a| a.parse::<f64>())?;
    println!(
        "steady state: a window of {window} keys, {turnovers} turnovers, batches of {}; load \
         average {:.1}",
        steady::BATCH,
        steady::load_average()
    );
    let temp = tempfile::tempdir()?;
    let dir = match args.get(4) {
        Some(kept) => {
            std::fs::create_dir_all(kept)?;
            std::path::PathBuf::from(kept)
        }
        None => temp.path().to_path_buf(),
    };
    let run = steady::run_store(&dir, window, turnovers, &mut |segment| {
        println!("{}", segment.line());
    })?;
    for line in steady::summary(&run) {
        println!("{line}");
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().nth(1).as_deref() == Some("steady") {
        return steady_main().map_err(|e| e as Box<dyn std::error::Error>);
    }
    let arg = |i: usize, default: usize| -> Result<usize, Box<dyn std::error::Error>> {
        Ok(match std::env::args().nth(i) {
            Some(arg) => arg.parse()?,
            None => default,
        })
    };
    let n = arg(1, 1_000_000)?;
    let cache_mib = arg(2, idemstore::Builder::DEFAULT_CACHE_SIZE >> 20)?;
    let cache_records = arg(3, idemstore::Builder::DEFAULT_CACHE_RECORDS)?;
    let result_len = arg(4, 2)?;
    let record_mib = arg(5, idemstore::Builder::DEFAULT_CACHE_RECORD_BYTES >> 20)?;
    // Two stores, each with its page cache and its record cache, which takes the lesser of
    // its two limits (a record here: a 31-byte key and the result).
    let records_mib = ((cache_records * (RECORD_CACHE_ENTRY + 31 + result_len)) as f64
        / (1 << 20) as f64)
        .min(record_mib as f64);
    let configured = 2.0 * (cache_mib as f64 + records_mib);
    println!(
        "2 stores, each with a {cache_mib} MiB page cache and {cache_records} cached records \
         of {result_len}-byte results in at most {record_mib} MiB: {configured:.0} MiB of caches \
         configured"
    );
    let dir = tempfile::tempdir()?;
    let open = |name: &str| {
        Store::builder()
            .preallocate_log(true)
            .cache_size(cache_mib << 20)
            .cache_records(cache_records)
            .cache_record_bytes(record_mib << 20)
            .open(dir.path().join(name))
    };
    let small = Arc::new(open("small.idem")?);
    fill(&small, 10_000, result_len)?;
    let big = Arc::new(open("big.idem")?);
    let started = Instant::now();
    fill(&big, n, result_len)?;
    println!(
        "filled {n} keys in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    println!("{}", memory("after the fill", configured));
    let mut ratios = Vec::new();
    for round in 1..=ROUNDS {
        let small_rate = reserve_rate(&small, &format!("s{round}"));
        let big_rate = reserve_rate(&big, &format!("b{round}"));
        ratios.push(big_rate / small_rate);
        println!(
            "round {round}: {THREADS} threads, first-time reserves: 10k-key store {small_rate:.0}/s, \
             {n}-key store {big_rate:.0}/s, ratio {:.2}; resident memory {:.0} MiB",
            big_rate / small_rate,
            rss_mib()
        );
    }
    ratios.sort_by(f64::total_cmp);
    println!("median ratio {:.2}", ratios[ROUNDS / 2]);
    println!("{}", memory("after the rounds", configured));
    // The big store's file as it stands open (free pages included); the log is apart.
    let file = std::fs::metadata(dir.path().join("big.idem"))?.len();
    let keys = (n + ROUNDS * THREADS * PER_THREAD) as f64;
    // Key (three parts behind a length byte each), fingerprint, the result, deadlines.
    let payload =
        (3 + "tenant".len() + "op".len() + "fill-".len() + 16 + 32 + result_len + 16) as f64;
    println!(
        "big store file {:.0} MiB, {:.1} bytes per key (payload {payload:.0} bytes per key, \
         ratio {:.2})",
        file as f64 / (1 << 20) as f64,
        file as f64 / keys,
        file as f64 / keys / payload
    );
    Ok(())
}
