//! The physical limit: one in-place overwrite of a preallocated 4 KiB block and one
//! `fdatasync` per durable operation, serialized by a mutex. Not a store (no index on disk, no
//! recovery); the in-memory set only tells new keys from duplicates, which cost no I/O.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use super::{context, preallocated, BenchKey, BenchResult, Engine, Handle};

const BLOCK: usize = 4096;
/// The preallocated ring the blocks are written to, in place: 4 MiB.
const RING: u64 = 4 << 20;
/// Bytes per record in a batch: key, fingerprint, padding.
const RECORD: usize = 64;

struct Ring {
    file: File,
    /// Byte offset of the next write.
    next: u64,
    seen: HashSet<[u8; BenchKey::FLAT_LEN]>,
    buf: Vec<u8>,
}

impl Ring {
    /// Overwrites `self.buf` in place at the next offset (wrapping) and syncs the data.
    fn write_and_sync(&mut self) -> BenchResult<()> {
        let len = self.buf.len().div_ceil(BLOCK) * BLOCK;
        self.buf.resize(len, 0);
        if self.next + len as u64 > RING {
            self.next = 0;
        }
        self.file
            .write_all_at(&self.buf, self.next)
            .map_err(context("fdatasync: write"))?;
        self.file
            .sync_data()
            .map_err(context("fdatasync: fdatasync"))?;
        self.next += len as u64;
        self.buf.clear();
        Ok(())
    }
}

/// A raw file overwritten in place, one `fdatasync` per operation (or per batch).
pub struct Fdatasync(Arc<Mutex<Ring>>);

impl Engine for Fdatasync {
    const NAME: &'static str = "fdatasync";
    type Handle = FdatasyncHandle;

    fn open(dir: &Path) -> BenchResult<Self> {
        let file = preallocated(&dir.join("ring.bin"), RING, "fdatasync")?;
        Ok(Fdatasync(Arc::new(Mutex::new(Ring {
            file,
            next: 0,
            seen: HashSet::new(),
            buf: Vec::with_capacity(BLOCK),
        }))))
    }

    fn handle(&self) -> BenchResult<FdatasyncHandle> {
        Ok(FdatasyncHandle(Arc::clone(&self.0)))
    }
}

/// A thread's handle: the shared file.
pub struct FdatasyncHandle(Arc<Mutex<Ring>>);

impl FdatasyncHandle {
    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds each new key's record to the buffer; how many were new.
    fn stage(ring: &mut Ring, keys: &[BenchKey], result: &[u8]) -> usize {
        let mut new = 0;
        for key in keys {
            if ring.seen.insert(*key.flat()) {
                let start = ring.buf.len();
                ring.buf.extend_from_slice(key.flat());
                ring.buf.extend_from_slice(&key.fingerprint());
                ring.buf.extend_from_slice(result);
                ring.buf.resize(
                    start + (ring.buf.len() - start).div_ceil(RECORD) * RECORD,
                    0,
                );
                new += 1;
            }
        }
        new
    }
}

impl Handle for FdatasyncHandle {
    type Lease = ();

    fn reserve(&mut self, key: &BenchKey) -> BenchResult<Option<()>> {
        let mut ring = self.lock();
        if Self::stage(&mut ring, std::slice::from_ref(key), &[]) == 0 {
            return Ok(None);
        }
        ring.write_and_sync()?;
        Ok(Some(()))
    }

    fn complete(&mut self, key: &BenchKey, _lease: (), result: &[u8]) -> BenchResult<()> {
        let mut ring = self.lock();
        ring.buf.extend_from_slice(key.flat());
        ring.buf.extend_from_slice(result);
        ring.write_and_sync()
    }

    fn reserve_many(&mut self, keys: &[BenchKey]) -> BenchResult<usize> {
        let mut ring = self.lock();
        let new = Self::stage(&mut ring, keys, &[]);
        if new > 0 {
            ring.write_and_sync()?;
        }
        Ok(new)
    }

    fn fill(&mut self, keys: &[BenchKey], result: &[u8]) -> BenchResult<()> {
        let mut ring = self.lock();
        let new = Self::stage(&mut ring, keys, result);
        if new != keys.len() {
            return Err("fdatasync: prefill of a key already stored".into());
        }
        ring.write_and_sync()
    }
}
