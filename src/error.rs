//! Error types. Outcomes such as "in progress" or "mismatch" are not errors: they are
//! [`Reservation`](crate::Reservation) values. Errors are bad input, lost ownership, I/O,
//! corruption and a poisoned store.

use std::fmt;
use std::path::PathBuf;

use crate::key::Key;

/// Which part of a [`Key`] an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyPart {
    /// The scope (who).
    Scope,
    /// The operation (what).
    Operation,
    /// The client's id.
    Id,
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyPart::Scope => "scope",
            KeyPart::Operation => "operation",
            KeyPart::Id => "id",
        })
    }
}

/// What a lease holder found in place of its own pending reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseLostReason {
    /// Another caller took the stale reservation over with a newer token.
    TakenOver {
        /// The token that now holds the key.
        by_token: u64,
    },
    /// The key is already completed (by this lease or another).
    Completed {
        /// The token of the lease that completed it.
        by_token: u64,
    },
    /// The key is parked for review.
    NeedsReview,
    /// The key is no longer stored: released, or expired and swept.
    Gone,
}

impl fmt::Display for LeaseLostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseLostReason::TakenOver { by_token } => {
                write!(f, "the reservation was taken over by token {by_token}")
            }
            LeaseLostReason::Completed { by_token } => {
                write!(f, "the key was already completed by token {by_token}")
            }
            LeaseLostReason::NeedsReview => f.write_str("the key is marked for review"),
            LeaseLostReason::Gone => f.write_str("the key is no longer reserved"),
        }
    }
}

