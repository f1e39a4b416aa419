//! Background checkpoints: the writer moves new frames to the log's other region and goes on
//! answering while the durable redb commit runs on another thread. These tests hold that
//! commit (a hook on its thread, or the store disk's syncs) and check that operations are
//! answered meanwhile, and that a power loss before, during or right after the commit keeps
//! every acknowledged operation: recovery follows the frames into the other region, and the
//! region the commit covers is not written again before the commit is durable.

use std::ops::Range;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::sim::{Rng, SimDisk};
use idemstore::{Builder, Fingerprint, Key, Reservation, Status, Store};

/// Checkpoints start as soon as anything is logged (the interval is tiny), and never for size.
fn builder() -> Builder {
    let mut builder = Store::builder();
    builder
        .sweep_interval(None)
        .checkpoint_interval(Duration::from_millis(5))
        .checkpoint_bytes(1 << 40)
        .verify_on_open(false);
    builder
}

fn open(db: &SimDisk, log: &SimDisk) -> Store {
    builder()
        .__open_unchecked(db.clone(), log.clone())
        .expect("the store opens")
}

fn key(i: usize) -> Key {
    Key::new("ckpt", "op", format!("k{i}")).unwrap()
}

fn complete(store: &Store, i: usize) {
    try_complete(store, i).unwrap()
}

fn try_complete(store: &Store, i: usize) -> Result<(), idemstore::Error> {
    match store.reserve(&key(i), Fingerprint::of(b"f"))? {
        Reservation::Acquired(lease) => store.complete(&lease, format!("r{i}")),
        other => panic!("key {i}: a new key is acquired, not {other:?}"),
    }
}

/// Every key of `keys` reads as completed with its result.
fn check(store: &Store, keys: Range<usize>, when: &str) {
    for i in keys {
        let record = store.get(&key(i)).unwrap();
        match record.as_ref().map(|r| r.status()) {
            Some(Status::Completed { result, .. }) => {
                assert_eq!(result, format!("r{i}").as_bytes(), "key {i} {when}")
            }
            Some(other) => panic!("key {i} {when}: completed and acknowledged, reads {other:?}"),
            None => panic!("key {i} {when}: completed and acknowledged, is lost"),
        }
    }
}

/// Holds the next background checkpoint just before its commit: returns a receiver told when
/// it got there, and a sender that lets it go on.
fn hold_next_checkpoint(store: &Store) -> (mpsc::Receiver<()>, mpsc::Sender<()>) {
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    store.__before_checkpoint_commit(move || {
        let _ = entered_tx.send(());
        let _ = release_rx.recv();
    });
    (entered, release)
}

/// Waits until the store counted `n` checkpoints.
fn wait_checkpoints(store: &Store, n: u64) {
    let start = Instant::now();
    while store.stats().checkpoints < n {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{} checkpoints after 20 s, waiting for {n}",
            store.stats().checkpoints
        );
        thread::sleep(Duration::from_millis(1));
    }
}

/// Releases the disk's held syncs when dropped (also when a test panics).
/// Power-loss images of both disks (the log first: a redb commit after the log stopped can
/// only add state), several per call.
fn images(db: &SimDisk, log: &SimDisk, rng: &mut Rng, n: usize) -> Vec<(SimDisk, SimDisk)> {
    (0..n)
        .map(|_| {
            let log = log.after_power_loss(rng);
            (db.after_power_loss(rng), log)
        })
        .collect()
}

/// Each image opens with `keys` completed.
fn reopen_and_check(images: Vec<(SimDisk, SimDisk)>, keys: Range<usize>, when: &str) {
    for (n, (db, log)) in images.into_iter().enumerate() {
        let store = builder()
            .__open_unchecked(db, log)
            .unwrap_or_else(|e| panic!("image {n} {when}: the store does not open: {e}"));
        check(
            &store,
            keys.clone(),
            &format!("after power loss {n} {when}"),
        );
    }
}

/// While a background checkpoint's commit is held, reserves and completions are answered and
/// read back; a power loss then (after the switch, before the commit) keeps all of them: the
/// store file still names the first region, and recovery follows into the second one.
#[test]
fn operations_are_answered_while_a_checkpoint_commits() {
    let (db, log) = (SimDisk::new(), SimDisk::new());
    let store = open(&db, &log);
    let (entered, release) = hold_next_checkpoint(&store);
    complete(&store, 0);
    entered
        .recv_timeout(Duration::from_secs(20))
        .expect("a background checkpoint starts once something is logged");
    let before = store.stats().checkpoints;
    let mut rng = Rng(0x5eed);
    let (done_tx, done) = mpsc::channel();
    let held = thread::scope(|s| {
        let store = &store;
        s.spawn(move || {
            for i in 1..40 {
                complete(store, i);
            }
            let _ = done_tx.send(());
        });
        let answered = done.recv_timeout(Duration::from_secs(20));
        let held = answered.is_ok().then(|| {
            check(store, 0..40, "while the checkpoint commits");
            images(&db, &log, &mut rng, 8)
        });
        // Counted before the release: once released, the checkpoint may finish at any time.
        let while_held = store.stats().checkpoints;
        release.send(()).unwrap();
        answered.expect("operations are answered while a checkpoint's commit is held");
        assert_eq!(while_held, before, "the checkpoint was held all along");
        held.expect("taken while held")
    });
    wait_checkpoints(&store, before + 1);
    check(&store, 0..40, "right after the checkpoint");
    for i in 40..60 {
        complete(&store, i);
    }
    check(&store, 0..60, "after the checkpoint");
    drop(store);
    reopen_and_check(held, 0..40, "between the switch and the commit");
    let store = open(&db, &log);
    check(&store, 0..60, "after a clean close");
}

