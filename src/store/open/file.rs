//! Opening a store file: refusing what is not ours, and creating new files crash-safely.
//!
//! redb can leave a file that never opens again if power fails inside `Database::create`, so a
//! new store is built under a temporary name in the same directory, made durable, and only
//! then linked to its real name (`link` fails if the name exists, so two processes creating
//! the same store cannot overwrite each other), after which the directory is synced. A crash at
//! any point leaves either no store (and possibly a `.NAME.creating.*` file that can be
//! deleted) or a complete one.
//!
//! Every file made here is created with the store's file mode ([`Builder::file_mode`](crate::Builder::file_mode),
//! 0600 by default) from its first instant, passed to `open(2)` rather than set afterwards, so
//! that no other user can open it in between, whatever the umask; the store file keeps the mode
//! of the temporary file it is linked from. A file that exists keeps its mode.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use redb::backends::FileBackend;
use redb::{Database, DatabaseError, ReadableDatabase, TableError};

use crate::error::{OpenError, StorageError};
use crate::log::{LogFile, OsFile};
use crate::tree::PageFile;
use crate::tree::Windows;
use crate::tree::{Tables, CONVERTED_FORMAT, FORMAT_VERSION, META, META_FORMAT};

/// The first bytes of every plain redb file (a store before page checksums).
const REDB_SIGNATURE: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];

/// Opens the store at `path`, creating it (with permission bits `mode`) if it does not exist.
/// `builder(verify)` gives redb's settings, asking for redb's integrity check on open when
/// `verify` is set; the check is asked for unless the file carries the clean-close mark
/// (`clean_close.rs`).
pub(crate) fn open_or_create(
    path: &Path,
    mode: u32,
    builder: impl Fn(bool) -> redb::Builder,
) -> Result<Database, OpenError> {
    match fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Err(not_a_store(path, "it is a directory")),
        Ok(_) => open_existing(path, builder),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            create(path, mode, &builder(false))?;
            open_existing(path, builder)
        }
        Err(e) => {
            Err(StorageError::io(format!("reading metadata of {}", path.display()), e).into())
        }
    }
}

/// Creates a new store at `path` whose B-tree file is a plain redb file, without the page
/// layer: for benchmarks only (`Builder::__without_page_checksums`, hidden feature
/// `__whitebox`), to measure the layer against the same engine without it. Refuses a path that
/// exists, so no store is ever opened this way; the file made starts with redb's signature, so
/// every normal open refuses it (`open_existing`).
pub(crate) fn create_without_pages(
    path: &Path,
    mode: u32,
    builder: &redb::Builder,
) -> Result<Database, OpenError> {
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| {
            StorageError::io(
                format!(
                    "creating store {} without page checksums (a benchmark-only store is always a new file)",
                    path.display()
                ),
                e,
            )
        })?;
    let backend = FileBackend::new(file).map_err(|e| open_error(path, "creating", e))?;
    let db = builder
        .create_with_backend(backend)
        .map_err(|e| open_error(path, "creating", e))?;
    initialize(&db)?;
    Ok(db)
}

