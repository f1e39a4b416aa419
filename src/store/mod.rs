//! [`Store`]: the public operations. Reads of existing keys go straight to the overlay, the
//! cache or a redb read transaction; every write goes through the commit path in
//! [`crate::commit`].
//!
//! - this file: the store's parts, the clock, and the reads (get, stale, snapshots; the read
//!   of one key every operation starts with);
//! - `open/`: opening (checks, creation, recovery) and assembling the parts;
//! - `reserve.rs`: reserve (one, many, async, waiting) and observe;
//! - `lease.rs`: complete, release, extend, review, recovery points, resolve (sync and async);
//! - `many.rs`: the batch forms of complete, release and extend (sync and async);
//! - `expire.rs`: expire (one, forced, many, async);
//! - `retain.rs`: completing or resolving with a retention of its own;
//! - `import.rs`: writing exported records into a closed store;

pub(crate) mod builder;
mod compact;
mod expire;
mod import;
pub(crate) mod inspect;
mod lease;
mod many;
pub(crate) mod open;
mod reserve;
mod retain;
#[cfg(feature = "__whitebox")]
mod seam;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::ReadableDatabase;

use crate::commit::{stale, Committer, Writer};
use crate::error::{Error, StorageError};
use crate::key::Key;
use crate::record::{Millis, Record, TokenFloor};
use crate::state::Engine;
use crate::state::Stats;
use crate::tree::DEADLINES;

pub use compact::compact;
pub use import::{import, Imported};
pub use open::file::{open_redb, open_redb_read_only};

/// An open idempotency store: one file, owned by one process.
///
/// `Store` is `Send + Sync`; share it between threads with `&Store` or `Arc<Store>`.
///
/// ```
/// use idemstore::{Fingerprint, Key, Reservation, Store};
///
/// # let dir = tempfile::tempdir()?;
/// let store = Store::open(dir.path().join("keys.idem"))?;
/// let key = Key::new("user-7", "checkout", "b7d1e0")?;
/// let request = Fingerprint::of(b"cart=42&total=1999");
///
/// match store.reserve(&key, request)? {
///     Reservation::Acquired(lease) => {
///         let receipt = b"order 1001 placed"; // do the work here
///         store.complete(&lease, receipt.to_vec())?;
///     }
///     other => panic!("a fresh key is acquired, got {other:?}"),
/// }
///
/// // The retry gets the stored result instead of running the work again.
/// match store.reserve(&key, request)? {
///     Reservation::Completed(done) => assert_eq!(done.result, b"order 1001 placed"),
///     other => panic!("expected the stored result, got {other:?}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Store {
    /// The parts shared with the engine's threads (and the admin socket's handle).
    engine: Arc<Engine>,
    /// Shared with the admin socket's handle, which is stopped first (see `Drop`). Seen by the
    /// crate's unit tests, which damage the file through the writer on purpose.
    pub(crate) committer: Arc<Committer>,
    max_result_len: usize,
    path: PathBuf,
    /// Runs once at the start of the next read (tests of races with poisoning).
    read_hook: ReadHook,
    /// Runs once between a reserve's read and its submission to the writer (tests of a
    /// state read going stale).
    submit_hook: ReadHook,
    /// The admin socket, when [`Builder::admin_socket`](crate::Builder::admin_socket) asks.
    admin: Option<crate::admin::Server>,
}

