//! What the live view costs a service's writers: reserve + complete latency while an operator
//! polls `stats` (counts by state) through the admin socket as fast as it answers, against
//! the same load with nobody polling.
//!
//! ```text
//! cargo run --release --example admin_load -- [SECONDS] [THREADS] [KEYS]
//! ```
//! Prints, per mode, operations per second and reserve-to-completion latency percentiles, and
//! how many `counts` answers the poller got.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use idemstore::{AdminClient, AdminSocket, Fingerprint, Key, Reservation, Store};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u64>());
    let seconds = args.next().transpose()?.unwrap_or(5);
    let threads = args.next().transpose()?.unwrap_or(8);
    let preload = args.next().transpose()?.unwrap_or(20_000);
    for poll in [false, true, false, true] {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("load.idem");
        let store = Arc::new(
            Store::builder()
                .admin_socket(AdminSocket::ReadOnly)
                .preallocate_log(true)
                .open(&path)?,
        );
        // A store with some history, so that counting reads a realistic number of records.
        let items: Vec<(Key, Fingerprint)> = (0..preload)
            .map(|i| {
                Ok((
                    Key::new("pre", "op", format!("{i}"))?,
                    Fingerprint::of(b"p"),
                ))
            })
            .collect::<Result<_, idemstore::Error>>()?;
        for chunk in items.chunks(1000) {
            store.reserve_many(chunk)?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let polls = Arc::new(AtomicU64::new(0));
        let poller = poll.then(|| {
            let (stop, polls, path) = (Arc::clone(&stop), Arc::clone(&polls), path.clone());
            thread::spawn(move || {
                let client = AdminClient::connect(&path).expect("the socket answers");
                while !stop.load(Ordering::Relaxed) {
                    client.counts().expect("counts");
                    polls.fetch_add(1, Ordering::Relaxed);
                }
            })
        });
        let started = Instant::now();
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (store, stop) = (Arc::clone(&store), Arc::clone(&stop));
                thread::spawn(move || {
                    let mut latency = Histogram::<u64>::new(3).expect("histogram");
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let key = Key::new("load", "op", format!("{t}-{i}")).expect("key");
                        let begun = Instant::now();
                        if let Reservation::Acquired(lease) =
                            store.reserve(&key, Fingerprint::of(b"r")).expect("reserve")
                        {
                            store.complete(&lease, b"ok".to_vec()).expect("complete");
                        }
                        latency
                            .record(begun.elapsed().as_micros() as u64)
                            .expect("record");
                        i += 1;
                    }
                    latency
                })
            })
            .collect();
        thread::sleep(Duration::from_secs(seconds));
        stop.store(true, Ordering::Relaxed);
        let mut all = Histogram::<u64>::new(3)?;
        for worker in workers {
            all.add(worker.join().expect("worker"))?;
        }
        if let Some(poller) = poller {
            poller.join().expect("poller");
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "{:<22} {:>7.0} reserve+complete/s  p50 {:>6} µs  p99 {:>6} µs  p99.9 {:>6} µs  max {:>6} µs  counts answered: {}",
            if poll { "stats polled nonstop" } else { "nobody polling" },
            all.len() as f64 / secs,
            all.value_at_quantile(0.50),
            all.value_at_quantile(0.99),
            all.value_at_quantile(0.999),
            all.max(),
            polls.load(Ordering::Relaxed)
        );
    }
    Ok(())
}
