//! Opening a local store fails with an `OpenError` that holds only the ways opening can fail
//! (its storage failures in the shared `StorageError`), and converts into the umbrella
//! `Error::Open` with the same message, I/O kind and source. Each case makes one kind of open
//! failure happen for real and checks both sides.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemstore::{Builder, Error, LogFile, OpenError, StorageError};

use crate::common::{acquire, fp, key, Env};

fn log_of(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".wal");
    PathBuf::from(name)
}

/// The variant's name (the caller's side of `#[non_exhaustive]` needs a wildcard); an
/// error of the shared core is named by its own variant.
fn open_variant(error: &OpenError) -> &'static str {
    match error {
        OpenError::InvalidConfig { .. } => "InvalidConfig",
        OpenError::AlreadyOpen { .. } => "AlreadyOpen",
        OpenError::NotAStore { .. } => "NotAStore",
        OpenError::ForeignLog { .. } => "ForeignLog",
        OpenError::LostLog { .. } => "LostLog",
        OpenError::Storage(StorageError::Io { .. }) => "Io",
        OpenError::Storage(StorageError::Redb { .. }) => "Redb",
        OpenError::Storage(StorageError::Corruption { .. }) => "Corruption",
        _ => "a variant this test does not know",
    }
}

fn error_variant(error: &Error) -> &'static str {
    match error {
        Error::Open(open) => open_variant(open),
        _ => "a variant opening cannot fail with",
    }
}

/// Checks that `result` failed as `expected`, and that its conversion into `Error` keeps the
/// variant, the message, the I/O kind and the source; returns the message.
#[track_caller]
fn fails_as<T>(result: Result<T, OpenError>, expected: &str) -> String {
    let Err(open) = result else {
        panic!("the open succeeded; expected OpenError::{expected}");
    };
    assert_eq!(open_variant(&open), expected, "{open:?}");
    converts_the_same(open)
}

/// Checks that `open` converts into `Error::Open` with the same
/// message, I/O kind and source; returns the message.
#[track_caller]
fn converts_the_same(open: OpenError) -> String {
    let message = open.to_string();
    let expected = open_variant(&open);
    let io_kind = open.io_kind();
    let source = std::error::Error::source(&open).map(ToString::to_string);
    // `?` in a function returning `idemstore::Result` converts it.
    let converted: Error = (|| -> idemstore::Result<()> { Err(open)? })()
        .expect_err("the conversion keeps the failure");
    assert_eq!(
        error_variant(&converted),
        expected,
        "converted into the wrong Error variant: {converted:?}"
    );
    assert_eq!(converted.to_string(), message, "the message changed");
    assert_eq!(converted.io_kind(), io_kind, "the I/O kind changed");
    assert_eq!(
        std::error::Error::source(&converted).map(ToString::to_string),
        source,
        "the source changed"
    );
    message
}

#[track_caller]
fn names(message: &str, path: &Path) {
    assert!(
        message.contains(&path.display().to_string()),
        "the message names {}: {message}",
        path.display()
    );
}

/// A store file and its log as a killed process leaves them (copied while the store is open:
/// the operating system holds every write the process made), at `env.path`.
fn killed(env: &Env) {
    let scratch = Env::new();
    let store = scratch.open();
    let lease = acquire(&store, &key("u", "charge", "k1"), fp("b"));
    store.complete(&lease, b"done".to_vec()).unwrap();
    fs::copy(&scratch.path, &env.path).unwrap();
    fs::copy(log_of(&scratch.path), log_of(&env.path)).unwrap();
    drop(store);
}

#[test]
fn a_setting_out_of_range_is_invalid_config() {
    let env = Env::new();
    let message = fails_as(
        env.builder().lease(Duration::ZERO).open(&env.path),
        "InvalidConfig",
    );
    assert!(message.contains("lease"), "{message}");
    assert!(!env.path.exists(), "nothing was created");
}

#[test]
fn a_store_open_elsewhere_is_already_open() {
    let env = Env::new();
    let store = env.open();
    names(
        &fails_as(env.builder().open(&env.path), "AlreadyOpen"),
        &env.path,
    );
    names(
        &fails_as(idemstore::open_redb(&env.path), "AlreadyOpen"),
        &env.path,
    );
    names(
        &fails_as(idemstore::compact(&env.path), "AlreadyOpen"),
        &env.path,
    );
    drop(store);
}

#[test]
fn a_directory_or_another_file_is_not_a_store() {
    let env = Env::new();
    let dir = env.dir.path().join("a-directory");
    fs::create_dir(&dir).unwrap();
    names(&fails_as(idemstore::Store::open(&dir), "NotAStore"), &dir);
    let text = env.dir.path().join("notes.txt");
    fs::write(&text, vec![b'x'; 4096]).unwrap();
    names(&fails_as(env.builder().open(&text), "NotAStore"), &text);
    names(
        &fails_as(idemstore::open_redb_read_only(&text), "NotAStore"),
        &text,
    );
    names(&fails_as(idemstore::compact(&text), "NotAStore"), &text);
    assert_eq!(fs::read(&text).unwrap(), vec![b'x'; 4096], "left untouched");
}