impl Drop for Store {
    /// Stops the admin socket before the store's parts go, so that its handle on them is
    /// gone by the time the committer shuts down and releases the file.
    fn drop(&mut self) {
        drop(self.admin.take());
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .field("policy", &self.engine.policy)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Counters of what the store has done since it was opened.
    pub fn stats(&self) -> Stats {
        self.engine.counters.snapshot()
    }

    pub(crate) fn now(&self) -> Millis {
        self.engine.now()
    }

    /// This owner's token floor: pending records below it were acquired by an earlier owner.
    pub(crate) fn token_floor(&self) -> TokenFloor {
        self.engine.policy.floor()
    }

    /// Deletes up to `limit` expired records and returns how many were deleted. Expired
    /// records already read as absent; sweeping reclaims their space. The background sweeper
    /// ([`Builder::sweep_interval`](crate::Builder::sweep_interval), on by default) does this
    /// by itself; call it when the sweeper is off, with a bound that keeps each call short,
    /// since it holds the writer while it runs.
    ///
    /// Earliest expiry first, exactly: the `limit` records that expired first are deleted
    /// (docs/format.md, "Sweeping"). When every expired record fits in `limit`, each ended
    /// expiry window goes whole; the expired records of a window that has not ended are found
    /// by reading its table, so a call costs a read of the windows that have started and not
    /// ended (and of the ended ones too when `limit` is smaller than what expired).
    ///
    /// # Errors
    /// Storage errors; a failed sweep poisons the store like any failed write.
    pub fn sweep(&self, limit: usize) -> Result<usize, Error> {
        self.committer.with_writer(|writer| writer.sweep(limit))
    }

    /// Makes everything acknowledged so far durable in the B-tree file and rewinds the log.
    /// The store does this by itself (see [`Builder::checkpoint_bytes`](crate::Builder::checkpoint_bytes)); call it before a
    /// backup or to bound the next open's replay.
    ///
    /// # Errors
    /// Storage errors; a failed checkpoint poisons the store like any failed write.
    pub fn checkpoint(&self) -> Result<(), Error> {
        self.committer.with_writer(Writer::checkpoint)
    }

    /// Bytes of log written since the last checkpoint.
    pub(crate) fn log_since_checkpoint(&self) -> Result<u64, Error> {
        self.committer
            .with_writer(|writer| Ok(writer.log_since_checkpoint()))
    }

    /// A second handle on this store's parts, for the admin socket's thread: no socket of
    /// its own, and it must be dropped before the owner's (the owner's `Drop` sees to that).
    pub(crate) fn handle(&self) -> Store {
        Store {
            engine: Arc::clone(&self.engine),
            committer: Arc::clone(&self.committer),
            max_result_len: self.max_result_len,
            path: self.path.clone(),
            read_hook: ReadHook::default(),
            submit_hook: ReadHook::default(),
            admin: None,
        }
    }

    /// The expiry windows the store keeps its records in.
    pub(crate) fn windows(&self) -> &crate::tree::Windows {
        &self.engine.windows
    }

    /// A redb read transaction on the store's file, to read the caller's own tables (those
    /// written with [`complete_with`](Store::complete_with)) while the store is open. It sees
    /// every durable redb commit; tables named `idemstore.*` belong to the store.
    ///
    /// # Errors
    /// Storage errors.
    pub fn begin_read(&self) -> Result<redb::ReadTransaction, Error> {
        self.engine.poison.check()?;
        self.engine
            .db
            .begin_read()
            .map_err(|e| StorageError::redb("starting a read transaction", e).into())
    }

    /// The record stored for `key`, or `None` when it is absent or expired.
    ///
    /// # Errors
    /// [`StorageError::Corruption`](crate::StorageError::Corruption) naming the key when its record is damaged.
    pub fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        self.engine.poison.check()?;
        let now = self.now();
        Ok(self.read(key)?.filter(|record| !record.is_expired(now)))
    }

    /// The stored record, from the overlay, the cache or a read transaction; expired or not.
    /// (No vector for the one key: this is the duplicate path.)
    pub(super) fn read(&self, key: &Key) -> Result<Option<Record>, Error> {
        self.read_hook();
        self.read_one(key)
    }

