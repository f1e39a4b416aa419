//! Error types. Outcomes such as "in progress" or "mismatch" are not errors: they are
//! [`Reservation`](crate::Reservation) values. Errors are bad input, lost ownership, I/O,
//! corruption and a poisoned store.
//!
//! Each message says what failed and names the file, key or limit; the error that caused it
//! (an operating-system error, redb's, a cluster client's) is not repeated in the message but
//! returned by [`source()`](std::error::Error::source), so a reporter that walks the chain
//! (anyhow's `{:#}`, eyre, `idemstore` on the command line) prints each cause once:
//!
//! ```
//! use std::error::Error as _;
//!
//! # let dir = tempfile::tempdir()?;
//! let Err(error) = idemstore::Store::open(dir.path()) else { unreachable!("a directory") };
//! let mut line = error.to_string();
//! let mut cause = error.source();
//! while let Some(next) = cause {
//!     line = format!("{line}: {next}");
//!     cause = next.source();
//! }
//! println!("{line}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Two types, as redb keeps `DatabaseError` (opening) apart from `StorageError` (operating):
//! [`OpenError`], the only ways opening a local store can fail, and [`Error`], the umbrella
//! every operation returns. Every `OpenError` converts into the `Error` variant of the same
//! name with the same message, so `?` on an open in a function returning [`Result`] works.

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
    /// open that fails on a full disk is an I/O error of that kind, naming the store and the
    /// room the same way ([`OpenError::Io`], converted).
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
            Error::InvalidConfig { setting, reason } => text::invalid_config(f, setting, reason),
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
            Error::AlreadyOpen { path } => text::already_open(f, path),
            Error::NotAStore { path, reason } => text::not_a_store(f, path, reason),
            Error::Io { context, .. } => text::io(f, context),
            Error::Storage { context, .. } => text::storage(f, context),
            Error::Corruption { location, reason } => text::corruption(f, location, reason),
            Error::Poisoned { cause, .. } => write!(
                f,
                "store is poisoned after an earlier failed write ({cause}); reopen it to recover"
            ),
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
            Error::ForeignLog { store, log, reason } => text::foreign_log(f, store, log, reason),
            Error::LostLog { store, log, reason } => text::lost_log(f, store, log, reason),
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

