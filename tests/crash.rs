//! Crash, power-loss and fault tests of the whole engine on simulated disks.
//!
//! Every acknowledged operation must survive: a process crash (the OS keeps every write), a
//! power loss (unsynced writes dropped, applied or torn sector by sector, on both the redb file
//! and the log), and a failed write or sync (the store poisons itself; reopening recovers).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use proptest::prelude::*;

use crate::support::model::{body, Answer, Keys, Model};
use crate::support::sim::{Rng, SimDisk};
use idemstore::whitebox::Millis;
use idemstore::whitebox::{from_millis, to_millis};
use idemstore::whitebox::{Recovered, Wal};
use idemstore::LogFile;
use idemstore::{
    Builder, Error, Fingerprint, Key, Lease, ManualClock, OpenError, Reservation, Status, Store,
};

const KEYS: usize = 6;

/// Cases of the crash model: `PROPTEST_CASES`, else 16 under `cargo test` (a debug build),
/// 48 in a release build (CI's `release` step) and 500 with `IDEMSTORE_LONG=1`.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| crate::common::by_mode(16, 48, 500))
}

/// What the crash model covered, summed over its cases: steps, power losses, process
/// crashes, clean restarts, simulated writes and syncs (each a point where a crash could
/// land; the power-loss images choose among the unsynced ones), power losses with an
/// operation in flight (its frame written, its sync not done), of those the ones whose
/// operation the images kept, clock moves, takeovers of a lease that ran out, and keys read
/// as expired.
static COVERED: [AtomicU64; 10] = [const { AtomicU64::new(0) }; 10];
static CASES_RUN: AtomicU64 = AtomicU64::new(0);

fn count(what: usize, n: u64) {
    COVERED[what].fetch_add(n, Ordering::Relaxed);
}

/// The store's lease: the clock's steps (up to twice this) make leases run out.
const LEASE_MS: Millis = 5_000;
/// The store's retention, for even keys; the clock's long steps pass it.
const RETENTION_MS: Millis = 600_000;
/// Odd keys belong to an operation with its own retention.
const SHORT_RETENTION_MS: Millis = 90_000;
/// Where every harness's clock starts (a fixed time, so no run depends on the date).
const START_MS: Millis = 1_700_000_000_000;

fn builder(clock: &ManualClock) -> Builder {
    let mut builder = Store::builder();
    builder
        .clock(clock.clone())
        .lease(Duration::from_millis(LEASE_MS))
        .retention(Duration::from_millis(RETENTION_MS))
        .checkpoint_bytes(64 * 1024)
        .checkpoint_interval(Duration::from_secs(3600))
        .cache_records(16)
        .retention_for("short-op", Duration::from_millis(SHORT_RETENTION_MS))
        // Repeatable runs: no background sweep commits at moments real time picks.
        .sweep_interval(None);
    builder
}

fn key(i: usize) -> Key {
    let operation = if i % 2 == 1 { "short-op" } else { "op" };
    Key::new("tenant", operation, format!("key-{i}")).unwrap()
}

/// How long key `i`'s records are kept.
fn retention_ms(i: usize) -> Millis {
    if i % 2 == 1 {
        SHORT_RETENTION_MS
    } else {
        RETENTION_MS
    }
}

/// A result big enough that a few hundred operations fill the log past a checkpoint.
fn result_for(i: usize, token: u64) -> Vec<u8> {
    let mut result = format!("key {i} done by token {token};").into_bytes();
    result.resize(700, b'.');
    result
}

#[derive(Debug, Clone)]
enum Step {
    Reserve(usize),
    Complete(usize),
    Release(usize),
    /// `expire`: refused while the key's lease is live.
    Expire(usize),
    /// `expire_forced`: the holder loses its lease.
    ExpireForced(usize),
    /// The clock moves this many milliseconds: leases run out, records expire.
    Advance(Millis),
    Checkpoint,
    Restart,
    PowerLoss(u64),
    ProcessCrash,
    /// A reserve (`false`) or a completion (`true`) of the key whose frame is written and
    /// whose sync is held when the power is cut: the images may keep it, tear it or lose it.
    PowerLossInFlight(usize, bool, u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..KEYS).prop_map(Step::Reserve),
        5 => (0..KEYS).prop_map(Step::Complete),
        2 => (0..KEYS).prop_map(Step::Release),
        2 => (0..KEYS).prop_map(Step::Expire),
        1 => (0..KEYS).prop_map(Step::ExpireForced),
        3 => (0..2 * LEASE_MS).prop_map(Step::Advance),
        1 => (SHORT_RETENTION_MS..2 * RETENTION_MS).prop_map(Step::Advance),
        1 => Just(Step::Checkpoint),
        1 => Just(Step::Restart),
        2 => any::<u64>().prop_map(Step::PowerLoss),
        1 => Just(Step::ProcessCrash),
        2 => (0..KEYS, any::<bool>(), any::<u64>())
            .prop_map(|(i, complete, seed)| Step::PowerLossInFlight(i, complete, seed)),
    ]
}

