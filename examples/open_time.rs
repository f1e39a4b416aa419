//! How long does opening a big store take, after a clean close and after a kill?
//!
//! Three steps, so that a big store is filled once and opened many times:
//!
//! ```text
//! # fill a store with N completed keys, 1,000 per batch, then close it cleanly
//! cargo run --release --example open_time -- fill /data/big.idem 1000000
//! # time Store::open (default settings) five times; each open closes cleanly
//! cargo run --release --example open_time -- open /data/big.idem
//! # a child process opens the store, writes 20,000 more keys (in the log; past about
//! # 100,000 the child also checkpoints), is killed with SIGKILL; then time the open
//! cargo run --release --example open_time -- kill /data/big.idem 20000
//! # the same without the open: the store is left as the killed process left it
//! cargo run --release --example open_time -- crash /data/big.idem 20000
//! ```
//!
//! Prints one line per open: `open <path> (<how>): <ms> ms`, and how long closing took on
//! stderr. Add `--verify` after the path to open with `verify_on_open(true)`, and
//! `--ascending` to `fill` to write the keys in order (much faster for big fills; by default
//! they are spread at random, like real idempotency keys). Run it on the disk being measured;
//! drop the page cache first (`echo 3 > /proc/sys/vm/drop_caches`) to measure a cold open.
//! `BENCHMARKS.md` ("Open time") has the figures.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use idemstore::{Builder, Fingerprint, Key, Reservation, Store};

/// Stores `n` completed keys named after `tag` (spread at random, or in ascending order),
/// 1,000 per batch, with 2-byte results (as `examples/scale/main.rs` does).
fn fill(store: &Store, tag: &str, n: usize, ascending: bool) -> Result<(), idemstore::Error> {
    let fp = Fingerprint::of(b"fill");
    let mut started = Instant::now();
    for batch in 0..n.div_ceil(1000) {
        let items = (0..1000.min(n - batch * 1000))
            .map(|i| {
                let i = (batch * 1000 + i) as u64;
                // Ascending keys append to the B-tree instead of touching a random leaf per
                // key: a 10M-key fill takes minutes instead of hours on a busy disk.
                let id = if ascending {
                    format!("{tag}-{i:016}")
                } else {
                    format!("{tag}-{:016x}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
                };
                Ok((Key::new("tenant", "op", id)?, fp))
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
        if (batch + 1) % 100 == 0 {
            eprintln!(
                "{} keys, last 100k at {:.0} keys/s",
                (batch + 1) * 1000,
                1e5 / started.elapsed().as_secs_f64()
            );
            started = Instant::now();
        }
    }
    Ok(())
}

fn builder(verify: bool) -> Builder {
    let mut builder = Store::builder();
    builder.verify_on_open(verify);
    builder
}

/// Opens the store, prints how long that took, and closes it (cleanly).
fn timed_open(path: &Path, verify: bool, how: &str) -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let store = builder(verify).open(path)?;
    let elapsed = started.elapsed();
    println!(
        "open {} ({how}{}): {:.1} ms",
        path.display(),
        if verify { ", --verify" } else { "" },
        elapsed.as_secs_f64() * 1e3
    );
    let closing = Instant::now();
    drop(store);
    eprintln!(
        "  closed in {:.1} ms",
        closing.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: open_time fill|open|kill|crash <path> [count] [--verify] [--ascending]";
    let (Some(mode), Some(path)) = (args.first(), args.get(1)) else {
        return Err(usage.into());
    };
    let path = Path::new(path);
    let verify = args.iter().any(|a| a == "--verify");
    let count = |default: usize| -> Result<usize, Box<dyn std::error::Error>> {
        match args.get(2).filter(|a| !a.starts_with("--")) {
            Some(n) => Ok(n.parse()?),
            None => Ok(default),
        }
    };
    match mode.as_str() {
        "fill" => {
            let n = count(1_000_000)?;
            let store = builder(verify).open(path)?;
            let started = Instant::now();
            let ascending = args.iter().any(|a| a == "--ascending");
            fill(&store, "fill", n, ascending)?;
            drop(store);
            println!(
                "filled {} with {n} keys in {:.1} s",
                path.display(),
                started.elapsed().as_secs_f64()
            );
        }
        "open" => {
            for _ in 0..count(5)? {
                timed_open(path, verify, "as left")?;
            }
        }
        "kill" | "crash" => {
            let n = count(20_000)?;
            let mut child = Command::new(std::env::current_exe()?)
                .args(["child", &path.display().to_string(), &n.to_string()])
                .stdout(Stdio::piped())
                .spawn()?;
            let stdout = child.stdout.take().ok_or("no child stdout")?;
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line)?;
            if line.trim() != "ready" {
                return Err(format!("the child said {line:?} instead of ready").into());
            }
            child.kill()?; // SIGKILL
            child.wait()?;
            if mode == "kill" {
                timed_open(path, verify, &format!("after a kill, {n} keys in the log"))?;
            }
        }
        "child" => {
            let n = count(20_000)?;
            let store = builder(false).open(path)?;
            let tag = format!(
                "kill-{}",
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)?
                    .as_nanos()
            );
            fill(&store, &tag, n, false)?;
            println!("ready");
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
        _ => return Err(usage.into()),
    }
    Ok(())
}