/// A power loss while the checkpoint's commit is in the store file's sync (held there), and
/// one right after the commit, keep every acknowledged operation, those logged in the region
/// the commit covers and those logged in the other one meanwhile.
#[test]
fn a_power_loss_during_or_right_after_a_checkpoint_loses_nothing() {
    for round in 0..4u64 {
        let mut rng = Rng(0xc0ffee + round);
        // During: the store file's syncs are held, so the commit stops in its first sync.
        let (db, log) = (SimDisk::new(), SimDisk::new());
        let store = open(&db, &log);
        // On a failed assertion, let the held sync go (declared after the store, so dropped
        // before it: dropping the store waits for the sync).
        let _release = db.release_syncs_on_drop();
        for i in 0..10 {
            complete(&store, i);
        }
        wait_checkpoints(&store, 1);
        let (entered_tx, entered) = mpsc::channel();
        store.__before_checkpoint_commit(move || {
            let _ = entered_tx.send(());
        });
        db.hold_syncs();
        complete(&store, 10);
        // A checkpoint's commit stops in the held sync: the next one's, or one that had
        // already started before the syncs were held (the interval is 5 ms, so one can be
        // running when the first is counted), which stops there just the same and starts no
        // other meanwhile.
        let start = Instant::now();
        while db.syncs_waiting() == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no checkpoint commit reached the store file's sync in 20 s (entered the hook: {})",
                entered.try_recv().is_ok()
            );
            thread::sleep(Duration::from_millis(1));
        }
        for i in 11..30 {
            complete(&store, i);
        }
        check(&store, 0..30, "during the commit");
        log.freeze();
        db.freeze();
        let during = images(&db, &log, &mut rng, 6);
        db.release_syncs();
        drop(store);
        reopen_and_check(during, 0..30, "during the commit");

        // Right after: the commit is durable, the next frames are in the other region.
        let (db, log) = (SimDisk::new(), SimDisk::new());
        let store = open(&db, &log);
        let mut next = 0;
        for checkpoints in 1..4 {
            for _ in 0..5 {
                complete(&store, next);
                next += 1;
            }
            wait_checkpoints(&store, checkpoints);
        }
        for _ in 0..5 {
            complete(&store, next);
            next += 1;
        }
        log.freeze();
        db.freeze();
        let after = images(&db, &log, &mut rng, 6);
        drop(store);
        reopen_and_check(after, 0..next, "right after a commit");
    }
}

