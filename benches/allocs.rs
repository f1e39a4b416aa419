//! Heap allocations per operation on idemstore's hot paths, counted by a global allocator that
//! counts every `alloc` and `realloc` of the whole process (the caller's thread and the
//! engine's committer and applier threads alike) around a run of operations.
//!
//! ```text
//! cargo bench --bench allocs
//! ```
//!
//! prints one line per path: allocations (and bytes) per operation, over `OPS` operations
//! after a warm-up, on a fresh store with `Store::open` defaults in the temp dir. The keys are
//! built before the count starts (`Key::new` allocates once per key), so the figures are the
//! engine's own. Allocations the background threads make after the last operation returns
//! (the applier catching up, a checkpoint) fall outside the count; over 20,000 operations
//! that edge is small.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use idemstore::{Fingerprint, Key, Reservation, Store};

/// Counts allocations and reallocations (and their bytes), then defers to the system
/// allocator.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed on unchanged to `System`, which upholds the contract.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: as the caller's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: as the caller's contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: as the caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as the caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Operations counted per path (after as many again as a warm-up).
const OPS: usize = 20_000;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn keys(prefix: &str, n: usize) -> Result<Vec<Key>> {
    (0..n)
        .map(|i| Ok(Key::new("t042", "pay", format!("{prefix}-{i:016x}"))?))
        .collect()
}

/// Allocations and bytes per operation while `run` does `ops` operations.
fn count(ops: usize, run: impl FnOnce() -> Result<()>) -> Result<(f64, f64)> {
    let (allocs, bytes) = (ALLOCS.load(Ordering::SeqCst), BYTES.load(Ordering::SeqCst));
    run()?;
    let allocs = ALLOCS.load(Ordering::SeqCst) - allocs;
    let bytes = BYTES.load(Ordering::SeqCst) - bytes;
    Ok((allocs as f64 / ops as f64, bytes as f64 / ops as f64))
}

fn reserve_new(store: &Store, keys: &[Key], fingerprint: Fingerprint) -> Result<()> {
    for key in keys {
        match store.reserve(key, fingerprint)? {
            Reservation::Acquired(_) => {}
            other => return Err(format!("a new key answered {other:?}").into()),
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let fingerprint = Fingerprint::of(b"request body");
    let mut lines = Vec::new();

    // One caller, new keys.
    let store = Store::open(dir.path().join("new.idem"))?;
    let warm = keys("warm", OPS)?;
    let new = keys("new", OPS)?;
    reserve_new(&store, &warm, fingerprint)?;
    let (a, b) = count(OPS, || reserve_new(&store, &new, fingerprint))?;
    lines.push(("reserve, new key, 1 caller", a, b));

    // One caller, duplicates of completed keys (the keys of the run above, completed).
    let stored = keys("stored", OPS)?;
    for key in &stored {
        if let Reservation::Acquired(lease) = store.reserve(key, fingerprint)? {
            store.complete(&lease, &b"201 Created"[..])?;
        }
    }
    let duplicates = |store: &Store| -> Result<()> {
        for key in &stored {
            match store.reserve(key, fingerprint)? {
                Reservation::Completed(_) => {}
                other => return Err(format!("a stored key answered {other:?}").into()),
            }
        }
        Ok(())
    };
    duplicates(&store)?;
    let (a, b) = count(OPS, || duplicates(&store))?;
    lines.push(("reserve, duplicate, 1 caller", a, b));

    // One caller, reserve then complete.
    let cycle = keys("cycle", OPS)?;
    let (a, b) = count(OPS, || {
        for key in &cycle {
            match store.reserve(key, fingerprint)? {
                Reservation::Acquired(lease) => store.complete(&lease, &b"201 Created"[..])?,
                other => return Err(format!("a new key answered {other:?}").into()),
            }
        }
        Ok(())
    })?;
    lines.push(("reserve + complete, 1 caller", a, b));

    // 32 callers, new keys.
    let store = Arc::new(store);
    let threads = 32;
    let per_thread: Vec<Vec<Key>> = (0..threads)
        .map(|t| keys(&format!("c{t}"), OPS / threads))
        .collect::<Result<_>>()?;
    let (a, b) = count(OPS / threads * threads, || {
        let start = Barrier::new(threads);
        std::thread::scope(|scope| {
            let workers: Vec<_> = per_thread
                .iter()
                .map(|keys| {
                    let (store, start) = (&store, &start);
                    scope.spawn(move || {
                        start.wait();
                        reserve_new(store, keys, fingerprint)
                    })
                })
                .collect();
            workers
                .into_iter()
                .try_for_each(|w| w.join().expect("a client thread panicked"))
        })
    })?;
    lines.push(("reserve, new key, 32 callers", a, b));

    // Batches of 1000 new keys (per key).
    let items: Vec<(Key, Fingerprint)> = keys("batch", OPS)?
        .into_iter()
        .map(|k| (k, fingerprint))
        .collect();
    let (a, b) = count(OPS, || {
        for chunk in items.chunks(1000) {
            for result in store.reserve_many(chunk)? {
                if !matches!(result?, Reservation::Acquired(_)) {
                    return Err("a new key in a batch was not acquired".into());
                }
            }
        }
        Ok(())
    })?;
    lines.push(("reserve_many of 1000 new keys, per key", a, b));

    // Batches of 1000 completed keys (duplicates, per key): each answer carries its result.
    let done: Vec<(Key, Fingerprint)> = keys("done", OPS)?
        .into_iter()
        .map(|k| (k, fingerprint))
        .collect();
    for chunk in done.chunks(1000) {
        let mut leases = Vec::new();
        for result in store.reserve_many(chunk)? {
            if let Reservation::Acquired(lease) = result? {
                leases.push(lease);
            }
        }
        let completions = leases
            .iter()
            .map(|lease| (lease, b"201 Created".to_vec()))
            .collect();
        for completed in store.complete_many(completions)? {
            completed?;
        }
    }
    // The completions applied and checkpointed first, so the background threads are idle.
    store.checkpoint()?;
    let (a, b) = count(OPS, || {
        for chunk in done.chunks(1000) {
            for result in store.reserve_many(chunk)? {
                if !matches!(result?, Reservation::Completed(_)) {
                    return Err("a completed key in a batch was not replayed".into());
                }
            }
        }
        Ok(())
    })?;
    lines.push(("reserve_many of 1000 completed keys, per key", a, b));

    println!("{:<42} {:>12} {:>12}", "path", "allocs/op", "bytes/op");
    for (path, allocs, bytes) in lines {
        println!("{path:<42} {allocs:>12.2} {bytes:>12.0}");
    }
    Ok(())
}
