//! Store configuration: [`Builder`] and [`Durability`]. Every default lives here.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{duration_millis, Clock, SystemClock};
use crate::error::OpenError;
use crate::key::Key;
use crate::log::LogFile;
pub use crate::state::Durability;
use crate::state::Limits;
use crate::store::Store;

/// Configures and opens a [`Store`].
///
/// ```
/// use std::time::Duration;
/// use idemstore::Store;
///
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("keys.idem");
/// let store = Store::builder()
///     .retention(Duration::from_secs(6 * 3600))
///     .lease(Duration::from_secs(30))
///     .max_result_len(64 * 1024)
///     .open(&path)?;
/// # drop(store);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Builder {
    pub(crate) retention: Duration,
    /// Per-operation retentions ([`Builder::retention_for`]).
    pub(crate) retention_by_operation: Vec<(Vec<u8>, Duration)>,
    pub(crate) lease: Duration,
    pub(crate) leases_survive_restart: bool,
    pub(crate) durability: Durability,
    pub(crate) max_result_len: usize,
    pub(crate) cache_size: usize,
    pub(crate) cache_records: usize,
    pub(crate) cache_record_bytes: usize,
    pub(crate) checkpoint_bytes: u64,
    pub(crate) checkpoint_interval: Duration,
    pub(crate) sweep_interval: Option<Duration>,
    pub(crate) preallocate_log: bool,
    pub(crate) verify_on_open: bool,
    pub(crate) accept_log_loss: bool,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) limits: Limits,
    /// The admin socket ([`Builder::admin_socket`]).
    pub(crate) admin_socket: AdminSocket,
    /// The mode of the files the store creates ([`Builder::file_mode`]).
    pub(crate) file_mode: u32,
    /// Whether the store file has the checksummed page layer (always, except for the
    /// benchmark-only `Builder::__without_page_checksums`).
    pub(crate) page_checksums: bool,
    /// Whether the engine's background work runs only when a test asks for it (the hidden
    /// `Builder::__manual_background`).
    pub(crate) manual_background: bool,
}

/// Whether and how a store serves its admin socket; see [`Builder::admin_socket`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdminSocket {
    /// No socket: only the owning process can look at the store.
    Off,
    /// Serve stats, get and list (the default).
    #[default]
    ReadOnly,
    /// Also serve expire, resolve, sweep and checkpoint.
    ReadWrite,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            retention: Self::DEFAULT_RETENTION,
            retention_by_operation: Vec::new(),
            lease: Self::DEFAULT_LEASE,
            leases_survive_restart: false,
            durability: Durability::default(),
            max_result_len: Self::DEFAULT_MAX_RESULT_LEN,
            cache_size: Self::DEFAULT_CACHE_SIZE,
            cache_records: Self::DEFAULT_CACHE_RECORDS,
            cache_record_bytes: Self::DEFAULT_CACHE_RECORD_BYTES,
            checkpoint_bytes: Self::DEFAULT_CHECKPOINT_BYTES,
            checkpoint_interval: Self::DEFAULT_CHECKPOINT_INTERVAL,
            sweep_interval: Some(Self::DEFAULT_SWEEP_INTERVAL),
            preallocate_log: true,
            verify_on_open: false,
            accept_log_loss: false,
            clock: Arc::new(SystemClock),
            limits: Limits::default(),
            admin_socket: AdminSocket::ReadOnly,
            file_mode: Self::DEFAULT_FILE_MODE,
            page_checksums: true,
            manual_background: false,
        }
    }
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("retention", &self.retention)
            .field("retention_by_operation", &self.retention_by_operation)
            .field("lease", &self.lease)
            .field("leases_survive_restart", &self.leases_survive_restart)
            .field("durability", &self.durability)
            .field("max_result_len", &self.max_result_len)
            .field("cache_size", &self.cache_size)
            .field("cache_records", &self.cache_records)
            .field("cache_record_bytes", &self.cache_record_bytes)
            .field("checkpoint_bytes", &self.checkpoint_bytes)
            .field("checkpoint_interval", &self.checkpoint_interval)
            .field("sweep_interval", &self.sweep_interval)
            .field("preallocate_log", &self.preallocate_log)
            .field("verify_on_open", &self.verify_on_open)
            .field("accept_log_loss", &self.accept_log_loss)
            .field("admin_socket", &self.admin_socket)
            .field("file_mode", &format_args!("{:#o}", self.file_mode))
            .finish_non_exhaustive()
    }
}

