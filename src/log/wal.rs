//! The log: every batch of changes is appended here, as one checksummed frame,
//! and synced before anyone in the batch is answered. redb then receives the batch in a
//! non-durable transaction; a periodic durable redb commit (a checkpoint) makes the log's
//! contents redundant, after which the log is rewound and overwritten in place from its first
//! frame, so a sync flushes data blocks only, not file metadata. The log starts with its
//! store's identity ([`identity`](super::identity)), so a store never replays another store's log.
//!
//! Every append writes its frame twice, back to back, in one write covered by one sync: the
//! frame, then a spare copy of it. The next frame starts where that copy starts (overwriting
//! it) when the frame is known durable by then, and after the copy otherwise, so every frame
//! that may have been acknowledged without a later frame recording it as durable (the last
//! frame, and frames written while a sync was still running) keeps a spare copy. Recovery
//! reads the copy when a frame is damaged ([`recovery`](super::recovery)).
//!
//! A checkpoint does not rewind the log under the writer: the writer moves new frames to the
//! log's other region ([`Wal::switch`]) under a salt recorded durably in advance, and the
//! durable redb commit runs on another thread; the region the commit covers is written again
//! only after that commit is durable ([`Wal::release`]). The first region starts right after
//! the identity block; the second starts where the first one ended when the writer switched
//! (after its last frame's spare copy). A region that starts at the identity block while the
//! other one is still needed may grow only up to that other region's start
//! ([`Wal::fits`]): the writer waits for the checkpoint before writing past it.
//!
//! Recovery reads the frames from the first one that form an unbroken run of sequence numbers and
//! replays those newer than the checkpoint recorded in redb. The run ends at the first frame
//! that is torn, fails its checksum, or is an older frame left from before the last rewind.
//! Each frame records the highest sequence number known durable when it was written, so a
//! valid later frame beyond that end tells whether the missing frame had been synced (an
//! acknowledged batch was lost: opening fails) or not (an unacknowledged tail, torn or
//! reordered by a power loss: dropped). Reading the log back is recovery's
//! ([`recovery`](super::recovery)).
//!
//! ## The file underneath
//!
//! The file underneath the log, behind a small public trait ([`LogFile`]) so that a store
//! can run on other storage ([`Builder::open_with_storage`](crate::Builder::open_with_storage)):
//! the simulated disk of the crash tests, an in-memory store in a user's own tests.
//!
//! ## Frames
//!
//! Log frames: one frame per committed batch.
//!
//! ```text
//! frame   = header payload padding
//! header  = payload_len u32 | seq u64 | durable u64 | payload_crc u32 | header_crc u32
//!           (28 bytes, LE)
//! payload = next_token u64 | count u32 | entry*count
//! entry   = kind u8 (1 put, 2 delete) | key_len u16 | key | [record_len u32 | record]  (put only)
//! padding = zero bytes up to the next multiple of 8
//! ```
//! `durable` is the highest sequence number known durable (synced) when the frame was written:
//! recovery uses it to tell an unacknowledged torn tail from a lost acknowledged frame.
//! `header_crc` is the CRC-32 of the log's current salt (8 bytes, little-endian) followed by the
//! first 24 header bytes; `payload_crc` covers the payload. The salt is a random number that
//! changes at every checkpoint and is kept in the store's meta table, so a frame written
//! before the last rewind, or bytes shaped like a frame inside a stored result, never pass as a
//! current frame: only the store knows the salt. Entries are
//! after-images (the record as stored, or its deletion), so replaying a frame twice leaves the
//! same state. Decoding never panics and never allocates more than the bytes it was given.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::StorageError;
pub(crate) use crate::log::identity::LOG_HEADER_LEN;
use crate::record::Record;

