//! What the running store holds in memory beside the B-tree, and its door: [`Engine`], the
//! parts every thread of the engine shares (the callers, the committer, the syncer, the
//! applier) in one struct behind one `Arc`, with the two small parts every call touches
//! kept here beside it: the latched first write failure ([`Poison`]) and the counters
//! ([`Counters`], [`Stats`]). The other parts have files of their own: the overlay of
//! acknowledged changes, the writer's epochs and the record cache ([`overlay`]), waiters for
//! a key ([`wait`]) and the settings the engine runs under ([`settings`]).
//!
//! ## The latched first write failure
//!
//! Once a write or sync fails, every call fails with [`StorageError::Poisoned`](crate::StorageError::Poisoned) until the store is
//! reopened.
//!
//! ## Counters
//!
//! Counters of what the store has done since it was opened, for [`Store::stats`] and, with
//! the `metrics` feature, for the `metrics` facade (Prometheus and friends).
//!
//! [`Store::stats`]: crate::Store::stats

pub(crate) mod overlay;
pub(crate) mod settings;
pub(crate) mod wait;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use redb::{Database, ReadableDatabase};

use crate::clock::{to_millis, Clock};
use crate::decide::policy::Policies;
use crate::error::{Error, OpenError, StorageError};
use crate::key::Key;
use crate::record::{Millis, Record};
use crate::tree::tables::decode_record;
use crate::tree::windows::{Records, Windows};
use overlay::{Overlay, RecordCache};

/// See the module docs. Assembled once, when the store opens (`Store::from_parts`).
pub(crate) struct Engine {
    /// The B-tree file.
    pub(crate) db: Database,
    /// The expiry windows the records are kept in, with their filters.
    pub(crate) windows: Windows,
    /// Recently committed records, for the duplicate path.
    pub(crate) cache: RecordCache,
    /// Acknowledged changes not yet committed to redb, and the writer's epochs.
    pub(crate) overlay: Overlay,
    pub(crate) counters: Counters,
    /// Latched by the first failed write.
    pub(crate) poison: Poison,
    pub(crate) clock: Arc<dyn Clock>,
    /// The lease and retention of each key.
    pub(crate) policy: Policies,
    /// Whether a background checkpoint commits (for the applier), and the tests' hook.
    pub(crate) checkpoint: CheckpointState,
    /// The latest time the store has seen ([`now`](Engine::now) never returns less).
    pub(crate) time_floor: AtomicU64,
}

impl Engine {
    /// The store's time, in milliseconds: the clock's, except that it never runs backward
    /// while the store is open. A clock stepped back (an NTP correction) holds the store's time
    /// where it was until the clock catches up, so nothing that expired, no lease that ran out
    /// and no window that was deleted comes back (docs/5-guarantees.md, "Time"). A reopen starts
    /// again from the clock.
    pub(crate) fn now(&self) -> Millis {
        let clock = to_millis(self.clock.now());
        let floor = self.time_floor.load(Ordering::Acquire);
        if clock > floor {
            // Written only when the clock moved on (at most once a millisecond per thread).
            self.time_floor
                .fetch_max(clock, Ordering::AcqRel)
                .max(clock)
        } else {
            floor
        }
    }

    /// The newest state of `key`, expired or not, read from the newest copy first: the
    /// overlay (acknowledged changes no redb commit the readers see holds yet), then the record
    /// cache (committed records), then the epoch's shared redb snapshot
    /// ([`Overlay::committed`]). Every read of a key's state goes through here: a caller's
    /// read (single, batched, waiting) and the writer's decisions (after its own changes since
    /// the last redb commit). A copy is consulted only when every newer one missed, so no
    /// answer comes from a state older than one another copy has published: the overlay's
    /// entries move to the cache before they leave it, and the cache holds a key's state only
    /// as the last commit of it left it.
    ///
    /// The inner `Err` is a damaged record (an error for this key alone); the outer one is a
    /// storage error, or [`StorageError::Poisoned`](crate::StorageError::Poisoned) when a failed write may have dropped a newer
    /// state from memory since the caller last checked.
    pub(crate) fn newest(&self, key: &Key) -> Result<Result<Option<Record>, Error>, Error> {
        if let Some(state) = self.overlay.get(key) {
            return Ok(Ok(state));
        }
        if let Some(record) = self.cache.get(key) {
            return Ok(Ok(Some(record)));
        }
        let ctx = "reading a record";
        let (_, table) = self.overlay.committed(|| {
            let txn = self
                .db
                .begin_read()
                .map_err(|e| StorageError::redb(ctx, e))?;
            Records::open(&txn, &self.windows)
        })?;
        let value = table
            .get(key.encoded())
            .map_err(|e| StorageError::redb(ctx, e))?;
        // A failed write clears the overlay and the cache after latching the poison: if that
        // happened since the caller checked, the overlay or the cache may have held a newer
        // acknowledged state than redb, so refuse rather than return an older one.
        self.poison.check()?;
        Ok(value
            .map(|bytes| decode_record(key.encoded(), bytes.value()))
            .transpose()
            .map_err(Into::into))
    }
}