impl Builder {
    // The defaults and limits of the settings.
    /// Default for [`Builder::retention`]: 24 hours, as long as Stripe keeps keys.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
    /// Default for [`Builder::lease`]: 60 seconds.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
    /// Default for [`Builder::max_result_len`]: 1 MiB.
    pub const DEFAULT_MAX_RESULT_LEN: usize = 1 << 20;
    /// The largest value [`Builder::max_result_len`] accepts: 256 MiB.
    pub const MAX_RESULT_LEN_LIMIT: usize = 256 << 20;
    /// Default for [`Builder::cache_size`]: 64 MiB.
    pub const DEFAULT_CACHE_SIZE: usize = 64 << 20;
    /// Default for [`Builder::cache_records`]: 65 536 records.
    pub const DEFAULT_CACHE_RECORDS: usize = 1 << 16;
    /// Default for [`Builder::cache_record_bytes`]: 64 MiB.
    pub const DEFAULT_CACHE_RECORD_BYTES: usize = 64 << 20;
    /// Default for [`Builder::checkpoint_bytes`]: 32 MiB of log.
    pub const DEFAULT_CHECKPOINT_BYTES: u64 = 32 << 20;
    /// Default for [`Builder::checkpoint_interval`]: 30 seconds.
    pub const DEFAULT_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(30);
    /// Default for [`Builder::sweep_interval`]: the background sweeper looks for expired records
    /// every second.
    pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(1);
    /// Default for [`Builder::file_mode`]: 0600, read and write for the owning user only.
    pub const DEFAULT_FILE_MODE: u32 = 0o600;

    /// A builder with every default.
    pub fn new() -> Builder {
        Builder::default()
    }

    /// How long a completed key is kept and its result replayed; afterwards the key reads as
    /// absent and the next request acquires it afresh. Also how long an abandoned reservation
    /// is kept after its lease ran out. At least 1 ms. Default =
    /// [`Builder::DEFAULT_RETENTION`] (24 h).
    pub fn retention(&mut self, retention: Duration) -> &mut Self {
        self.retention = retention;
        self
    }

