//! Error types. Outcomes such as "in progress" or "mismatch" are not errors but
//! [`Reservation`](crate::Reservation) values. As in redb, one core, [`StorageError`], is
//! wrapped by each narrower type ([`OpenError`] for opening, [`KeyError`] for a key), and
//! [`Error`] is the umbrella every operation returns; conversions only go up (`?`).
//!
//! A message names the file, key or limit; its cause (an operating-system error, redb's, a
//! client's) is not repeated in it but returned by [`source()`](std::error::Error::source), and
//! a wrapped error prints as itself, so a reporter that walks the chain prints each cause once.

use std::path::PathBuf;

pub(crate) use crate::answers::LeaseLostReason;
use crate::key::{Key, KeyError};

/// The core every other error type wraps: the storage under a store failed, or holds bytes
/// that are not what the store writes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// An operating-system I/O error, with what was being done; on a full disk an open says
    /// how much room it needs.
    #[error("{context}")]
    Io {
        /// What failed, naming the file.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// An error from the redb storage layer.
    #[error("storage error while {context}")]
    Redb {
        /// What was being done.
        context: &'static str,
        /// The underlying error.
        source: Box<redb::Error>,
    },
    /// Stored bytes failed their checksum or do not decode (a block of the store file, a frame
    /// of the log, a record); they are never returned as data.
    #[error("corruption detected in {location}: {reason}")]
    Corruption {
        /// Where: a file offset, a log frame or the key of a record.
        location: String,
        /// What is wrong.
        reason: String,
    },
    /// An earlier write or sync failed (the calls it failed get this error too), so the store
    /// refuses all further work: reopen it to recover to the last durable state. On a full
    /// disk ([`io_kind`](StorageError::io_kind) is [`std::io::ErrorKind::StorageFull`]) the
    /// cause names the store file and the free space reopening needs (an upper estimate).
    #[error("store is poisoned after an earlier failed write ({cause}); reopen it to recover")]
    Poisoned {
        /// The first failure.
        cause: String,
        /// The kind of the operating-system error behind it, when there was one.
        io_kind: Option<std::io::ErrorKind>,
    },
}