struct Harness {
    clock: ManualClock,
    db: SimDisk,
    log: SimDisk,
    store: Option<Store>,
    /// What each key must hold, and the time: the shared reference model
    /// (`tests/support/model.rs`).
    keys: Keys,
    /// The last lease handed out for each key, until it completes or is released.
    leases: HashMap<usize, Lease>,
}

impl Harness {
    fn new() -> Harness {
        let clock = ManualClock::starting_at(from_millis(START_MS));
        let db = SimDisk::new();
        let log = SimDisk::new();
        let store = builder(&clock)
            .open_with_storage(db.clone(), log.clone())
            .unwrap();
        Harness {
            clock,
            db,
            log,
            store: Some(store),
            keys: Keys::new(START_MS, LEASE_MS, retention_ms),
            leases: HashMap::new(),
        }
    }

    fn store(&self) -> &Store {
        self.store.as_ref().unwrap()
    }

    /// What key `i` holds now (absent once expired).
    fn expected(&self, i: usize) -> Model {
        self.keys.live(i).cloned().unwrap_or(Model::Absent)
    }

    /// Opens the store on `db` and `log` (what a crash left, or the same disks).
    fn open_on(&mut self, db: SimDisk, log: SimDisk) {
        self.db = db;
        self.log = log;
        self.store = Some(
            builder(&self.clock)
                .open_with_storage(self.db.clone(), self.log.clone())
                .unwrap(),
        );
        // Leases end with the store that granted them.
        self.keys.floor = self.store().__token_floor();
    }

    fn reopen(&mut self, db: SimDisk, log: SimDisk) {
        self.open_on(db, log);
        self.verify();
    }

    fn crash(&mut self, images: impl FnOnce(&SimDisk, &SimDisk) -> (SimDisk, SimDisk)) {
        count(4, self.db.io_count() + self.log.io_count());
        self.db.freeze();
        self.log.freeze();
        let (db, log) = images(&self.db, &self.log);
        drop(self.store.take());
        self.reopen(db, log);
    }

    /// A later call with the lease of key `i` that was taken over or removed is refused.
    fn check_late(&self, i: usize, lease: &Lease) {
        let late = self.store().complete(lease, b"late".to_vec());
        assert!(
            matches!(late, Err(Error::LeaseLost { .. })),
            "key {i}: {late:?}"
        );
    }

    fn run(&mut self, step: Step) {
        count(0, 1);
        match &step {
            Step::PowerLoss(_) | Step::PowerLossInFlight(..) => count(1, 1),
            Step::ProcessCrash => count(2, 1),
            Step::Restart => count(3, 1),
            Step::Advance(_) => count(7, 1),
            _ => {}
        }
        match step {
            Step::Reserve(i) => {
                let expected = self.keys.reserve(i, 0);
                if matches!(
                    expected,
                    Answer::Acquired { attempt } if attempt > 1
                ) {
                    count(8, 1);
                }
                if self.keys.records.contains_key(&i) && self.keys.live(i).is_none() {
                    count(9, 1);
                }
                let outcome = self.store().reserve(&key(i), body(0)).unwrap();
                match (expected, outcome) {
                    (Answer::Acquired { attempt }, Reservation::Acquired(lease)) => {
                        assert!(lease.token() > self.keys.max_token, "token reused");
                        assert_eq!(lease.attempt(), attempt, "key {i}: attempt");
                        assert_eq!(lease.is_retry(), attempt > 1);
                        self.keys.max_token = lease.token();
                        self.keys.pending(i, 0, lease.token(), attempt);
                        if let Some(old) = self.leases.insert(i, lease) {
                            self.check_late(i, &old);
                        }
                    }
                    (
                        Answer::InProgress { attempt, .. },
                        Reservation::InProgress { attempt: a, .. },
                    ) => {
                        assert_eq!(a, attempt, "key {i}: attempt in progress");
                    }
                    (Answer::Completed { result, .. }, Reservation::Completed(done)) => {
                        assert_eq!(done.result, result);
                    }
                    (expected, got) => panic!("key {i}: expected {expected:?}, got {got:?}"),
                }
            }
            Step::Complete(i) => {
                let Some(lease) = self.leases.remove(&i) else {
                    return;
                };
                let result = result_for(i, lease.token());
                let answer = self.store().complete(&lease, result.clone());
                match self.keys.owner_check(i, lease.token()) {
                    Ok(()) => {
                        answer.unwrap();
                        self.keys.complete(i, result, None);
                    }
                    Err(reason) => match answer {
                        Err(Error::LeaseLost { reason: got, .. }) => assert_eq!(got, reason),
                        other => panic!("key {i}: expected LeaseLost({reason:?}), got {other:?}"),
                    },
                }
            }
            Step::Release(i) => {
                let Some(lease) = self.leases.remove(&i) else {
                    return;
                };
                let answer = self.store().release_if_pending(&lease);
                match self.keys.live(i) {
                    None | Some(Model::Completed { .. }) => assert!(!answer.unwrap()),
                    Some(_) => match self.keys.owner_check(i, lease.token()) {
                        Ok(()) => {
                            assert!(answer.unwrap());
                            self.keys.records.remove(&i);
                        }
                        Err(_) => assert!(
                            matches!(answer, Err(Error::LeaseLost { .. })),
                            "key {i}: {answer:?}"
                        ),
                    },
                }
            }
            Step::Expire(i) | Step::ExpireForced(i) => {
                let force = matches!(step, Step::ExpireForced(_));
                let answer = if force {
                    self.store().expire_forced(&key(i))
                } else {
                    self.store().expire(&key(i))
                };
                match (self.keys.expire(i, force), answer) {
                    (Ok(want), Ok(got)) => assert_eq!(got, want, "expire of key {i}"),
                    (
                        Err(until),
                        Err(Error::LeaseLive {
                            key: got,
                            lease_until,
                        }),
                    ) => {
                        assert_eq!(got, key(i));
                        assert_eq!(to_millis(lease_until), until);
                    }
                    (want, got) => panic!("expire of key {i}: expected {want:?}, got {got:?}"),
                }
                if !self.keys.records.contains_key(&i) {
                    if let Some(lease) = self.leases.remove(&i) {
                        self.check_late(i, &lease);
                    }
                }
            }
            Step::Advance(ms) => {
                self.clock.advance(Duration::from_millis(ms));
                self.keys.now += ms;
            }
            Step::Checkpoint => self.store().checkpoint().unwrap(),
            Step::Restart => {
                count(4, self.db.io_count() + self.log.io_count());
                drop(self.store.take());
                let (db, log) = (self.db.clone(), self.log.clone());
                self.reopen(db, log);
            }
            Step::PowerLoss(seed) => {
                let mut rng = Rng(seed | 1);
                self.crash(|db, log| {
                    (
                        db.after_power_loss(&mut rng),
                        log.after_power_loss(&mut rng),
                    )
                });
            }
            Step::ProcessCrash => {
                self.crash(|db, log| (db.after_process_crash(), log.after_process_crash()));
            }
            Step::PowerLossInFlight(i, complete, seed) => self.cut_in_flight(i, complete, seed),
        }
    }

