//! Recovery: reading the log back ([`Wal::recover`]: the run of frames after the checkpoint,
//! and where appending resumes) and replaying it into redb when a store is opened.
//!
//! (Checkpoints, which make redb durable and rewind the log, are in `commit/checkpoint.rs`.)
//!
//! Opening a store replays the log frames newer than the file's checkpoint into redb, in one
//! durable transaction, and then rewinds the log. A store closed cleanly skips the log
//! (`clean_close.rs`). Frames are after-images, so replaying a
//! frame that was already applied changes nothing: recovery can itself crash and run again.

use std::path::PathBuf;
use std::sync::Arc;

use redb::Database;

use crate::error::StorageError;
use crate::log::identity::LOG_HEADER_LEN;
use crate::log::wal::{self, parse_header, Frame, LogFile, Wal, HEADER_LEN};
use crate::record::Record;
use crate::tree::Windows;
use crate::tree::{new_salt, IndexEntries, Tables};

/// Brings `db` up to date with the log and returns the log, rewound and ready for appends,
/// and the next fencing token.
pub(crate) fn recover(
    db: &Database,
    windows: &Windows,
    log: Arc<dyn LogFile>,
    log_path: PathBuf,
    strict: bool,
) -> Result<(Wal, u64), StorageError> {
    replay(db, windows, log, log_path, strict)
}

fn replay(
    db: &Database,
    windows: &Windows,
    log: Arc<dyn LogFile>,
    log_path: PathBuf,
    strict: bool,
) -> Result<(Wal, u64), StorageError> {
    let ctx = "replaying the log";
    let mut txn = db.begin_write().map_err(|e| StorageError::redb(ctx, e))?;
    // Record redb's allocator state with this commit, as checkpoints do (`commit/writer.rs`).
    txn.set_quick_repair(true);
    let (checkpoint_seq, mut next_token, salt, start, next_salt) = {
        let tables = Tables::open(&txn, windows)?;
        (
            tables.wal_seq()?,
            tables.next_token()?,
            tables.log_salt()?,
            tables.log_start()?,
            tables.next_log_salt()?,
        )
    };
    // A store of the log layout before regions has neither: its frames start at the first
    // frame's place, and the next region's salt is chosen and made durable now, before any
    // frame can carry it.
    let start = start.unwrap_or(LOG_HEADER_LEN);
    let recorded_next = next_salt;
    let next_salt = next_salt.unwrap_or_else(new_salt);
    // The log never shrinks; its length now lets a later open tell a truncated log
    // (`log/lost_log.rs`).
    let log_len = log.len().map_err(|e| {
        StorageError::io(
            format!("reading the length of log {}", log_path.display()),
            e,
        )
    })?;
    let mut changed = crate::log::lost_log::record_len(&txn, log_len)?;
    if recorded_next.is_none() {
        Tables::open(&txn, windows)?.set_log_region(start, salt, next_salt)?;
        changed = true;
    }
    if crate::log::clean_close::take(&txn)? {
        // Closed cleanly: the checkpoint holds every frame, so the log is not read. The mark
        // is removed durably before any new frame can be written.
        txn.commit().map_err(|e| StorageError::redb(ctx, e))?;
        let mut wal = Wal::resume_at(log, log_path, checkpoint_seq, salt, start);
        wal.set_next_salt(next_salt);
        return Ok((wal, next_token));
    }
    let position = LogPosition {
        checkpoint_seq,
        start,
        salt,
        next_salt: recorded_next,
    };
    let Recovered {
        mut wal,
        frames,
        dropped_tail,
    } = Wal::recover_from(log, log_path, position, strict)?;
    #[cfg(feature = "tracing")]
    tracing::info!(
        checkpoint_seq,
        frames = frames.len(),
        entries = frames.iter().map(|f| f.entries.len()).sum::<usize>(),
        "idemstore recovery: replaying log frames newer than the checkpoint"
    );
    if frames.is_empty() && !dropped_tail {
        // Nothing to replay or drop: the region is started again under the same salt. Frames
        // left from before have sequence numbers at or below the checkpoint, so they never
        // extend the new run, and nothing can forge a frame without knowing the salt. (Only a
        // changed log length or a new next salt is committed.)
        if changed {
            txn.commit().map_err(|e| StorageError::redb(ctx, e))?;
        } else {
            txn.abort().map_err(|e| StorageError::redb(ctx, e))?;
        }
        wal.rewind_to(start, salt);
        wal.set_next_salt(next_salt);
        return Ok((wal, next_token));
    }
    // The replay and a new salt commit durably together; the log is then rewound to its
    // first region (every frame is in the file then). A dropped tail also takes a new salt:
    // under the old one, a dropped frame could line up with the end of a new run and pass as
    // its next frame. The next region's salt is new too.
    let (new_salt, next_salt) = (new_salt(), new_salt());
    {
        let mut tables = Tables::open(&txn, windows)?;
        for frame in &frames {
            for entry in &frame.entries {
                // A damaged old record cannot tell where it is kept: it is removed from every
                // window that may hold it (a lease entry of it stays, matching no record).
                let old = match tables.load(&entry.key)? {
                    Ok(old) => old,
                    Err(_) => {
                        tables.remove_everywhere(&entry.key)?;
                        None
                    }
                };
                let old_index = old.as_ref().map(IndexEntries::of);
                match &entry.record {
                    Some(bytes) => {
                        let record =
                            Record::decode(bytes).map_err(|reason| StorageError::Corruption {
                                location: format!("log frame seq {}", frame.seq),
                                reason: format!("a logged record does not decode: {reason}"),
                            })?;
                        tables.put(&entry.key, old_index, &record, bytes)?;
                    }
                    None => tables.delete(&entry.key, old_index)?,
                }
            }
            next_token = next_token.max(frame.next_token);
        }
        tables.set_next_token(next_token)?;
        tables.save_filters()?;
        tables.set_wal_seq(wal.last_seq())?;
        tables.set_log_region(LOG_HEADER_LEN, new_salt, next_salt)?;
    }
    txn.commit().map_err(|e| StorageError::redb(ctx, e))?;
    wal.rewind(new_salt);
    wal.set_next_salt(next_salt);
    Ok((wal, next_token))
}