impl StorageError {
    /// The kind of the operating-system I/O error behind this error (for a poisoned store, of
    /// the failure that poisoned it): a full disk is [`std::io::ErrorKind::StorageFull`].
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            StorageError::Io { source, .. } => Some(source.kind()),
            StorageError::Redb { source, .. } => match source.as_ref() {
                redb::Error::Io(e) => Some(e.kind()),
                _ => None,
            },
            StorageError::Poisoned { io_kind, .. } => *io_kind,
            StorageError::Corruption { .. } => None,
        }
    }

    /// A storage error from redb while doing `context`; a block that failed its checksum in
    /// the page layer (`tree/pages.rs`) is [`StorageError::Corruption`] naming the file and
    /// the offset.
    pub(crate) fn redb(context: &'static str, source: impl Into<redb::Error>) -> StorageError {
        let source = source.into();
        if let redb::Error::Io(e) = &source {
            if let Some(damage) = StorageError::damage(e, context) {
                return damage;
            }
        }
        let source = Box::new(source);
        StorageError::Redb { context, source }
    }

    /// The damaged block of a store file behind `error`, met while `doing`: the page layer
    /// (`tree/pages.rs`) returns a block that fails its checksum as an `io::Error` that
    /// carries a [`StorageError::Corruption`] naming the file and the offset.
    pub(crate) fn damage(error: &std::io::Error, doing: &str) -> Option<StorageError> {
        match error.get_ref()?.downcast_ref::<StorageError>()? {
            StorageError::Corruption { location, reason } => Some(StorageError::Corruption {
                location: location.clone(),
                reason: format!("{reason} (met while {doing})"),
            }),
            _ => None,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> StorageError {
        StorageError::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn corrupt_record(key_bytes: &[u8], reason: impl Into<String>) -> StorageError {
        let location = match Key::decode(key_bytes) {
            Some(key) => format!("record {key}"),
            None => format!("record with undecodable key {}", key_bytes.escape_ascii()),
        };
        StorageError::Corruption {
            location,
            reason: reason.into(),
        }
    }
}

/// Why a local store could not be opened (by [`Store::open`](crate::Store::open), a
/// [`Builder`](crate::Builder), [`compact`](crate::compact), ...), or a setting a remote
/// store's builder refused. It converts into [`Error::Open`], so `?` opens in a [`Result`]:
///
/// ```
/// use idemstore::{OpenError, Store};
///
/// fn open_twice(path: &std::path::Path) -> idemstore::Result<()> {
///     let _store = Store::open(path)?; // an OpenError, converted
///     match Store::open(path) {
///         Err(OpenError::AlreadyOpen { path: held }) => assert_eq!(held, path),
///         other => panic!("one process owns a store file, got {other:?}"),
///     }
///     Ok(())
/// }
/// # let dir = tempfile::tempdir()?;
/// open_twice(&dir.path().join("keys.idem"))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// A builder setting is out of range.
    #[error("invalid setting {setting}: {reason}")]
    InvalidConfig {
        /// The setting's name.
        setting: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// Another process (or another `Store` in this one) has the file open.
    #[error(
        "store {path} is already open in another process or Store handle; one process owns \
         a store file"
    )]
    AlreadyOpen {
        /// The store file.
        path: PathBuf,
    },
    /// The file exists but is not an idemstore store (a directory, another program's file, an
    /// unknown format version, a damaged redb structure); the file was not modified.
    #[error("{path} is not an idemstore store ({reason}); the file was left untouched")]
    NotAStore {
        /// The file.
        path: PathBuf,
        /// Why it was refused.
        reason: String,
    },
    /// The log next to the store file cannot be shown to be the store's own (its identity
    /// block is damaged, or it is not an idemstore log). Nothing was replayed and both files
    /// were left untouched. (A log that carries another store's identity is not an error: it
    /// is set aside under a new name and never replayed; see `docs/format.md`.)
    #[error(
        "log {log} cannot be shown to belong to store {store} ({reason}); nothing was \
         replayed and both files were left untouched: if the log is not needed, move it away \
         and open again; if the store was restored from a backup, put back the log that was \
         saved with it"
    )]
    ForeignLog {
        /// The store file.
        store: PathBuf,
        /// The log file.
        log: PathBuf,
        /// What is wrong with the log.
        reason: String,
    },
    /// The store was not closed cleanly and its log is missing, empty, truncated or another
    /// store's: the operations acknowledged since the last checkpoint would be lost. Put the
    /// log back, or accept the loss: [`Builder::accept_log_loss`](crate::Builder::accept_log_loss)
    /// or `idemstore recover --accept-loss PATH`.
    #[error(
        "store {store} was not closed cleanly and its log {log} {reason}: the operations \
         acknowledged since its last checkpoint are only in its own log, so it refuses to open. \
         Put the store's own log back at {log}; or, to accept losing them, open with \
         Builder::accept_log_loss(true) or run `idemstore recover --accept-loss {store}`"
    )]
    LostLog {
        /// The store file.
        store: PathBuf,
        /// The log file.
        log: PathBuf,
        /// What is wrong with the log.
        reason: String,
    },
    /// Reading, creating, replaying into or compacting the files failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl OpenError {
    /// As [`StorageError::io_kind`] for [`OpenError::Storage`]; `None` otherwise.
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            OpenError::Storage(e) => e.io_kind(),
            _ => None,
        }
    }
}