#[test]
fn a_missing_directory_is_an_io_error_naming_the_store() {
    let env = Env::new();
    let path = env.dir.path().join("no-such-directory").join("store.idem");
    names(&fails_as(env.builder().open(&path), "Io"), &path);
    names(&fails_as(idemstore::open_redb(&path), "Io"), &path);
}

#[test]
fn a_log_with_a_damaged_identity_is_a_foreign_log() {
    let env = Env::new();
    drop(env.open());
    let mut log = fs::read(log_of(&env.path)).unwrap();
    log[0] ^= 0xff;
    fs::write(log_of(&env.path), &log).unwrap();
    let message = fails_as(env.builder().open(&env.path), "ForeignLog");
    names(&message, &env.path);
    names(&message, &log_of(&env.path));
}

#[test]
fn a_crashed_store_without_its_log_is_a_lost_log() {
    let env = Env::new();
    killed(&env);
    fs::remove_file(log_of(&env.path)).unwrap();
    let message = fails_as(env.builder().open(&env.path), "LostLog");
    names(&message, &env.path);
    assert!(message.contains("accept_log_loss"), "{message}");
}

#[test]
fn a_damaged_log_frame_is_corruption() {
    let env = Env::new();
    killed(&env);
    let mut log = fs::read(log_of(&env.path)).unwrap();
    // Inside the first frame's payload (frames start after the 32-byte identity).
    log[62] ^= 1 << 3;
    fs::write(log_of(&env.path), &log).unwrap();
    let message = fails_as(env.builder().open(&env.path), "Corruption");
    assert!(message.contains("offset"), "{message}");
}

/// Bytes in memory shared by clones, whose syncs fail once `syncs_left` runs out.
#[derive(Clone, Debug)]
struct Memory {
    bytes: Arc<Mutex<Vec<u8>>>,
    syncs_left: Arc<AtomicI64>,
}

impl Memory {
    fn new() -> Memory {
        Memory {
            bytes: Arc::default(),
            syncs_left: Arc::new(AtomicI64::new(i64::MAX)),
        }
    }

    /// A copy of the bytes on a disk of its own, whose syncs fail after `syncs` succeed.
    fn copy_failing_after(&self, syncs: i64) -> Memory {
        Memory {
            bytes: Arc::new(Mutex::new(self.bytes.lock().unwrap().clone())),
            syncs_left: Arc::new(AtomicI64::new(syncs)),
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let mut bytes = self.bytes.lock().unwrap();
        let end = offset as usize + data.len();
        if bytes.len() < end {
            bytes.resize(end, 0);
        }
        bytes[offset as usize..end].copy_from_slice(data);
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let bytes = self.bytes.lock().unwrap();
        let range = offset as usize..offset as usize + out.len();
        out.copy_from_slice(bytes.get(range).ok_or(io::ErrorKind::UnexpectedEof)?);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        if self.syncs_left.fetch_sub(1, Ordering::Relaxed) <= 0 {
            return Err(io::Error::other("the disk refused the sync"));
        }
        Ok(())
    }
}

impl idemstore::redb::StorageBackend for Memory {
    fn len(&self) -> io::Result<u64> {
        Ok(self.bytes.lock().unwrap().len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        Memory::read(self, offset, out)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.bytes.lock().unwrap().resize(len as usize, 0);
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        self.sync()
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        Memory::write(self, offset, data);
        Ok(())
    }
}

impl LogFile for Memory {
    fn len(&self) -> io::Result<u64> {
        Ok(self.bytes.lock().unwrap().len() as u64)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read(offset, buf)
    }
    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.write(offset, data);
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        self.sync()
    }
}

/// The store file's disk refuses a sync, the first, the second, ... of an open, until one
/// open needs no more syncs than it allows: redb's own open fails with an I/O error naming
/// the store, and the open's durable commit (the one that takes the clean-close mark, in
/// recovery, a helper shared with the operations) with a storage error whose source is the
/// disk's error. Each converts into the same `Error`.
#[test]
fn a_sync_refused_during_the_open_is_an_io_or_storage_error() {
    let (db, log) = (Memory::new(), Memory::new());
    drop(
        Builder::new()
            .open_with_storage(db.clone(), log.clone())
            .unwrap(),
    );
    let mut seen = Vec::new();
    for syncs in 0.. {
        assert!(
            syncs < 100,
            "an open of a closed store takes fewer than 100 syncs"
        );
        let open = Builder::new().open_with_storage(
            db.copy_failing_after(syncs),
            log.copy_failing_after(i64::MAX),
        );
        let Err(error) = open else { break };
        let variant = open_variant(&error);
        // The disk's refusal is the cause (`source()`), printed once by a reporter.
        let mut chain = error.to_string();
        let mut cause = std::error::Error::source(&error);
        while let Some(next) = cause {
            chain = format!("{chain}: {next}");
            cause = next.source();
        }
        let message = converts_the_same(error);
        assert!(chain.contains("the disk refused the sync"), "{chain}");
        if variant == "Io" {
            assert!(message.contains("storage.idem"), "{message}");
        }
        seen.push(variant);
    }
    seen.dedup();
    assert_eq!(
        seen,
        ["Io", "Redb"],
        "the failures, in the order of the syncs"
    );
}
