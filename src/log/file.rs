//! The file underneath the log, behind a small public trait ([`LogFile`]) so that a store
//! can run on other storage ([`Builder::open_with_storage`](crate::Builder::open_with_storage)):
//! the simulated disk of the crash tests, an in-memory store in a user's own tests.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Positional I/O on the store's log: the log file's half of the storage seam, as
/// [`redb::StorageBackend`] is the store file's (see
/// [`Builder::open_with_storage`](crate::Builder::open_with_storage)).
///
/// The store relies on what a file gives: bytes written and then synced by
/// [`sync_data`](LogFile::sync_data) survive a crash; unsynced ones may be lost or torn, which
/// recovery handles. An implementation that loses synced bytes loses acknowledged answers.
// `len` mirrors `redb::StorageBackend::len` (an I/O result, so no `is_empty` beside it).
#[allow(clippy::len_without_is_empty)]
pub trait LogFile: Send + Sync + fmt::Debug {
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Fills `buf` from `offset`; an error if the file ends first.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `data` at `offset`, extending the file if needed.
    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every write so far durable (fdatasync).
    fn sync_data(&self) -> io::Result<()>;
}

/// The operating system's file.
#[derive(Debug)]
pub(crate) struct OsFile(pub(crate) File);

impl LogFile for OsFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(&self.0, buf, offset)
    }
    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(&self.0, data, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
}
