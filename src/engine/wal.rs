//! The log: every batch of changes is appended here, as one checksummed frame,
//! and synced before anyone in the batch is answered. redb then receives the batch in a
//! non-durable transaction; a periodic durable redb commit (a checkpoint) makes the log's
//! contents redundant, after which the log is rewound and overwritten in place from its first
//! frame, so a sync flushes data blocks only, not file metadata. The log starts with its
//! store's identity ([`identity`]), so a store never replays another store's log.
//!
//! Every append writes its frame twice, back to back, in one write covered by one sync: the
//! frame, then a spare copy of it. The next frame starts where that copy starts (overwriting
//! it) when the frame is known durable by then, and after the copy otherwise, so every frame
//! that may have been acknowledged without a later frame recording it as durable (the last
//! frame, and frames written while a sync was still running) keeps a spare copy. Recovery
//! reads the copy when a frame is damaged ([`recovery`](super::recovery)).
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

pub(crate) use crate::format::frame::Frame;
pub(crate) use crate::format::identity::LOG_HEADER_LEN;
pub(crate) use crate::format::log_file::{LogFile, OsFile};

use crate::error::Error;
use crate::format::frame;

/// An open log positioned for appending.
#[derive(Debug)]
pub struct Wal {
    pub(super) file: Arc<dyn LogFile>,
    pub(super) path: PathBuf,
    /// Where the last frame's spare copy starts: the next frame is written here when the last
    /// frame is durable by then (and after the copy, at `end`, otherwise).
    pub(super) offset: u64,
    /// Where the last frame's spare copy ends.
    pub(super) end: u64,
    /// The sequence number of the next frame.
    pub(super) next_seq: u64,
    /// Mixed into every frame header's checksum; see [`frame`].
    pub(super) salt: u64,
    /// The largest frame payload (see [`Limits`](crate::engine::settings::Limits)).
    pub(super) max_payload: usize,
    pub(super) buf: Vec<u8>,
}

/// The log file that belongs to the store at `store_path`.
pub(crate) fn log_path(store_path: &Path) -> PathBuf {
    let mut name = store_path.as_os_str().to_os_string();
    name.push(".wal");
    PathBuf::from(name)
}

impl Wal {
    /// The log positioned at its first frame, the next one numbered after the checkpoint at
    /// `checkpoint_seq`, without reading it: where [`recover`](Wal::recover) starts reading,
    /// and what a store closed cleanly overwrites (the checkpoint holds every frame, and
    /// frames left in the file are under older salts than `salt`).
    pub(crate) fn resume(
        file: Arc<dyn LogFile>,
        path: PathBuf,
        checkpoint_seq: u64,
        salt: u64,
    ) -> Wal {
        Wal {
            file,
            path,
            offset: LOG_HEADER_LEN,
            end: LOG_HEADER_LEN,
            next_seq: checkpoint_seq + 1,
            salt,
            max_payload: u32::MAX as usize,
            buf: Vec::new(),
        }
    }

    /// Appends one frame holding `entries`, followed by its spare copy; returns its sequence
    /// number. Not yet durable: the caller syncs [`file`](Wal::file).
    ///
    /// `durable` is the highest sequence number known durable now (see [`recover`](Wal::recover)).
    /// When it covers the last frame, the new frame overwrites that frame's spare copy (the
    /// frame itself is durable, and the new frame records it so); otherwise it goes after the
    /// copy, which stays.
    pub fn append<'a>(
        &mut self,
        next_token: u64,
        durable: u64,
        entries: impl ExactSizeIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    ) -> Result<u64, Error> {
        let seq = self.next_seq;
        let at = if durable >= self.last_seq() {
            self.offset
        } else {
            self.end
        };
        self.buf.clear();
        frame::encode(
            self.max_payload,
            self.salt,
            seq,
            durable,
            next_token,
            entries,
            &mut self.buf,
        );
        let len = self.buf.len();
        self.buf.extend_from_within(..len);
        self.file.write_all_at(&self.buf, at).map_err(|e| {
            Error::io(
                format!("writing log {} at offset {at}", self.path.display()),
                e,
            )
        })?;
        self.offset = at + len as u64;
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
        self.offset = LOG_HEADER_LEN;
        self.end = LOG_HEADER_LEN;
        self.salt = salt;
    }

    /// Bytes appended since the last rewind (the last frame's spare copy excepted).
    pub(crate) fn len_since_rewind(&self) -> u64 {
        self.offset - LOG_HEADER_LEN
    }

    /// The sequence number of the last frame appended (0 when none ever was).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }
}
