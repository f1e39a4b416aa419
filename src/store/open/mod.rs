//! Opening a store, all in one place: the file checks and crash-safe creation (`file.rs`),
//! recovery ([`crate::log::recover`]), and assembling the commit path. Every open goes through
//! [`Store::from_parts`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::Database;

use crate::commit::{Committer, Schedule, Writer};
use crate::decide::Policies;
use crate::error::{OpenError, StorageError};
use crate::log::{claim_identity, read_identity, recover, Identity};
use crate::log::{log_path, LogFile, PREALLOC_FIRST};
use crate::record::TokenFloor;
use crate::state::Counters;
use crate::state::Durability;
use crate::state::Engine;
use crate::state::Overlay;
use crate::state::RecordCache;
use crate::state::{full_disk_at_open, replay_bound, Poison};
use crate::store::builder::Builder;
use crate::tree::{open_windows, store_id as stored_id};

use super::Store;

pub(crate) mod file;

/// The name a store opened on other storage goes by in messages and [`Store::path`]: it has no
/// file of its own (its log is named after it, `storage.idem.wal`).
pub(crate) const STORAGE_NAME: &str = "storage.idem";

/// redb's settings for a store; `verify` asks for redb's integrity check on open (with
/// [`Builder::verify_on_open`], and only when the store was not closed cleanly).
fn redb_builder(builder: &Builder, verify: bool) -> redb::Builder {
    let mut redb_builder = redb::Builder::new();
    redb_builder
        .set_cache_size(builder.cache_size)
        .set_check_integrity_on_open(verify && builder.verify_on_open);
    redb_builder
}

/// Runs an open. redb can panic on a damaged file that it trusts; hostile bytes must never
/// panic the caller, so a panic becomes [`OpenError::NotAStore`]. The format check and the
/// clean-close mark are read before any integrity check, so this guard is what refuses a
/// file damaged in those pages; later reads are guarded by [`Store::guard_read`].
///
/// An open that fails on a full disk says how much room it needs (`replay`: the most log it
/// may replay, in bytes).
fn guard_open(
    path: &Path,
    replay: u64,
    open: impl FnOnce() -> Result<Store, OpenError>,
) -> Result<Store, OpenError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(open))
        .unwrap_or_else(|_| {
            Err(OpenError::NotAStore {
                path: path.to_path_buf(),
                reason: "redb panicked while reading it: the file is damaged".into(),
            })
        })
        // Only an I/O or redb error of a full disk is reworded (into an I/O one).
        .map_err(|e| full_disk_at_open(e, path, replay))
}

/// The store's random identity, from its meta table.
pub(in crate::store) fn store_id(db: &Database) -> Result<u64, OpenError> {
    Ok(stored_id(db)?)
}

/// How long a log may grow zero-filled ahead of its frames (`Builder::preallocate_log`): the
/// checkpoint region and 1 MiB; `None` when it is not preallocated.
fn log_preallocation(builder: &Builder) -> Option<u64> {
    builder
        .preallocate_log
        .then_some(builder.checkpoint_bytes.saturating_add(1 << 20))
}

/// Whose log `log` is; refuses one whose identity block is damaged (it may be the store's own,
/// so it is neither replayed nor set aside).
fn log_identity(
    log: &dyn LogFile,
    store_id: u64,
    store: &Path,
    log_path: &Path,
) -> Result<Identity, OpenError> {
    let identity = read_identity(log, store_id).map_err(|e| {
        StorageError::io(
            format!("reading the identity of log {}", log_path.display()),
            e,
        )
    })?;
    if identity == Identity::Damaged {
        return Err(OpenError::ForeignLog {
            store: store.to_path_buf(),
            log: log_path.to_path_buf(),
            reason: "its first 32 bytes are not a valid idemstore log identity".into(),
        });
    }
    Ok(identity)
}

impl Store {
    /// Opens the store at `path` with every default, creating it if it does not exist.
    ///
    /// # Errors
    /// See [`Builder::open`](crate::Builder::open).
    pub fn open(path: impl AsRef<Path>) -> Result<Store, OpenError> {
        Builder::new().open(path)
    }

