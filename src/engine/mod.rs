//! Floor 4, the engine: how operations reach the disk and come back. The commit path
//! ([`commit`]: queue, writer, syncer, applier, checkpoint), the log ([`wal`]), recovery on
//! open ([`recovery`]), refusing an open that lost its log ([`lost_log`]), the clean-close
//! marker ([`clean_close`]), the record cache ([`cache`]), the
//! overlay of acknowledged changes and the writer's epochs ([`overlay`]), waiters for a key ([`wait`]), the poison flag
//! after a failed sync ([`poison`]), sweeping expired records ([`sweep`]) and the counters
//! ([`stats`]), and the
//! settings it runs under ([`settings`]). It imports the vocabulary, [`decide`](crate::decide) and
//! [`format`](crate::format), nothing above.

pub(crate) mod cache;
pub(crate) mod clean_close;
pub(crate) mod commit;
pub(crate) mod lost_log;
pub(crate) mod overlay;
pub(crate) mod poison;
pub(crate) mod recovery;
pub(crate) mod settings;
pub(crate) mod stats;
pub(crate) mod sweep;
pub(crate) mod wait;
pub(crate) mod wal;
