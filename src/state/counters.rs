//! Counters of what the store has done since it was opened, for
//! [`Store::stats`](crate::Store::stats) and, with the `metrics` feature, for the `metrics`
//! facade (Prometheus and friends).

use std::sync::atomic::{AtomicU64, Ordering};

/// One counter. With the `metrics` feature each increment is also reported to the `metrics`
/// facade under [`Counter::metric`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counter {
    Acquired,
    Takeovers,
    Replayed,
    InProgress,
    Mismatches,
    NeedsReview,
    Swept,
    WindowsDeleted,
    WindowsMerged,
    Batches,
    BatchedOps,
    Syncs,
    Commits,
    Checkpoints,
    Expired,
}

const COUNTERS: usize = 15;

impl Counter {
    /// The metric name reported to the `metrics` facade.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn metric(self) -> &'static str {
        match self {
            Counter::Acquired => "idemstore_acquired_total",
            Counter::Takeovers => "idemstore_takeovers_total",
            Counter::Replayed => "idemstore_replayed_total",
            Counter::InProgress => "idemstore_in_progress_total",
            Counter::Mismatches => "idemstore_mismatches_total",
            Counter::NeedsReview => "idemstore_needs_review_total",
            Counter::Swept => "idemstore_swept_total",
            Counter::WindowsDeleted => "idemstore_windows_deleted_total",
            Counter::WindowsMerged => "idemstore_windows_merged_total",
            Counter::Batches => "idemstore_batches_total",
            Counter::BatchedOps => "idemstore_batched_ops_total",
            Counter::Syncs => "idemstore_log_syncs_total",
            Counter::Commits => "idemstore_redb_commits_total",
            Counter::Checkpoints => "idemstore_checkpoints_total",
            Counter::Expired => "idemstore_expired_total",
        }
    }
}

/// Live counters, shared by the store and its commit path.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    values: [AtomicU64; COUNTERS],
    max_batch: AtomicU64,
}

impl Counters {
    pub(crate) fn add(&self, counter: Counter, n: u64) {
        self.values[counter as usize].fetch_add(n, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!(counter.metric()).increment(n);
    }

    pub(crate) fn batch(&self, ops: u64) {
        self.add(Counter::Batches, 1);
        self.add(Counter::BatchedOps, ops);
        self.max_batch.fetch_max(ops, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::histogram!("idemstore_batch_ops").record(ops as f64);
        #[cfg(feature = "tracing")]
        tracing::trace!(ops, "idemstore batch committed to the log");
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let get = |c: Counter| self.values[c as usize].load(Ordering::Relaxed);
        Stats {
            acquired: get(Counter::Acquired),
            takeovers: get(Counter::Takeovers),
            replayed: get(Counter::Replayed),
            in_progress: get(Counter::InProgress),
            mismatches: get(Counter::Mismatches),
            needs_review: get(Counter::NeedsReview),
            swept: get(Counter::Swept),
            windows_deleted: get(Counter::WindowsDeleted),
            windows_merged: get(Counter::WindowsMerged),
            batches: get(Counter::Batches),
            batched_ops: get(Counter::BatchedOps),
            max_batch: self.max_batch.load(Ordering::Relaxed),
            syncs: get(Counter::Syncs),
            commits: get(Counter::Commits),
            checkpoints: get(Counter::Checkpoints),
            expired: get(Counter::Expired),
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
    /// Records deleted by sweeps (expired records, whole windows of them or one by one).
    pub swept: u64,
    /// Expiry windows whose table was deleted whole once they ended (see
    /// [`Builder::sweep_interval`](crate::Builder::sweep_interval)).
    pub windows_deleted: u64,
    /// Narrow expiry windows whose records moved into their horizon's window (each record is
    /// first written to a window 8 times narrower, whose B-tree stays small; see
    /// docs/format.md, "Narrow windows, merged").
    pub windows_merged: u64,
    /// Batches run through the commit path.
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
    /// Records deleted by [`Store::expire`](crate::Store::expire) and its other forms (not
    /// by sweeps).
    pub expired: u64,
}