    /// A power loss while an operation that writes key `i` waits for its sync: its frame is
    /// written, unsynced, and the images keep, tear or lose it. After the reopen the key holds
    /// either what it held before or what the operation would have made it, and every other
    /// key what was acknowledged. An operation that would write nothing runs as a plain step.
    fn cut_in_flight(&mut self, i: usize, complete: bool, seed: u64) {
        let before = self.expected(i);
        let lease = self.leases.get(&i).cloned();
        let after = match (&lease, complete) {
            (Some(lease), true) if self.keys.owner_check(i, lease.token()).is_ok() => {
                let mut keys_after = self.expected(i);
                if let Model::Pending { token, attempt, .. } = keys_after {
                    keys_after = Model::Completed {
                        token,
                        attempt,
                        body: 0,
                        result: result_for(i, lease.token()),
                        completed_at: self.keys.now,
                        expires_at: self.keys.now + retention_ms(i),
                    };
                }
                keys_after
            }
            (_, false) => match self.keys.reserve(i, 0) {
                // Token 0: any token above those acknowledged before.
                Answer::Acquired { attempt } => Model::Pending {
                    token: 0,
                    attempt,
                    body: 0,
                    lease_until: self.keys.now + LEASE_MS,
                },
                _ => return self.run(Step::Reserve(i)),
            },
            _ => return self.run(Step::Complete(i)),
        };
        count(4, self.db.io_count() + self.log.io_count());
        self.log.hold_syncs();
        let mut rng = Rng(seed | 1);
        let store = self.store.take().unwrap();
        let (db, log) = std::thread::scope(|s| {
            let (store, key) = (&store, key(i));
            let call = s.spawn(move || {
                if complete {
                    let lease = lease.expect("a lease to complete");
                    let _ = store.complete(&lease, result_for(i, lease.token()));
                } else {
                    let _ = store.reserve(&key, body(0));
                }
            });
            // A wait on a condition, not on time: the operation's frame is written and its
            // sync waits at the gate.
            while self.log.syncs_waiting() == 0 {
                assert!(!call.is_finished(), "key {i}: the operation wrote nothing");
                std::thread::yield_now();
            }
            self.db.freeze();
            self.log.freeze();
            let images = (
                self.db.after_power_loss(&mut rng),
                self.log.after_power_loss(&mut rng),
            );
            self.log.release_syncs();
            call.join().unwrap();
            images
        });
        drop(store);
        self.open_on(db, log);
        count(5, 1);
        let record = self.store().get(&key(i)).unwrap();
        let max_token = self.keys.max_token;
        if before.matches(record.as_ref(), max_token) {
            // Lost: the key is as it was.
        } else if after.matches(record.as_ref(), max_token) {
            count(6, 1);
            let now = self.keys.now;
            let landed = Model::of(record.as_ref(), now, &[after], retention_ms(i));
            self.keys.max_token = self.keys.max_token.max(record.as_ref().unwrap().token());
            self.keys.records.insert(i, landed);
            self.leases.remove(&i);
        } else {
            panic!(
                "key {i} after a power loss with its {} in flight: expected {before:?} or {after:?}, got {:?}",
                if complete { "completion" } else { "reserve" },
                record.as_ref().map(|r| (r.token(), r.attempt(), r.status()))
            );
        }
        self.verify();
    }