fn not_a_store(path: &Path, reason: impl Into<String>) -> OpenError {
    OpenError::NotAStore {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// The backend of a store file: redb's file backend (its locks: one process owns a store)
/// under the checksummed page layer (`tree/pages.rs`).
pub(crate) fn page_file(file: File, path: &Path) -> Result<PageFile<FileBackend>, OpenError> {
    let backend = FileBackend::new(file).map_err(|e| open_error(path, "opening", e))?;
    PageFile::new(backend, &path.display().to_string()).map_err(|e| damaged_or_io(path, e))
}

/// An I/O error of the page layer, or the damage it found, naming `path`.
fn damaged_or_io(path: &Path, e: io::Error) -> OpenError {
    StorageError::damage(&e, "opening the store")
        .unwrap_or_else(|| StorageError::io(format!("opening store {}", path.display()), e))
        .into()
}

/// Opens an existing file after checking, without writing, that it is a store file (the page
/// layer's header); then checks that it is an idemstore store of a format this build reads.
fn open_existing(
    path: &Path,
    builder: impl Fn(bool) -> redb::Builder,
) -> Result<Database, OpenError> {
    let mut start = [0u8; 32];
    let read = File::open(path).and_then(|mut file| file.read_exact(&mut start));
    match read {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            return Err(not_a_store(path, "it is shorter than a store header"))
        }
        Err(e) => return Err(StorageError::io(format!("reading {}", path.display()), e).into()),
    }
    if start[..REDB_SIGNATURE.len()] == REDB_SIGNATURE {
        return Err(not_a_store(
            path,
            "it is a plain redb file (another program's database, or a development format of idemstore from before page checksums, which this build does not read)",
        ));
    }
    if let Err(reason) = crate::tree::check_header(&start) {
        return Err(not_a_store(path, reason));
    }
    // Check the format through a read-only handle first, so a foreign database is refused
    // without redb rewriting its header, and read the clean-close mark. A store that needs
    // crash recovery cannot be opened read-only; it is checked after the read-write open below,
    // which verifies it first when asked to.
    let read_only = File::open(path)
        .map_err(|e| StorageError::io(format!("opening {}", path.display()), e).into())
        .and_then(|file| page_file(file, path))
        .and_then(|pages| {
            builder(false)
                .open_read_only_with_backend(pages)
                .map_err(|e| open_error(path, "opening", e))
        });
    let (checked, closed_clean) = match read_only {
        Ok(read_only) => {
            check_format(&read_only, path)?;
            let closed_clean = crate::log::recorded(&read_only)?;
            (true, closed_clean)
        }
        Err(
            e @ (OpenError::Storage(StorageError::Corruption { .. })
            | OpenError::AlreadyOpen { .. }),
        ) => return Err(e),
        Err(_) => (false, false),
    };
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| StorageError::io(format!("opening store {}", path.display()), e))?;
    let db = builder(!closed_clean)
        .create_with_backend(page_file(file, path)?)
        .map_err(|e| open_error(path, "opening", e))?;
    if !checked {
        check_format(&db, path)?;
    }
    Ok(db)
}

/// An error from redb opening or creating `path`, naming the file.
pub(crate) fn open_error(path: &Path, doing: &str, error: DatabaseError) -> OpenError {
    match error {
        DatabaseError::DatabaseAlreadyOpen => OpenError::AlreadyOpen {
            path: path.to_path_buf(),
        },
        DatabaseError::Storage(redb::StorageError::Io(e)) => StorageError::damage(&e, doing)
            .unwrap_or_else(|| StorageError::io(format!("{doing} store {}", path.display()), e))
            .into(),
        DatabaseError::Storage(redb::StorageError::Corrupted(reason)) => {
            not_a_store(path, format!("its redb structure is damaged: {reason}"))
        }
        other => not_a_store(path, format!("redb refused it: {other}")),
    }
}

/// Refuses a redb database that is not an idemstore store, or one of a format this build
/// neither reads nor converts.
pub(crate) fn check_format(db: &impl ReadableDatabase, path: &Path) -> Result<(), OpenError> {
    let ctx = "reading the store's format marker";
    let txn = db.begin_read().map_err(|e| StorageError::redb(ctx, e))?;
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        Err(TableError::TableDoesNotExist(_)) => {
            return Err(not_a_store(
                path,
                "a redb database without idemstore's tables",
            ))
        }
        Err(e) => return Err(StorageError::redb(ctx, e).into()),
    };
    match meta
        .get(META_FORMAT)
        .map_err(|e| StorageError::redb(ctx, e))?
    {
        // The earlier format is converted by `tables::open_windows`.
        Some(v) if v.value() == FORMAT_VERSION || v.value() == CONVERTED_FORMAT => Ok(()),
        Some(v) => Err(not_a_store(
            path,
            format!(
                "store format version {} (this build reads versions {CONVERTED_FORMAT} and \
                 {FORMAT_VERSION}; earlier \
                 versions were development formats that no release wrote: export the keys \
                 with the build that wrote the file, or start a new store)",
                v.value()
            ),
        )),
        None => Err(not_a_store(path, "the format marker is missing")),
    }
}

