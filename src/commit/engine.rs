//! The parts of an open store that every thread of the engine shares (the callers, the
//! committer, the syncer, the applier), in one struct behind one `Arc`.

use std::sync::Arc;

use parking_lot::Mutex;
use redb::Database;

use crate::clock::{to_millis, Clock};
use crate::decide::policy::Policies;
use crate::record::Millis;
use crate::state::overlay::Overlay;
use crate::state::overlay::RecordCache;
use crate::state::poison::Poison;
use crate::state::stats::Counters;
use crate::tree::windows::Windows;

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
}

impl Engine {
    /// The current time, in the store's milliseconds.
    pub(crate) fn now(&self) -> Millis {
        to_millis(self.clock.now())
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
    pub(super) fn take_hook(&self, start: &CheckpointStart) -> Option<Box<dyn FnOnce() + Send>> {
        let mut armed = self.hook.lock();
        if armed.as_ref().is_some_and(|a| (a.which)(start)) {
            armed.take().map(|a| a.hook)
        } else {
            None
        }
    }
}
