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
/// the close is first met by reads: every damaged image gives errors or the right answers,
/// never a panic and never a wrong answer, whichever page is hit. Every key was completed
/// before the close, so every answer that is `Ok` must be that completion: a `get` finds it
/// with its result, a `reserve` replays it (a key that came back absent or acquired would run
/// its work twice), `stale` lists nothing, and `counts` counts the 300 completions (or
/// reports some of them as damaged).
#[test]
fn pages_damaged_after_a_clean_close_give_errors_not_panics() {
    const KEYS: usize = 300;
    let clock = ManualClock::new();
    let (db, log) = (SimDisk::new(), SimDisk::new());
    let store = builder(&clock)
        .open_with_storage(db.clone(), log.clone())
        .unwrap();
    for i in 0..KEYS {
        complete(&store, i);
    }
    drop(store);
    assert!(mark_on(&db));
    let (image, log_image) = (db.bytes(), log.bytes());
    let (mut errors, mut right) = (0, 0);
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
                return (1, 0);
            };
            let (mut failed, mut answered) = (0, 0);
            let wrong = |what: &str, got: &dyn std::fmt::Debug| -> ! {
                panic!("a page damaged at offset {offset}: {what} answered {got:?}")
            };
            for i in 0..KEYS {
                let expected = format!("result {i}");
                match store.get(&key(i)) {
                    Err(_) => failed += 1,
                    Ok(record) => match record.as_ref().map(|r| r.status()) {
                        Some(Status::Completed { result, .. }) if result == expected.as_bytes() => {
                            answered += 1
                        }
                        other => wrong(&format!("get of key {i}"), &other),
                    },
                }
                match store.reserve(&key(i), Fingerprint::of(b"r")) {
                    Err(_) => failed += 1,
                    Ok(Reservation::Completed(done)) if done.result == expected.as_bytes() => {
                        answered += 1
                    }
                    Ok(other) => wrong(&format!("reserve of key {i}"), &other),
                }
            }
            match store.stale(10) {
                Err(_) => failed += 1,
                Ok(listed) if listed.is_empty() => answered += 1,
                Ok(listed) => wrong("stale", &listed),
            }
            match store.counts() {
                Err(_) => failed += 1,
                // A record counted as damaged is reported, not answered.
                Ok(counts)
                    if counts.completed + counts.damaged == KEYS as u64 && counts.pending == 0 =>
                {
                    answered += 1
                }
                Ok(counts) => wrong("counts", &counts),
            }
            failed += usize::from(store.verify().is_err());
            (failed, answered)
        });
        match run {
            Ok((failed, answered)) => {
                errors += failed;
                right += answered;
            }
            Err(panic) => match panic.downcast_ref::<String>() {
                Some(message) if message.starts_with("a page damaged at") => {
                    std::panic::resume_unwind(panic)
                }
                _ => panic!("a page damaged at offset {offset} panicked"),
            },
        }
    }
    eprintln!("pages damaged after a clean close: {errors} errors, {right} right answers");
    assert!(errors > 0, "no damaged image was noticed at all");
    assert!(right > 0, "no damaged image answered anything");
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
                Err(idemstore::OpenError::Storage(idemstore::StorageError::Corruption {
                    location,
                    ..
                })) => {
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