/// Everything that can go wrong in idemstore: the umbrella for callers who want one type.
/// Each narrower type converts into it with `?` and prints the same through it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A key part is empty or longer than [`Key::MAX_PART_LEN`].
    #[error(transparent)]
    InvalidKey(#[from] KeyError),
    /// A result is larger than the store's limit ([`Builder::max_result_len`](crate::Builder::max_result_len)).
    #[error(
        "result for key {key} is {len} bytes; the store's limit (max_result_len) is {limit} bytes"
    )]
    ResultTooLarge {
        /// The key being completed.
        key: Key,
        /// The result's length in bytes.
        len: usize,
        /// The configured limit.
        limit: usize,
    },
    /// A review note is longer than [`Key::MAX_NOTE_LEN`](crate::Key::MAX_NOTE_LEN).
    #[error(
        "review note for key {key} is {len} bytes; the limit is {} bytes",
        Key::MAX_NOTE_LEN
    )]
    NoteTooLarge {
        /// The key being marked.
        key: Key,
        /// The note's length in bytes.
        len: usize,
    },
    /// The caller's lease no longer owns the key; nothing was changed.
    #[error("lease on key {key} with token {token} is lost: {reason}; nothing was changed")]
    LeaseLost {
        /// The key.
        key: Key,
        /// The caller's token.
        token: u64,
        /// What holds the key now.
        reason: LeaseLostReason,
    },
    /// [`Store::resolve`](crate::Store::resolve) was called on a key that is neither marked
    /// for review nor stale.
    #[error(
        "key {key} cannot be resolved: {reason}; only a key marked for review or a stale \
         reservation can; nothing was changed"
    )]
    NotResolvable {
        /// The key.
        key: Key,
        /// What the key holds instead.
        reason: &'static str,
    },
    /// [`Store::expire`](crate::Store::expire) found the key held by a live lease: a worker
    /// is doing the work now. Nothing was changed; force it with
    /// [`Store::expire_forced`](crate::Store::expire_forced) to take the key from the holder.
    #[error(
        "key {key} is held by a live lease until {}; nothing was changed; force the expiry to \
         take the key from its holder (its later complete and extend then fail with \"lease \
         lost\")",
        crate::clock::describe_millis(crate::clock::to_millis(*lease_until))
    )]
    LeaseLive {
        /// The key.
        key: Key,
        /// When the holder's lease ends (it may still be extended).
        lease_until: std::time::SystemTime,
    },
    /// A store's admin socket refused a request of an
    /// [`AdminClient`](crate::admin::AdminClient); nothing was changed unless the message
    /// says otherwise.
    #[error("{message} (answered by the store's admin socket {})", socket.display())]
    Admin {
        /// The socket.
        socket: PathBuf,
        /// The store's own error message.
        message: String,
    },
    /// The closure passed to [`Store::complete_with`](crate::Store::complete_with) returned an
    /// error; its transaction was rolled back and the key is still pending.
    #[error("complete_with callback failed, transaction rolled back")]
    Callback {
        /// The closure's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A cluster-backed store (feature `etcd`) got no definite answer (unreachable, no
    /// leader, refused) within its operation deadline.
    #[error("cluster error while {context}")]
    Cluster {
        /// What was being done, naming the key when there is one, and whether a write may
        /// have landed.
        context: String,
        /// The client's last error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A database-backed store (feature `postgres`) got no definite answer (unreachable,
    /// restarting, a refused statement) within its operation deadline.
    #[error("PostgreSQL error while {context}")]
    Database {
        /// What was being done, naming the key when there is one, and whether a write may
        /// have landed.
        context: String,
        /// The client's last error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A write, `checkpoint`, `sweep`, `stale` or an inspection was called inside a
    /// [`Store::complete_with`](crate::Store::complete_with) closure, which holds the writer.
    #[error(
        "a store operation that needs the writer was called from inside a complete_with \
         closure, which runs while the writer is held; reads work there, do the rest after \
         complete_with returns"
    )]
    Reentrant,
    /// A store could not be opened, or a remote store's builder refused a setting.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The storage failed, holds damaged bytes, or the store is poisoned.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl Error {
    /// As [`StorageError::io_kind`]: a full disk is [`std::io::ErrorKind::StorageFull`].
    ///
    /// ```
    /// use idemstore::{Error, StorageError};
    ///
    /// let full = Error::from(StorageError::Poisoned {
    ///     cause: "writing the log: no space left on device".into(),
    ///     io_kind: Some(std::io::ErrorKind::StorageFull),
    /// });
    /// assert_eq!(full.io_kind(), Some(std::io::ErrorKind::StorageFull));
    /// ```
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            Error::Open(e) => e.io_kind(),
            Error::Storage(e) => e.io_kind(),
            _ => None,
        }
    }
}

/// A `Result` with idemstore's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `error`'s message and each of its causes, `": "` between them, where it is kept as text (a
/// poisoned store's latched cause, an admin socket's answer).
pub(crate) fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        text.push_str(": ");
        text.push_str(&next.to_string());
        cause = next.source();
    }
    text
}
