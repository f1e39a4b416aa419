//! The clean-close mark: written at a clean close, cleared on open before anything else, so a
//! crash after it replays the log (`src/log/clean_close.rs`).

use std::time::Duration;

use crate::support::sim::SimDisk;
use idemstore::{Builder, Fingerprint, Key, ManualClock, Reservation, Status, Store};

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
    idemstore::whitebox::closed_clean(disk.after_process_crash()).unwrap()
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
                Err(idemstore::OpenError::Corruption { location, .. }) => {
                    assert!(location.contains("storage.idem"), "{location}");
                    refused += 1;
                }
                Err(idemstore::OpenError::NotAStore { reason, .. }) => {
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
