//! Does the hot path hold up on a big store, and what does it cost in memory?
//!
//! Fills one store with `N` completed keys (default 1,000,000; pass another count as the only
//! argument, e.g. `10000000` for the long mode, which takes several minutes and ~2 GB of disk),
//! and a second one with 10,000, then measures durable first-time reserves from 32 threads on
//! each, twice, and prints the ratio and this process's resident memory (both stores open).
//!
//! ```text
//! cargo run --release --example scale            # 1M keys
//! cargo run --release --example scale -- 10000000
//! ```
//!
//! Run it on the disk being measured (the stores go to the system temp dir, `TMPDIR`).

use std::sync::Arc;
use std::thread;
use std::time::Instant;

use idemstore::{Fingerprint, Key, Reservation, Store};

const THREADS: usize = 32;
const PER_THREAD: usize = 300;

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

/// Stores `n` completed keys, 1,000 per batch.
fn fill(store: &Store, n: usize) -> Result<(), idemstore::Error> {
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
        store.complete_many(leases.iter().map(|l| (l, b"ok".to_vec())).collect())?;
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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = match std::env::args().nth(1) {
        Some(arg) => arg.parse()?,
        None => 1_000_000,
    };
    let dir = tempfile::tempdir()?;
    let open = |name: &str| {
        Store::builder()
            .preallocate_log(true)
            .open(dir.path().join(name))
    };
    let small = Arc::new(open("small.idem")?);
    fill(&small, 10_000)?;
    let big = Arc::new(open("big.idem")?);
    let started = Instant::now();
    fill(&big, n)?;
    println!(
        "filled {n} keys in {:.1} s; resident memory {:.0} MiB",
        started.elapsed().as_secs_f64(),
        rss_mib()
    );
    for round in 1..=2 {
        let small_rate = reserve_rate(&small, &format!("s{round}"));
        let big_rate = reserve_rate(&big, &format!("b{round}"));
        println!(
            "round {round}: {THREADS} threads, first-time reserves: 10k-key store {small_rate:.0}/s, \
             {n}-key store {big_rate:.0}/s, ratio {:.2}; resident memory {:.0} MiB",
            big_rate / small_rate,
            rss_mib()
        );
    }
    Ok(())
}