    /// A [`Builder`] to configure retention, leases, limits and the clock.
    pub fn builder() -> Builder {
        Builder::new()
    }

    pub(crate) fn open_with(builder: &Builder, path: &Path) -> Result<Store, OpenError> {
        // The log a reopen replays is at most its file (and two regions' worth).
        let bound = replay_bound(builder.checkpoint_bytes, builder.limits.frame_bytes as u64);
        let replay = std::fs::metadata(log_path(path)).map_or(bound, |log| log.len().min(bound));
        guard_open(path, replay, || Store::open_unguarded(builder, path))
    }

    pub(super) fn open_unguarded(builder: &Builder, path: &Path) -> Result<Store, OpenError> {
        let log_path = log_path(path);
        let db = if builder.page_checksums {
            file::open_or_create(path, builder.file_mode, |verify| {
                redb_builder(builder, verify)
            })?
        } else {
            file::create_without_pages(path, builder.file_mode, &redb_builder(builder, false))?
        };
        let store_id = store_id(&db)?;
        let closed_clean = crate::log::recorded(&db)?;
        let refuse = !closed_clean && !builder.accept_log_loss;
        if refuse && !log_path.exists() {
            return Err(crate::log::refuse(path, &log_path, "is missing"));
        }
        // Checked before the log is preallocated, which would grow a truncated log back.
        let recorded = crate::log::recorded_len(&db)?;
        match std::fs::metadata(&log_path) {
            Ok(meta) if refuse && meta.len() < recorded => {
                return Err(crate::log::truncated(path, &log_path, meta.len(), recorded))
            }
            _ => {}
        }
        let preallocate = log_preallocation(builder).map(|cap| PREALLOC_FIRST.min(cap));
        let mut log = file::open_log(&log_path, builder.file_mode, preallocate)?;
        if let Identity::Other(other) = log_identity(&log, store_id, path, &log_path)? {
            if !closed_clean && !builder.accept_log_loss {
                return Err(crate::log::refuse(
                    path,
                    &log_path,
                    format!("is another store's log (store {other:#018x}; this store is {store_id:#018x})"),
                ));
            }
            // Another store's log (a deleted store's at the same path, or one copied here):
            // never replayed, never deleted, set aside under a name that says whose it is.
            drop(log);
            let aside = file::set_aside(&log_path, other)?;
            #[cfg(feature = "tracing")]
            tracing::warn!(
                log = %log_path.display(),
                set_aside = %aside.display(),
                "idemstore: the log belonged to another store; set aside, not replayed"
            );
            let _ = aside;
            log = file::open_log(&log_path, builder.file_mode, preallocate)?;
        }
        Store::from_parts(db, Arc::new(log), log_path, builder, path.to_path_buf())
    }

    /// Opens (creating if empty) a store on `db` and `log` instead of files (see
    /// [`Builder::open_with_storage`]). `db` is opened twice, read-only to read the clean-close
    /// mark and then for writing, so its clones must share its bytes.
    pub(crate) fn open_with_storage<B: redb::StorageBackend + Clone>(
        builder: &Builder,
        db: B,
        log: Arc<dyn LogFile>,
    ) -> Result<Store, OpenError> {
        let path = PathBuf::from(STORAGE_NAME);
        // Storage without files has no directory to serve an admin socket in.
        let mut builder = builder.clone();
        builder.admin_socket(crate::AdminSocket::Off);
        // Nor is it preallocated: the storage decides how its log grows.
        builder.preallocate_log = false;
        let builder = &builder;
        guard_open(
            &path.clone(),
            replay_bound(builder.checkpoint_bytes, builder.limits.frame_bytes as u64),
            || {
                // The clean-close mark, read as `file::open_or_create` reads it.
                // Every page checksummed, as on a file (`tree/pages.rs`).
                let pages = |disk: &B| {
                    crate::tree::PageFile::new(disk.clone(), STORAGE_NAME)
                        .map_err(|e| file::open_error(&path, "opening", e.into()))
                };
                let closed_clean =
                    match redb_builder(builder, false).open_read_only_with_backend(pages(&db)?) {
                        Ok(read_only) => crate::log::recorded(&read_only)?,
                        Err(_) => false,
                    };
                let db = redb_builder(builder, !closed_clean)
                    .create_with_backend(pages(&db)?)
                    .map_err(|e| file::open_error(&path, "opening", e))?;
                file::initialize_if_new(&db)?;
                file::check_format(&db, &path)?;
                Store::from_parts(db, log, log_path(&path), builder, path)
            },
        )
    }