/// A closure the crate's tests run on a background checkpoint's thread before it takes the
/// applier's transaction (to hold the checkpoint, feature `__whitebox`), and which checkpoint
/// it is for. (The applier needs no other word from the thread: the thread holds the applier's
/// transaction while it applies and commits, and latches a failed commit's error as the
/// store's poison before it lets go, so the applier sees that poison rather than the error
/// redb gives every transaction after.)
#[derive(Default)]
pub(crate) struct CheckpointState {
    hook: Mutex<Option<ArmedHook>>,
}

/// Which checkpoint a test's hook is for, and the hook.
struct ArmedHook {
    which: Box<dyn Fn(&CheckpointStart) -> bool + Send>,
    hook: Box<dyn FnOnce() + Send>,
}

/// What a test's checkpoint hook is told of a background checkpoint as it starts (see
/// `Store::__before_checkpoint_commit_if`, feature `__whitebox`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointStart {
    /// The writer moved the frames back to the log's first region, which may grow only up to
    /// the region this checkpoint covers: the writer waits for its commit once that is full.
    pub back_to_first_region: bool,
}

impl CheckpointState {
    /// Arms `hook` for the first background checkpoint started from now on of which `which`
    /// holds; the checkpoints started before it run without it.
    #[cfg(feature = "__whitebox")]
    pub(crate) fn arm(
        &self,
        which: Box<dyn Fn(&CheckpointStart) -> bool + Send>,
        hook: Box<dyn FnOnce() + Send>,
    ) {
        *self.hook.lock() = Some(ArmedHook { which, hook });
    }

    /// The hook armed for the checkpoint starting now, if it is the one the hook is for
    /// (taken on the writer as it starts the checkpoint, run on the checkpoint's thread: a
    /// checkpoint that started before the hook was armed never runs it).
    pub(crate) fn take_hook(&self, start: &CheckpointStart) -> Option<Box<dyn FnOnce() + Send>> {
        let mut armed = self.hook.lock();
        if armed.as_ref().is_some_and(|a| (a.which)(start)) {
            armed.take().map(|a| a.hook)
        } else {
            None
        }
    }
}

// The latched first write failure (see the module docs).

/// The first write failure, latched: once set, every call fails.
#[derive(Debug, Default)]
pub(crate) struct Poison(
    OnceLock<(String, Option<std::io::ErrorKind>)>,
    /// The log a reopen would replay now (the writer keeps it current, see
    /// [`set_replay`](Poison::set_replay)), for the full-disk message.
    AtomicU64,
    /// The store file, whose disk needs the room: named by the full-disk message (a failed
    /// B-tree commit's own error does not name it).
    PathBuf,
);

/// The most log a reopen may replay for a store checkpointed every `checkpoint_bytes` whose
/// frames hold up to `frame_bytes`: two regions' worth (while a background checkpoint's
/// durable commit runs, the region it covers and the frames written meanwhile in the other
/// are both still to replay; the writer starts no other checkpoint before that commit is
/// durable), each past `checkpoint_bytes` by at most its last frame and that frame's spare
/// copy. Before the writer runs, the open's full-disk message asks for the room to replay
/// this much (or the log file, when smaller); after, the writer keeps the figure exact.
pub(crate) fn replay_bound(checkpoint_bytes: u64, frame_bytes: u64) -> u64 {
    checkpoint_bytes
        .saturating_add(frame_bytes.saturating_mul(2))
        .saturating_mul(2)
}

