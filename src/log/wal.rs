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

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) use crate::log::file::{LogFile, OsFile};
pub(crate) use crate::log::frame::Frame;
pub(crate) use crate::log::identity::LOG_HEADER_LEN;

use crate::error::Error;
use crate::log::frame;

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
    /// The largest frame payload (see [`Limits`](crate::state::settings::Limits)).
    pub(super) max_payload: usize,
    pub(super) buf: Vec<u8>,
    /// Where the frame in `buf` goes.
    pub(super) pending_at: u64,
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
    ) -> Result<u64, Error> {
        self.encode(next_token, durable, entries);
        if !self.fits() {
            return Err(self.corrupt_limit());
        }
        self.write_encoded()
    }

    /// Encodes the next frame (and its spare copy) without writing it.
    pub(crate) fn encode<'a>(
        &mut self,
        next_token: u64,
        durable: u64,
        entries: impl ExactSizeIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    ) {
        self.pending_at = if durable >= self.last_seq() {
            self.offset
        } else {
            self.end
        };
        self.buf.clear();
        frame::encode(
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
    fn corrupt_limit(&self) -> Error {
        Error::Corruption {
            location: format!("log {}", self.path.display()),
            reason: format!(
                "a frame at offset {} would overwrite the log region at {} before its checkpoint is durable",
                self.pending_at, self.limit
            ),
        }
    }

    /// Writes the frame [`encode`](Wal::encode)d last; returns its sequence number.
    pub(crate) fn write_encoded(&mut self) -> Result<u64, Error> {
        let at = self.pending_at;
        let seq = self.next_seq;
        debug_assert!(self.fits(), "a frame never reaches a region still needed");
        self.file.write_all_at(&self.buf, at).map_err(|e| {
            Error::io(
                format!("writing log {} at offset {at}", self.path.display()),
                e,
            )
        })?;
        self.offset = at + (self.buf.len() / 2) as u64;
        self.end = at + self.buf.len() as u64;
        self.next_seq += 1;
        Ok(seq)
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
            (frame::padded(self.end as usize) as u64, u64::MAX)
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
