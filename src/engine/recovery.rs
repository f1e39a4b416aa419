//! Recovery: replaying the log into redb when a store is opened.
//!
//! (Checkpoints, which make redb durable and rewind the log, are in `engine/commit/checkpoint.rs`.)
//!
//! Opening a store replays the log frames newer than the file's checkpoint into redb, in one
//! durable transaction, and then rewinds the log. A store closed cleanly skips the log
//! (`clean_close.rs`). Frames are after-images, so replaying a
//! frame that was already applied changes nothing: recovery can itself crash and run again.

use std::path::PathBuf;
use std::sync::Arc;

use redb::Database;

use crate::engine::wal::{LogFile, Recovered, Wal};
use crate::error::Error;
use crate::format::tables::{new_salt, IndexEntries, Tables};
use crate::record::Record;

/// Brings `db` up to date with the log and returns the log, rewound and ready for appends,
/// and the next fencing token.
pub(crate) fn recover(
    db: &Database,
    log: Arc<dyn LogFile>,
    log_path: PathBuf,
    strict: bool,
) -> Result<(Wal, u64), Error> {
    let ctx = "replaying the log";
    let mut txn = db.begin_write().map_err(|e| Error::storage(ctx, e))?;
    // Record redb's allocator state with this commit, as checkpoints do (`commit/writer.rs`).
    txn.set_quick_repair(true);
    let (checkpoint_seq, mut next_token, salt) = {
        let tables = Tables::open(&txn)?;
        (tables.wal_seq()?, tables.next_token()?, tables.log_salt()?)
    };
    // The log never shrinks; its length now lets a later open tell a truncated log
    // (`engine/lost_log.rs`).
    let log_len = log.len().map_err(|e| {
        Error::io(
            format!("reading the length of log {}", log_path.display()),
            e,
        )
    })?;
    let len_changed = crate::engine::lost_log::record_len(&txn, log_len)?;
    if crate::engine::clean_close::take(&txn)? {
        // Closed cleanly: the checkpoint holds every frame, so the log is not read. The mark
        // is removed durably before any new frame can be written.
        txn.commit().map_err(|e| Error::storage(ctx, e))?;
        return Ok((Wal::resume(log, log_path, checkpoint_seq, salt), next_token));
    }
    let Recovered {
        mut wal,
        frames,
        dropped_tail,
    } = Wal::recover(log, log_path, checkpoint_seq, salt, strict)?;
    #[cfg(feature = "tracing")]
    tracing::info!(
        checkpoint_seq,
        frames = frames.len(),
        entries = frames.iter().map(|f| f.entries.len()).sum::<usize>(),
        "idemstore recovery: replaying log frames newer than the checkpoint"
    );
    if frames.is_empty() && !dropped_tail {
        // Nothing to replay or drop: the log is rewound under the same salt. Frames left from
        // before have sequence numbers at or below the checkpoint, so they never extend the new
        // run, and nothing can forge a frame without knowing the salt. (Only a changed log
        // length is committed.)
        if len_changed {
            txn.commit().map_err(|e| Error::storage(ctx, e))?;
        } else {
            txn.abort().map_err(|e| Error::storage(ctx, e))?;
        }
        wal.rewind(salt);
        return Ok((wal, next_token));
    }
    // The replay and a new salt commit durably together; the log is then rewound. A dropped
    // tail also takes a new salt: under the old one, a dropped frame could line up with the
    // end of a new run and pass as its next frame.
    let new_salt = new_salt();
    {
        let mut tables = Tables::open(&txn)?;
        for frame in &frames {
            for entry in &frame.entries {
                // A damaged old record cannot tell where it was indexed; the sweep drops
                // index entries that do not match a record.
                let old = tables.load(&entry.key)?.ok().flatten();
                let old_index = old.as_ref().map(IndexEntries::of);
                match &entry.record {
                    Some(bytes) => {
                        let record = Record::decode(bytes).map_err(|reason| Error::Corruption {
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
        tables.set_wal_seq(wal.last_seq())?;
        tables.set_log_salt(new_salt)?;
    }
    txn.commit().map_err(|e| Error::storage(ctx, e))?;
    wal.rewind(new_salt);
    Ok((wal, next_token))
}
