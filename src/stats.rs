//! Counters of what the store has done since it was opened, for metrics and dashboards.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters, shared by the store and its commit path.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) acquired: AtomicU64,
    pub(crate) takeovers: AtomicU64,
    pub(crate) replayed: AtomicU64,
    pub(crate) in_progress: AtomicU64,
    pub(crate) mismatches: AtomicU64,
    pub(crate) needs_review: AtomicU64,
    pub(crate) swept: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) batched_ops: AtomicU64,
    pub(crate) max_batch: AtomicU64,
    pub(crate) syncs: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) checkpoints: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn batch(&self, ops: u64) {
        Counters::add(&self.batches, 1);
        Counters::add(&self.batched_ops, ops);
        self.max_batch.fetch_max(ops, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            acquired: get(&self.acquired),
            takeovers: get(&self.takeovers),
            replayed: get(&self.replayed),
            in_progress: get(&self.in_progress),
            mismatches: get(&self.mismatches),
            needs_review: get(&self.needs_review),
            swept: get(&self.swept),
            batches: get(&self.batches),
            batched_ops: get(&self.batched_ops),
            max_batch: get(&self.max_batch),
            syncs: get(&self.syncs),
            commits: get(&self.commits),
            checkpoints: get(&self.checkpoints),
        }
    }
}

/// What the store has done since it was opened, from [`Store::stats`](crate::Store::stats).
///
/// ```
/// use idemstore::{Fingerprint, Key, Store};
///
/// # let dir = tempfile::tempdir()?;
/// let store = Store::open(dir.path().join("s.idem"))?;
/// let key = Key::new("u", "op", "1")?;
/// let _ = store.reserve(&key, Fingerprint::of(b"a"))?;
/// let _ = store.reserve(&key, Fingerprint::of(b"a"))?;
/// let stats = store.stats();
/// assert_eq!((stats.acquired, stats.in_progress), (1, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Reserves answered `Acquired` (takeovers included).
    pub acquired: u64,
    /// Acquisitions that took a stale reservation over (`attempt > 1`).
    pub takeovers: u64,
    /// Reserves answered with a stored result.
    pub replayed: u64,
    /// Reserves answered `InProgress`.
    pub in_progress: u64,
    /// Reserves answered `Mismatch`.
    pub mismatches: u64,
    /// Reserves answered `NeedsReview`.
    pub needs_review: u64,
    /// Records deleted by sweeps.
    pub swept: u64,
    /// Batches the committer ran.
    pub batches: u64,
    /// Operations in those batches (`batched_ops / batches` is the mean batch size).
    pub batched_ops: u64,
    /// The largest batch.
    pub max_batch: u64,
    /// Log syncs (fdatasync); each made one or more batches durable.
    pub syncs: u64,
    /// redb commits.
    pub commits: u64,
    /// Checkpoints (durable redb commits after which the log is reused).
    pub checkpoints: u64,
}