/// Where the frames after a checkpoint are, as its durable commit recorded them.
#[derive(Debug, Clone, Copy)]
pub struct LogPosition {
    /// The last frame the checkpoint holds.
    pub checkpoint_seq: u64,
    /// Where the region of the frames after it starts.
    pub start: u64,
    /// Their salt.
    pub salt: u64,
    /// The salt of the region after it, if the writer may have moved there.
    pub next_salt: Option<u64>,
}

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

/// Reading the log back: the run of frames after the checkpoint, and where appending resumes.
impl Wal {
    /// Reads the log and returns the frames newer than `checkpoint_seq`, in order, the log
    /// positioned to continue after them (to be rewound once they are checkpointed), and
    /// whether anything after them was dropped (then the caller must change the salt before
    /// appending, so a dropped frame can never pass as current later).
    ///
    /// A frame's spare copy (written after it, see [`Wal::append`]) is skipped, and read in
    /// its place when the frame itself is torn or damaged. The run of frames ends at the first
    /// frame that is torn, fails its checksum, or is an older frame left from before the last
    /// rewind, and has no whole copy; say the run ends where frame `E` was expected. Every valid frame (of this salt) found beyond that point with a sequence
    /// number of `E` or more records the highest sequence number that was durable when it was
    /// written. With `strict`, if any of them says `E` was durable, frame `E` could have been
    /// acknowledged and is gone: the open is refused. Otherwise `E` was never synced, so
    /// nothing from `E` on was acknowledged (a sync covers every earlier write), and the tail
    /// is dropped. Without `strict` (a buffered log, whose answers precede their sync) the tail
    /// is always dropped.
    #[cfg_attr(not(feature = "__whitebox"), allow(dead_code))] // tests and fuzz targets
    pub fn recover(
        file: Arc<dyn LogFile>,
        path: PathBuf,
        checkpoint_seq: u64,
        salt: u64,
        strict: bool,
    ) -> Result<Recovered, StorageError> {
        let position = LogPosition {
            checkpoint_seq,
            start: crate::log::identity::LOG_HEADER_LEN,
            salt,
            next_salt: None,
        };
        Wal::recover_from(file, path, position, strict)
    }