/// An open log positioned for appending.
#[derive(Debug)]
pub struct Wal {
    pub(super) file: Arc<dyn LogFile>,
    pub(super) path: PathBuf,
    /// Where the current region starts: the first frame after the last checkpoint (or
    /// rewind) is written here.
    pub(super) start: u64,
    /// How far frames may reach: the start of the other region while its frames are still
    /// needed (a checkpoint covering them is not durable yet) and it lies after this one;
    /// `u64::MAX` otherwise.
    pub(super) limit: u64,
    /// Where the last frame's spare copy starts: the next frame is written here when the last
    /// frame is durable by then (and after the copy, at `end`, otherwise).
    pub(super) offset: u64,
    /// Where the last frame's spare copy ends.
    pub(super) end: u64,
    /// The sequence number of the next frame.
    pub(super) next_seq: u64,
    /// Mixed into every frame header's checksum; see [`frame`].
    pub(super) salt: u64,
    /// The salt of the next region's frames, durable in redb's meta (set by recovery; a
    /// switch takes it and leaves the one its checkpoint records).
    pub(super) next_salt: u64,
    /// The bytes of the region left at the last switch, still to replay after a crash until
    /// the checkpoint covering them is durable ([`release`](Wal::release)).
    pub(super) left: u64,
    /// The largest frame payload (see [`Limits`](crate::state::Limits)).
    pub(super) max_payload: usize,
    pub(super) buf: Vec<u8>,
    /// Where the frame in `buf` goes.
    pub(super) pending_at: u64,
    /// How far the file is zero-filled ahead of the frames, and how far it may be
    /// ([`preallocate`](Wal::preallocate)); `None`: the file grows with each frame.
    pub(super) prealloc: Option<Prealloc>,
}

/// The log's zero-filled length and the length it grows to at most, ahead of the frames.
#[derive(Debug, Clone, Copy)]
pub(super) struct Prealloc {
    filled: u64,
    cap: u64,
}

/// The first zero-filled length of a preallocated log (a store that logs little keeps a log
/// this small).
pub(crate) const PREALLOC_FIRST: u64 = 256 << 10;
/// The most a preallocated log grows by at once: it doubles until then.
pub(crate) const PREALLOC_STEP_MAX: u64 = 4 << 20;

/// The length a preallocated log of `filled` bytes grows to so that a frame ending at `end`
/// lies in zero-filled bytes: doubled (by at most [`PREALLOC_STEP_MAX`]), never past `cap`.
fn prealloc_target(filled: u64, end: u64, cap: u64) -> u64 {
    let step = filled.clamp(PREALLOC_FIRST, PREALLOC_STEP_MAX);
    filled.saturating_add(step).max(end).min(cap)
}