/// Creates an empty store at `path` through a temporary file of
/// permission bits `mode`, so that a crash never leaves a half-made file under the real name.
/// Losing a creation race to another process is fine.
fn create(path: &Path, mode: u32, builder: &redb::Builder) -> Result<(), OpenError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| not_a_store(path, "the path has no file name"))?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(StorageError::io(
            format!("creating store {}", path.display()),
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("directory {} does not exist", dir.display()),
            ),
        )
        .into());
    }
    let temp = dir.join(format!(
        ".{}.creating.{}.{}",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result =
        build_empty_store(&temp, mode, builder).and_then(|()| link_into_place(&temp, path));
    let _ = fs::remove_file(&temp);
    result?;
    sync_dir(&dir)
}

fn build_empty_store(temp: &Path, mode: u32, builder: &redb::Builder) -> Result<(), OpenError> {
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(temp)
        .map_err(|e| StorageError::io(format!("creating store file {}", temp.display()), e))?;
    let db = builder
        .create_with_backend(page_file(file, temp)?)
        .map_err(|e| open_error(temp, "creating", e))?;
    initialize(&db)?;
    drop(db);
    File::open(temp)
        .and_then(|file| file.sync_all())
        .map_err(|e| {
            StorageError::io(format!("syncing new store file {}", temp.display()), e).into()
        })
}

/// Writes the store's tables and format marker into an empty database, durably.
fn initialize(db: &Database) -> Result<(), OpenError> {
    let ctx = "initializing a new store";
    let txn = db.begin_write().map_err(|e| StorageError::redb(ctx, e))?;
    Tables::open(&txn, &Windows::new())
        .and_then(|mut tables| tables.initialize())
        // Nothing was logged yet: a new store is closed cleanly (`log/lost_log.rs`).
        .and_then(|()| crate::log::mark(&txn))?;
    txn.commit().map_err(|e| StorageError::redb(ctx, e).into())
}

/// Initializes a database that has no tables yet (one just created on a storage backend by
/// [`Builder::open_with_storage`](crate::Builder::open_with_storage)).
pub(crate) fn initialize_if_new(db: &Database) -> Result<(), OpenError> {
    let ctx = "checking for a new store";
    let txn = db.begin_read().map_err(|e| StorageError::redb(ctx, e))?;
    match txn.open_table(META) {
        Err(TableError::TableDoesNotExist(_)) => initialize(db),
        Err(e) => Err(StorageError::redb(ctx, e).into()),
        Ok(_) => Ok(()),
    }
}

/// Gives the finished temporary file its real name without ever replacing an existing file.
fn link_into_place(temp: &Path, path: &Path) -> Result<(), OpenError> {
    match fs::hard_link(temp, path) {
        Ok(()) => Ok(()),
        // Another process created the store first: use theirs.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        // File systems without hard links: a rename, checked first (a narrow race remains).
        Err(_) if !path.exists() => fs::rename(temp, path).map_err(|e| {
            StorageError::io(format!("moving the new store to {}", path.display()), e).into()
        }),
        Err(e) => {
            Err(StorageError::io(format!("linking the new store to {}", path.display()), e).into())
        }
    }
}

/// Opens the log file, creating it with permission bits `mode` if needed, and makes its
/// directory entry durable. With `preallocate`, zero-fills it to that many bytes first (unless
/// it is that long already), so that appends overwrite allocated blocks and a sync flushes data
/// only; the log then grows ahead of its frames as it is used (`Wal::preallocate`).
///
/// The directory is synced on every open, not only when the file is created here: a process
/// that created the log may have died before its directory sync, and the file it left can
/// still be in the page cache only; a power loss would then take the log, and every answer
/// given from it, away.
pub(crate) fn open_log(
    path: &Path,
    mode: u32,
    preallocate: Option<u64>,
) -> Result<OsFile, OpenError> {
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(mode)
        .open(path)
        .map_err(|e| StorageError::io(format!("opening log {}", path.display()), e))?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    sync_dir(dir)?;
    let file = OsFile(file);
    if let Some(size) = preallocate {
        zero_fill_to(&file, size)
            .map_err(|e| StorageError::io(format!("preallocating log {}", path.display()), e))?;
    }
    Ok(file)
}

/// Renames another store's log at `path` out of the way (it is never deleted), with a name
/// that says whose it was and when it was set aside, and makes the rename durable. Returns the
/// new name.
pub(crate) fn set_aside(path: &Path, other: u64) -> Result<PathBuf, OpenError> {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".foreign-{other:016x}-{millis}"));
    let aside = PathBuf::from(name);
    fs::rename(path, &aside).map_err(|e| {
        StorageError::io(
            format!(
                "setting aside log {} (it belongs to another store) as {}",
                path.display(),
                aside.display()
            ),
            e,
        )
    })?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    sync_dir(dir)?;
    Ok(aside)
}

