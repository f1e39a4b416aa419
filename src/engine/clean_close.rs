//! The clean-close mark: what lets a store that was closed cleanly open in constant time.
//!
//! Closing a store ends with a checkpoint (a durable redb commit that holds every frame of the
//! log) which also writes `"closed_clean" → 1` into `idemstore.meta`. Opening a store whose
//! file carries the mark:
//!
//! - skips reading the log: the checkpoint holds every frame, and the frames left in the file
//!   are under older salts, so none of them can be current (see [`crate::engine::wal`]);
//! - skips redb's full integrity check ([`Builder::verify_on_open`](crate::Builder::verify_on_open)):
//!   nothing was in flight when the file was last written. The mark is read through a
//!   read-only handle before the store is opened for writing, so a store that was not closed
//!   cleanly is verified by redb's own open, before any of its pages is trusted.
//!
//! The mark is removed, durably, in the open's first commit, before any new frame is written,
//! so a store that dies later is never taken for cleanly closed: its next open replays the log
//! (at most [`Builder::checkpoint_bytes`](crate::Builder::checkpoint_bytes) of it) and, with
//! `verify_on_open`, verifies the file.
//!
//! Without the integrity check, a page damaged after the clean close (on the disk, or by
//! another program) is first met by a read; reads of the store's tables are guarded
//! ([`Store::guard_read`](crate::Store)), so such a page gives an error naming the file,
//! never a panic.

use redb::{ReadableDatabase, TableError, WriteTransaction};

use crate::engine::commit::{CommitKind, Writer};
use crate::error::Error;
use crate::format::tables::{META, META_CLOSED_CLEAN};

/// Whether the file carries the clean-close mark (read without writing).
pub(crate) fn recorded(db: &impl ReadableDatabase) -> Result<bool, Error> {
    let ctx = "reading the clean-close mark";
    let txn = db.begin_read().map_err(|e| Error::storage(ctx, e))?;
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        // Not a store: the format check reports it.
        Err(TableError::TableDoesNotExist(_)) => return Ok(false),
        Err(e) => return Err(Error::storage(ctx, e)),
    };
    let value = meta
        .get(META_CLOSED_CLEAN)
        .map_err(|e| Error::storage(ctx, e))?;
    Ok(value.is_some_and(|v| v.value() == 1))
}

/// Removes the mark in `txn` and returns whether it was there.
pub(crate) fn take(txn: &WriteTransaction) -> Result<bool, Error> {
    let ctx = "clearing the clean-close mark";
    let mut meta = txn.open_table(META).map_err(|e| Error::storage(ctx, e))?;
    let removed = meta
        .remove(META_CLOSED_CLEAN)
        .map_err(|e| Error::storage(ctx, e))?;
    Ok(removed.is_some_and(|v| v.value() == 1))
}

/// Writes the mark in `txn` (a new store, which has logged nothing).
pub(crate) fn mark(txn: &WriteTransaction) -> Result<(), Error> {
    let ctx = "writing the clean-close mark";
    let mut meta = txn.open_table(META).map_err(|e| Error::storage(ctx, e))?;
    meta.insert(META_CLOSED_CLEAN, 1)
        .map_err(|e| Error::storage(ctx, e))?;
    Ok(())
}