/// Writes zeros into `file` from `from` up to `to`, a megabyte at a time.
pub(crate) fn zero_fill(file: &dyn LogFile, from: u64, to: u64) -> io::Result<()> {
    const CHUNK: u64 = 1 << 20;
    let zeros = vec![0u8; CHUNK.min(to.saturating_sub(from)) as usize];
    let mut at = from;
    while at < to {
        let n = CHUNK.min(to - at) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// The log file that belongs to the store at `store_path`.
pub(crate) fn log_path(store_path: &Path) -> PathBuf {
    let mut name = store_path.as_os_str().to_os_string();
    name.push(".wal");
    PathBuf::from(name)
}

impl Wal {
    /// The log positioned at the first frame of the region at `start`, the next one numbered after the checkpoint at
    /// `checkpoint_seq`, without reading it: where [`recover`](Wal::recover) starts reading,
    /// and what a store closed cleanly overwrites (the checkpoint holds every frame, and
    /// frames left in the file are under older salts than `salt`).
    pub(crate) fn resume_at(
        file: Arc<dyn LogFile>,
        path: PathBuf,
        checkpoint_seq: u64,
        salt: u64,
        start: u64,
    ) -> Wal {
        Wal {
            file,
            path,
            start,
            limit: u64::MAX,
            offset: start,
            end: start,
            next_seq: checkpoint_seq + 1,
            salt,
            next_salt: 0,
            left: 0,
            max_payload: u32::MAX as usize,
            buf: Vec::new(),
            pending_at: start,
            prealloc: None,
        }
    }

    /// Appends one frame holding `entries`, followed by its spare copy; returns its sequence
    /// number. Not yet durable: the caller syncs [`file`](Wal::file).
    ///
    /// `durable` is the highest sequence number known durable now (see [`recover`](Wal::recover)).
    /// When it covers the last frame, the new frame overwrites that frame's spare copy (the
    /// frame itself is durable, and the new frame records it so); otherwise it goes after the
    /// copy, which stays. Frames may not reach past the region a running checkpoint still
    /// needs: the writer checks [`fits`](Wal::fits) between [`encode`](Wal::encode) and
    /// [`write_encoded`](Wal::write_encoded); this does both and fails if it does not fit.
    #[cfg_attr(not(feature = "__whitebox"), allow(dead_code))] // tests and fuzz targets
    pub fn append<'a>(
        &mut self,
        next_token: u64,
        durable: u64,
        entries: impl ExactSizeIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    ) -> Result<u64, StorageError> {
        self.encode(next_token, durable, entries);
        if !self.fits() {
            return Err(self.corrupt_limit());
        }
        self.write_encoded()
    }

    /// Encodes the next frame (and its spare copy) without writing it.
    pub(crate) fn encode<'a, R: EntryRecord>(
        &mut self,
        next_token: u64,
        durable: u64,
        entries: impl ExactSizeIterator<Item = (&'a [u8], Option<R>)>,
    ) {
        self.pending_at = if durable >= self.last_seq() {
            self.offset
        } else {
            self.end
        };
        self.buf.clear();
        encode(
            self.max_payload,
            self.salt,
            self.next_seq,
            durable,
            next_token,
            entries,
            &mut self.buf,
        );
        let len = self.buf.len();
        self.buf.extend_from_within(..len);
    }

    /// Whether the encoded frame and its copy end before the region a running checkpoint
    /// still needs.
    pub(crate) fn fits(&self) -> bool {
        self.pending_at + self.buf.len() as u64 <= self.limit
    }

    #[cfg_attr(not(feature = "__whitebox"), allow(dead_code))]
    fn corrupt_limit(&self) -> StorageError {
        StorageError::Corruption {
            location: format!("log {}", self.path.display()),
            reason: format!(
                "a frame at offset {} would overwrite the log region at {} before its checkpoint is durable",
                self.pending_at, self.limit
            ),
        }
    }

    /// Writes the frame [`encode`](Wal::encode)d last; returns its sequence number.
    pub(crate) fn write_encoded(&mut self) -> Result<u64, StorageError> {
        let at = self.pending_at;
        let seq = self.next_seq;
        debug_assert!(self.fits(), "a frame never reaches a region still needed");
        self.grow(at + self.buf.len() as u64)?;
        self.file.write_all_at(&self.buf, at).map_err(|e| {
            StorageError::io(
                format!("writing log {} at offset {at}", self.path.display()),
                e,
            )
        })?;
        self.offset = at + (self.buf.len() / 2) as u64;
        self.end = at + self.buf.len() as u64;
        self.next_seq += 1;
        Ok(seq)
    }

    /// Keeps the file zero-filled ahead of the frames, growing it up to `cap` bytes as they
    /// reach its end (from its length now: a log zero-filled to [`PREALLOC_FIRST`] when it was
    /// created, or longer from an earlier run). A frame then overwrites allocated blocks, so its
    /// sync flushes data only, not the file's size, except at the few syncs that follow a
    /// growth: the log doubles (by at most [`PREALLOC_STEP_MAX`]) each time.
    pub(crate) fn preallocate(&mut self, cap: u64) -> Result<(), StorageError> {
        let filled = self.file.len().map_err(|e| {
            StorageError::io(
                format!("reading the length of log {}", self.path.display()),
                e,
            )
        })?;
        self.prealloc = Some(Prealloc { filled, cap });
        Ok(())
    }

    /// Zero-fills the file past `end` when a preallocated log's frames reach its end.
    fn grow(&mut self, end: u64) -> Result<(), StorageError> {
        let Some(prealloc) = &mut self.prealloc else {
            return Ok(());
        };
        if end <= prealloc.filled || prealloc.filled >= prealloc.cap {
            return Ok(());
        }
        let target = prealloc_target(prealloc.filled, end, prealloc.cap);
        zero_fill(&*self.file, prealloc.filled, target).map_err(|e| {
            StorageError::io(
                format!(
                    "preallocating log {} from {} to {target} bytes",
                    self.path.display(),
                    prealloc.filled
                ),
                e,
            )
        })?;
        prealloc.filled = target;
        Ok(())
    }

    /// Sets the largest frame payload (tests scale it down).
    pub(crate) fn set_max_payload(&mut self, max: usize) {
        self.max_payload = max;
    }

    /// The file, for syncing from another thread.
    pub(crate) fn file(&self) -> Arc<dyn LogFile> {
        Arc::clone(&self.file)
    }

    /// The log's path, for error messages.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Starts overwriting the log from its first frame with frames under `salt`. Only after a
    /// durable checkpoint that covers every frame appended so far and recorded `salt`.
    pub fn rewind(&mut self, salt: u64) {
        self.rewind_to(LOG_HEADER_LEN, salt);
        self.left = 0;
    }

    /// Starts a region at `start` under `salt`. Only where nothing still needed lies.
    pub(crate) fn rewind_to(&mut self, start: u64, salt: u64) {
        self.start = start;
        self.limit = u64::MAX;
        self.offset = start;
        self.end = start;
        self.salt = salt;
    }

    /// Moves new frames to the other region, under the next salt (durable in redb's meta),
    /// and returns where that region starts and its salt; `following` becomes the next salt,
    /// which the checkpoint covering the region left must record before another switch.
    ///
    /// The region left keeps every frame written so far until [`release`](Wal::release). The
    /// new region starts right after the identity block when at least `room` bytes lie there
    /// before the region left, and may then grow only up to it; otherwise it starts after the
    /// last frame's spare copy. So the file grows to about twice `room` (a checkpoint's worth)
    /// plus what is written while a commit runs, and the writer waits for a commit only when
    /// a region before another fills up meanwhile.
    pub fn switch(&mut self, following: u64, room: u64) -> (u64, u64) {
        let salt = std::mem::replace(&mut self.next_salt, following);
        self.left = self.end - self.start;
        let (start, limit) = if self.start - LOG_HEADER_LEN >= room.max(1) {
            (LOG_HEADER_LEN, self.start)
        } else {
            (padded(self.end as usize) as u64, u64::MAX)
        };
        self.rewind_to(start, salt);
        self.limit = limit;
        (start, salt)
    }

    /// The salt of the next region's frames (durable in redb's meta once the checkpoint that
    /// records it is).
    pub(crate) fn next_salt(&self) -> u64 {
        self.next_salt
    }

    /// Sets the next region's salt, durable in redb's meta.
    pub fn set_next_salt(&mut self, salt: u64) {
        self.next_salt = salt;
    }

    /// Whether frames may grow only up to the region a running checkpoint still needs (the
    /// writer moved them back to the first region at the last switch, and that checkpoint
    /// is not yet durable).
    pub(crate) fn bounded(&self) -> bool {
        self.limit != u64::MAX
    }

    /// The checkpoint covering the other region is durable: frames may overwrite it.
    pub(crate) fn release(&mut self) {
        self.limit = u64::MAX;
        self.left = 0;
    }

    /// The bytes of log a reopen after a crash now would replay: this region's frames (with
    /// the last one's spare copy) and, while the checkpoint covering it is not durable, the
    /// region left.
    pub(crate) fn unreplayed(&self) -> u64 {
        self.end - self.start + self.left
    }

    /// Bytes appended since the last rewind or switch (the last frame's spare copy excepted).
    pub(crate) fn len_since_rewind(&self) -> u64 {
        self.offset - self.start
    }

    /// The sequence number of the last frame appended (0 when none ever was).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }
}

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

/// Size of a frame header in bytes.
pub const HEADER_LEN: usize = 28;
/// Frames start at multiples of this many bytes.
pub const ALIGN: usize = 8;

const KIND_PUT: u8 = 1;
const KIND_DELETE: u8 = 2;

/// One decoded change: the key and its new encoded record, or `None` for a deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key, encoded.
    pub key: Vec<u8>,
    /// The new encoded record; `None` deletes the key.
    pub record: Option<Vec<u8>>,
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The frame's sequence number.
    pub seq: u64,
    /// The highest sequence number known durable when the frame was written.
    pub durable: u64,
    /// The next fencing token once this frame is applied.
    pub next_token: u64,
    /// The changes, in order.
    pub entries: Vec<Entry>,
}