    /// [`recover`](Wal::recover) from the region and salt a checkpoint recorded, following the
    /// run into the other region when its frames carry `next_salt` (the writer moved there
    /// while a checkpoint was being made durable).
    ///
    /// Where the run ends in its region at frame `E`, the whole file is searched for a valid
    /// frame under `next_salt` with `seq = E`: the first frame of the next region (or its
    /// spare copy), where the run continues. Otherwise the frames judged after the run are
    /// those of the current salt after it and those of `next_salt` anywhere: a frame of the
    /// next region that records `E` as durable means frame `E` was lost.
    pub fn recover_from(
        file: Arc<dyn LogFile>,
        path: PathBuf,
        position: LogPosition,
        strict: bool,
    ) -> Result<Recovered, StorageError> {
        let LogPosition {
            checkpoint_seq,
            start,
            salt,
            mut next_salt,
        } = position;
        let len = file.len().map_err(|e| {
            StorageError::io(format!("reading the length of log {}", path.display()), e)
        })?;
        let mut wal = Wal::resume_at(file, path, checkpoint_seq, salt, start);
        let mut frames = Vec::new();
        let mut previous: Option<u64> = None;
        let later = loop {
            let expected = previous
                .map_or(checkpoint_seq + 1, |p| p + 1)
                .max(checkpoint_seq + 1);
            let found = wal.read_frame(wal.offset, len)?;
            if let Some((header, _)) = &found {
                if previous == Some(header.seq) {
                    // The spare copy of the frame just read.
                    wal.offset += header.frame_len() as u64;
                    continue;
                }
            }
            // The next frame of the run: one more than the previous, or for the first, at or
            // below the first frame after the checkpoint.
            let fits = |seq: u64| previous.map_or(seq <= checkpoint_seq + 1, |p| seq == p + 1);
            let Some((header, payload)) = found.filter(|(header, _)| fits(header.seq)) else {
                // The frame expected here is torn, damaged or absent (or an older frame left
                // from before a rewind is here: the log may end). The expected frame's spare
                // copy, written after it in the same write, stands in for it when it is
                // whole: a valid frame of this salt with the expected sequence number is
                // that frame. Otherwise the run ends here, and what lies beyond is judged
                // below.
                let mut later = wal.valid_frames_after(wal.salt, wal.offset, len, expected)?;
                if let Some(&(copy, _)) = later.iter().find(|(_, h)| h.seq == expected) {
                    wal.offset = copy;
                    continue;
                }
                if let Some(next) = next_salt {
                    // The run may go on in the other region, under the next salt.
                    let start = crate::log::identity::LOG_HEADER_LEN;
                    let next_frames = wal.valid_frames_after(next, start, len, expected)?;
                    if let Some(&(first, _)) = next_frames.iter().find(|(_, h)| h.seq == expected) {
                        next_salt = None;
                        wal.rewind_to(first, next);
                        continue;
                    }
                    later.extend(next_frames);
                }
                break later;
            };
            let frame = wal::decode_payload(&header, &payload, wal.offset)?;
            previous = Some(header.seq);
            wal.offset += header.frame_len() as u64;
            if header.seq > checkpoint_seq {
                wal.next_seq = header.seq + 1;
                frames.push(frame);
            }
        };
        wal.end = wal.offset;
        let expected = previous
            .map_or(checkpoint_seq + 1, |p| p + 1)
            .max(checkpoint_seq + 1);
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

    fn corrupt(&self, offset: u64, reason: String) -> StorageError {
        StorageError::Corruption {
            location: format!("log {} at offset {offset}", self.path.display()),
            reason,
        }
    }

    fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), StorageError> {
        self.file.read_exact_at(buf, offset).map_err(|e| {
            StorageError::io(
                format!("reading log {} at offset {offset}", self.path.display()),
                e,
            )
        })
    }

    /// The checksum-valid frame at `offset`, or `None` if there is none (end of the log).
    fn read_frame(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<Option<(wal::Header, Vec<u8>)>, StorageError> {
        self.read_frame_under(self.salt, offset, len)
    }

    /// [`read_frame`](Wal::read_frame) under `salt`.
    fn read_frame_under(
        &self,
        salt: u64,
        offset: u64,
        len: u64,
    ) -> Result<Option<(wal::Header, Vec<u8>)>, StorageError> {
        if offset + HEADER_LEN as u64 > len {
            return Ok(None);
        }
        let mut header_bytes = [0u8; HEADER_LEN];
        self.read(&mut header_bytes, offset)?;
        let Some(header) = parse_header(salt, &header_bytes) else {
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

    /// Every valid frame under `salt` with seq ≥ `expected` that starts after `from`, with
    /// its offset.
    fn valid_frames_after(
        &self,
        salt: u64,
        from: u64,
        len: u64,
        expected: u64,
    ) -> Result<Vec<(u64, wal::Header)>, StorageError> {
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
                if let Some(header) = parse_header(salt, &buf[at..]) {
                    let offset = start + at as u64;
                    if header.seq >= expected && self.read_frame_under(salt, offset, len)?.is_some()
                    {
                        found.push((offset, header));
                    }
                }
                at += wal::ALIGN;
            }
            start += CHUNK;
        }
        Ok(found)
    }
}
