//! The log: every batch of changes is appended here, as one checksummed frame,
//! and synced before anyone in the batch is answered. redb then receives the batch in a
//! non-durable transaction; a periodic durable redb commit (a checkpoint) makes the log's
//! contents redundant, after which the log is rewound and overwritten in place from its first
//! frame, so a sync flushes data blocks only, not file metadata. The log starts with its
//! store's identity ([`identity`]), so a store never replays another store's log.
//!
//! Recovery reads the frames from the first one that form an unbroken run of sequence numbers and
//! replays those newer than the checkpoint recorded in redb. The run ends at the first frame
//! that is torn, fails its checksum, or is an older frame left from before the last rewind.
//! Each frame records the highest sequence number known durable when it was written, so a
//! valid later frame beyond that end tells whether the missing frame had been synced (an
//! acknowledged batch was lost: opening fails) or not (an unacknowledged tail, torn or
//! reordered by a power loss: dropped). See [`Wal::recover`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) use crate::format::frame::Frame;
pub(crate) use crate::format::identity::LOG_HEADER_LEN;
pub(crate) use crate::format::log_file::{LogFile, OsFile};

use crate::error::Error;
use crate::format::frame::{self, parse_header, HEADER_LEN};

/// What [`Wal::recover`] found.
#[derive(Debug)]
pub struct Recovered {
    /// The log, positioned after the last frame of the run.
    pub wal: Wal,
    /// The frames newer than the checkpoint, in order.
    pub frames: Vec<Frame>,
    /// Valid frames of this salt lay after the run and were dropped (never acknowledged).
    pub dropped_tail: bool,
}

/// An open log positioned for appending.
#[derive(Debug)]
pub struct Wal {
    file: Arc<dyn LogFile>,
    path: PathBuf,
    /// Where the next frame is written.
    offset: u64,
    /// The sequence number of the next frame.
    next_seq: u64,
    /// Mixed into every frame header's checksum; see [`frame`].
    salt: u64,
    /// The largest frame payload (see [`Limits`](crate::engine::settings::Limits)).
    max_payload: usize,
    buf: Vec<u8>,
}

/// The log file that belongs to the store at `store_path`.
pub(crate) fn log_path(store_path: &Path) -> PathBuf {
    let mut name = store_path.as_os_str().to_os_string();
    name.push(".wal");
    PathBuf::from(name)
}

