//! The log's identity block: the first [`LOG_HEADER_LEN`] bytes of the log name the store it
//! belongs to, so a store never replays another store's log.
//!
//! ```text
//! identity = magic "IDEMLOG\x04" | store_id u64 | zero 12 bytes | crc32 u32   (32 bytes, LE)
//! ```
//! The magic's last byte is the log's layout: 4, two regions (frames after a checkpoint may
//! start at the offset redb's meta records, and continue in the other region under the next
//! salt; `log/wal.rs`), every frame followed by a spare copy. It is the first layout of a
//! release: earlier ones were never written by a released version, and their blocks are not
//! recognized (such a log is refused as not an idemstore log).
//! `store_id` is the random identity made durable in the store's meta table when the store is
//! created. The block is written and synced when the log is created (or found empty) and never
//! changes; frames start after it.

use crate::error::{OpenError, StorageError};

use super::wal::LogFile;

/// Bytes before the first frame.
pub const LOG_HEADER_LEN: u64 = 32;

const MAGIC: [u8; 8] = *b"IDEMLOG\x04";

/// Whose log a log file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// Empty, or zeros where the identity block goes (new or preallocated): the store takes
    /// it. Nothing was ever logged in it, since the block is synced before any frame.
    Fresh,
    /// The store's own log.
    Ours,
    /// A valid identity block of another store.
    Other(u64),
    /// Bytes that are no identity block: damaged, or not an idemstore log.
    Damaged,
}

/// Reads the identity of `file` as seen by the store `store_id`.
pub(crate) fn read(file: &dyn LogFile, store_id: u64) -> std::io::Result<Identity> {
    let len = file.len()?;
    let mut block = [0u8; LOG_HEADER_LEN as usize];
    if len < LOG_HEADER_LEN {
        let mut short = vec![0u8; len as usize];
        file.read_exact_at(&mut short, 0)?;
        return Ok(if short.iter().all(|&b| b == 0) {
            Identity::Fresh
        } else {
            Identity::Damaged
        });
    }
    file.read_exact_at(&mut block, 0)?;
    Ok(parse(&block, store_id))
}

/// Whose log `block` says it is, as seen by the store `store_id`.
pub fn parse(block: &[u8; LOG_HEADER_LEN as usize], store_id: u64) -> Identity {
    if block.iter().all(|&b| b == 0) {
        return Identity::Fresh;
    }
    let stored = u32::from_le_bytes(block[28..32].try_into().expect("4 bytes"));
    if block[..8] != MAGIC || crc32fast::hash(&block[..28]) != stored {
        return Identity::Damaged;
    }
    match u64::from_le_bytes(block[8..16].try_into().expect("8 bytes")) {
        id if id == store_id => Identity::Ours,
        id => Identity::Other(id),
    }
}

/// The identity block of the store `store_id`.
pub fn block(store_id: u64) -> [u8; LOG_HEADER_LEN as usize] {
    let mut block = [0u8; LOG_HEADER_LEN as usize];
    block[..8].copy_from_slice(&MAGIC);
    block[8..16].copy_from_slice(&store_id.to_le_bytes());
    let crc = crc32fast::hash(&block[..28]);
    block[28..32].copy_from_slice(&crc.to_le_bytes());
    block
}

/// Writes and syncs the identity block of `store_id` into a [`Identity::Fresh`] log (on open).
pub(crate) fn claim(
    file: &dyn LogFile,
    store_id: u64,
    path: &std::path::Path,
) -> Result<(), OpenError> {
    let ctx = || format!("writing the identity of log {}", path.display());
    file.write_all_at(&block(store_id), 0)
        .and_then(|()| file.sync_data())
        .map_err(|e| StorageError::io(ctx(), e).into())
}