    pub(crate) fn from_parts(
        db: Database,
        log: Arc<dyn LogFile>,
        log_path: PathBuf,
        builder: &Builder,
        path: PathBuf,
    ) -> Result<Store, OpenError> {
        let store_id = store_id(&db)?;
        let closed_clean = crate::log::recorded(&db)?;
        let refuse = !closed_clean && !builder.accept_log_loss;
        match log_identity(&*log, store_id, &path, &log_path)? {
            Identity::Ours => {}
            Identity::Fresh if refuse => {
                return Err(crate::log::refuse(
                    &path,
                    &log_path,
                    "is empty (a new log in place of the store's own)",
                ))
            }
            Identity::Fresh => claim_identity(&*log, store_id, &log_path)?,
            // Set aside by the caller when it can rename files; refused otherwise.
            Identity::Other(_) | Identity::Damaged => {
                return Err(OpenError::ForeignLog {
                    store: path,
                    log: log_path,
                    reason: format!(
                        "it carries another store's identity (this store is {store_id:#018x})"
                    ),
                })
            }
        }
        let log_len = log.len().map_err(|e| {
            StorageError::io(
                format!("reading the length of log {}", log_path.display()),
                e,
            )
        })?;
        let recorded = crate::log::recorded_len(&db)?;
        if refuse && log_len < recorded {
            return Err(crate::log::truncated(&path, &log_path, log_len, recorded));
        }
        let strict = builder.durability == Durability::Immediate;
        let windows = open_windows(&db)?;
        let (mut wal, next_token) = recover(&db, &windows, log, log_path, strict)?;
        wal.set_max_payload(builder.limits.frame_bytes);
        if let Some(cap) = log_preallocation(builder) {
            wal.preallocate(cap)?;
        }
        // Leases end with their process: every token below the first one this owner hands
        // out was handed out by an earlier owner of the file (`Builder::leases_survive_restart`).
        let floor = if builder.leases_survive_restart {
            TokenFloor::NONE
        } else {
            TokenFloor(next_token)
        };
        let engine = Arc::new(Engine {
            db,
            windows,
            cache: RecordCache::new(builder.cache_records, builder.cache_record_bytes),
            overlay: Overlay::default(),
            counters: Counters::default(),
            poison: Poison::new(
                replay_bound(builder.checkpoint_bytes, builder.limits.frame_bytes as u64),
                path.clone(),
            ),
            clock: Arc::clone(&builder.clock),
            policy: Policies::new(
                builder.lease,
                builder.retention,
                &builder.retention_by_operation,
                floor,
            ),
            checkpoint: Default::default(),
            time_floor: Default::default(),
        });
        let writer = Writer::new(
            Arc::clone(&engine),
            wal,
            next_token,
            Schedule {
                durability: builder.durability,
                checkpoint_bytes: builder.checkpoint_bytes,
                checkpoint_interval: builder.checkpoint_interval,
                sweep_interval: builder.sweep_interval,
                manual: builder.manual_background,
            },
        );
        let mut store = Store {
            engine,
            committer: Arc::new(Committer::start(writer, builder.limits)?),
            max_result_len: builder.max_result_len,
            path,
            read_hook: super::ReadHook::default(),
            submit_hook: super::ReadHook::default(),
            admin: None,
        };
        store.admin = crate::admin::Server::start(store.handle(), builder.admin_socket)?;
        Ok(store)
    }
}
