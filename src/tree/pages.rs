//! The checksummed page layer under redb: every 4 KiB block redb writes gets a CRC-32, and
//! every block read back from the disk is checked against it before redb sees a byte, so a
//! damaged page is an error naming the file and the offset, never a page redb trusts (which
//! could panic it, or answer a completed key as absent). The idea is SQLite's checksum VFS
//! shim (`cksumvfs`), here behind redb's public [`redb::StorageBackend`] seam.
//!
//! # Layout (docs/format.md, "The page layer")
//! ```text
//! file   = header block | group 0 | group 1 | ...            (every block 4096 bytes)
//! header = magic "IDEMPAGE" | version u32 = 1 | block u32 = 4096 | group u32 = 1024
//!          | zero 8 bytes | crc32 u32 of bytes 0..28          (then zeros to 4096)
//! group  = sums block (1024 × crc32 u32) | 1024 data blocks (4 MiB of redb's bytes)
//! ```
//! redb's byte `L` lives in data block `L / 4096`; the sum of data block `b` is
//! `crc32(b as u64 LE ‖ the block's 4096 bytes)` (the block number is mixed in, so a block
//! written at the wrong place fails too). CRC-32 finds every change of up to 32 consecutive
//! bits, so every single flipped byte is found, not only most. A sum of 0 with an all-zero
//! block is a block never written (files grow zero-filled). Block 0 (redb's header, rewritten
//! in place by every commit) carries its sum inside itself, in bytes 504..508 (redb's header
//! uses 320 bytes), and is written one 512-byte sector at a time: see "Crash consistency".
//!
//! # Crash consistency
//! A sum and its block are two writes, so a crash can leave one without the other. This
//! never turns into a false alarm, because of how redb commits (copy on write, and every
//! durable commit of a store is two-phase, `set_quick_repair`):
//! - a block reachable from the last durable commit is never rewritten until a later durable
//!   commit replaced it; after a crash redb reads only blocks reachable from the last durable
//!   commit, whose sums were synced with them (sums are written just before each sync);
//! - a sums block is rewritten whole, but the sums of blocks that did not change are the same
//!   bytes in the old and the new copy, so a torn or lost write of it changes only the sums of
//!   blocks rewritten since the last sync, which nothing reachable uses;
//! - redb's header (block 0) is the one block rewritten in place. Its sum sits in the same
//!   512-byte sector as its 320 bytes, and only that sector is written, so a write of it is
//!   all old or all new, header and sum together (the model of the simulated disk: a power
//!   loss keeps or loses each sector of a write as a whole).
//!
//! Sums are kept in memory once read (4 KiB per 4 MiB of store, read on first use), so an open
//! reads one sums block per group it touches and its time does not grow with the store.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io;
use std::ops::Bound;
use std::sync::Arc;

use parking_lot::Mutex;
use redb::{BackendError, StorageBackend};

/// Bytes per block.
pub const BLOCK: u64 = 4096;
/// Data blocks per group (one sums block covers them).
pub const GROUP: u64 = BLOCK / 4;
/// Bytes of a group on disk: its sums block and its data blocks.
pub const GROUP_BYTES: u64 = (GROUP + 1) * BLOCK;
/// The page file's magic.
pub(crate) const MAGIC: [u8; 8] = *b"IDEMPAGE";
/// The layout version this build writes and reads.
const VERSION: u32 = 1;
/// Where block 0 keeps its own sum.
const HEADER_SUM: std::ops::Range<usize> = 504..508;
/// The sector of block 0 that holds redb's header and the sum.
const SECTOR: usize = 512;

use crate::error::StorageError;

/// The sums of one group, as in memory.
struct Sums {
    sums: Box<[u32]>,
    dirty: bool,
}

#[derive(Default)]
struct State {
    groups: HashMap<u64, Sums>,
    /// Block 0 as last read or written (its sum in place).
    block0: Option<Box<[u8]>>,
}

/// redb's storage, checksummed block by block, over any backend (a file, a simulated disk).
pub(crate) struct PageFile<B> {
    inner: B,
    file: Arc<str>,
    state: Mutex<State>,
}

impl<B> fmt::Debug for PageFile<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PageFile({})", self.file)
    }
}

/// The header block of a new page file.
fn header_block() -> Vec<u8> {
    let mut block = vec![0u8; BLOCK as usize];
    block[..8].copy_from_slice(&MAGIC);
    block[8..12].copy_from_slice(&VERSION.to_le_bytes());
    block[12..16].copy_from_slice(&(BLOCK as u32).to_le_bytes());
    block[16..20].copy_from_slice(&(GROUP as u32).to_le_bytes());
    let crc = crc32fast::hash(&block[..28]);
    block[28..32].copy_from_slice(&crc.to_le_bytes());
    block
}