/// A parsed, checksum-valid frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The payload's length in bytes, padding excluded.
    pub payload_len: usize,
    /// The frame's sequence number.
    pub seq: u64,
    /// The highest sequence number known durable when the frame was written.
    pub durable: u64,
    /// The payload's checksum.
    pub payload_crc: u32,
}

impl Header {
    /// The whole frame's length, padding included.
    pub fn frame_len(&self) -> usize {
        padded(HEADER_LEN + self.payload_len)
    }
}

/// `len` rounded up to the frame alignment.
pub fn padded(len: usize) -> usize {
    len.div_ceil(ALIGN) * ALIGN
}

/// A put entry's record as [`encode`] writes it into a frame: bytes encoded already, or a
/// record encoded in place (the writer's batches: no vector of its own per record).
pub trait EntryRecord {
    /// Appends the record's stored bytes to `out`.
    fn append_to(&self, out: &mut Vec<u8>);
}

impl EntryRecord for &[u8] {
    fn append_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl EntryRecord for &Record {
    fn append_to(&self, out: &mut Vec<u8>) {
        self.encode_into(out);
    }
}

/// Appends the encoding of a frame to `out` (which must start at an aligned length).
/// Each entry is a key and its new encoded record, or `None` for a deletion.
pub fn encode<'a, R: EntryRecord>(
    max_payload: usize,
    salt: u64,
    seq: u64,
    durable: u64,
    next_token: u64,
    entries: impl ExactSizeIterator<Item = (&'a [u8], Option<R>)>,
    out: &mut Vec<u8>,
) {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_LEN]);
    out.extend_from_slice(&next_token.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for (key, record) in entries {
        let key_len = u16::try_from(key.len()).expect("encoded keys are at most 768 bytes");
        out.push(if record.is_some() {
            KIND_PUT
        } else {
            KIND_DELETE
        });
        out.extend_from_slice(&key_len.to_le_bytes());
        out.extend_from_slice(key);
        if let Some(record) = record {
            let at = out.len();
            out.extend_from_slice(&[0; 4]);
            record.append_to(out);
            let len = u32::try_from(out.len() - at - 4).expect("records are below 4 GiB");
            out[at..at + 4].copy_from_slice(&len.to_le_bytes());
        }
    }
    let payload_len = out.len() - start - HEADER_LEN;
    // Unreachable by input: a batch holds at most 64 MiB of entries or one request part of one
    // operation (a result is at most 256 MiB), far below the u32 length field's limit.
    assert!(
        payload_len <= max_payload,
        "a frame of {payload_len} bytes is over the format's limit of {max_payload}"
    );
    let payload_crc = crc32fast::hash(&out[start + HEADER_LEN..]);
    let header = &mut out[start..start + HEADER_LEN];
    header[0..4].copy_from_slice(
        &u32::try_from(payload_len)
            .expect("a batch frame is below 4 GiB")
            .to_le_bytes(),
    );
    header[4..12].copy_from_slice(&seq.to_le_bytes());
    header[12..20].copy_from_slice(&durable.to_le_bytes());
    header[20..24].copy_from_slice(&payload_crc.to_le_bytes());
    let header_crc = header_crc(salt, &header[..24]);
    header[24..28].copy_from_slice(&header_crc.to_le_bytes());
    out.resize(start + padded(out.len() - start), 0);
}