    /// Every key holds exactly what was acknowledged (token, attempt, body, deadlines, result),
    /// and exactly the keys whose lease ran out or ended with an earlier store are stale.
    fn verify(&self) {
        let floor = self.store().__token_floor();
        assert!(
            floor > self.keys.max_token,
            "floor {floor} at or below an old token"
        );
        let mut stale: Vec<Key> = self
            .store()
            .stale(KEYS + 1)
            .unwrap()
            .into_iter()
            .map(|(key, _)| key)
            .collect();
        stale.sort_by_key(|k| k.id().to_vec());
        let mut expected_stale: Vec<Key> = (0..KEYS)
            .filter(|&i| self.keys.stale_since(i).is_some())
            .map(key)
            .collect();
        expected_stale.sort_by_key(|k| k.id().to_vec());
        assert_eq!(stale, expected_stale, "stale() at {}", self.keys.now);
        for i in 0..KEYS {
            let expected = self.expected(i);
            let record = self.store().get(&key(i)).unwrap();
            assert!(
                expected.matches(record.as_ref(), self.keys.max_token),
                "key {i} at {}: expected {expected:?}, got {:?}",
                self.keys.now,
                record
                    .as_ref()
                    .map(|r| (r.token(), r.attempt(), r.status()))
            );
            // The deadline follows the key's operation, also after recovery.
            if let Model::Completed { expires_at, .. } = expected {
                let got = record.as_ref().and_then(|r| r.expires_at());
                assert_eq!(got, Some(from_millis(expires_at)), "key {i}: expires_at");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// Random operations with the clock moving (leases run out and are taken over, records
    /// expire) and restarts, process crashes and power losses in between, some with an
    /// operation in flight: after every recovery each key holds exactly what was
    /// acknowledged, and tokens keep rising.
    #[test]
    fn acknowledged_operations_survive_crashes(steps in proptest::collection::vec(step(), 1..160)) {
        let mut harness = Harness::new();
        for step in steps {
            harness.run(step);
        }
        harness.run(Step::PowerLoss(7));
        // The first reserve of every key pending before the cut takes it over (attempt + 1).
        for i in 0..KEYS {
            harness.run(Step::Reserve(i));
        }
        if CASES_RUN.fetch_add(1, Ordering::Relaxed) + 1 == u64::from(cases()) {
            let n = |i: usize| COVERED[i].load(Ordering::Relaxed);
            eprintln!(
                "crash model: {} cases, {} steps, {} power losses ({} with an operation in flight, {} of them kept), {} process crashes, {} restarts, {} simulated writes and syncs, {} clock moves, {} takeovers, {} reserves of an expired key",
                cases(), n(0), n(1), n(5), n(6), n(2), n(3), n(4), n(7), n(8), n(9)
            );
        }
    }
}

#[test]
fn log_is_checkpointed_and_reused_in_place() {
    let mut harness = Harness::new();
    for round in 0..300 {
        let i = round % KEYS;
        harness.run(Step::Reserve(i));
        harness.run(Step::Complete(i));
        harness.run(Step::Reserve(i));
        harness.run(Step::Release(i));
    }
    // 64 KiB checkpoints with ~800-byte frames: the log was rewound many times, and is
    // bounded by the checkpoint size plus one frame instead of growing with the history.
    let log_len = harness.log.bytes().len();
    assert!(log_len < 80 * 1024, "log grew to {log_len} bytes");
    harness.run(Step::PowerLoss(99));
    harness.run(Step::ProcessCrash);
}

/// An acknowledged expiry is never undone by recovery: not when the completion it removed is
/// in the checkpointed file and the expiry only in the log, not when both are only in the log,
/// and not after the log was rewound by a checkpoint.
#[test]
fn expired_keys_stay_expired_across_crashes() {
    for checkpoint_before in [false, true] {
        for checkpoint_after in [false, true] {
            let mut harness = Harness::new();
            for i in 0..KEYS {
                harness.run(Step::Reserve(i));
                harness.run(Step::Complete(i));
            }
            if checkpoint_before {
                harness.run(Step::Checkpoint);
            }
            for i in 0..KEYS {
                harness.run(Step::Expire(i));
            }
            assert!((0..KEYS).all(|i| harness.keys.live(i).is_none()));
            if checkpoint_after {
                harness.run(Step::Checkpoint);
            }
            for seed in 1..=4 {
                harness.run(Step::PowerLoss(seed));
                harness.run(Step::ProcessCrash);
            }
            // The keys are acquired afresh, with tokens above every earlier one.
            for i in 0..KEYS {
                harness.run(Step::Reserve(i));
            }
        }
    }
}

fn ops_then_process_crash(count: usize) -> (ManualClock, SimDisk, SimDisk) {
    let clock = ManualClock::new();
    let (db, log) = (SimDisk::new(), SimDisk::new());
    let mut b = builder(&clock);
    b.checkpoint_bytes(64 << 20);
    let store = b.open_with_storage(db.clone(), log.clone()).unwrap();
    for i in 0..count {
        let key = Key::new("t", "op", format!("{i}")).unwrap();
        assert!(matches!(
            store.reserve(&key, Fingerprint::of(b"r")).unwrap(),
            Reservation::Acquired(_)
        ));
    }
    db.freeze();
    log.freeze();
    let images = (db.after_process_crash(), log.after_process_crash());
    drop(store);
    (clock, images.0, images.1)
}

#[test]
fn replay_restores_every_acknowledged_reserve_and_twice_gives_the_same_state() {
    let (clock, db, log) = ops_then_process_crash(50);
    assert!(log.bytes().len() > 50 * 20, "the log holds the frames");
    let b = builder(&clock);
    let first = b
        .open_with_storage(db.after_process_crash(), log.after_process_crash())
        .unwrap();
    let second = b
        .open_with_storage(db.after_process_crash(), log.after_process_crash())
        .unwrap();
    for i in 0..50 {
        let key = Key::new("t", "op", format!("{i}")).unwrap();
        let a = first.get(&key).unwrap().expect("acknowledged reserve lost");
        assert_eq!(Some(a), second.get(&key).unwrap());
    }
}

#[test]
fn damaged_frame_followed_by_valid_frames_refuses_to_open() {
    let (clock, db, log) = ops_then_process_crash(50);
    // Byte 62 is inside the first frame's payload (frames start after the 32-byte identity).
    log.flip_bit(62, 3);
    let err = builder(&clock)
        .open_with_storage(db.clone(), log.clone())
        .unwrap_err();
    assert!(
        matches!(
            err,
            OpenError::Storage(idemstore::StorageError::Corruption { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("offset"), "{err}");
}

#[test]
fn torn_tail_ends_the_log() {
    let disk = SimDisk::new();
    let file: std::sync::Arc<dyn LogFile> = std::sync::Arc::new(disk.clone());
    let Recovered {
        mut wal, frames, ..
    } = Wal::recover(file, "t.wal".into(), 0, 0, true).unwrap();
    assert!(frames.is_empty());
    for i in 0..5u8 {
        let key = vec![1, b'a', 1, b'b', 1, i];
        let record = vec![i; 100];
        wal.append(
            10 + u64::from(i),
            u64::from(i),
            std::iter::once((key.as_slice(), Some(record.as_slice()))),
        )
        .unwrap();
    }
    // The last write is frame 5 and its spare copy, byte for byte.
    let bytes = disk.bytes();
    let mut last = Vec::new();
    let (key, record) = (vec![1, b'a', 1, b'b', 1, 4], vec![4u8; 100]);
    idemstore::whitebox::encode(
        usize::MAX,
        0,
        5,
        4,
        14,
        std::iter::once((key.as_slice(), Some(record.as_slice()))),
        &mut last,
    );
    let frame_len = last.len();
    assert_eq!(
        &bytes[bytes.len() - 2 * frame_len..],
        [&last[..], &last[..]].concat()
    );
    let recover = |image: &[u8]| {
        let disk = SimDisk::new();
        disk.write_all_at(image, 0).unwrap();
        Wal::recover(std::sync::Arc::new(disk), "t.wal".into(), 0, 0, true).unwrap()
    };
    // A torn copy: the frame itself is whole.
    assert_eq!(recover(&bytes[..bytes.len() - 40]).frames.len(), 5);
    // A damaged frame (its length bytes, or its payload) whose copy is whole: the copy is read.
    for at in [0, 1, 3, 30, frame_len - 20] {
        let mut damaged = bytes.clone();
        damaged[bytes.len() - 2 * frame_len + at] ^= 0x10;
        let frames = recover(&damaged).frames;
        assert_eq!(frames.len(), 5, "byte {at} of the last frame damaged");
        assert_eq!(frames[4].next_token, 14);
    }
    // Cut the last frame and its copy short, as a torn append would.
    let Recovered { wal, frames, .. } = recover(&bytes[..bytes.len() - frame_len - 40]);
    assert_eq!(frames.len(), 4);
    assert_eq!(wal.last_seq(), 4);
    assert_eq!(frames[3].next_token, 13);
    // Frames at or below the checkpoint are skipped.
    let again = SimDisk::new();
    again.write_all_at(&bytes, 0).unwrap();
    let frames = Wal::recover(std::sync::Arc::new(again), "t.wal".into(), 3, 0, true)
        .unwrap()
        .frames;
    assert_eq!(frames.iter().map(|f| f.seq).collect::<Vec<_>>(), vec![4, 5]);
}

/// Frames written while no sync had covered the one before (32 callers, a sync running) keep
/// their spare copies: any one of them damaged is read from its copy, none is lost.
#[test]
fn frames_written_before_a_sync_keep_their_copies() {
    let disk = SimDisk::new();
    let file: std::sync::Arc<dyn LogFile> = std::sync::Arc::new(disk.clone());
    let mut wal = Wal::recover(file, "t.wal".into(), 0, 7, true).unwrap().wal;
    for i in 0..5u8 {
        let key = vec![1, b'a', 1, b'b', 1, i];
        let record = vec![i; 100 + usize::from(i)];
        // Nothing known durable yet: every frame goes after the previous one's copy.
        wal.append(
            10 + u64::from(i),
            0,
            std::iter::once((key.as_slice(), Some(record.as_slice()))),
        )
        .unwrap();
    }
    let bytes = disk.bytes();
    let header = idemstore::whitebox::LOG_HEADER_LEN as usize;
    let mut start = header;
    for seq in 1..=5u64 {
        let len = idemstore::whitebox::parse_header(7, &bytes[start..])
            .unwrap_or_else(|| panic!("frame {seq} not at {start}"))
            .frame_len();
        for at in [start, start + 2, start + len - 12] {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x41;
            let image = SimDisk::new();
            image.write_all_at(&damaged, 0).unwrap();
            let frames = Wal::recover(std::sync::Arc::new(image), "t.wal".into(), 0, 7, true)
                .unwrap()
                .frames;
            assert_eq!(
                frames.iter().map(|f| f.next_token).collect::<Vec<_>>(),
                vec![10, 11, 12, 13, 14],
                "frame {seq} damaged at byte {at}"
            );
        }
        start += 2 * len;
    }
}

#[test]
fn failed_log_sync_poisons_and_reopen_recovers() {
    let clock = ManualClock::new();
    let (db, log) = (SimDisk::new(), SimDisk::new());
    let store = builder(&clock)
        .open_with_storage(db.clone(), log.clone())
        .unwrap();
    let fp = Fingerprint::of(b"r");
    let Reservation::Acquired(kept) = store.reserve(&key(0), fp).unwrap() else {
        panic!()
    };
    log.fail_after(1);
    let err = store.reserve(&key(1), fp).unwrap_err();
    assert!(err.to_string().contains("injected"), "{err}");
    let later = store.reserve(&key(2), fp).unwrap_err();
    assert!(
        matches!(
            later,
            Error::Storage(idemstore::StorageError::Poisoned { .. })
        ),
        "{later}"
    );
    assert!(matches!(
        store.get(&key(0)),
        Err(Error::Storage(idemstore::StorageError::Poisoned { .. }))
    ));
    db.freeze();
    log.freeze();
    let (db, log) = (db.after_process_crash(), log.after_process_crash());
    drop(store);
    let store = builder(&clock)
        .open_with_storage(db.clone(), log.clone())
        .unwrap();
    let record = store
        .get(&key(0))
        .unwrap()
        .expect("acknowledged reserve kept");
    assert_eq!(record.token(), kept.token());
    // The failed reserve was never acknowledged: absent, or fully there.
    if let Some(record) = store.get(&key(1)).unwrap() {
        assert!(record.token() > kept.token());
    }
}

#[test]
fn failed_redb_write_at_checkpoint_poisons_and_reopen_recovers() {
    let clock = ManualClock::new();
    let (db, log) = (SimDisk::new(), SimDisk::new());
    let store = builder(&clock)
        .open_with_storage(db.clone(), log.clone())
        .unwrap();
    let fp = Fingerprint::of(b"r");
    for i in 0..KEYS {
        assert!(matches!(
            store.reserve(&key(i), fp).unwrap(),
            Reservation::Acquired(_)
        ));
    }
    db.fail_after(1);
    assert!(store.checkpoint().is_err());
    assert!(matches!(
        store.reserve(&key(0), fp),
        Err(Error::Storage(idemstore::StorageError::Poisoned { .. }))
    ));
    db.freeze();
    log.freeze();
    let (db, log) = (db.after_process_crash(), log.after_process_crash());
    drop(store);
    let store = builder(&clock)
        .open_with_storage(db.clone(), log.clone())
        .unwrap();
    for i in 0..KEYS {
        assert!(store.get(&key(i)).unwrap().is_some(), "key {i} lost");
    }
}

/// A completed result is the caller's opaque bytes. One that contains a checksum-valid log
/// frame with a high sequence number lands in the log; once a checkpoint rewinds the log and
/// shorter frames overwrite its start, recovery scans the stale bytes after the run of current
/// frames, takes the embedded frame for an acknowledged batch behind a damaged one, and
/// refuses to open the store. Found while writing the `decode` fuzz target's invariant.
#[test]
fn a_result_shaped_like_a_log_frame_does_not_stop_the_store_from_opening() {
    let clock = ManualClock::new();
    let (db, log) = (SimDisk::new(), SimDisk::new());
    let store = builder(&clock)
        .open_with_storage(db.clone(), log.clone())
        .unwrap();
    let mut fake = Vec::new();
    idemstore::whitebox::encode(
        usize::MAX,
        0,
        1 << 40,
        1 << 40,
        1,
        std::iter::empty::<(&[u8], Option<&[u8]>)>(),
        &mut fake,
    );
    // Copies 41 bytes apart: one of the eight starts at a multiple of 8 in the log.
    fake.extend_from_slice(&[0; 9]);
    let result = fake.repeat(8);
    let fp = Fingerprint::of(b"r");
    let Reservation::Acquired(lease) = store.reserve(&key(0), fp).unwrap() else {
        panic!()
    };
    store.complete(&lease, result.clone()).unwrap();
    store.checkpoint().unwrap();
    let Reservation::Acquired(_) = store.reserve(&key(1), fp).unwrap() else {
        panic!("a fresh key is acquired")
    };
    // A process crash, not a clean close: a cleanly closed store never reads its log.
    db.freeze();
    log.freeze();
    let (db, log) = (db.after_process_crash(), log.after_process_crash());
    drop(store);
    assert!(
        !idemstore::whitebox::closed_clean(db.clone()).unwrap(),
        "the crashed store carries no clean-close mark, so the open scans its log"
    );
    let store = match builder(&clock).open_with_storage(db.clone(), log.clone()) {
        Ok(store) => store,
        Err(e) => panic!("{e}"),
    };
    let record = store.get(&key(0)).unwrap();
    match record.as_ref().map(|r| r.status()) {
        Some(Status::Completed { result: got, .. }) => assert_eq!(got, result.as_slice()),
        other => panic!("key 0 after the crash: {other:?}"),
    }
    let record = store.get(&key(1)).unwrap();
    assert!(
        matches!(
            record.as_ref().map(|r| r.status()),
            Some(Status::Pending { .. })
        ),
        "key 1, acknowledged only in the log, is replayed"
    );
}

/// Whether `error` is a full disk, by its I/O error kind (also for a poisoned store).
fn is_disk_full(error: &Error) -> bool {
    error.io_kind() == Some(std::io::ErrorKind::StorageFull)
}

/// Reserves and completes new keys with 1 KiB results until a call fails; returns the
/// acknowledged (key, result) pairs and the error.
fn fill_until_error(store: &Store, limit: usize) -> (Vec<(Key, Vec<u8>)>, Error) {
    let fp = Fingerprint::of(b"fill");
    let mut acked = Vec::new();
    for i in 0..limit {
        let key = Key::new("fill", "op", format!("{i}")).unwrap();
        let lease = match store.reserve(&key, fp) {
            Ok(Reservation::Acquired(lease)) => lease,
            Ok(other) => panic!("a fresh key is acquired, got {other:?}"),
            Err(e) => return (acked, e),
        };
        let result = result_for(i, lease.token()).repeat(2);
        if let Err(e) = store.complete(&lease, result.clone()) {
            return (acked, e);
        }
        acked.push((key, result));
    }
    panic!("the disk never filled up in {limit} operations");
}

/// After a failure, every later call is refused as poisoned; the store then opens again from
/// what the disks hold (with room again) and every acknowledged completion is there.
fn poisoned_then_recovers(
    clock: &ManualClock,
    store: Store,
    db: &SimDisk,
    log: &SimDisk,
    acked: &[(Key, Vec<u8>)],
) {
    let fp = Fingerprint::of(b"after");
    let later = store.reserve(&Key::new("fill", "op", "later").unwrap(), fp);
    assert!(
        matches!(
            later,
            Err(Error::Storage(idemstore::StorageError::Poisoned { .. }))
        ),
        "{later:?}"
    );
    assert!(matches!(
        store.checkpoint(),
        Err(Error::Storage(idemstore::StorageError::Poisoned { .. }))
    ));
    db.freeze();
    log.freeze();
    let (db, log) = (db.after_process_crash(), log.after_process_crash());
    drop(store);
    let store = builder(clock)
        .open_with_storage(db.clone(), log.clone())
        .unwrap();
    for (key, result) in acked {
        let record = store
            .get(key)
            .unwrap()
            .expect("acknowledged completion kept");
        match record.status() {
            Status::Completed { result: got, .. } => assert_eq!(got, result.as_slice()),
            other => panic!("{key}: expected the completed result, got {other:?}"),
        }
    }
    // And the store works again, with room.
    let Reservation::Acquired(lease) = store.reserve(&key(0), fp).unwrap() else {
        panic!("a fresh key is acquired");
    };
    store.complete(&lease, b"done".to_vec()).unwrap();
}

#[test]
fn full_disk_under_the_log_fails_clearly_poisons_and_loses_nothing_acknowledged() {
    let clock = ManualClock::new();
    let (db, log) = (SimDisk::new(), SimDisk::new());
    let mut b = builder(&clock);
    b.checkpoint_bytes(64 << 20);
    let store = b.open_with_storage(db.clone(), log.clone()).unwrap();
    log.set_size_limit(Some(48 * 1024));
    let (acked, error) = fill_until_error(&store, 10_000);
    assert!(acked.len() > 10, "only {} completions fit", acked.len());
    assert!(is_disk_full(&error), "not named as a full disk: {error}");
    assert!(error.to_string().contains("log"), "{error}");
    eprintln!("{error}");
    poisoned_then_recovers(&clock, store, &db, &log, &acked);
}

#[test]
fn full_disk_under_the_btree_fails_clearly_poisons_and_loses_nothing_acknowledged() {
    let clock = ManualClock::new();
    let (db, log) = (SimDisk::new(), SimDisk::new());
    let store = builder(&clock)
        .open_with_storage(db.clone(), log.clone())
        .unwrap();
    let room = db.bytes().len() as u64 + 256 * 1024;
    db.set_size_limit(Some(room));
    // 64 KiB checkpoints write the B-tree every ~40 completions; fail at the one that
    // needs the file to grow past the limit.
    let (acked, error) = fill_until_error(&store, 10_000);
    assert!(acked.len() > 10, "only {} completions fit", acked.len());
    assert!(is_disk_full(&error), "not named as a full disk: {error}");
    eprintln!("{error}");
    assert!(db.bytes().len() as u64 <= room);
    poisoned_then_recovers(&clock, store, &db, &log, &acked);
}

/// A full disk under the B-tree says how much room reopening needs, and a reopen with exactly
/// that much free space on the store file's disk succeeds with everything acknowledged.
#[test]
fn a_full_disk_says_how_much_room_reopening_needs_and_that_is_enough() {
    let clock = ManualClock::new();
    let (db, log) = (SimDisk::new(), SimDisk::new());
    let store = builder(&clock)
        .open_with_storage(db.clone(), log.clone())
        .unwrap();
    let room = db.bytes().len() as u64 + 256 * 1024;
    db.set_size_limit(Some(room));
    let (acked, error) = fill_until_error(&store, 10_000);
    assert!(is_disk_full(&error), "not named as a full disk: {error}");
    let later = store
        .reserve(
            &Key::new("fill", "op", "later").unwrap(),
            Fingerprint::of(b"x"),
        )
        .unwrap_err();
    let message = later.to_string();
    // The number the message gives after `words`.
    let number_after = |words: &str| -> u64 {
        message
            .split(words)
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("the message gives no number after {words:?}: {message}"))
    };
    let needed = number_after("free at least ");
    // The log the store held when it failed (both regions while a checkpoint committed).
    let replay = number_after("replays up to ");
    assert_eq!(
        needed,
        idemstore::whitebox::reopen_room(replay),
        "{message}"
    );
    assert!(replay > 0, "{message}");
    db.freeze();
    log.freeze();
    let (db, log) = (db.after_process_crash(), log.after_process_crash());
    drop(store);
    db.set_size_limit(Some(db.bytes().len() as u64 + needed));
    log.set_size_limit(Some(log.bytes().len() as u64));
    let store = builder(&clock)
        .open_with_storage(db.clone(), log.clone())
        .unwrap_or_else(|e| panic!("reopening with the room the message named failed: {e}"));
    for (key, result) in &acked {
        match store.get(key).unwrap().expect("kept").status() {
            Status::Completed { result: got, .. } => assert_eq!(got, result.as_slice()),
            other => panic!("{key}: {other:?}"),
        }
    }
}

/// A store of the current format left uncleanly, as a killed process leaves it
/// (`tests/fixtures/unclean`: 10 keys completed before a checkpoint, 10 completed and one
/// reserved after it, only in the log), opens with every acknowledged operation. The fixture
/// is checked in, so a change of the file's or the log's layout that this build would misread
/// fails here.
///
/// The store is opened through a [`ManualClock`] a second after the fixture's last operation
/// (`tests/fixtures/README.md`), never the system clock: its completed keys have a 24 h
/// retention, and they must read the same on any date.
#[test]
fn an_unclean_store_of_the_current_format_recovers() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/unclean");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.idem");
    let log = dir.path().join("store.idem.wal");
    std::fs::copy(fixture.join("store.idem"), &path).unwrap();
    std::fs::copy(fixture.join("store.idem.wal"), &log).unwrap();
    let fixture_key = |id: String| Key::new("fixture", "op", id).unwrap();
    // 2026-12-05T00:00:01.021Z: 21 operations of 1 ms from 2026-12-05T00:00:00Z, and a second.
    let clock = ManualClock::starting_at(UNIX_EPOCH + Duration::from_millis(1_796_428_801_021));
    let store = Store::builder()
        .clock(clock)
        .sweep_interval(None)
        // The fixture's log as it is (no 33 MiB of zeros written after it).
        .preallocate_log(false)
        .open(&path)
        .unwrap();
    for (prefix, result) in [("before", "result"), ("logged", "logged result")] {
        for i in 0..10 {
            let record = store
                .get(&fixture_key(format!("{prefix}-{i}")))
                .unwrap()
                .unwrap_or_else(|| panic!("{prefix}-{i} lost"));
            match record.status() {
                Status::Completed { result: r, .. } => {
                    assert_eq!(r, format!("{result} {i}").as_bytes(), "{prefix}-{i}")
                }
                other => panic!("{prefix}-{i} reads as {other:?}"),
            }
        }
    }
    let pending = store.get(&fixture_key("pending".into())).unwrap();
    assert!(
        pending.is_some_and(|r| matches!(r.status(), Status::Pending { .. })),
        "the reserved key is lost"
    );
    assert!(store.verify().unwrap().is_ok());
    drop(store);
    assert_eq!(&std::fs::read(&log).unwrap()[..8], b"IDEMLOG\x04");
}
