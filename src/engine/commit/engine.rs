//! The parts of an open store that every thread of the engine shares (the callers, the
//! committer, the syncer, the applier), in one struct behind one `Arc`.

use std::sync::Arc;

use redb::Database;

use crate::clock::{to_millis, Clock};
use crate::decide::policy::Policies;
use crate::engine::cache::{Overlay, RecordCache};
use crate::engine::poison::Poison;
use crate::engine::stats::Counters;
use crate::record::Millis;

/// See the module docs. Assembled once, when the store opens (`Store::from_parts`).
pub(crate) struct Engine {
    /// The B-tree file.
    pub(crate) db: Database,
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
    pub(crate) checkpoint: super::checkpoint::CheckpointState,
}

impl Engine {
    /// The current time, in the store's milliseconds.
    pub(crate) fn now(&self) -> Millis {
        to_millis(self.clock.now())
    }
}