/// Zero-fills the log to `size` bytes unless it is that long already, and makes its length
/// durable.
fn zero_fill_to(file: &OsFile, size: u64) -> io::Result<()> {
    let len = file.len()?;
    if len >= size {
        return Ok(());
    }
    crate::log::zero_fill(file, len, size)?;
    file.0.sync_all()
}

/// Every directory synced, for tests that check a directory entry was made durable (feature
/// `__whitebox`).
#[cfg(feature = "__whitebox")]
pub(crate) static SYNCED_DIRS: parking_lot::Mutex<Vec<PathBuf>> =
    parking_lot::Mutex::new(Vec::new());

fn sync_dir(dir: &Path) -> Result<(), OpenError> {
    #[cfg(feature = "__whitebox")]
    SYNCED_DIRS.lock().push(dir.to_path_buf());
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StorageError::io(format!("syncing directory {}", dir.display()), e).into())
}

/// Opens the file of a closed store as a plain redb [`Database`], through the checksummed
/// page layer every store file has (docs/format.md): for reading the tables a caller writes
/// with [`Store::complete_with`](crate::Store::complete_with), or for tools. A block that
/// fails its checksum is an error from redb, and redb's own `Database::open` cannot read the
/// file (it does not start with redb's header).
///
/// The store must not be open (one process owns a file: [`OpenError::AlreadyOpen`] otherwise).
/// Nothing is replayed from the store's log: open the store once first if it was not closed
/// cleanly. A write transaction committed through this handle should use redb's
/// `set_two_phase_commit(true)`, as the store's own durable commits do, so that a power loss
/// during it cannot leave a block whose checksum does not match.
///
/// ```
/// use idemstore::redb::ReadableDatabase;
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("keys.idem");
/// drop(idemstore::Store::open(&path)?);
/// let db = idemstore::open_redb(&path)?;
/// let txn = db.begin_read()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`OpenError::NotAStore`] for a file that is not a store file, [`OpenError::AlreadyOpen`],
/// [`OpenError::Storage`] with [`StorageError::Corruption`](crate::StorageError::Corruption)
/// naming the offset of a damaged block or [`StorageError::Io`](crate::StorageError::Io).
/// Each converts into [`Error::Open`](crate::Error::Open).
pub fn open_redb(path: impl AsRef<Path>) -> Result<Database, OpenError> {
    let path = path.as_ref();
    check_page_file(path)?;
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| StorageError::io(format!("opening store {}", path.display()), e))?;
    redb::Builder::new()
        .create_with_backend(page_file(file, path)?)
        .map_err(|e| open_error(path, "opening", e))
}

/// [`open_redb`] without writing: a [`redb::ReadOnlyDatabase`] (which refuses a file that
/// needs crash recovery; open the store once first).
///
/// # Errors
/// As [`open_redb`].
pub fn open_redb_read_only(path: impl AsRef<Path>) -> Result<redb::ReadOnlyDatabase, OpenError> {
    let path = path.as_ref();
    check_page_file(path)?;
    let file =
        File::open(path).map_err(|e| StorageError::io(format!("opening {}", path.display()), e))?;
    redb::Builder::new()
        .open_read_only_with_backend(page_file(file, path)?)
        .map_err(|e| open_error(path, "opening", e))
}

/// Refuses a path that is not a page file, without writing to it: with the same
/// [`OpenError::NotAStore`] as opening a store, for a directory or a file too short.
pub(crate) fn check_page_file(path: &Path) -> Result<(), OpenError> {
    if fs::metadata(path).is_ok_and(|meta| meta.is_dir()) {
        return Err(not_a_store(path, "it is a directory"));
    }
    let mut start = [0u8; 32];
    match File::open(path).and_then(|mut file| file.read_exact(&mut start)) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            return Err(not_a_store(path, "it is shorter than a store header"))
        }
        read => read.map_err(|e| StorageError::io(format!("reading {}", path.display()), e))?,
    }
    crate::tree::check_header(&start).map_err(|reason| not_a_store(path, reason))
}
