//! The latched first write failure: once a write or sync fails, every call fails with
//! [`StorageError::Poisoned`](crate::StorageError::Poisoned) until the store is reopened;
//! and the room a reopen needs on a full disk.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::error::{Error, OpenError, StorageError};

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
