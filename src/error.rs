//! Error types. Outcomes such as "in progress" or "mismatch" are not errors: they are
//! [`Reservation`](crate::Reservation) values. Errors are bad input, lost ownership, I/O,
//! corruption and a poisoned store.
//!
//! Each message says what failed and names the file, key or limit; the error that caused it
//! (an operating-system error, redb's, a cluster client's) is not repeated in the message but
//! returned by [`source()`](std::error::Error::source), so a reporter that walks the chain
//! (anyhow's `{:#}`, eyre, `idemstore` on the command line) prints each cause once.
//!
//! As in redb, one core, [`StorageError`] (I/O naming the file, redb's own error, corruption
//! naming where, a poisoned store), is wrapped once by each narrower type: [`OpenError`], the
//! only ways opening a local store can fail, and [`KeyError`], a key's validation. [`Error`]
//! is the umbrella every operation returns. Conversions only go up (`?` turns each into
//! [`Error`]), and a wrapped error prints as itself: its message and its causes, once.

use std::fmt;
use std::path::PathBuf;

pub(crate) use crate::answers::LeaseLostReason;
use crate::key::{Key, KeyError};

/// The core every other error type wraps: the storage under a store failed, or holds bytes
/// that are not what the store writes. redb's `StorageError` plays the same part.
#[derive(Debug)]
#[non_exhaustive]
pub enum StorageError {
    /// An operating-system I/O error, with what was being done. On a full disk
    /// ([`io_kind`](StorageError::io_kind) is [`std::io::ErrorKind::StorageFull`]) an open
    /// says how much room it needs.
    Io {
        /// What failed, naming the file.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// An error from the redb storage layer.
    Redb {
        /// What was being done.
        context: &'static str,
        /// The underlying error.
        source: Box<redb::Error>,
    },
    /// Stored bytes failed their checksum or do not decode: a block of the store file (naming
    /// the file and the offset), a frame of the log, or a record. They are never returned as
    /// data.
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
    Poisoned {
        /// The first failure.
        cause: String,
        /// The kind of the operating-system error behind it, when there was one: for example
        /// [`std::io::ErrorKind::StorageFull`] for a full disk (free space, then reopen).
        io_kind: Option<std::io::ErrorKind>,
    },
}

impl StorageError {
    /// The kind of the operating-system I/O error behind this error, if there is one; for a
    /// poisoned store, that of the failure that poisoned it. A full disk is
    /// [`std::io::ErrorKind::StorageFull`].
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

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageError::Io { context, .. } => f.write_str(context),
            StorageError::Redb { context, .. } => write!(f, "storage error while {context}"),
            StorageError::Corruption { location, reason } => {
                write!(f, "corruption detected in {location}: {reason}")
            }
            StorageError::Poisoned { cause, .. } => write!(
                f,
                "store is poisoned after an earlier failed write ({cause}); reopen it to recover"
            ),
        }
    }
}

