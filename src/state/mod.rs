//! What the running store holds in memory beside the B-tree, and its door: [`Engine`], the
//! parts every thread of the engine shares (the callers, the committer, the syncer, the
//! applier) in one struct behind one `Arc`. Its rooms: the latched first write failure
//! ([`Poison`], `poison.rs`), the counters ([`Counters`], [`Stats`], `counters.rs`), the
//! overlay of acknowledged changes, the writer's epochs and the record cache ([`overlay`]),
//! waiters for a key ([`wait`]) and the settings the engine runs under ([`settings`]).

mod counters;
mod overlay;
mod poison;
mod settings;
mod wait;

pub(crate) use overlay::Held;
#[cfg(feature = "__whitebox")]
pub(crate) use overlay::{entry_bytes, RecordsTable};
pub use settings::Durability;
pub(crate) use settings::Limits;
pub(crate) use wait::{wake_at, Signal};

pub use counters::Stats;
pub(crate) use counters::{Counter, Counters};
pub use poison::reopen_room;
pub(crate) use poison::{error_copy, full_disk_at_open, replay_bound, Poison};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use redb::{Database, ReadableDatabase};

use crate::clock::{to_millis, Clock};
use crate::decide::Policies;
use crate::error::{Error, StorageError};
use crate::key::Key;
use crate::record::{Millis, Record};
use crate::tree::decode_record;
use crate::tree::{Records, Windows};
pub(crate) use overlay::{Overlay, RecordCache};

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
