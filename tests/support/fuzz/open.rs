//! The `open` target: a store opened from damaged or made-up file images.

use crate::support::sim::SimDisk;
use idemstore::{Fingerprint, Key, Reservation, Status, Store};

use super::{builder, clock, open_sim, Input};

/// The largest raw image taken from the input, so that one input stays fast.
const MAX_IMAGE: usize = 1 << 20;
/// Keys written into the base images.
const BASE_KEYS: usize = 8;

/// A redb file image and a log image.
type Images = (&'static [u8], &'static [u8]);

fn base_key(i: usize) -> Key {
    Key::new("tenant", "op", format!("key-{i}")).expect("valid key")
}

/// Two valid stores to damage: one closed cleanly (everything checkpointed), and one whose
/// process died with batches in the log that opening must replay. They are files written by
/// [`base`] (through `write_seeds`), not rebuilt at run time: the committer's background
/// commits follow real time, so a rebuilt image would differ from run to run and an input's
/// patches would not land on the same bytes twice.
pub(super) fn bases() -> [Images; 2] {
    macro_rules! image {
        ($name:literal) => {
            // Relative to this file, so the fuzz targets that compile it find them too.
            include_bytes!(concat!("../../../fuzz/bases/", $name)).as_slice()
        };
    }
    [
        (image!("clean.idem"), image!("clean.idem.wal")),
        (image!("crashed.idem"), image!("crashed.idem.wal")),
    ]
}

/// Builds a base image pair: see [`bases`].
pub(super) fn base(crashed: bool) -> (Vec<u8>, Vec<u8>) {
    let clock = clock();
    let (db, log) = (SimDisk::new(), SimDisk::new());
    let store = open_sim(&builder(&clock), &db, &log).expect("a new simulated store opens");
    let fp = Fingerprint::of(b"base");
    let mut leases = Vec::new();
    for i in 0..BASE_KEYS {
        match store.reserve(&base_key(i), fp).expect("reserve") {
            Reservation::Acquired(lease) => leases.push(lease),
            other => panic!("a fresh key is acquired, got {other:?}"),
        }
    }
    for lease in &leases[..4] {
        store
            .complete(lease, format!("result of {}", lease.token()))
            .expect("complete");
    }
    store.release_if_pending(&leases[4]).expect("release");
    store
        .mark_needs_review(&leases[5], "gateway timed out")
        .expect("mark");
    store.checkpoint().expect("checkpoint");
    store.extend(&leases[6]).expect("extend");
    store.complete(&leases[7], "late result").expect("complete");
    if crashed {
        db.freeze();
        log.freeze();
        let images = (db.bytes(), log.bytes());
        drop(store);
        images
    } else {
        drop(store);
        (db.bytes(), log.bytes())
    }
}

/// Input: a mode byte, then either raw images (`u32` length of the redb image, the redb
/// image, the log image) or patches to one of the base images (target byte, `u32` offset,
/// length byte, bytes), repeated to the end of the input.
///
/// Opening may fail with any error, but must not panic, hang or allocate without bound. When
/// it succeeds the store is used (reads of every base key, a stale listing, a reserve and
/// complete of a new key, a sweep, a checkpoint); if all of that succeeds, the store must open
/// again from what it left on disk and hold the new key's result.
pub fn open(data: &[u8]) {
    let mut input = Input(data);
    let mode = input.byte();
    let (db, log) = if mode & 1 == 0 {
        let db_len = (input.u32() as usize).min(MAX_IMAGE);
        let db = input.take(db_len).to_vec();
        let log = input.take(MAX_IMAGE).to_vec();
        (db, log)
    } else {
        let (db, log) = bases()[usize::from(mode >> 1) % 2];
        let (mut db, mut log) = (db.to_vec(), log.to_vec());
        while !input.is_empty() {
            let target = input.byte();
            let image = if target & 1 == 0 { &mut db } else { &mut log };
            let offset = input.u32() as usize;
            let len = usize::from(input.byte() % 16) + 1;
            let bytes = input.take(len);
            patch(image, target >> 1, offset, bytes);
        }
        (db, log)
    };
    check(db, log);
}