/// Why a local store could not be opened: what [`Store::open`](crate::Store::open), the
/// [`Builder`](crate::Builder)'s opens, [`open_redb`](crate::open_redb),
/// [`open_redb_read_only`](crate::open_redb_read_only) and [`compact`](crate::compact)
/// return. It holds only the ways opening can fail; the operations of an open store return
/// [`Error`].
///
/// Every variant converts into the [`Error`] variant of the same name, with the same fields
/// and the same message, so a function returning [`Result`] opens with `?`:
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
    /// A builder setting is out of range ([`Error::InvalidConfig`]).
    InvalidConfig {
        /// The setting's name.
        setting: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// Another process (or another `Store` in this one) has the file open
    /// ([`Error::AlreadyOpen`]).
    AlreadyOpen {
        /// The store file.
        path: PathBuf,
    },
    /// The file exists but is not an idemstore store (a directory, another program's file,
    /// a store written by an unknown format version, or one whose redb structure is damaged).
    /// The file was not modified ([`Error::NotAStore`]).
    NotAStore {
        /// The file.
        path: PathBuf,
        /// Why it was refused.
        reason: String,
    },
    /// The log next to the store file cannot be shown to be the store's own; nothing was
    /// replayed and both files were left untouched ([`Error::ForeignLog`], which says more).
    ForeignLog {
        /// The store file.
        store: PathBuf,
        /// The log file.
        log: PathBuf,
        /// What is wrong with the log.
        reason: String,
    },
    /// The store was not closed cleanly and its log is missing, empty, truncated or another
    /// store's, so it refuses to open ([`Error::LostLog`], which says what to do).
    LostLog {
        /// The store file.
        store: PathBuf,
        /// The log file.
        log: PathBuf,
        /// What is wrong with the log.
        reason: String,
    },
    /// An operating-system I/O error, with what was being done, naming the file
    /// ([`Error::Io`]). On a full disk ([`io_kind`](OpenError::io_kind) is
    /// [`std::io::ErrorKind::StorageFull`]) it says how much room the open needs.
    Io {
        /// What failed, naming the file.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// An error from the redb storage layer while reading, replaying into or compacting the
    /// file ([`Error::Storage`]).
    Storage {
        /// What was being done.
        context: &'static str,
        /// The underlying error.
        source: Box<redb::Error>,
    },
    /// Stored bytes failed their checksum or do not decode: a block of the store file (naming
    /// the file and the offset), a frame of the log, or a record ([`Error::Corruption`]).
    Corruption {
        /// Where: a file offset, a log frame or the key of a record.
        location: String,
        /// What is wrong.
        reason: String,
    },
}

impl OpenError {
    /// The kind of the operating-system I/O error behind this error, if there is one, as
    /// [`Error::io_kind`]. A full disk is [`std::io::ErrorKind::StorageFull`].
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            OpenError::Io { source, .. } => Some(source.kind()),
            OpenError::Storage { source, .. } => match source.as_ref() {
                redb::Error::Io(e) => Some(e.kind()),
                _ => None,
            },
            _ => None,
        }
    }

    /// A storage error from redb while opening, doing `context`: as [`Error::storage`], a block
    /// that failed its checksum is [`OpenError::Corruption`] naming the file and the offset.
    pub(crate) fn storage(context: &'static str, source: impl Into<redb::Error>) -> OpenError {
        let source = source.into();
        if let redb::Error::Io(e) = &source {
            if let Some(damage) = Damage::of(e) {
                return damage.to_open_error(context);
            }
        }
        OpenError::Storage {
            context,
            source: Box::new(source),
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> OpenError {
        OpenError::Io {
            context: context.into(),
            source,
        }
    }

    /// The error of a helper the open path shares with the operations (the tables and expiry
    /// windows, recovery, starting the engine's threads), which speaks [`Error`].
    ///
    /// Total and exhaustive (no wildcard: a new `Error` variant must be placed here). The
    /// variants opening can meet keep their name and fields, so converting back
    /// (`From<OpenError> for Error`) gives the error the helper returned. The others cannot
    /// come out of an open, for the reason written beside each, and are mapped to the nearest
    /// honest variant, keeping their message.
    pub(crate) fn from_shared(error: Error) -> OpenError {
        match error {
            Error::InvalidConfig { setting, reason } => {
                OpenError::InvalidConfig { setting, reason }
            }
            Error::AlreadyOpen { path } => OpenError::AlreadyOpen { path },
            Error::NotAStore { path, reason } => OpenError::NotAStore { path, reason },
            Error::ForeignLog { store, log, reason } => {
                OpenError::ForeignLog { store, log, reason }
            }
            Error::LostLog { store, log, reason } => OpenError::LostLog { store, log, reason },
            Error::Io { context, source } => OpenError::Io { context, source },
            Error::Storage { context, source } => OpenError::Storage { context, source },
            Error::Corruption { location, reason } => OpenError::Corruption { location, reason },
            // Opening takes no key, result, note or lease from a caller: every key it meets
            // is read from the file or the log. One of these could only describe stored bytes
            // that are not what the store writes, which is corruption.
            e @ (Error::InvalidKey { .. }
            | Error::ResultTooLarge { .. }
            | Error::NoteTooLarge { .. }
            | Error::LeaseLost { .. }
            | Error::NotResolvable { .. }
            | Error::LeaseLive { .. }) => OpenError::Corruption {
                location: "the store's records".into(),
                reason: e.to_string(),
            },
            // The latch is set by a failed write or sync of a running writer; the open path's
            // own writes fail as `Io` or `Storage` before any writer runs. Its I/O kind is kept.
            e @ Error::Poisoned { .. } => OpenError::Io {
                context: "opening the store".into(),
                source: std::io::Error::new(e.io_kind().unwrap_or(std::io::ErrorKind::Other), e),
            },
            // Opening calls no admin client, runs no `complete_with` closure (so no callback
            // error and no re-entry into the writer) and talks to no cluster or database. Kept
            // whole as the source of an I/O error of kind `Other`.
            e @ (Error::Admin { .. }
            | Error::Callback { .. }
            | Error::Cluster { .. }
            | Error::Database { .. }
            | Error::Reentrant) => OpenError::Io {
                context: "opening the store".into(),
                source: std::io::Error::other(e),
            },
        }
    }
}

impl From<OpenError> for Error {
    /// The [`Error`] variant of the same name, with the same fields and message.
    fn from(error: OpenError) -> Error {
        match error {
            OpenError::InvalidConfig { setting, reason } => {
                Error::InvalidConfig { setting, reason }
            }
            OpenError::AlreadyOpen { path } => Error::AlreadyOpen { path },
            OpenError::NotAStore { path, reason } => Error::NotAStore { path, reason },
            OpenError::ForeignLog { store, log, reason } => {
                Error::ForeignLog { store, log, reason }
            }
            OpenError::LostLog { store, log, reason } => Error::LostLog { store, log, reason },
            OpenError::Io { context, source } => Error::Io { context, source },
            OpenError::Storage { context, source } => Error::Storage { context, source },
            OpenError::Corruption { location, reason } => Error::Corruption { location, reason },
        }
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::InvalidConfig { setting, reason } => {
                text::invalid_config(f, setting, reason)
            }
            OpenError::AlreadyOpen { path } => text::already_open(f, path),
            OpenError::NotAStore { path, reason } => text::not_a_store(f, path, reason),
            OpenError::ForeignLog { store, log, reason } => {
                text::foreign_log(f, store, log, reason)
            }
            OpenError::LostLog { store, log, reason } => text::lost_log(f, store, log, reason),
            OpenError::Io { context, .. } => text::io(f, context),
            OpenError::Storage { context, .. } => text::storage(f, context),
            OpenError::Corruption { location, reason } => text::corruption(f, location, reason),
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::Io { source, .. } => Some(source),
            OpenError::Storage { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

/// The messages of the variants [`Error`] and [`OpenError`] share, written once so that a
/// converted error reads the same.
mod text {
    use std::fmt::{Formatter, Result};
    use std::path::Path;

    pub(super) fn invalid_config(f: &mut Formatter<'_>, setting: &str, reason: &str) -> Result {
        write!(f, "invalid setting {setting}: {reason}")
    }

    pub(super) fn already_open(f: &mut Formatter<'_>, path: &Path) -> Result {
        write!(
            f,
            "store {} is already open in another process or Store handle; one process owns a store file",
            path.display()
        )
    }

    pub(super) fn not_a_store(f: &mut Formatter<'_>, path: &Path, reason: &str) -> Result {
        write!(
            f,
            "{} is not an idemstore store ({reason}); the file was left untouched",
            path.display()
        )
    }

    pub(super) fn io(f: &mut Formatter<'_>, context: &str) -> Result {
        f.write_str(context)
    }

    pub(super) fn storage(f: &mut Formatter<'_>, context: &str) -> Result {
        write!(f, "storage error while {context}")
    }

    pub(super) fn corruption(f: &mut Formatter<'_>, location: &str, reason: &str) -> Result {
        write!(f, "corruption detected in {location}: {reason}")
    }

    pub(super) fn foreign_log(
        f: &mut Formatter<'_>,
        store: &Path,
        log: &Path,
        reason: &str,
    ) -> Result {
        write!(
            f,
            "log {} cannot be shown to belong to store {} ({reason}); nothing was replayed and \
             both files were left untouched: if the log is not needed, move it away and open \
             again; if the store was restored from a backup, put back the log that was saved \
             with it",
            log.display(),
            store.display()
        )
    }

    pub(super) fn lost_log(
        f: &mut Formatter<'_>,
        store: &Path,
        log: &Path,
        reason: &str,
    ) -> Result {
        write!(
            f,
            "store {} was not closed cleanly and its log {} {reason}: the operations \
             acknowledged since its last checkpoint are only in its own log, so it refuses to \
             open. Put the store's own log back at {}; or, to accept losing them, open with \
             Builder::accept_log_loss(true) or run `idemstore recover --accept-loss {}`",
            store.display(),
            log.display(),
            log.display(),
            store.display()
        )
    }
}

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
        let (location, reason) = self.describe(doing);
        Error::Corruption { location, reason }
    }

    /// The error an open gets, met while `doing`: the same as [`Damage::to_error`].
    pub(crate) fn to_open_error(&self, doing: &str) -> OpenError {
        let (location, reason) = self.describe(doing);
        OpenError::Corruption { location, reason }
    }

    /// The location and reason of the corruption error, met while `doing`.
    fn describe(&self, doing: &str) -> (String, String) {
        (
            format!("store {} at offset {}", self.file, self.offset),
            format!("{} (met while {doing})", self.reason),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails when a message repeats the message of its source: a reporter that walks
    /// `source()` (anyhow's `{:#}`) would print that cause twice.
    #[track_caller]
    fn each_cause_once(error: &dyn std::error::Error) {
        let mut outer = error;
        let mut depth = 0;
        while let Some(source) = outer.source() {
            let (message, cause) = (outer.to_string(), source.to_string());
            assert!(
                !message.contains(&cause),
                "{message:?} repeats its source {cause:?}"
            );
            (outer, depth) = (source, depth + 1);
        }
        assert!(depth < 8, "a chain of {depth} causes");
    }

    /// Every kind of error, with a source wherever the kind has one: each cause is printed
    /// once, by the message or by `source()`, never both; the chain as one line holds them all.
    #[test]
    fn every_error_kind_prints_each_cause_once() {
        let io = || std::io::Error::new(std::io::ErrorKind::IsADirectory, "Is a directory");
        let boxed = || -> Box<dyn std::error::Error + Send + Sync> { Box::new(io()) };
        let path = || PathBuf::from("store.idem");
        let key = || Key::new("u", "op", "id").expect("a key");
        let errors = vec![
            Error::InvalidKey {
                part: KeyPart::Id,
                len: 0,
            },
            Error::ResultTooLarge {
                key: key(),
                len: 2,
                limit: 1,
            },
            Error::NoteTooLarge {
                key: key(),
                len: 9000,
            },
            Error::InvalidConfig {
                setting: "lease",
                reason: "zero".into(),
            },
            Error::LeaseLost {
                key: key(),
                token: 1,
                reason: LeaseLostReason::Gone,
            },
            Error::NotResolvable {
                key: key(),
                reason: "completed",
            },
            Error::LeaseLive {
                key: key(),
                lease_until: std::time::UNIX_EPOCH,
            },
            Error::Admin {
                socket: path(),
                message: "refused".into(),
            },
            Error::AlreadyOpen { path: path() },
            Error::NotAStore {
                path: path(),
                reason: "it is a directory".into(),
            },
            Error::io("reading store.idem", io()),
            Error::Storage {
                context: "compacting the store file",
                source: Box::new(redb::Error::Io(io())),
            },
            Error::Corruption {
                location: "record u/op/id".into(),
                reason: "checksum".into(),
            },
            Error::Poisoned {
                cause: with_causes(&Error::io("writing", io())),
                io_kind: None,
            },
            Error::Callback { source: boxed() },
            Error::Cluster {
                context: "reserving u/op/id".into(),
                source: boxed(),
            },
            Error::Database {
                context: "reserving u/op/id".into(),
                source: boxed(),
            },
            Error::Reentrant,
            Error::ForeignLog {
                store: path(),
                log: path(),
                reason: "damaged".into(),
            },
            Error::LostLog {
                store: path(),
                log: path(),
                reason: "is missing".into(),
            },
        ];
        for error in errors {
            each_cause_once(&error);
            if std::error::Error::source(&error).is_some() {
                assert!(with_causes(&error).ends_with("Is a directory"), "{error:?}");
            }
            // Its open-side twin (or what opening maps it to) too.
            each_cause_once(&OpenError::from_shared(error));
        }
        // The poisoned store's cause keeps the whole chain as text.
        let poisoned = crate::state::error_copy(&Error::io("writing the log", io()));
        assert!(
            poisoned
                .to_string()
                .contains("writing the log: Is a directory"),
            "{poisoned}"
        );
    }

    /// `OpenError::from_shared` keeps every variant opening can meet, and converting back gives
    /// the error the helper returned; the others keep their message, in the chain.
    #[test]
    fn from_shared_keeps_what_opening_meets() {
        let path = || PathBuf::from("store.idem");
        let kept = vec![
            Error::InvalidConfig {
                setting: "lease",
                reason: "must be at least 1 ms".into(),
            },
            Error::AlreadyOpen { path: path() },
            Error::NotAStore {
                path: path(),
                reason: "it is a directory".into(),
            },
            Error::ForeignLog {
                store: path(),
                log: PathBuf::from("store.idem.wal"),
                reason: "damaged".into(),
            },
            Error::LostLog {
                store: path(),
                log: PathBuf::from("store.idem.wal"),
                reason: "is missing".into(),
            },
            Error::io(
                "opening store store.idem",
                std::io::ErrorKind::StorageFull.into(),
            ),
            Error::Storage {
                context: "replaying the log",
                source: Box::new(redb::Error::Corrupted("a page".into())),
            },
            Error::Corruption {
                location: "log frame seq 3".into(),
                reason: "a logged record does not decode".into(),
            },
        ];
        for error in kept {
            let (debug, text, kind) = (format!("{error:?}"), error.to_string(), error.io_kind());
            let open = OpenError::from_shared(error);
            assert_eq!(open.to_string(), text);
            assert_eq!(open.io_kind(), kind);
            assert_eq!(
                format!("{:?}", Error::from(open)),
                debug,
                "a round trip keeps it"
            );
        }
        let others = vec![
            Error::Reentrant,
            Error::Poisoned {
                cause: "writing the log: no space left on device".into(),
                io_kind: Some(std::io::ErrorKind::StorageFull),
            },
            Error::InvalidKey {
                part: KeyPart::Id,
                len: 0,
            },
        ];
        for error in others {
            let text = error.to_string();
            let open = OpenError::from_shared(error);
            let chain = with_causes(&open);
            assert!(chain.contains(&text), "{chain} keeps {text}");
        }
    }
}