/// The checksum of a header's fields, seeded with the log's salt.
pub fn header_crc(salt: u64, fields: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&salt.to_le_bytes());
    hasher.update(fields);
    hasher.finalize()
}

/// Parses a header written with `salt`; `None` when the bytes are not a checksum-valid header.
pub fn parse_header(salt: u64, bytes: &[u8]) -> Option<Header> {
    let bytes: &[u8; HEADER_LEN] = bytes.get(..HEADER_LEN)?.try_into().ok()?;
    let stored = u32::from_le_bytes(bytes[24..28].try_into().ok()?);
    if header_crc(salt, &bytes[..24]) != stored {
        return None;
    }
    Some(Header {
        payload_len: u32::from_le_bytes(bytes[0..4].try_into().ok()?) as usize,
        seq: u64::from_le_bytes(bytes[4..12].try_into().ok()?),
        durable: u64::from_le_bytes(bytes[12..20].try_into().ok()?),
        payload_crc: u32::from_le_bytes(bytes[20..24].try_into().ok()?),
    })
}

/// Decodes a payload whose checksum matched. `offset` names the frame in errors.
pub fn decode_payload(header: &Header, payload: &[u8], offset: u64) -> Result<Frame, StorageError> {
    let bad = |reason: &str| StorageError::Corruption {
        location: format!("log frame at offset {offset} (seq {})", header.seq),
        reason: reason.to_string(),
    };
    if crc32fast::hash(payload) != header.payload_crc {
        return Err(bad("payload checksum mismatch"));
    }
    let mut rest = payload;
    let mut take = |n: usize| -> Result<&[u8], StorageError> {
        if rest.len() < n {
            return Err(bad("payload ends inside an entry"));
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let next_token = u64::from_le_bytes(take(8)?.try_into().expect("8 bytes"));
    let count = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
    // Each entry takes at least 3 bytes, so a hostile count cannot force a huge allocation.
    let mut entries = Vec::with_capacity(count.min(payload.len() / 3));
    for _ in 0..count {
        let kind = take(1)?[0];
        let key_len = u16::from_le_bytes(take(2)?.try_into().expect("2 bytes")) as usize;
        let key = take(key_len)?.to_vec();
        let record = match kind {
            KIND_PUT => {
                let len = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
                Some(take(len)?.to_vec())
            }
            KIND_DELETE => None,
            _ => return Err(bad("unknown entry kind")),
        };
        entries.push(Entry { key, record });
    }
    if !rest.is_empty() {
        return Err(bad("bytes left after the last entry"));
    }
    Ok(Frame {
        seq: header.seq,
        durable: header.durable,
        next_token,
        entries,
    })
}
