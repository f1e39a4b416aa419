//! The settings the engine runs under, set through the [`Builder`](crate::Builder) (which
//! owns them and their defaults): how durable an acknowledgment is, and the size limits of a
//! batch and a log frame.

use std::time::Duration;

/// When an operation counts as done; set with [`Builder::durability`](crate::Builder::durability).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// Every acknowledged reservation, completion and release is in the log and
    /// synced (fdatasync) before the call returns; concurrent callers share one sync.
    ///
    /// Survives a process crash: yes. Survives a power loss: yes.
    #[default]
    Immediate,
    /// Operations are written to the log (handed to the operating system) before the call
    /// returns, and the log is synced at most `flush_interval` later.
    ///
    /// Survives a process crash: yes (the operating system holds the writes). Survives a power
    /// loss: everything but the operations acknowledged in the last `flush_interval`. For pure
    /// deduplication that accepts a stated loss window; never for keys that guard money.
    /// Recovery after a power loss stops at the first damaged frame (the lost window) instead
    /// of refusing to open.
    Buffered {
        /// The longest time an acknowledged operation stays unsynced.
        flush_interval: Duration,
    },
}

/// The size limits of one batch and one log frame. Fixed in normal builds; tests scale them
/// down so that oversized input is a few megabytes rather than gigabytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// The most bytes of log entries (keys, records, results) one batch takes, so a frame
    /// stays far below its limit however large the configured results are.
    pub(crate) batch_bytes: usize,
    /// The largest frame payload the log format can hold (its length field is a `u32`).
    pub(crate) frame_bytes: usize,
    /// The most async requests waiting in the commit queue; more wait to be let in.
    pub(crate) queued_async: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            batch_bytes: 64 << 20,
            frame_bytes: u32::MAX as usize,
            queued_async: 4096,
        }
    }
}
