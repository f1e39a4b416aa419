//! A tokio consumer of an at-least-once queue, deduplicated with `reserve_async` and
//! `complete_async`, on a single runtime thread.
//!
//! ```text
//! cargo run --release --example async_tokio
//! ```
//!
//! 2,000 deliveries of 500 messages (each message is delivered four times, as a queue that
//! redelivers does) are handled by 2,000 concurrent tasks. Each task reserves the message's
//! key; the one that acquires it does the work (an async call of 2 ms) and completes the key
//! with its result; a duplicate gets the stored result, or, while the work is still running,
//! tries again 2 ms later. Every reservation and completion is durable (fdatasync) before it
//! is answered.
//!
//! It runs everything on one runtime thread and prints: how long one blocking `reserve` takes
//! on this disk (a baseline: one sync each); how many times the work ran (once per message)
//! and how many duplicates got the stored result (byte-identical to the original); the wall
//! time for the 1,000 durable writes against what one sync each would take; and the time the
//! runtime thread spent inside the store's futures in total. The store's committer thread runs
//! the syncs for async callers, batching the writes of many tasks into one, so that time is a
//! small fraction of even one sync per write: no poll waits on a sync. Exits non-zero if a message
//! was processed twice or a duplicate saw a different result.

use std::cell::Cell;
use std::collections::HashMap;
use std::error::Error;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idemstore::{Fingerprint, Key, Reservation, Store};
use tokio::sync::Mutex;

const MESSAGES: usize = 500;
const DELIVERIES_PER_MESSAGE: usize = 4;

/// What one delivery ended with.
enum Handled {
    /// This task did the work and stored `result`.
    Processed(Vec<u8>),
    /// The stored result of another task was replayed.
    Replayed(Vec<u8>),
}

thread_local! {
    /// Time the runtime thread spent inside the store's futures (one thread: a plain cell).
    static IN_STORE: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// Runs `future`, adding the time each of its polls takes to [`IN_STORE`]. A poll that
/// blocked on a sync would add the sync's time.
async fn timed<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    poll_fn(|cx| {
        let start = Instant::now();
        let poll = future.as_mut().poll(cx);
        IN_STORE.set(IN_STORE.get() + start.elapsed());
        poll
    })
    .await
}

/// Handles one delivery of message `id`: do the work once per message, replay otherwise.
async fn handle(store: &Store, id: usize, task: usize) -> Result<Handled, idemstore::Error> {
    let key = Key::new("orders-queue", "consume", format!("msg-{id}"))?;
    let body = format!("order {id} shipped");
    loop {
        match timed(store.reserve_async(&key, Fingerprint::of(body.as_bytes()))).await? {
            Reservation::Acquired(lease) => {
                tokio::time::sleep(Duration::from_millis(2)).await; // the real work: an async call
                let result = format!("label L-{id:04} printed by task {task}").into_bytes();
                timed(store.complete_async(&lease, result.clone())).await?;
                return Ok(Handled::Processed(result));
            }
            Reservation::Completed(done) => return Ok(Handled::Replayed(done.result)),
            // Another task is doing it: a queue consumer would let the message be redelivered.
            Reservation::InProgress { .. } => tokio::time::sleep(Duration::from_millis(2)).await,
            other => panic!("unexpected answer for msg-{id}: {other:?}"),
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Store::open(dir.path().join("queue.idem"))?);

    // Baseline: blocking reserves one after another, each waits for its own sync.
    let baseline_ops = 20;
    let started = Instant::now();
    for i in 0..baseline_ops {
        let key = Key::new("baseline", "reserve", format!("k{i}"))?;
        let _ = store.reserve(&key, Fingerprint::of(b"b"))?;
    }
    let per_sync = started.elapsed() / baseline_ops;
    println!(
        "baseline: {baseline_ops} blocking reserves one after another: {:.2} ms each (one sync each)",
        per_sync.as_secs_f64() * 1e3
    );

    let local = tokio::task::LocalSet::new();
    let results: Arc<Mutex<HashMap<usize, Vec<u8>>>> = Arc::default();
    let started = Instant::now();
    let (processed, replayed, differing) = local
        .run_until(async {
            let mut tasks = Vec::new();
            for round in 0..DELIVERIES_PER_MESSAGE {
                for id in 0..MESSAGES {
                    let task = round * MESSAGES + id;
                    let store = Arc::clone(&store);
                    tasks.push(tokio::task::spawn_local(async move {
                        (id, handle(&store, id, task).await)
                    }));
                    if task % 50 == 49 {
                        // Deliveries arrive over time, not all in one poll.
                        tokio::task::yield_now().await;
                    }
                }
            }
            let (mut processed, mut replayed) = (0usize, Vec::new());
            for task in tasks {
                let (id, handled) = task.await.expect("task finished");
                match handled.expect("store error") {
                    Handled::Processed(result) => {
                        processed += 1;
                        results.lock().await.insert(id, result);
                    }
                    Handled::Replayed(result) => replayed.push((id, result)),
                }
            }
            let results = results.lock().await;
            let differing = replayed
                .iter()
                .filter(|(id, result)| results.get(id) != Some(result))
                .count();
            (processed, replayed.len(), differing)
        })
        .await;
    let elapsed = started.elapsed();

    let writes = 2 * MESSAGES; // one reservation and one completion per message
    println!(
        "{} deliveries of {MESSAGES} messages by {} tasks on one runtime thread:",
        MESSAGES * DELIVERIES_PER_MESSAGE,
        MESSAGES * DELIVERIES_PER_MESSAGE
    );
    println!("  work ran {processed} times (once per message); {replayed} duplicates got the stored result, {differing} differed");
    println!(
        "  {writes} durable writes in {:.0} ms; one sync each, one after another, would take {:.0} ms",
        elapsed.as_secs_f64() * 1e3,
        (per_sync * writes as u32).as_secs_f64() * 1e3
    );
    println!(
        "  the runtime thread spent {:.0} ms in total inside reserve_async/complete_async polls; \
         the syncs ran on the store's committer thread",
        IN_STORE.get().as_secs_f64() * 1e3
    );
    if processed != MESSAGES || differing != 0 {
        return Err("a message was processed twice or a replay differed".into());
    }
    Ok(())
}