impl Writer {
    /// The last checkpoint, on close: a durable commit that holds every frame and carries the
    /// clean-close mark.
    pub(crate) fn checkpoint_and_mark_clean(&mut self) -> Result<(), Error> {
        self.transact(CommitKind::Durable, |_, txn, _, _| mark(txn).map(Ok))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::recorded;
    use crate::testing::sim::SimDisk;
    use crate::{Builder, Fingerprint, Key, ManualClock, Reservation, Status, Store};

    fn builder(clock: &ManualClock) -> Builder {
        let mut builder = Store::builder();
        builder
            .clock(clock.clone())
            .lease(Duration::from_secs(3600))
            .checkpoint_interval(Duration::from_secs(3600))
            .sweep_interval(None);
        builder
    }

    fn key(i: usize) -> Key {
        Key::new("t", "op", format!("key-{i}")).unwrap()
    }

    fn complete(store: &Store, i: usize) {
        let Reservation::Acquired(lease) = store.reserve(&key(i), Fingerprint::of(b"r")).unwrap()
        else {
            panic!("a fresh key is acquired");
        };
        store.complete(&lease, format!("result {i}")).unwrap();
    }

    /// The mark as the file on `disk` holds it.
    fn mark_on(disk: &SimDisk) -> bool {
        let pages = crate::format::pages::PageFile::new(disk.after_process_crash(), "storage.idem")
            .unwrap();
        let db = redb::Builder::new().create_with_backend(pages).unwrap();
        recorded(&db).unwrap()
    }

    /// A clean close marks the file; the next open clears the mark durably before writing
    /// anything, so a crash after it replays the log instead of taking the store for closed
    /// cleanly and losing what was acknowledged since.
    #[test]
    fn the_mark_is_cleared_on_open_so_a_later_crash_replays_the_log() {
        let clock = ManualClock::new();
        let (db, log) = (SimDisk::new(), SimDisk::new());
        let store = builder(&clock)
            .open_with_storage(db.clone(), log.clone())
            .unwrap();
        complete(&store, 0);
        assert!(!mark_on(&db), "no mark while open");
        drop(store);
        assert!(mark_on(&db), "a clean close marks the file");

        let store = builder(&clock)
            .open_with_storage(db.clone(), log.clone())
            .unwrap();
        assert!(!mark_on(&db), "opening clears the mark");
        complete(&store, 1); // acknowledged: in the log, not checkpointed
        db.freeze();
        log.freeze();
        let (db, log) = (db.after_process_crash(), log.after_process_crash());
        drop(store);

        let store = builder(&clock)
            .open_with_storage(db.clone(), log.clone())
            .unwrap();
        for i in 0..2 {
            let record = store.get(&key(i)).unwrap().expect("acknowledged key kept");
            match record.status() {
                Status::Completed { result, .. } => {
                    assert_eq!(result, format!("result {i}").as_bytes())
                }
                other => panic!("key {i} reads back as {other:?}"),
            }
        }
    }

    /// A store closed cleanly opens without redb's integrity check, so a page damaged after
    /// the close is first met by reads: every damaged image gives answers or errors, never a
    /// panic, whichever page is hit.
    #[test]
    fn pages_damaged_after_a_clean_close_give_errors_not_panics() {
        let clock = ManualClock::new();
        let (db, log) = (SimDisk::new(), SimDisk::new());
        let store = builder(&clock)
            .open_with_storage(db.clone(), log.clone())
            .unwrap();
        for i in 0..300 {
            complete(&store, i);
        }
        drop(store);
        assert!(mark_on(&db));
        let (image, log_image) = (db.bytes(), log.bytes());
        let mut errors = 0;
        // Each page past the header, with its first bytes (page type, entry count, the first
        // offsets) overwritten by a few patterns, so that redb meets nonsense it trusts.
        let patterns: [&[u8]; 4] = [
            &[0xFF; 16],
            &[1, 0xFF, 0xFF, 0, 0xFF, 0xFF, 0xFF, 0xFF],
            &[2, 3, 0, 0, 9, 0, 0, 0],
            &[1, 200, 0, 0],
        ];
        let damages = (4096..image.len())
            .step_by(4096)
            .flat_map(|page| patterns.iter().map(move |p| (page, *p)));
        for (offset, pattern) in damages {
            let mut damaged = image.clone();
            let end = (offset + pattern.len()).min(image.len());
            damaged[offset..end].copy_from_slice(&pattern[..end - offset]);
            let run = std::panic::catch_unwind(|| {
                let (db, log) = (
                    SimDisk::from_image(damaged),
                    SimDisk::from_image(log_image.clone()),
                );
                let Ok(store) = builder(&clock).open_with_storage(db.clone(), log.clone()) else {
                    return 1;
                };
                let mut failed = 0;
                for i in 0..300 {
                    failed += usize::from(store.get(&key(i)).is_err());
                    failed += usize::from(store.reserve(&key(i), Fingerprint::of(b"r")).is_err());
                }
                failed += usize::from(store.stale(10).is_err());
                failed += usize::from(store.counts().is_err());
                failed += usize::from(store.verify().is_err());
                failed
            });
            match run {
                Ok(failed) => errors += failed,
                Err(_) => panic!("a page damaged at offset {offset} panicked"),
            }
        }
        assert!(errors > 0, "no damaged image was noticed at all");
    }

    /// With `verify_on_open(true)`, redb's integrity check runs when a store that was not
    /// closed cleanly opens (it reads every page, so a damaged one is refused at the open,
    /// naming the file), and never after a clean close (an open that does not read the
    /// damaged page succeeds).
    #[test]
    fn verify_on_open_checks_the_file_only_after_an_unclean_shutdown() {
        let clock = ManualClock::new();
        let images = |crash: bool| {
            let (db, log) = (SimDisk::new(), SimDisk::new());
            let store = builder(&clock)
                .open_with_storage(db.clone(), log.clone())
                .unwrap();
            for i in 0..300 {
                complete(&store, i);
            }
            store.checkpoint().unwrap();
            if crash {
                db.freeze();
                log.freeze();
                let images = (
                    db.after_process_crash().bytes(),
                    log.after_process_crash().bytes(),
                );
                drop(store);
                images
            } else {
                drop(store);
                (db.bytes(), log.bytes())
            }
        };
        // How many single-page damages the open refused as damage.
        let refused_at_open = |(image, log_image): (Vec<u8>, Vec<u8>)| {
            let mut refused = 0;
            for offset in (4096..image.len()).step_by(4096) {
                let mut damaged = image.clone();
                damaged[offset..offset + 16].fill(0xFF);
                let (db, log) = (
                    SimDisk::from_image(damaged),
                    SimDisk::from_image(log_image.clone()),
                );
                let mut verifying = builder(&clock);
                verifying.verify_on_open(true);
                match verifying.open_with_storage(db.clone(), log.clone()) {
                    Err(crate::Error::Corruption { location, .. }) => {
                        assert!(location.contains("storage.idem"), "{location}");
                        refused += 1;
                    }
                    Err(crate::Error::NotAStore { reason, .. }) => {
                        assert!(reason.contains("damaged"), "{reason}");
                        refused += 1;
                    }
                    Err(other) => panic!("damage at offset {offset} gave {other}"),
                    Ok(_) => {}
                }
            }
            refused
        };
        let after_crash = refused_at_open(images(true));
        let after_close = refused_at_open(images(false));
        assert!(
            after_crash > after_close,
            "the check did not run after a crash ({after_crash} refused) or ran after a clean close ({after_close} refused)"
        );
    }
}