/// The free space a reopen needs on the store file's disk after a failure, when it replays
/// `replay` bytes of log: the B-tree pages it rewrites (copy on write: up to about 4 bytes of
/// pages per byte of log, with the crash model's 1 KiB results) and 2 MiB for redb's growth
/// steps and a log that is preallocated at open. The full-disk test reopens with exactly
/// this much room.
pub fn reopen_room(replay: u64) -> u64 {
    4 * replay + (2 << 20)
}

/// An open that failed on a full disk (replaying the log into the B-tree grows the store file)
/// says so, naming the store file and how much room the next try needs; other errors are
/// returned as they are.
pub(crate) fn full_disk_at_open(error: OpenError, store: &Path, replay: u64) -> OpenError {
    let (context, source) = match error {
        OpenError::Storage(StorageError::Io { context, source })
            if source.kind() == std::io::ErrorKind::StorageFull =>
        {
            (context, source)
        }
        OpenError::Storage(StorageError::Redb { context, source }) => match *source {
            redb::Error::Io(e) if e.kind() == std::io::ErrorKind::StorageFull => {
                (context.to_string(), e)
            }
            other => {
                let source = Box::new(other);
                return StorageError::Redb { context, source }.into();
            }
        },
        other => return other,
    };
    StorageError::io(
        format!(
            "{context} while opening store {} (the disk is full: free at least {} bytes on its disk, then open it again; opening replays up to {} bytes of log into it)",
            store.display(),
            reopen_room(replay),
            replay
        ),
        source,
    )
    .into()
}

impl Poison {
    /// A latch whose full-disk message says how much room a reopen needs to replay up to
    /// `replay` bytes of log (until the writer says how much it holds), on the disk of the
    /// store file `store`.
    pub(crate) fn new(replay: u64, store: PathBuf) -> Poison {
        Poison(OnceLock::new(), AtomicU64::new(replay), store)
    }

    /// The log a reopen would replay now: the frames since the last durable checkpoint, in
    /// both regions while a background checkpoint's commit runs. Set by the writer after
    /// each frame and checkpoint.
    pub(crate) fn set_replay(&self, bytes: u64) {
        self.1.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn check(&self) -> Result<(), Error> {
        match self.0.get() {
            None => Ok(()),
            Some((cause, io_kind)) => Err(StorageError::Poisoned {
                cause: cause.clone(),
                io_kind: *io_kind,
            }
            .into()),
        }
    }

    /// What every caller of a batch that failed with `error` is answered, once `error` is
    /// latched: the latched failure (so the full-disk message with its room reaches the
    /// failing call too, not only later ones), or a copy of `error` if nothing is latched.
    pub(crate) fn answer(&self, error: &Error) -> Error {
        match self.check() {
            Err(latched) => latched,
            Ok(()) => error_copy(error),
        }
    }

    pub(crate) fn set(&self, error: &Error) {
        let mut cause = crate::error::with_causes(error);
        if error.io_kind() == Some(std::io::ErrorKind::StorageFull) {
            let replay = self.1.load(Ordering::Relaxed);
            cause.push_str(&format!(
                "; the disk is full: free at least {} bytes on the disk of store file {} before reopening (a reopen replays up to {} bytes of log into it)",
                reopen_room(replay),
                self.2.display(),
                replay
            ));
        }
        if self.0.set((cause, error.io_kind())).is_ok() {
            #[cfg(feature = "tracing")]
            tracing::error!(%error, "idemstore poisoned: refusing all further work until reopened");
        }
    }
}

/// Errors are not `Clone`: every caller of a failed batch gets `Poisoned` with the failure's
/// message and I/O error kind (so a full disk is recognizable with [`Error::io_kind`]).
pub(crate) fn error_copy(error: &Error) -> Error {
    match error {
        Error::Storage(StorageError::Poisoned { cause, io_kind }) => StorageError::Poisoned {
            cause: cause.clone(),
            io_kind: *io_kind,
        },
        other => StorageError::Poisoned {
            cause: crate::error::with_causes(other),
            io_kind: other.io_kind(),
        },
    }
    .into()
}

// The counters (see the module docs).

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
    Batches,
    BatchedOps,
    Syncs,
    Commits,
    Checkpoints,
    Expired,
}

const COUNTERS: usize = 14;

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