    /// How long completed keys of `operation` (the middle part of a [`Key`](crate::Key)) are kept,
    /// instead of [`retention`](Builder::retention): payments for days, a dedup window for
    /// minutes. Also how long an abandoned reservation of that operation is kept after its
    /// lease ran out. Setting an operation again replaces its retention. At least 1 ms.
    /// Default = none: every operation uses [`retention`](Builder::retention).
    ///
    /// Each record carries its own deadline, written when it is completed; changing the
    /// setting later does not move the deadline of keys already completed.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idemstore::{Fingerprint, Key, Reservation, Store};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::builder()
    ///     .retention(Duration::from_secs(24 * 3600))
    ///     .retention_for("POST /charges", Duration::from_secs(7 * 24 * 3600))
    ///     .retention_for("consume", Duration::from_secs(5 * 60))
    ///     .open(dir.path().join("keys.idem"))?;
    /// let key = Key::new("user-7", "POST /charges", "k1")?;
    /// let Reservation::Acquired(lease) = store.reserve(&key, Fingerprint::of(b"amount=5"))? else {
    ///     unreachable!("a fresh key is acquired")
    /// };
    /// store.complete(&lease, b"201".to_vec())?;
    /// let Reservation::Completed(done) = store.reserve(&key, Fingerprint::of(b"amount=5"))? else {
    ///     unreachable!("a completed key is replayed")
    /// };
    /// let kept = done.expires_at.duration_since(done.completed_at)?;
    /// assert_eq!(kept, Duration::from_secs(7 * 24 * 3600));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn retention_for(&mut self, operation: impl AsRef<[u8]>, retention: Duration) -> &mut Self {
        let operation = operation.as_ref().to_vec();
        self.retention_by_operation
            .retain(|(name, _)| *name != operation);
        self.retention_by_operation.push((operation, retention));
        self
    }

    /// How long an acquisition owns a key before it goes stale and the next reserve may take it
    /// over. Extend it with [`Store::extend`] for long work. At least 1 ms.
    /// Default = [`Builder::DEFAULT_LEASE`] (60 s).
    pub fn lease(&mut self, lease: Duration) -> &mut Self {
        self.lease = lease;
        self
    }

    /// Whether a lease granted before the store was last opened lasts its full time.
    /// Default = `false`: leases end with their process.
    ///
    /// One process owns a store file, so when a store is opened, every reservation still
    /// pending from before was acquired by an earlier owner (a process that died, or a
    /// [`Store`] value that was dropped). By default these reservations are stale at once:
    /// the next [`reserve`](Store::reserve) of such a key takes it over (a new token,
    /// `attempt + 1`, [`Lease::is_retry`](crate::Lease::is_retry)), [`Store::stale`] lists
    /// them, and no [`InProgress`](crate::Reservation::InProgress) answer points past the
    /// restart. A request cut by a crash then succeeds on its first retry instead of being
    /// refused for a whole lease. (The rule: fencing tokens rise across restarts, so every
    /// token below the first one this owner hands out belongs to an earlier owner.)
    ///
    /// Set `true` when work may still be running outside the process after it died: an
    /// external side effect in flight (a payment submitted to another service, a job handed
    /// to a worker elsewhere) that must not be retried before its lease ends. Leases then
    /// last their time across a restart, as they do within one process.
    ///
    /// Either way, fencing holds: a token is never handed out twice, an old holder's
    /// `complete` after a takeover answers [`Error::LeaseLost`](crate::Error::LeaseLost), and
    /// `attempt` counts every acquisition. A [`Lease`](crate::Lease) kept from before the
    /// open (a dropped `Store` of this process) can still complete or release its key until
    /// someone takes it over, as a holder whose lease time ran out can; extending it moves its
    /// time but does not make it live again.
    ///
    /// ```
    /// use idemstore::{Fingerprint, Key, Reservation, Store};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("keys.idem");
    /// let key = Key::new("user-1", "charge", "k1")?;
    /// let store = Store::open(&path)?;
    /// let Reservation::Acquired(_lease) = store.reserve(&key, Fingerprint::of(b"x"))? else {
    ///     unreachable!("a fresh key is acquired")
    /// };
    /// drop(store); // the owner goes away with the work unfinished (as a crash would)
    ///
    /// let store = Store::open(&path)?;
    /// let Reservation::Acquired(lease) = store.reserve(&key, Fingerprint::of(b"x"))? else {
    ///     unreachable!("the earlier owner's lease ended with it")
    /// };
    /// assert_eq!(lease.attempt(), 2);
    /// drop(store);
    ///
    /// // With the setting, a lease outlasts the restart.
    /// let store = Store::builder().leases_survive_restart(true).open(&path)?;
    /// let answer = store.reserve(&key, Fingerprint::of(b"x"))?;
    /// assert!(matches!(answer, Reservation::InProgress { .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn leases_survive_restart(&mut self, survive: bool) -> &mut Self {
        self.leases_survive_restart = survive;
        self
    }

    /// When operations count as done. Default = [`Durability::Immediate`].
    pub fn durability(&mut self, durability: Durability) -> &mut Self {
        self.durability = durability;
        self
    }

    /// The largest result [`Store::complete`] accepts, in bytes, up to
    /// [`Builder::MAX_RESULT_LEN_LIMIT`]. Default = [`Builder::DEFAULT_MAX_RESULT_LEN`] (1 MiB).
    pub fn max_result_len(&mut self, bytes: usize) -> &mut Self {
        self.max_result_len = bytes;
        self
    }

    /// Memory redb may use to cache pages of the file. Default =
    /// [`Builder::DEFAULT_CACHE_SIZE`] (64 MiB).
    pub fn cache_size(&mut self, bytes: usize) -> &mut Self {
        self.cache_size = bytes;
        self
    }

    /// How many recently written records to keep in memory so duplicates are answered without
    /// a read transaction. The cache is exact (filled only with committed records); 0 turns it
    /// off. Default = [`Builder::DEFAULT_CACHE_RECORDS`].
    pub fn cache_records(&mut self, records: usize) -> &mut Self {
        self.cache_records = records;
        self
    }

    /// The most memory the record cache of [`cache_records`](Builder::cache_records) may
    /// take, in bytes: each record counts its key, its result (or recovery point, or review
    /// note) and 320 bytes of bookkeeping, and the oldest records are evicted when either
    /// limit is reached. With small results the record count binds first (65 536 records of
    /// 64-byte results take about 26 MiB); with large ones this does, so that results up to
    /// [`max_result_len`](Builder::max_result_len) cannot make the cache grow without bound.
    /// 0 keeps no record. Default = [`Builder::DEFAULT_CACHE_RECORD_BYTES`] (64 MiB).
    ///
    /// With [`cache_size`](Builder::cache_size) (redb's page cache) it bounds the memory the
    /// store keeps; docs/4-configuration.md ("What the defaults cost", "Memory") lists what else counts.
    pub fn cache_record_bytes(&mut self, bytes: usize) -> &mut Self {
        self.cache_record_bytes = bytes;
        self
    }

    /// Checkpoint (a durable redb commit, after which the log is reused from its start) once
    /// this many bytes of log were written since the last one. Larger values mean fewer
    /// stalls but a longer replay after a crash. At least 64 KiB.
    /// Default = [`Builder::DEFAULT_CHECKPOINT_BYTES`] (32 MiB).
    pub fn checkpoint_bytes(&mut self, bytes: u64) -> &mut Self {
        self.checkpoint_bytes = bytes;
        self
    }

    /// Checkpoint when this long has passed since the last checkpoint and the log holds
    /// frames, even if it is small. Default = [`Builder::DEFAULT_CHECKPOINT_INTERVAL`] (30 s).
    pub fn checkpoint_interval(&mut self, interval: Duration) -> &mut Self {
        self.checkpoint_interval = interval;
        self
    }

    /// Delete expired records in the background, looking every `interval`; `None` turns the
    /// background sweeper off, and expired records are then deleted only when
    /// [`Store::sweep`] is called.
    ///
    /// Expired records already read as absent, so sweeping only reclaims disk space; without
    /// it a store keeps every key it ever saw. A store keeps its records in one table per
    /// window of expiry time (at most a 16th of each record's retention, docs/format.md,
    /// "Expiry windows") and deletes
    /// a window's table whole once the window has ended, without reading its records: in the
    /// transaction that applies logged batches to the file while the store is written, and on
    /// the committer thread at the next interval when the applier holds none. So an expired record stays stored,
    /// reading as absent, until its window ends and the next look after.
    ///
    /// The interval is real time; what counts as expired follows the store's
    /// [`clock`](Builder::clock). With a [`ManualClock`](crate::ManualClock), records expire
    /// when the test moves the clock, and the sweeper deletes them within an interval once
    /// their window has ended; a test
    /// that counts what [`Store::sweep`] returns turns the sweeper off with `None`.
    /// Default = `Some(`[`Builder::DEFAULT_SWEEP_INTERVAL`]`)` (1 s).
    pub fn sweep_interval(&mut self, interval: Option<Duration>) -> &mut Self {
        self.sweep_interval = interval;
        self
    }

    /// Zero-fill the log ahead of its frames: 256 KiB when it is created, then doubled (by at
    /// most 4 MiB at a time) each time its frames reach its end, up to
    /// [`checkpoint_bytes`](Builder::checkpoint_bytes) + 1 MiB, where it stays (the log is
    /// overwritten in place after every checkpoint). A frame then overwrites allocated blocks,
    /// so its sync flushes data only, not file metadata, which made syncs faster when measured
    /// (BENCHMARKS.md, "Preallocating the log and verifying on open"); only the sync after each
    /// growth also flushes the file's new size.
    ///
    /// Cost: the zero-filled part of the log on disk (at most `checkpoint_bytes` + 1 MiB, 33
    /// MiB with the default; a store that logs little keeps a small log), written once. A test
    /// suite that creates many short-lived stores may turn it off.
    /// Default = `true`.
    pub fn preallocate_log(&mut self, preallocate: bool) -> &mut Self {
        self.preallocate_log = preallocate;
        self
    }

    /// Verify the checksum of every B-tree page when a store that was not closed cleanly
    /// opens (after a kill, a crash or a power loss), so that a damaged file (a disk that lost
    /// writes it had acknowledged, say) is refused with [`OpenError::NotAStore`] naming it before
    /// any of its pages is trusted. It reads the whole file (seconds per GB: BENCHMARKS.md,
    /// "Preallocating the log and verifying on open"), so an open after a crash then grows with
    /// the store.
    ///
    /// Off by default: a kill cannot damage the file, and redb's two-phase commit (used by
    /// every checkpoint) survives a power loss on a disk that honours its syncs, so an open
    /// after a crash replays at most [`checkpoint_bytes`](Builder::checkpoint_bytes) of log
    /// and loads redb's recorded allocator state: its time does not grow with the store. A
    /// page damaged anyway is met by the read that reaches it, which returns
    /// [`StorageError::Corruption`](crate::StorageError::Corruption) naming the file, never a panic; [`Store::verify`] checks every
    /// record on demand.
    ///
    /// A store closed cleanly (dropped) is never verified on open: nothing was in flight when
    /// its file was last written, and its open reads neither the log nor the whole file.
    /// Default = `false`.
    pub fn verify_on_open(&mut self, verify: bool) -> &mut Self {
        self.verify_on_open = verify;
        self
    }

    /// Open a store that was not closed cleanly even though its log is missing, empty,
    /// truncated or another store's ([`OpenError::LostLog`] otherwise), accepting the loss of what
    /// that log held: the operations acknowledged since the store's last checkpoint (at most
    /// [`checkpoint_bytes`](Builder::checkpoint_bytes) of log, or
    /// [`checkpoint_interval`](Builder::checkpoint_interval) of time). Keys completed in that
    /// window read as absent, so their work can run again: set it for one open, after
    /// deciding that the log cannot be put back (the `idemstore recover --accept-loss PATH`
    /// command does exactly that). Another store's log is set aside, never deleted.
    /// Default = `false`.
    pub fn accept_log_loss(&mut self, accept: bool) -> &mut Self {
        self.accept_log_loss = accept;
        self
    }

    /// The time source. Default = [`SystemClock`]; use [`ManualClock`](crate::ManualClock) in tests.
    pub fn clock(&mut self, clock: impl Clock) -> &mut Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Serve a Unix socket next to the store file ([`socket_path`](crate::admin::socket_path)) through which the
    /// `idemstore` tool (or an [`AdminClient`](crate::AdminClient)) reads the live store, and with
    /// [`AdminSocket::ReadWrite`] changes it, while this process owns it. A socket file left
    /// by a process that died is replaced; any other file at that path is refused. The
    /// socket is removed when the store is dropped (which waits for a request being answered,
    /// at most the 5 s a client is given). See the [`admin`](crate::admin) module for what it
    /// costs the service. Default = [`AdminSocket::ReadOnly`].
    ///
    /// On by default, read-only, so that an operator who finds a service misbehaving can look
    /// at its store (`idemstore stats FILE`) without restarting it with another setting, and
    /// cannot change it through the socket. The socket is private to the service's user
    /// whatever [`file_mode`](Builder::file_mode) says: mode 0600 from the first instant it is
    /// at its path, and on Linux each connection's credentials are checked, so another user's
    /// process is refused even when it could reach the file, and root's is served (the
    /// [`admin`](crate::admin) module, "Access"). Its cost is one mostly idle thread, a file
    /// descriptor and the socket file (docs/4-configuration.md, "What the defaults cost").
    /// [`AdminSocket::Off`] serves nothing (a test suite opening many stores, a file system
    /// without Unix sockets).
    ///
    /// # Errors
    /// [`Builder::open`] fails with [`StorageError::Io`](crate::StorageError::Io) naming the socket when it
    /// cannot be served: a path longer than a Unix socket address allows (107 bytes on
    /// Linux), or a file that is not a socket in its place (or, at `.NAME.a` next to the store,
    /// one that is not the directory the socket is bound in). Choose [`AdminSocket::Off`] there.
    ///
    /// ```
    /// use idemstore::{AdminClient, AdminSocket, Fingerprint, Key, Store};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("keys.idem");
    /// let store = Store::builder().admin_socket(AdminSocket::ReadOnly).open(&path)?;
    /// let _ = store.reserve(&Key::new("user-1", "charge", "k1")?, Fingerprint::of(b"x"))?;
    ///
    /// // Another process (here the same one) looks at the live store.
    /// let admin = AdminClient::connect(&path)?;
    /// assert_eq!(admin.counts()?.pending, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn admin_socket(&mut self, socket: AdminSocket) -> &mut Self {
        self.admin_socket = socket;
        self
    }

    /// The permission bits of every file the store creates: the store file (made under a
    /// temporary name first, with this mode from its first instant) and its log. The
    /// stored results are a service's responses, private data, so the default gives no one
    /// but the owning user access, whatever the process's umask; a service whose files a
    /// group must read (a backup agent, say) chooses, for example, `0o640`. The mode must
    /// give the owner read and write (the store reopens its files) and nothing beyond the
    /// permission bits (no set-id or sticky bits); the process's umask can still take bits
    /// away, never add them. Default = [`Builder::DEFAULT_FILE_MODE`] (0600).
    ///
    /// Files that exist keep their mode: a store created by an earlier build (0644 under
    /// the usual umask) stays as it is until its owner changes it (`chmod 600 FILE FILE.wal`).
    /// Renaming another store's log aside keeps its mode. The admin socket is always 0600
    /// and serves its owner's user and root only, whatever this says
    /// ([`admin_socket`](Builder::admin_socket)).
    ///
    /// ```
    /// use std::os::unix::fs::PermissionsExt;
    /// use idemstore::Store;
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("keys.idem");
    /// let store = Store::builder().file_mode(0o640).open(&path)?;
    /// let mode = std::fs::metadata(&path)?.permissions().mode() & 0o777;
    /// // 0o640 under the usual umask (022); a stricter umask takes the group's bit away too.
    /// assert_eq!(mode & !0o040, 0o600, "the owner reads and writes, other users nothing");
    /// # drop(store);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn file_mode(&mut self, mode: u32) -> &mut Self {
        self.file_mode = mode;
        self
    }

    /// Opens the store at `path`, creating it (crash-safely) if it does not exist.
    ///
    /// # Errors
    /// An [`OpenError`], which converts into [`Error::Open`](crate::Error::Open) (so `?` works in
    /// a function returning [`idemstore::Result`](crate::Result)):
    /// - [`OpenError::InvalidConfig`] for a setting out of range;
    /// - [`OpenError::NotAStore`] when `path` is a directory or another program's file (which
    ///   is left untouched);
    /// - [`OpenError::AlreadyOpen`] when another process or `Store` has it open;
    /// - [`OpenError::LostLog`] when the store was not closed cleanly and its log is missing,
    ///   empty, truncated or another store's (see [`Builder::accept_log_loss`]);
    /// - [`OpenError::ForeignLog`] when the log next to it cannot be shown to be its own;
    /// - [`StorageError::Io`](crate::StorageError::Io), [`OpenError::Storage`] or [`StorageError::Corruption`](crate::StorageError::Corruption) when the file
    ///   or its log cannot be read or replayed.
    pub fn open(&self, path: impl AsRef<Path>) -> Result<Store, OpenError> {
        self.validate()?;
        Store::open_with(self, path.as_ref())
    }

    /// Opens the closed store at `path` for reading only, without writing to its files
    /// ([`ReadOnlyStore`](crate::ReadOnlyStore), which says what it refuses), with this
    /// builder's [`clock`](Builder::clock) and
    /// [`leases_survive_restart`](Builder::leases_survive_restart); the other settings are
    /// for writing and are not used.
    ///
    /// # Errors
    /// As [`ReadOnlyStore::open`](crate::ReadOnlyStore::open).
    pub fn open_read_only(
        &self,
        path: impl AsRef<Path>,
    ) -> Result<crate::ReadOnlyStore, OpenError> {
        crate::store::inspect::ReadOnlyStore::open_with(self, path.as_ref())
    }

    /// Opens (creating if empty) a store on other storage than files: `db` holds what the store
    /// file would ([`redb::StorageBackend`], redb's own seam), `log` what its log file would
    /// ([`LogFile`]). This is the storage seam: an in-memory store for a service's own tests,
    /// or a disk that loses, tears or refuses writes on purpose, as the crate's crash and power-loss
    /// models and its fuzz targets use (`tests/support/sim.rs`).
    ///
    /// The store is named `storage.idem` in messages and by [`Store::path`]. `db` is opened
    /// twice (read-only for the clean-close mark, then for writing), so its clones must share
    /// its bytes, as a handle on one disk does. Durability is what the two backends give:
    /// bytes written and then synced must survive. Such a store serves no admin socket (it has
    /// no directory to serve it in), whatever [`admin_socket`](Builder::admin_socket) says.
    ///
    /// ```
    /// use std::io;
    /// use std::sync::{Arc, Mutex};
    /// use idemstore::{Builder, Fingerprint, Key, LogFile, Reservation};
    ///
    /// /// Bytes in memory, shared by clones: an in-memory store for tests.
    /// #[derive(Clone, Debug, Default)]
    /// struct Memory(Arc<Mutex<Vec<u8>>>);
    ///
    /// impl Memory {
    ///     fn write(&self, offset: u64, data: &[u8]) {
    ///         let mut bytes = self.0.lock().unwrap();
    ///         let end = offset as usize + data.len();
    ///         if bytes.len() < end {
    ///             bytes.resize(end, 0);
    ///         }
    ///         bytes[offset as usize..end].copy_from_slice(data);
    ///     }
    ///     fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
    ///         let bytes = self.0.lock().unwrap();
    ///         let range = offset as usize..offset as usize + out.len();
    ///         let data = bytes.get(range).ok_or(io::ErrorKind::UnexpectedEof)?;
    ///         out.copy_from_slice(data);
    ///         Ok(())
    ///     }
    /// }
    ///
    /// impl idemstore::redb::StorageBackend for Memory {
    ///     fn len(&self) -> io::Result<u64> { Ok(self.0.lock().unwrap().len() as u64) }
    ///     fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> { Memory::read(self, offset, out) }
    ///     fn set_len(&self, len: u64) -> io::Result<()> { Ok(self.0.lock().unwrap().resize(len as usize, 0)) }
    ///     fn sync_data(&self) -> io::Result<()> { Ok(()) }
    ///     fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> { Ok(Memory::write(self, offset, data)) }
    /// }
    ///
    /// impl LogFile for Memory {
    ///     fn len(&self) -> io::Result<u64> { Ok(self.0.lock().unwrap().len() as u64) }
    ///     fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> { self.read(offset, buf) }
    ///     fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> { Ok(self.write(offset, data)) }
    ///     fn sync_data(&self) -> io::Result<()> { Ok(()) }
    /// }
    ///
    /// let store = Builder::new().open_with_storage(Memory::default(), Memory::default())?;
    /// let key = Key::new("user-1", "charge", "k1")?;
    /// assert!(matches!(store.reserve(&key, Fingerprint::of(b"x"))?, Reservation::Acquired(_)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`open`](Builder::open), naming `storage.idem` for the store.
    pub fn open_with_storage(
        &self,
        db: impl redb::StorageBackend + Clone,
        log: impl LogFile + 'static,
    ) -> Result<Store, OpenError> {
        self.validate()?;
        Store::open_with_storage(self, db, Arc::new(log))
    }

    fn validate(&self) -> Result<(), OpenError> {
        self.validate_retentions()?;
        let check = |ok: bool, setting: &'static str, reason: &str| {
            if ok {
                Ok(())
            } else {
                Err(OpenError::InvalidConfig {
                    setting,
                    reason: reason.to_string(),
                })
            }
        };
        check(
            duration_millis(self.lease) >= 1,
            "lease",
            "must be at least 1 ms",
        )?;
        check(
            duration_millis(self.retention) >= 1,
            "retention",
            "must be at least 1 ms",
        )?;
        check(
            self.checkpoint_bytes >= 64 * 1024,
            "checkpoint_bytes",
            "must be at least 64 KiB",
        )?;
        if let Durability::Buffered { flush_interval } = self.durability {
            check(
                !flush_interval.is_zero(),
                "durability",
                "a buffered flush_interval must be above zero",
            )?;
        }
        check(
            self.file_mode & !0o777 == 0 && self.file_mode & 0o600 == 0o600,
            "file_mode",
            &format!(
                "{:#o} must give the owner read and write (0o600) and hold only permission \
                 bits (at most 0o777)",
                self.file_mode
            ),
        )?;
        check(
            self.max_result_len <= Self::MAX_RESULT_LEN_LIMIT,
            "max_result_len",
            &format!(
                "{} bytes is above the limit of {} bytes",
                self.max_result_len,
                Self::MAX_RESULT_LEN_LIMIT
            ),
        )
    }

    /// Checks the per-operation retentions.
    fn validate_retentions(&self) -> Result<(), OpenError> {
        validate_retentions(&self.retention_by_operation)
    }
}

/// Checks a list of per-operation retentions (of this builder or the etcd store's).
pub(crate) fn validate_retentions(by_operation: &[(Vec<u8>, Duration)]) -> Result<(), OpenError> {
    for (operation, retention) in by_operation {
        let name = String::from_utf8_lossy(operation);
        let reason = if operation.is_empty() || operation.len() > Key::MAX_PART_LEN {
            format!(
                "operation {name:?} is {} bytes; a key's operation has 1 to {} bytes",
                operation.len(),
                Key::MAX_PART_LEN
            )
        } else if duration_millis(*retention) < 1 {
            format!("the retention of operation {name:?} must be at least 1 ms")
        } else {
            continue;
        };
        return Err(OpenError::InvalidConfig {
            setting: "retention_for",
            reason,
        });
    }
    Ok(())
}