impl std::error::Error for StorageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StorageError::Io { source, .. } => Some(source),
            StorageError::Redb { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

/// Why a local store could not be opened: what [`Store::open`](crate::Store::open), the
/// [`Builder`](crate::Builder)'s opens, [`open_redb`](crate::open_redb),
/// [`open_redb_read_only`](crate::open_redb_read_only) and [`compact`](crate::compact)
/// return, and the settings a remote store refuses when it is built. It converts into
/// [`Error::Open`], so a function returning [`Result`] opens with `?`:
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
#[derive(Debug)]
#[non_exhaustive]
pub enum OpenError {
    /// A builder setting is out of range.
    InvalidConfig {
        /// The setting's name.
        setting: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// Another process (or another `Store` in this one) has the file open.
    AlreadyOpen {
        /// The store file.
        path: PathBuf,
    },
    /// The file exists but is not an idemstore store (a directory, another program's file,
    /// a store written by an unknown format version, or one whose redb structure is damaged).
    /// The file was not modified.
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
    ForeignLog {
        /// The store file.
        store: PathBuf,
        /// The log file.
        log: PathBuf,
        /// What is wrong with the log.
        reason: String,
    },
    /// The store was not closed cleanly and its log is missing, empty, truncated or another
    /// store's: what the log held since the last checkpoint (acknowledged operations) would be
    /// lost, so the store refuses to open. Put the store's own log back; or, accepting the
    /// loss, open with [`Builder::accept_log_loss`](crate::Builder::accept_log_loss) or run
    /// `idemstore recover --accept-loss PATH`.
    LostLog {
        /// The store file.
        store: PathBuf,
        /// The log file.
        log: PathBuf,
        /// What is wrong with the log.
        reason: String,
    },
    /// Reading, creating, replaying into or compacting the files failed.
    Storage(StorageError),
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

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::InvalidConfig { setting, reason } => {
                write!(f, "invalid setting {setting}: {reason}")
            }
            OpenError::AlreadyOpen { path } => write!(
                f,
                "store {} is already open in another process or Store handle; one process owns a store file",
                path.display()
            ),
            OpenError::NotAStore { path, reason } => write!(
                f,
                "{} is not an idemstore store ({reason}); the file was left untouched",
                path.display()
            ),
            OpenError::ForeignLog { store, log, reason } => write!(
                f,
                "log {} cannot be shown to belong to store {} ({reason}); nothing was replayed and \
                 both files were left untouched: if the log is not needed, move it away and open \
                 again; if the store was restored from a backup, put back the log that was saved \
                 with it",
                log.display(),
                store.display()
            ),
            OpenError::LostLog { store, log, reason } => write!(
                f,
                "store {} was not closed cleanly and its log {} {reason}: the operations \
                 acknowledged since its last checkpoint are only in its own log, so it refuses to \
                 open. Put the store's own log back at {}; or, to accept losing them, open with \
                 Builder::accept_log_loss(true) or run `idemstore recover --accept-loss {}`",
                store.display(),
                log.display(),
                log.display(),
                store.display()
            ),
            OpenError::Storage(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::Storage(e) => e.source(),
            _ => None,
        }
    }
}

impl From<StorageError> for OpenError {
    fn from(error: StorageError) -> OpenError {
        OpenError::Storage(error)
    }
}

/// Everything that can go wrong in idemstore: the umbrella for callers who want one type.
/// Each narrower type converts into it with `?` and prints the same through it.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A key part is empty or longer than [`Key::MAX_PART_LEN`].
    InvalidKey(KeyError),
    /// A result is larger than the store's limit ([`Builder::max_result_len`](crate::Builder::max_result_len)).
    ResultTooLarge {
        /// The key being completed.
        key: Key,
        /// The result's length in bytes.
        len: usize,
        /// The configured limit.
        limit: usize,
    },
    /// A review note is longer than [`Key::MAX_NOTE_LEN`](crate::Key::MAX_NOTE_LEN).
    NoteTooLarge {
        /// The key being marked.
        key: Key,
        /// The note's length in bytes.
        len: usize,
    },
    /// The caller's lease no longer owns the key; nothing was changed.
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
    NotResolvable {
        /// The key.
        key: Key,
        /// What the key holds instead.
        reason: &'static str,
    },
    /// [`Store::expire`](crate::Store::expire) found the key held by a live lease: a worker
    /// is doing the work now. Nothing was changed; force it with
    /// [`Store::expire_forced`](crate::Store::expire_forced) to take the key from the holder.
    LeaseLive {
        /// The key.
        key: Key,
        /// When the holder's lease ends (it may still be extended).
        lease_until: std::time::SystemTime,
    },
    /// A store's admin socket refused a request of an
    /// [`AdminClient`](crate::admin::AdminClient); nothing was changed unless the message
    /// says otherwise.
    Admin {
        /// The socket.
        socket: PathBuf,
        /// The store's own error message.
        message: String,
    },
    /// The closure passed to [`Store::complete_with`](crate::Store::complete_with) returned an
    /// error; its transaction was rolled back and the key is still pending.
    Callback {
        /// The closure's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A cluster-backed store (feature `etcd`) got no definite answer from the cluster: it
    /// was unreachable, had no leader, or refused the request, for longer than the store's
    /// operation deadline. For a write the error says whether it may have been applied.
    Cluster {
        /// What was being done, naming the key when there is one, and whether a write may
        /// have landed.
        context: String,
        /// The client's last error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A database-backed store (feature `postgres`) got no definite answer from PostgreSQL:
    /// it was unreachable or restarting for longer than the store's operation deadline, or it
    /// refused a statement. The context says what was being done, naming the key when there
    /// is one, and what is known about the write: that nothing was applied, or that a write
    /// whose answer was lost may or may not have been applied.
    Database {
        /// What was being done, naming the key when there is one, and whether a write may
        /// have landed.
        context: String,
        /// The client's (or the pool's) last error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A store operation that needs the writer (any write, `checkpoint`, `sweep`, `stale`,
    /// inspection) was called from inside a [`Store::complete_with`](crate::Store::complete_with)
    /// closure, which runs while the store's writer is held. Reads work there; do the rest
    /// after `complete_with` returns.
    Reentrant,
    /// A store could not be opened, or a remote store's builder refused a setting.
    Open(OpenError),
    /// The storage failed, holds damaged bytes, or the store is poisoned.
    Storage(StorageError),
}

impl Error {
    /// The kind of the operating-system I/O error behind this error, if there is one
    /// ([`StorageError::io_kind`]). A full disk is [`std::io::ErrorKind::StorageFull`].
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

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidKey(e) => e.fmt(f),
            Error::ResultTooLarge { key, len, limit } => write!(
                f,
                "result for key {key} is {len} bytes; the store's limit (max_result_len) is {limit} bytes"
            ),
            Error::NoteTooLarge { key, len } => write!(
                f,
                "review note for key {key} is {len} bytes; the limit is {} bytes",
                Key::MAX_NOTE_LEN
            ),
            Error::LeaseLost { key, token, reason } => write!(
                f,
                "lease on key {key} with token {token} is lost: {reason}; nothing was changed"
            ),
            Error::NotResolvable { key, reason } => write!(
                f,
                "key {key} cannot be resolved: {reason}; only a key marked for review or a stale reservation can; nothing was changed"
            ),
            Error::LeaseLive { key, lease_until } => write!(
                f,
                "key {key} is held by a live lease until {}; nothing was changed; force the expiry to take the key from its holder (its later complete and extend then fail with \"lease lost\")",
                crate::clock::describe_millis(crate::clock::to_millis(*lease_until))
            ),
            Error::Admin { socket, message } => {
                write!(f, "{message} (answered by the store's admin socket {})", socket.display())
            }
            Error::Callback { .. } => {
                f.write_str("complete_with callback failed, transaction rolled back")
            }
            Error::Cluster { context, .. } => write!(f, "cluster error while {context}"),
            Error::Database { context, .. } => write!(f, "PostgreSQL error while {context}"),
            Error::Reentrant => f.write_str(
                "a store operation that needs the writer was called from inside a complete_with \
                 closure, which runs while the writer is held; reads work there, do the rest \
                 after complete_with returns",
            ),
            Error::Open(e) => e.fmt(f),
            Error::Storage(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // A wrapped error is printed as itself, so its causes are its own.
            Error::Open(e) => e.source(),
            Error::Storage(e) => e.source(),
            Error::Callback { source } => Some(source.as_ref()),
            Error::Cluster { source, .. } => Some(source.as_ref()),
            Error::Database { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

impl From<KeyError> for Error {
    fn from(error: KeyError) -> Error {
        Error::InvalidKey(error)
    }
}

impl From<OpenError> for Error {
    fn from(error: OpenError) -> Error {
        Error::Open(error)
    }
}

impl From<StorageError> for Error {
    fn from(error: StorageError) -> Error {
        Error::Storage(error)
    }
}

/// A `Result` with idemstore's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `error`'s message followed by each of its causes ([`source()`](std::error::Error::source)),
/// `": "` between them: the whole story in one line, where it is kept as text (the latched
/// cause of a poisoned store, an admin socket's answer).
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