    /// The stored records of `keys`, in order (see [`read`](Store::read)). Each source is
    /// visited once for the batch: the overlay under one lock, the cache under one lock per
    /// shard, and the keys in neither are read from the writer epoch's shared redb snapshot
    /// (`Overlay::committed`, its epoch checked for each key), in key order (the B-tree pages
    /// of neighbouring keys are then read one after the other). Every key is
    /// still looked up in the overlay before the cache and in the cache before redb, the
    /// order [`read_one`](Store::read_one) keeps. Never an older state than acknowledged:
    /// after the store is poisoned a record read from redb is [`StorageError::Poisoned`](crate::StorageError::Poisoned) instead.
    pub(super) fn read_many<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k Key>,
    ) -> Vec<Result<Option<Record>, Error>> {
        self.read_hook();
        let keys: Vec<&Key> = keys.into_iter().collect();
        let mut found = vec![false; keys.len()];
        let mut answers: Vec<Result<Option<Record>, Error>> =
            keys.iter().map(|_| Ok(None)).collect();
        self.engine
            .overlay
            .get_many(&keys, &mut found, &mut answers);
        self.engine.cache.get_many(&keys, &mut found, &mut answers);
        let mut missing: Vec<usize> = (0..keys.len()).filter(|&i| !found[i]).collect();
        missing.sort_unstable_by(|&a, &b| keys[a].encoded().cmp(keys[b].encoded()));
        for i in missing {
            // Looks in the overlay and the cache again (a newer state may have been
            // published since) before redb.
            answers[i] = self.read_one(keys[i]);
        }
        answers
    }

    /// Runs the test hook set to race a read against other work.
    fn read_hook(&self) {
        self.read_hook.run();
    }

    /// One key of [`read_many`](Store::read_many): the engine's one read of a key's newest
    /// state (`Engine::newest`), with a panic inside redb turned into an error.
    fn read_one(&self, key: &Key) -> Result<Option<Record>, Error> {
        self.guard_read("reading a record", || self.engine.newest(key)?)
    }

    /// Runs `read`, which reads redb pages, turning a panic inside redb into
    /// [`StorageError::Corruption`](crate::StorageError::Corruption) naming the file. A store closed cleanly opens without verifying
    /// every page (`clean_close.rs`), so a page damaged since is first met by a read, and redb
    /// can panic on a damaged page it trusts.
    pub(crate) fn guard_read<T>(
        &self,
        doing: &str,
        read: impl FnOnce() -> Result<T, Error>,
    ) -> Result<T, Error> {
        guard_read(&self.path, doing, read)
    }

    /// Up to `limit` reservations whose lease ran out without completion, oldest first: work
    /// that may have had side effects and died. Recover each by asking the external system
    /// about the key, then take it over with [`reserve`](Store::reserve) or settle it with
    /// [`resolve`](Store::resolve).
    ///
    /// # Errors
    /// [`StorageError::Corruption`](crate::StorageError::Corruption) naming the key of a damaged record; storage errors.
    pub fn stale(&self, limit: usize) -> Result<Vec<(Key, Record)>, Error> {
        // Commit what the committer holds in its open transaction, so the listing sees every
        // acknowledged operation.
        self.committer.with_writer(|_| Ok(()))?;
        let ctx = "listing stale reservations";
        self.guard_read(ctx, || {
            let txn = self
                .engine
                .db
                .begin_read()
                .map_err(|e| StorageError::redb(ctx, e))?;
            let records = crate::tree::Records::open(&txn, &self.engine.windows)?;
            let deadlines = txn
                .open_table(DEADLINES)
                .map_err(|e| StorageError::redb(ctx, e))?;
            stale(&records, &deadlines, self.now(), self.token_floor(), limit)
        })
    }

    /// Commits the writer's open transaction and begins a snapshot that sees every
    /// acknowledged operation (for inspection).
    pub(crate) fn snapshot(&self) -> Result<redb::ReadTransaction, Error> {
        self.engine.poison.check()?;
        self.committer.with_writer(|_| Ok(()))?;
        self.engine
            .db
            .begin_read()
            .map_err(|e| StorageError::redb("inspecting the store", e).into())
    }
}

/// A closure a test arms to run once at the start of the next read, to race a read against
/// other work ([`Store::__before_next_read`], feature `__whitebox`). Unarmed, a read pays one
/// relaxed load.
#[derive(Default)]
pub(crate) struct ReadHook {
    armed: std::sync::atomic::AtomicBool,
    hook: parking_lot::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl ReadHook {
    /// Runs the armed closure, if any.
    pub(crate) fn run(&self) {
        use std::sync::atomic::Ordering;
        if self.armed.load(Ordering::Relaxed) && self.armed.swap(false, Ordering::AcqRel) {
            let hook = self.hook.lock().take();
            if let Some(hook) = hook {
                hook();
            }
        }
    }

    #[cfg(feature = "__whitebox")]
    fn arm(&self, hook: Box<dyn FnOnce() + Send>) {
        *self.hook.lock() = Some(hook);
        self.armed.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Runs `read`, which reads redb pages of the store file at `path`, turning a panic inside
/// redb into [`StorageError::Corruption`] naming the file ([`Store::guard_read`]).
pub(crate) fn guard_read<T>(
    path: &Path,
    doing: &str,
    read: impl FnOnce() -> Result<T, Error>,
) -> Result<T, Error> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)).unwrap_or_else(|_| {
        Err(StorageError::Corruption {
            location: format!("store {}", path.display()),
            reason: format!("redb panicked {doing}: a page of the file is damaged"),
        }
        .into())
    })
}
