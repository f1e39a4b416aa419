//! What the default admin socket costs an idle service (Linux: it reads `/proc/self`): threads,
//! file descriptors, resident memory and the admin thread's CPU time while nobody asks,
//! for a store opened with `AdminSocket::Off` and with the default `AdminSocket::ReadOnly`,
//! alternately, on the same file.
//!
//! ```text
//! cargo run --release --example admin_idle -- [IDLE_SECONDS] [ROUNDS]
//! ```
//! Prints one line per store opened, then the differences (median over the rounds).

use std::time::Duration;

use idemstore::{AdminSocket, Store};

/// A field of `/proc/self/status` in kB (`VmRSS`).
fn status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

/// CPU time (user + system, clock ticks) of the threads named `name`.
fn thread_ticks(name: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .filter_map(|stat| {
            // Fields after the parenthesised name: state is field 3; utime 14, stime 15.
            let rest = stat.rsplit_once(") ")?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
        })
        .sum()
}

struct Sample {
    threads: usize,
    fds: usize,
    rss_kb: u64,
    admin_ticks: u64,
}

fn measure(path: &std::path::Path, socket: AdminSocket, idle: Duration) -> Sample {
    let store = Store::builder()
        .admin_socket(socket)
        .open(path)
        .expect("open the store");
    std::thread::sleep(Duration::from_millis(200));
    let before = thread_ticks("idemstore-admin");
    std::thread::sleep(idle);
    let sample = Sample {
        threads: count("/proc/self/task"),
        fds: count("/proc/self/fd"),
        rss_kb: status_kb("VmRSS:"),
        admin_ticks: thread_ticks("idemstore-admin") - before,
    };
    println!(
        "{socket:?}: {} threads, {} file descriptors, {} KiB resident, admin thread {} ticks in {:?} idle",
        sample.threads, sample.fds, sample.rss_kb, sample.admin_ticks, idle
    );
    drop(store);
    sample
}

fn median(mut values: Vec<i64>) -> i64 {
    values.sort_unstable();
    values[values.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u64>());
    let idle = Duration::from_secs(args.next().transpose()?.unwrap_or(10));
    let rounds = args.next().transpose()?.unwrap_or(3).max(1);
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("idle.idem");
    drop(
        Store::builder()
            .admin_socket(AdminSocket::Off)
            .open(&path)?,
    );
    let (mut threads, mut fds, mut rss, mut ticks) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        let off = measure(&path, AdminSocket::Off, idle);
        let on = measure(&path, AdminSocket::ReadOnly, idle);
        threads.push(on.threads as i64 - off.threads as i64);
        fds.push(on.fds as i64 - off.fds as i64);
        rss.push(on.rss_kb as i64 - off.rss_kb as i64);
        ticks.push(on.admin_ticks as i64);
    }
    println!(
        "ReadOnly - Off (median of {rounds}): {:+} threads, {:+} file descriptors, {:+} KiB resident; admin thread CPU {} ticks (1/100 s) per {:?} idle",
        median(threads),
        median(fds),
        median(rss),
        median(ticks),
        idle
    );
    Ok(())
}