/// Everything that can go wrong in idemstore.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A key part is empty or longer than [`Key::MAX_PART_LEN`].
    InvalidKey {
        /// The offending part.
        part: KeyPart,
        /// Its length in bytes.
        len: usize,
    },
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
    /// A builder setting is out of range.
    InvalidConfig {
        /// The setting's name.
        setting: &'static str,
        /// Why it was refused.
        reason: String,
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
    /// Another process (or another `Store` in this one) has the file open.
    AlreadyOpen {
        /// The store file.
        path: PathBuf,
    },
    /// The file exists but is not an idemstore store (a directory, another program's file,
    /// or a store written by an unknown format version). The file was not modified.
    NotAStore {
        /// The file.
        path: PathBuf,
        /// Why it was refused.
        reason: String,
    },
    /// An operating-system I/O error, with what was being done.
    Io {
        /// What failed, naming the file.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// An error from the redb storage layer.
    Storage {
        /// What was being done.
        context: &'static str,
        /// The underlying error.
        source: Box<redb::Error>,
    },
    /// Stored bytes failed their checksum or do not decode. They are never returned as data.
    Corruption {
        /// Where: the key of a record, or a file offset.
        location: String,
        /// What is wrong.
        reason: String,
    },
    /// An earlier write or sync failed, so the store refuses all further work. Reopen the
    /// store to recover to the last durable state.
    ///
    /// Every call the failure fails gets this error, the calls whose write failed included.
    /// On a full disk ([`io_kind`](Error::io_kind) is [`std::io::ErrorKind::StorageFull`]) the
    /// cause names the store file and the free space reopening needs ("free at least N
    /// bytes"): an upper estimate, the rule `idemstore check` uses for the next checkpoint. An
    /// open that fails on a full disk is [`Error::Io`] of that kind, naming the store and the
    /// room the same way.
    Poisoned {
        /// The first failure.
        cause: String,
        /// The kind of the operating-system error behind it, when there was one: for example
        /// [`std::io::ErrorKind::StorageFull`] for a full disk (free space, then reopen).
        io_kind: Option<std::io::ErrorKind>,
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
}

impl Error {
    /// A storage error from redb while doing `context`; a block that failed its checksum in
    /// the page layer (`tree/pages.rs`) is [`Error::Corruption`] naming the file and the offset.
    pub(crate) fn storage(context: &'static str, source: impl Into<redb::Error>) -> Error {
        let source = source.into();
        if let redb::Error::Io(e) = &source {
            if let Some(damage) = Damage::of(e) {
                return damage.to_error(context);
            }
        }
        Error::Storage {
            context,
            source: Box::new(source),
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn corrupt_record(key_bytes: &[u8], reason: impl Into<String>) -> Error {
        let location = match Key::decode(key_bytes) {
            Some(key) => format!("record {key}"),
            None => format!("record with undecodable key {}", key_bytes.escape_ascii()),
        };
        Error::Corruption {
            location,
            reason: reason.into(),
        }
    }
}

impl Error {
    /// The kind of the operating-system I/O error behind this error, if there is one; for a
    /// poisoned store, that of the failure that poisoned it. A full disk is
    /// [`std::io::ErrorKind::StorageFull`].
    ///
    /// ```
    /// use idemstore::Error;
    ///
    /// let full = Error::Poisoned {
    ///     cause: "writing the log: no space left on device".into(),
    ///     io_kind: Some(std::io::ErrorKind::StorageFull),
    /// };
    /// assert_eq!(full.io_kind(), Some(std::io::ErrorKind::StorageFull));
    /// ```
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            Error::Io { source, .. } => Some(source.kind()),
            Error::Storage { source, .. } => match source.as_ref() {
                redb::Error::Io(e) => Some(e.kind()),
                _ => None,
            },
            Error::Poisoned { io_kind, .. } => *io_kind,
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidKey { part, len: 0 } => write!(f, "key {part} is empty; it needs 1 to {} bytes", Key::MAX_PART_LEN),
            Error::InvalidKey { part, len } => write!(
                f,
                "key {part} is {len} bytes; the limit is {} bytes",
                Key::MAX_PART_LEN
            ),
            Error::ResultTooLarge { key, len, limit } => write!(
                f,
                "result for key {key} is {len} bytes; the store's limit (max_result_len) is {limit} bytes"
            ),
            Error::NoteTooLarge { key, len } => write!(
                f,
                "review note for key {key} is {len} bytes; the limit is {} bytes",
                Key::MAX_NOTE_LEN
            ),
            Error::InvalidConfig { setting, reason } => {
                write!(f, "invalid setting {setting}: {reason}")
            }
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
            Error::AlreadyOpen { path } => write!(
                f,
                "store {} is already open in another process or Store handle; one process owns a store file",
                path.display()
            ),
            Error::NotAStore { path, reason } => write!(
                f,
                "{} is not an idemstore store ({reason}); the file was left untouched",
                path.display()
            ),
            Error::Io { context, source } => write!(f, "{context}: {source}"),
            Error::Storage { context, source } => write!(f, "storage error while {context}: {source}"),
            Error::Corruption { location, reason } => {
                write!(f, "corruption detected in {location}: {reason}")
            }
            Error::Poisoned { cause, .. } => write!(
                f,
                "store is poisoned after an earlier failed write ({cause}); reopen it to recover"
            ),
            Error::Callback { source } => {
                write!(f, "complete_with callback failed, transaction rolled back: {source}")
            }
            Error::Cluster { context, source } => write!(f, "cluster error while {context}: {source}"),
            Error::Database { context, source } => {
                write!(f, "PostgreSQL error while {context}: {source}")
            }
            Error::Reentrant => f.write_str(
                "a store operation that needs the writer was called from inside a complete_with \
                 closure, which runs while the writer is held; reads work there, do the rest \
                 after complete_with returns",
            ),
            Error::ForeignLog { store, log, reason } => write!(
                f,
                "log {} cannot be shown to belong to store {} ({reason}); nothing was replayed and \
                 both files were left untouched: if the log is not needed, move it away and open \
                 again; if the store was restored from a backup, put back the log that was saved \
                 with it",
                log.display(),
                store.display()
            ),
            Error::LostLog { store, log, reason } => write!(
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
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::Storage { source, .. } => Some(source.as_ref()),
            Error::Callback { source } => Some(source.as_ref()),
            Error::Cluster { source, .. } => Some(source.as_ref()),
            Error::Database { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

/// A `Result` with idemstore's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A damaged block of a store file, found by its checksum in the page layer
/// (`tree/pages.rs`); carried inside the `io::Error` redb returns.
#[derive(Debug)]
pub(crate) struct Damage {
    /// The file, as named to the user.
    pub(crate) file: String,
    /// The block's offset in the file on disk.
    pub(crate) offset: u64,
    /// What is wrong.
    pub(crate) reason: String,
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "store {} at offset {}: {}",
            self.file, self.offset, self.reason
        )
    }
}

impl std::error::Error for Damage {}

impl Damage {
    /// The damage behind `error`, if it is one.
    pub(crate) fn of(error: &std::io::Error) -> Option<&Damage> {
        error.get_ref().and_then(|e| e.downcast_ref::<Damage>())
    }

    /// The error a caller gets, met while `doing`.
    pub(crate) fn to_error(&self, doing: &str) -> Error {
        Error::Corruption {
            location: format!("store {} at offset {}", self.file, self.offset),
            reason: format!("{} (met while {doing})", self.reason),
        }
    }
}