impl Wal {
    /// Reads the log and returns the frames newer than `checkpoint_seq`, in order, the log
    /// positioned to continue after them (to be rewound once they are checkpointed), and
    /// whether anything after them was dropped (then the caller must change the salt before
    /// appending, so a dropped frame can never pass as current later).
    ///
    /// The run of frames ends at the first frame that is torn, fails its checksum, or is an
    /// older frame left from before the last rewind; say the run ends where frame `E` was
    /// expected. Every valid frame (of this salt) found beyond that point with a sequence
    /// number of `E` or more records the highest sequence number that was durable when it was
    /// written. With `strict`, if any of them says `E` was durable, frame `E` could have been
    /// acknowledged and is gone: the open is refused. Otherwise `E` was never synced, so
    /// nothing from `E` on was acknowledged (a sync covers every earlier write), and the tail
    /// is dropped. Without `strict` (a buffered log, whose answers precede their sync) the tail
    /// is always dropped.
    pub fn recover(
        file: Arc<dyn LogFile>,
        path: PathBuf,
        checkpoint_seq: u64,
        salt: u64,
        strict: bool,
    ) -> Result<Recovered, Error> {
        let len = file
            .len()
            .map_err(|e| Error::io(format!("reading the length of log {}", path.display()), e))?;
        let mut wal = Wal::resume(file, path, checkpoint_seq, salt);
        let mut frames = Vec::new();
        let mut previous: Option<u64> = None;
        while let Some((header, payload)) = wal.read_frame(wal.offset, len)? {
            if previous.is_some_and(|p| header.seq != p + 1) {
                break; // an older frame left from before a rewind: the log ends here
            }
            if previous.is_none() && header.seq > checkpoint_seq + 1 {
                break; // the first frame after the checkpoint is missing: judged below
            }
            let frame = frame::decode_payload(&header, &payload, wal.offset)?;
            previous = Some(header.seq);
            wal.offset += header.frame_len() as u64;
            if header.seq > checkpoint_seq {
                wal.next_seq = header.seq + 1;
                frames.push(frame);
            }
        }
        let expected = previous
            .map_or(checkpoint_seq + 1, |p| p + 1)
            .max(checkpoint_seq + 1);
        let later = wal.valid_frames_after(wal.offset, len, expected)?;
        if strict {
            if let Some((offset, header)) = later.iter().find(|(_, h)| h.durable >= expected) {
                return Err(wal.corrupt(
                    wal.offset,
                    format!(
                        "frame seq {expected} is missing or damaged here, but the valid frame seq {} at offset {offset} records that every frame up to seq {} was durable when it was written: an acknowledged batch was lost; refusing to open rather than drop it",
                        header.seq, header.durable
                    ),
                ));
            }
        }
        Ok(Recovered {
            dropped_tail: !later.is_empty(),
            wal,
            frames,
        })
    }

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
            next_seq: checkpoint_seq + 1,
            salt,
            max_payload: u32::MAX as usize,
            buf: Vec::new(),
        }
    }

    fn corrupt(&self, offset: u64, reason: String) -> Error {
        Error::Corruption {
            location: format!("log {} at offset {offset}", self.path.display()),
            reason,
        }
    }

    fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), Error> {
        self.file.read_exact_at(buf, offset).map_err(|e| {
            Error::io(
                format!("reading log {} at offset {offset}", self.path.display()),
                e,
            )
        })
    }

    /// The checksum-valid frame at `offset`, or `None` if there is none (end of the log).
    fn read_frame(&self, offset: u64, len: u64) -> Result<Option<(frame::Header, Vec<u8>)>, Error> {
        if offset + HEADER_LEN as u64 > len {
            return Ok(None);
        }
        let mut header_bytes = [0u8; HEADER_LEN];
        self.read(&mut header_bytes, offset)?;
        let Some(header) = parse_header(self.salt, &header_bytes) else {
            return Ok(None);
        };
        let payload_start = offset + HEADER_LEN as u64;
        if header.payload_len as u64 > len - payload_start {
            return Ok(None); // torn: the frame runs past the end of the file
        }
        let mut payload = vec![0u8; header.payload_len];
        self.read(&mut payload, payload_start)?;
        if crc32fast::hash(&payload) != header.payload_crc {
            return Ok(None);
        }
        Ok(Some((header, payload)))
    }

    /// Every valid frame (of this salt) with seq ≥ `expected` that starts after `from`, with
    /// its offset.
    fn valid_frames_after(
        &self,
        from: u64,
        len: u64,
        expected: u64,
    ) -> Result<Vec<(u64, frame::Header)>, Error> {
        const CHUNK: u64 = 1 << 20;
        let mut found = Vec::new();
        let mut start = from;
        let mut buf = Vec::new();
        while start + HEADER_LEN as u64 <= len {
            let end = (start + CHUNK + HEADER_LEN as u64).min(len);
            buf.resize((end - start) as usize, 0);
            self.read(&mut buf, start)?;
            let mut at = 0;
            while at + HEADER_LEN <= buf.len() && (at as u64) < CHUNK {
                if let Some(header) = parse_header(self.salt, &buf[at..]) {
                    let offset = start + at as u64;
                    if header.seq >= expected && self.read_frame(offset, len)?.is_some() {
                        found.push((offset, header));
                    }
                }
                at += frame::ALIGN;
            }
            start += CHUNK;
        }
        Ok(found)
    }

    /// Appends one frame holding `entries`; returns its sequence number. Not yet durable: the
    /// caller syncs [`file`](Wal::file).
    ///
    /// `durable` is the highest sequence number known durable now (see [`recover`](Wal::recover)).
    pub fn append<'a>(
        &mut self,
        next_token: u64,
        durable: u64,
        entries: impl ExactSizeIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    ) -> Result<u64, Error> {
        let seq = self.next_seq;
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
        self.file
            .write_all_at(&self.buf, self.offset)
            .map_err(|e| {
                Error::io(
                    format!(
                        "writing log {} at offset {}",
                        self.path.display(),
                        self.offset
                    ),
                    e,
                )
            })?;
        self.offset += self.buf.len() as u64;
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
        self.salt = salt;
    }

    /// Bytes appended since the last rewind.
    pub(crate) fn len_since_rewind(&self) -> u64 {
        self.offset - LOG_HEADER_LEN
    }

    /// The sequence number of the last frame appended (0 when none ever was).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }
}