/// Why `block` (the first bytes of a file) is not a page-file header this build reads.
pub(crate) fn check_header(block: &[u8]) -> Result<(), String> {
    if block.len() < 32 || block[..8] != MAGIC {
        return Err("it does not start with idemstore's page-file magic".into());
    }
    let le = |r: std::ops::Range<usize>| u32::from_le_bytes(block[r].try_into().expect("4 bytes"));
    if crc32fast::hash(&block[..28]) != le(28..32) {
        return Err("its page-file header fails its checksum".into());
    }
    if le(8..12) != VERSION || le(12..16) != BLOCK as u32 || le(16..20) != GROUP as u32 {
        return Err(format!(
            "page-file layout version {} (block {}, group {}); this build reads version {VERSION}",
            le(8..12),
            le(12..16),
            le(16..20)
        ));
    }
    Ok(())
}

/// The layer's work since the process started, counted for the load generator only (hidden
/// feature `__whitebox`; `whitebox::page_work`): 4 KiB blocks checksummed (read or written)
/// and sums blocks written.
#[cfg(feature = "__whitebox")]
pub(crate) mod work {
    use std::sync::atomic::AtomicU64;

    /// CRC-32s of a 4 KiB block (data blocks and block 0).
    pub(crate) static SUMMED: AtomicU64 = AtomicU64::new(0);
    /// Sums blocks written (one per group changed, before each sync).
    pub(crate) static SUMS_WRITTEN: AtomicU64 = AtomicU64::new(0);
}

/// Counts one unit of the layer's work.
#[cfg(feature = "__whitebox")]
fn count(what: &std::sync::atomic::AtomicU64) {
    what.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// The sum of data block `index` holding `data`.
pub(crate) fn sum(index: u64, data: &[u8]) -> u32 {
    #[cfg(feature = "__whitebox")]
    count(&work::SUMMED);
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&index.to_le_bytes());
    hasher.update(data);
    hasher.finalize()
}

/// The sum of block 0, over the block with its sum bytes zeroed.
fn sum0(block: &[u8]) -> u32 {
    #[cfg(feature = "__whitebox")]
    count(&work::SUMMED);
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&0u64.to_le_bytes());
    hasher.update(&block[..HEADER_SUM.start]);
    hasher.update(&[0; 4]);
    hasher.update(&block[HEADER_SUM.end..]);
    hasher.finalize()
}

/// The offset on disk of data block `index`.
pub fn data_offset(index: u64) -> u64 {
    BLOCK + (index / GROUP) * GROUP_BYTES + BLOCK + (index % GROUP) * BLOCK
}

/// The offset on disk of the sums block of `group`.
fn sums_offset(group: u64) -> u64 {
    BLOCK + group * GROUP_BYTES
}

/// The length on disk of a page file holding `len` bytes for redb.
pub fn physical_len(len: u64) -> u64 {
    let blocks = len.div_ceil(BLOCK);
    let groups = blocks.div_ceil(GROUP);
    // The last block may be partial: the file ends where redb's last byte does.
    BLOCK + groups * BLOCK + len
}

/// The bytes for redb in a page file of `physical` bytes on disk.
pub fn logical_len(physical: u64) -> u64 {
    let body = physical.saturating_sub(BLOCK);
    let full = body / GROUP_BYTES;
    let rest = body % GROUP_BYTES;
    full * GROUP * BLOCK + rest.saturating_sub(BLOCK)
}

fn is_zero(data: &[u8]) -> bool {
    data.iter().all(|&b| b == 0)
}

impl<B: StorageBackend> PageFile<B> {
    /// A page file over `inner`, named `file` in errors. An empty `inner` gets the header
    /// block (not synced: redb syncs before anything depends on it); otherwise the header is
    /// checked.
    pub(crate) fn new(inner: B, file: &str) -> io::Result<PageFile<B>> {
        let pages = PageFile {
            inner,
            file: file.into(),
            state: Mutex::new(State::default()),
        };
        let len = pages.inner.len()?;
        if len == 0 {
            pages.inner.write(0, &header_block())?;
        } else {
            let mut header = vec![0u8; (BLOCK.min(len)) as usize];
            pages.inner.read(0, &mut header)?;
            if let Err(reason) = check_header(&header) {
                return Err(pages.damage(0, reason));
            }
        }
        Ok(pages)
    }