/// The region a running checkpoint covers is not written again before its commit is durable:
/// with the commit held, the writer fills the other region up to it and then waits (no
/// operation is answered from a frame that would overwrite it); a power loss then keeps every
/// acknowledged operation.
///
/// The checkpoint held is the first to move the frames back to the log's first region (which
/// may grow only up to the second one's start), chosen as it starts by a hook armed before any
/// checkpoint: the ones before it (the first moves the frames to a second region after the
/// first) run unheld, however many the machine's speed lets run. How large the first region
/// is depends on how far the log grew before the first checkpoint started (about 1,000 to
/// 1,300 keys' frames on an idle machine, more under load), so the writer is given ten times
/// more keys than that to write: it must stop long before them.
#[test]
fn the_region_a_checkpoint_covers_is_kept_until_its_commit_is_durable() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    const KEYS: usize = 20_000;
    let (db, log) = (SimDisk::new(), SimDisk::new());
    // Small checkpoints: the room before the second region is enough to go back there.
    let store = builder()
        .checkpoint_bytes(4 * 1024)
        .__open_unchecked(db.clone(), log.clone())
        .unwrap();
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    store.__before_checkpoint_commit_if(
        |start| start.back_to_first_region,
        move || {
            let _ = entered_tx.send(());
            let _ = release_rx.recv();
        },
    );
    let acked = AtomicUsize::new(0);
    let frozen = AtomicBool::new(false);
    let mut rng = Rng(0xfeed);
    let held = thread::scope(|s| {
        // Owned here, so that a failed assertion drops it and lets the held checkpoint go (the
        // scope's threads then end, and the test fails instead of hanging).
        let release = release;
        let (store, acked, frozen) = (&store, &acked, &frozen);
        s.spawn(move || {
            for i in 0..KEYS {
                // Once the disks are frozen (the process "died"), what follows does not count.
                match try_complete(store, i) {
                    _ if frozen.load(SeqCst) => return,
                    Ok(()) => acked.store(i + 1, SeqCst),
                    Err(e) => panic!("key {i}: {e}"),
                }
            }
        });
        entered
            .recv_timeout(Duration::from_secs(20))
            .expect("a checkpoint moves the frames back to the first region");
        // Wait until the writer stops: the first region is full up to the second one. (A
        // whole second without an answer: a loaded machine can pause a running writer for a
        // few hundred milliseconds.)
        let mut last = acked.load(SeqCst);
        let mut still = Instant::now();
        while still.elapsed() < Duration::from_millis(1000) {
            let now = acked.load(SeqCst);
            if now != last {
                (last, still) = (now, Instant::now());
            }
            thread::sleep(Duration::from_millis(5));
        }
        let acked_at_cut = acked.load(SeqCst);
        frozen.store(true, SeqCst);
        log.freeze();
        db.freeze();
        let held = images(&db, &log, &mut rng, 8);
        let acked = acked.load(SeqCst);
        assert_eq!(
            acked, acked_at_cut,
            "nothing was answered while the writer waited"
        );
        release.send(()).unwrap();
        (held, acked)
    });
    let (held, acked) = held;
    drop(store);
    reopen_and_check(held, 0..acked, "with the first region full");
    assert!(
        acked < KEYS,
        "the writer waits for the held checkpoint once the first region is full ({acked} acknowledged)"
    );
}

/// The frames of the region left, written before the switch (and so synced: the switch
/// follows a flush), are witnessed by the next region's frames: the last frame of the first
/// region damaged, with its spare copy, is a lost acknowledged frame (the next region's first
/// frame records it as durable), and recovery refuses to open rather than drop it and what
/// follows. Undamaged, recovery reads across the switch.
#[test]
fn a_lost_frame_before_the_switch_is_told_by_the_frames_after_it() {
    use idemstore::whitebox::{parse_header, LogPosition, Wal, LOG_HEADER_LEN};
    use idemstore::LogFile;
    let (salt, next) = (7, 9);
    let disk = SimDisk::new();
    let file: std::sync::Arc<dyn LogFile> = std::sync::Arc::new(disk.clone());
    let mut wal = Wal::recover(file, "t.wal".into(), 0, salt, true)
        .unwrap()
        .wal;
    wal.set_next_salt(next);
    let append = |wal: &mut Wal, seq: u8, durable: u64| {
        let key = vec![1, b'a', 1, b'b', 1, seq];
        let record = vec![seq; 100];
        wal.append(
            u64::from(seq),
            durable,
            std::iter::once((key.as_slice(), Some(record.as_slice()))),
        )
        .unwrap();
    };
    // Frames 1-3 in the first region (3 not known durable when written: its copy stays).
    for seq in 1..=3 {
        append(&mut wal, seq, u64::from(seq) - 1);
    }
    let (start, switched_salt) = wal.switch(11, 1 << 20);
    assert_eq!(switched_salt, next);
    assert!(
        start > LOG_HEADER_LEN,
        "the second region follows the first"
    );
    // Frames 4-5 in the second region, written once 3 was synced.
    append(&mut wal, 4, 3);
    append(&mut wal, 5, 4);
    let position = LogPosition {
        checkpoint_seq: 0,
        start: LOG_HEADER_LEN,
        salt,
        next_salt: Some(next),
    };
    let recover = |image: &[u8]| {
        let disk = SimDisk::new();
        disk.write_all_at(image, 0).unwrap();
        Wal::recover_from(std::sync::Arc::new(disk), "t.wal".into(), position, true)
    };
    let bytes = disk.bytes();
    let seqs: Vec<u64> = recover(&bytes)
        .unwrap()
        .frames
        .iter()
        .map(|f| f.seq)
        .collect();
    assert_eq!(
        seqs,
        vec![1, 2, 3, 4, 5],
        "the run follows into the second region"
    );
    // Damage frame 3 and its spare copy.
    let mut damaged = bytes.clone();
    let mut hit = 0;
    for at in (LOG_HEADER_LEN as usize..start as usize).step_by(8) {
        if parse_header(salt, &bytes[at..]).is_some_and(|h| h.seq == 3) {
            damaged[at + 2] ^= 0x40;
            hit += 1;
        }
    }
    assert_eq!(hit, 2, "frame 3 and its copy");
    let error = recover(&damaged).expect_err("frame 3 was durable: its loss is refused");
    assert!(
        error
            .to_string()
            .contains("frame seq 3 is missing or damaged"),
        "{error}"
    );
}
