//! Reserve latency while the background sweeper deletes a large backlog of expired keys.
//!
//! Fills a store with `N` completed keys (default 1,000,000; pass another count as the only
//! argument), moves its clock past their retention, and measures first-time reserves from 8
//! threads while the sweeper (`Builder::sweep_interval`) deletes them 1,000 per slice, then
//! again once the backlog is gone. Prints p50 and p99 of both phases, the sweep rate, and the
//! longest a reserve waited.
//!
//! ```text
//! cargo run --release --example sweep_load             # 1M expired keys, ~2 minutes
//! cargo run --release --example sweep_load -- 100000   # quicker
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use idemstore::{Fingerprint, Key, ManualClock, Reservation, Store};

const THREADS: usize = 8;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

/// Reserves new keys from `THREADS` threads until `until` says stop; returns sorted latencies.
fn reserve_while(store: &Arc<Store>, tag: &str, until: impl Fn() -> bool + Sync) -> Vec<Duration> {
    let stop = AtomicBool::new(false);
    let mut all = thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (store, stop) = (Arc::clone(store), &stop);
                scope.spawn(move || {
                    let mut latencies = Vec::new();
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let key = Key::new("load", "op", format!("{tag}-{t}-{i}")).expect("key");
                        let started = Instant::now();
                        let got = store.reserve(&key, Fingerprint::of(b"r")).expect("reserve");
                        latencies.push(started.elapsed());
                        assert!(matches!(got, Reservation::Acquired(_)), "{got:?}");
                        i += 1;
                    }
                    latencies
                })
            })
            .collect();
        while !until() {
            thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::Relaxed);
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("worker"))
            .collect::<Vec<_>>()
    });
    all.sort();
    all
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = match std::env::args().nth(1) {
        Some(arg) => arg.parse()?,
        None => 1_000_000,
    };
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new();
    let retention = Duration::from_secs(60);
    let store = Arc::new(
        Store::builder()
            .clock(clock.clone())
            .retention(retention)
            .sweep_interval(Some(Duration::from_millis(10)))
            .preallocate_log(true)
            .open(dir.path().join("sweep.idem"))?,
    );
    let started = Instant::now();
    for batch in 0..n.div_ceil(1000) {
        let items = (0..1000.min(n - batch * 1000))
            .map(|i| {
                Ok((
                    Key::new("old", "op", format!("{batch}-{i}"))?,
                    Fingerprint::of(b"o"),
                ))
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
        store.complete_many(leases.iter().map(|l| (l, b"done".to_vec())).collect())?;
    }
    store.checkpoint()?;
    println!(
        "filled {n} keys in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    clock.advance(retention + Duration::from_secs(1)); // every key is now expired
    let sweep_started = Instant::now();
    let during = reserve_while(&store, "during", || store.stats().swept >= n as u64);
    let sweep_took = sweep_started.elapsed();
    let swept = store.stats().swept;
    let after_for = Duration::from_secs(5).min(sweep_took);
    let after_started = Instant::now();
    let after = reserve_while(&store, "after", || after_started.elapsed() >= after_for);

    println!(
        "swept {swept} expired keys in {:.1} s ({:.0}/s) while {THREADS} threads reserved",
        sweep_took.as_secs_f64(),
        swept as f64 / sweep_took.as_secs_f64()
    );
    for (phase, latencies) in [("while sweeping", &during), ("after sweeping", &after)] {
        println!(
            "{phase:>15}: {} reserves, p50 {:?}, p99 {:?}, max {:?}",
            latencies.len(),
            percentile(latencies, 0.50),
            percentile(latencies, 0.99),
            latencies.last().copied().unwrap_or_default()
        );
    }
    println!(
        "p99 ratio while/after sweeping: {:.2}",
        percentile(&during, 0.99).as_secs_f64() / percentile(&after, 0.99).as_secs_f64()
    );
    Ok(())
}