    fn damage(&self, offset: u64, reason: String) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            StorageError::Corruption {
                location: format!("store {} at offset {offset}", self.file),
                reason,
            },
        )
    }

    /// Runs `f` with the sums of `group`, reading them on first use.
    fn with_sums<R>(
        &self,
        state: &mut State,
        group: u64,
        f: impl FnOnce(&mut Sums) -> R,
    ) -> io::Result<R> {
        let sums = match state.groups.entry(group) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let mut bytes = vec![0u8; BLOCK as usize];
                let offset = sums_offset(group);
                // A group past the end of the file (being grown into) has no sums yet.
                if offset + BLOCK <= self.inner.len()? {
                    self.inner.read(offset, &mut bytes)?;
                }
                let sums = bytes
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                    .collect();
                entry.insert(Sums { sums, dirty: false })
            }
        };
        Ok(f(sums))
    }

    /// Checks data block `index` (not block 0), read from disk as `data`.
    fn verify(&self, index: u64, data: &[u8]) -> io::Result<()> {
        let mut state = self.state.lock();
        let stored = self.with_sums(&mut state, index / GROUP, |s| {
            s.sums[(index % GROUP) as usize]
        })?;
        drop(state);
        if stored == sum(index, data) || (stored == 0 && is_zero(data)) {
            return Ok(());
        }
        Err(self.damage(
            data_offset(index),
            format!(
                "a page of the B-tree file fails its checksum (stored {stored:#010x}, computed {:#010x}): the block was damaged on disk",
                sum(index, data)
            ),
        ))
    }

    /// Block 0, read and checked (zeroed sum bytes: what redb wrote).
    fn block0(&self, state: &mut State) -> io::Result<Box<[u8]>> {
        if let Some(block) = &state.block0 {
            return Ok(block.clone());
        }
        let mut block = vec![0u8; BLOCK as usize].into_boxed_slice();
        let have = self.block_len(0)?;
        self.inner.read(data_offset(0), &mut block[..have])?;
        let stored = u32::from_le_bytes(block[HEADER_SUM].try_into().expect("4 bytes"));
        if stored != sum0(&block) && !is_zero(&block) {
            return Err(self.damage(
                data_offset(0),
                format!(
                    "redb's header block fails its checksum (stored {stored:#010x}, computed {:#010x}): the block was damaged on disk",
                    sum0(&block)
                ),
            ));
        }
        block[HEADER_SUM].fill(0);
        state.block0 = Some(block.clone());
        Ok(block)
    }

    /// Reads `out.len()` bytes of redb's at `offset`, checking every block they touch. The
    /// lock is held to look sums up, not across the reads (redb never rewrites a block a
    /// reader can reach).
    fn read_checked(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let end = offset + out.len() as u64;
        let mut at = offset;
        let mut scratch = Vec::new();
        while at < end {
            let index = at / BLOCK;
            let in_block = (at % BLOCK) as usize;
            let out_at = (at - offset) as usize;
            if index == 0 {
                let block = self.block0(&mut self.state.lock())?;
                let n = (BLOCK as usize - in_block).min((end - at) as usize);
                out[out_at..out_at + n].copy_from_slice(&block[in_block..in_block + n]);
                at += n as u64;
                continue;
            }
            if in_block == 0 && end - at >= BLOCK {
                // Whole blocks, contiguous on disk up to the end of the group.
                let group_end = (index / GROUP + 1) * GROUP;
                let blocks = ((end - at) / BLOCK).min(group_end - index);
                let n = (blocks * BLOCK) as usize;
                let chunk = &mut out[out_at..out_at + n];
                self.inner.read(data_offset(index), chunk)?;
                for (i, data) in chunk.chunks_exact(BLOCK as usize).enumerate() {
                    self.verify(index + i as u64, data)?;
                }
                at += n as u64;
                continue;
            }
            // Part of a block: read it all to check it.
            let block_len = self.block_len(index)?;
            scratch.resize(block_len, 0);
            self.inner.read(data_offset(index), &mut scratch)?;
            if block_len == BLOCK as usize {
                self.verify(index, &scratch)?;
            }
            let n = (block_len - in_block).min((end - at) as usize);
            out[out_at..out_at + n].copy_from_slice(&scratch[in_block..in_block + n]);
            at += n as u64;
        }
        Ok(())
    }

    /// How many bytes of block `index` the file holds (the last one may be partial).
    fn block_len(&self, index: u64) -> io::Result<usize> {
        let len = logical_len(self.inner.len()?);
        Ok((len.saturating_sub(index * BLOCK)).min(BLOCK) as usize)
    }

    fn write_checked(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut state = self.state.lock();
        let end = offset + data.len() as u64;
        let mut at = offset;
        while at < end {
            let index = at / BLOCK;
            let in_block = (at % BLOCK) as usize;
            let data_at = (at - offset) as usize;
            let n = (BLOCK as usize - in_block).min((end - at) as usize);
            if index == 0 {
                let mut block = self.block0(&mut state)?;
                block[in_block..in_block + n].copy_from_slice(&data[data_at..data_at + n]);
                if !is_zero(&block[HEADER_SUM]) {
                    return Err(io::Error::other(format!(
                        "store {}: redb wrote into bytes {}..{} of its header block, where the page layer keeps the block's checksum",
                        self.file, HEADER_SUM.start, HEADER_SUM.end
                    )));
                }
                let mut stored = block.clone();
                stored[HEADER_SUM].copy_from_slice(&sum0(&block).to_le_bytes());
                // One sector when the write stays in it: all old or all new after a crash.
                let whole = in_block + n > SECTOR;
                let len = if whole { BLOCK as usize } else { SECTOR };
                self.inner.write(data_offset(0), &stored[..len])?;
                state.block0 = Some(block);
                at += n as u64;
                continue;
            }
            if in_block == 0 && end - at >= BLOCK {
                let group_end = (index / GROUP + 1) * GROUP;
                let blocks = ((end - at) / BLOCK).min(group_end - index);
                let len = (blocks * BLOCK) as usize;
                let chunk = &data[data_at..data_at + len];
                self.inner.write(data_offset(index), chunk)?;
                self.with_sums(&mut state, index / GROUP, |s| {
                    for (i, block) in chunk.chunks_exact(BLOCK as usize).enumerate() {
                        let b = index + i as u64;
                        s.sums[(b % GROUP) as usize] = sum(b, block);
                    }
                    s.dirty = true;
                })?;
                at += len as u64;
                continue;
            }
            // Part of a block: read the rest (checked), then write the whole block.
            let block_len = self.block_len(index)?.max(in_block + n);
            let mut block = vec![0u8; block_len];
            let have = self.block_len(index)?;
            self.inner.read(data_offset(index), &mut block[..have])?;
            if have == BLOCK as usize {
                drop(state);
                self.verify(index, &block)?;
                state = self.state.lock();
            }
            block[in_block..in_block + n].copy_from_slice(&data[data_at..data_at + n]);
            self.inner.write(data_offset(index), &block)?;
            if block_len == BLOCK as usize {
                self.with_sums(&mut state, index / GROUP, |s| {
                    s.sums[(index % GROUP) as usize] = sum(index, &block);
                    s.dirty = true;
                })?;
            }
            at += n as u64;
        }
        Ok(())
    }

    /// Writes the sums changed since the last sync (before the sync that makes them durable).
    fn write_sums(&self) -> io::Result<()> {
        let mut state = self.state.lock();
        let groups = logical_len(self.inner.len()?)
            .div_ceil(BLOCK)
            .div_ceil(GROUP);
        let dirty: BTreeMap<u64, Vec<u8>> = state
            .groups
            .iter()
            .filter(|(g, s)| s.dirty && **g < groups)
            .map(|(g, s)| (*g, s.sums.iter().flat_map(|v| v.to_le_bytes()).collect()))
            .collect();
        for (group, bytes) in dirty {
            self.inner.write(sums_offset(group), &bytes)?;
            #[cfg(feature = "__whitebox")]
            count(&work::SUMS_WRITTEN);
            state.groups.get_mut(&group).expect("listed").dirty = false;
        }
        Ok(())
    }

    fn set_len_checked(&self, len: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        let old = logical_len(self.inner.len()?);
        if len < old {
            // Blocks cut off lose their sums, so that growing again finds zeros, not stale sums.
            let first = len.div_ceil(BLOCK);
            let last = old.div_ceil(BLOCK);
            for index in first..last {
                let group = index / GROUP;
                if group * GROUP >= first {
                    // No block of the group is left: its sums block goes with the file's end.
                    state.groups.remove(&group);
                    continue;
                }
                self.with_sums(&mut state, group, |s| {
                    s.sums[(index % GROUP) as usize] = 0;
                    s.dirty = true;
                })?;
            }
            if len < BLOCK {
                state.block0 = None;
            }
        }
        self.inner.set_len(physical_len(len))
    }
}

impl<B: StorageBackend> StorageBackend for PageFile<B> {
    fn len(&self) -> io::Result<u64> {
        Ok(logical_len(self.inner.len()?))
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.read_checked(offset, out)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.set_len_checked(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.write_sums()?;
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write_checked(offset, data)
    }

    fn close(&self) -> io::Result<()> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}
