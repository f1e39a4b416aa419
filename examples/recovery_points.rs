//! Recovery points for multi-step work: a checkout that reserves stock, charges a card and
//! sends a receipt, each step recorded durably with `Store::record_step`. The first worker
//! dies after the charge; the worker that takes the stale key over resumes after the last
//! recorded step, so the card is charged once and the receipt sent once.
//!
//! Run it with `cargo run --example recovery_points`. It prints each step as it runs, which
//! worker ran it, and a final check that every side effect happened exactly once.

use std::cell::Cell;
use std::time::Duration;

use idemstore::{Fingerprint, Key, Lease, ManualClock, Reservation, Store};

const STEPS: [&str; 3] = ["reserve stock", "charge card", "send receipt"];

/// Counts of each side effect, to check that none ran twice.
#[derive(Default)]
struct World {
    effects: [Cell<u32>; 3],
}

/// Runs the steps after the lease's last recovery point; `die_after` simulates a crash.
fn run_checkout(
    store: &Store,
    lease: &Lease,
    world: &World,
    worker: &str,
    die_after: Option<u32>,
) -> Result<bool, idemstore::Error> {
    let start = lease.progress().map_or(0, |p| p.step);
    if let Some(progress) = lease.progress() {
        println!(
            "  {worker}: attempt {} resumes after step {} ({})",
            lease.attempt(),
            progress.step,
            String::from_utf8_lossy(&progress.data)
        );
    }
    for step in start + 1..=STEPS.len() as u32 {
        let i = (step - 1) as usize;
        world.effects[i].set(world.effects[i].get() + 1);
        let data = format!("{} done by {worker}", STEPS[i]);
        store.record_step(lease, step, data.as_bytes())?;
        println!("  {worker}: step {step} {:<13} recorded", STEPS[i]);
        if die_after == Some(step) {
            println!("  {worker}: crashes before finishing");
            return Ok(false);
        }
    }
    store.complete(lease, b"order 7 confirmed".to_vec())?;
    println!("  {worker}: completed");
    Ok(true)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("checkout.idem");
    let clock = ManualClock::new();
    let lease_time = Duration::from_secs(30);
    let open = || {
        Store::builder()
            .clock(clock.clone())
            .lease(lease_time)
            .open(&path)
    };
    let key = Key::new("user-7", "checkout", "cart-7")?;
    let request = Fingerprint::of(b"cart 7: 2 books, card 4242");
    let world = World::default();

    println!("worker A takes the checkout:");
    let store = open()?;
    let Reservation::Acquired(lease) = store.reserve(&key, request)? else {
        return Err("a fresh key must be acquired".into());
    };
    run_checkout(&store, &lease, &world, "worker A", Some(2))?;
    drop(store); // the process is gone; its lease runs out
    clock.advance(lease_time + Duration::from_secs(1));

    println!("worker B retries after the lease ran out:");
    let store = open()?;
    let Reservation::Acquired(lease) = store.reserve(&key, request)? else {
        return Err("the stale key must be taken over".into());
    };
    run_checkout(&store, &lease, &world, "worker B", None)?;

    println!("a duplicate request now gets:");
    if let Reservation::Completed(done) = store.reserve(&key, request)? {
        println!("  {}", String::from_utf8_lossy(&done.result));
    }
    let counts: Vec<u32> = world.effects.iter().map(Cell::get).collect();
    println!("side effects per step: {counts:?}");
    if counts != [1, 1, 1] {
        return Err("a step ran twice or not at all".into());
    }
    println!("ok: every step ran exactly once across the crash");
    Ok(())
}