/// Applies one patch: overwrite, flip bits, truncate, or zero a range.
fn patch(image: &mut Vec<u8>, how: u8, offset: usize, bytes: &[u8]) {
    if image.is_empty() {
        return;
    }
    let at = offset % image.len();
    let end = (at + bytes.len()).min(image.len());
    match how % 4 {
        0 => image[at..end].copy_from_slice(&bytes[..end - at]),
        1 => {
            for (b, x) in image[at..end].iter_mut().zip(bytes) {
                *b ^= x;
            }
        }
        2 => image.truncate(at),
        _ => image[at..end].fill(0),
    }
}

fn check(db: Vec<u8>, log: Vec<u8>) {
    let clock = clock();
    let (db, log) = (SimDisk::from_image(db), SimDisk::from_image(log));
    let Ok(store) = open_sim(&builder(&clock), &db, &log) else {
        return;
    };
    for i in 0..BASE_KEYS {
        let _ = store.get(&base_key(i));
    }
    let _ = store.stale(16);
    let key = Key::new("fuzz", "open", "new key").expect("valid key");
    let result = b"fuzz result".to_vec();
    let used = (|| -> Result<bool, idemstore::Error> {
        let Reservation::Acquired(lease) = store.reserve(&key, Fingerprint::of(b"new"))? else {
            return Ok(false); // a made-up image may hold this key already
        };
        store.complete(&lease, result.clone())?;
        store.sweep(16)?;
        store.checkpoint()?;
        Ok(true)
    })();
    drop(store);
    if !matches!(used, Ok(true)) {
        return;
    }
    let (db, log) = (db.after_process_crash(), log.after_process_crash());
    let store: Store = match open_sim(&builder(&clock), &db, &log) {
        Ok(store) => store,
        Err(e) => panic!("a store that opened and worked does not open again: {e}"),
    };
    let record = store
        .get(&key)
        .expect("the new key reads back")
        .expect("the completed key is kept");
    match record.status() {
        Status::Completed { result: got, .. } => assert_eq!(got, result.as_slice()),
        other => panic!("the completed key reads back as {other:?}"),
    }
}

/// Hand-made starting inputs: empty and raw images, each base image untouched, and a few
/// patches.
pub(super) fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut seeds = vec![("empty".to_string(), vec![0u8])];
    let (db, log) = base(true);
    let mut raw = vec![0u8];
    raw.extend_from_slice(&(db.len() as u32).to_le_bytes());
    raw.extend_from_slice(&db);
    raw.extend_from_slice(&log);
    seeds.push(("raw-crashed".into(), raw));
    seeds.push(("base-clean".into(), vec![1]));
    seeds.push(("base-crashed".into(), vec![3]));
    // Patches: target byte (bit 0: log; bits 1-2: overwrite, xor, truncate, zero), offset,
    // length byte, bytes.
    let patch = |mode: u8, target: u8, offset: u32, bytes: &[u8]| {
        let mut out = vec![mode, target];
        out.extend_from_slice(&offset.to_le_bytes());
        out.push(bytes.len() as u8 - 1);
        out.extend_from_slice(bytes);
        out
    };
    seeds.push(("log-truncated".into(), patch(3, 1 | 2 << 1, 100, &[0])));
    seeds.push(("log-bit".into(), patch(3, 1 | 1 << 1, 30, &[8])));
    seeds.push(("db-header-bit".into(), patch(1, 1 << 1, 9, &[1])));
    seeds.push(("db-zeroed-page".into(), patch(1, 3 << 1, 4096, &[0; 16])));
    seeds.push(("db-truncated".into(), patch(3, 2 << 1, 8192, &[0])));
    seeds
}
