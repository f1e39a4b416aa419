//! Crash, power-loss and fault tests of the whole engine on simulated disks.
//!
//! Every acknowledged operation must survive: a process crash (the OS keeps every write), a
//! power loss (unsynced writes dropped, applied or torn sector by sector, on both the redb file
//! and the log), and a failed write or sync (the store poisons itself; reopening recovers).

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;

use crate::sim::{Rng, SimDisk};
use crate::wal::{LogFile, Wal};
use crate::{Builder, Error, Fingerprint, Key, Lease, ManualClock, Reservation, Status, Store};

const KEYS: usize = 6;

fn builder(clock: &ManualClock) -> Builder {
    let mut builder = Store::builder();
    builder
        .clock(clock.clone())
        .lease(Duration::from_secs(3600))
        .checkpoint_bytes(64 * 1024)
        .checkpoint_interval(Duration::from_secs(3600))
        .cache_records(16);
    builder
}

fn key(i: usize) -> Key {
    Key::new("tenant", "op", format!("key-{i}")).unwrap()
}

/// A result big enough that a few hundred operations fill the log past a checkpoint.
fn result_for(i: usize, token: u64) -> Vec<u8> {
    let mut result = format!("key {i} done by token {token};").into_bytes();
    result.resize(700, b'.');
    result
}

#[derive(Debug, Clone, PartialEq)]
enum Expected {
    Absent,
    Pending { token: u64 },
    Completed { result: Vec<u8> },
}

#[derive(Debug, Clone)]
enum Step {
    Reserve(usize),
    Complete(usize),
    Release(usize),
    Checkpoint,
    Restart,
    PowerLoss(u64),
    ProcessCrash,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..KEYS).prop_map(Step::Reserve),
        5 => (0..KEYS).prop_map(Step::Complete),
        2 => (0..KEYS).prop_map(Step::Release),
        1 => Just(Step::Checkpoint),
        1 => Just(Step::Restart),
        2 => any::<u64>().prop_map(Step::PowerLoss),
        1 => Just(Step::ProcessCrash),
    ]
}

struct Harness {
    clock: ManualClock,
    db: SimDisk,
    log: SimDisk,
    store: Option<Store>,
    expected: Vec<Expected>,
    leases: HashMap<usize, Lease>,
    max_token: u64,
}

impl Harness {
    fn new() -> Harness {
        let clock = ManualClock::new();
        let db = SimDisk::new();
        let log = SimDisk::new();
        let store = Store::open_sim(&builder(&clock), &db, &log).unwrap();
        Harness {
            clock,
            db,
            log,
            store: Some(store),
            expected: vec![Expected::Absent; KEYS],
            leases: HashMap::new(),
            max_token: 0,
        }
    }

    fn store(&self) -> &Store {
        self.store.as_ref().unwrap()
    }

    fn reopen(&mut self, db: SimDisk, log: SimDisk) {
        self.db = db;
        self.log = log;
        self.store = Some(Store::open_sim(&builder(&self.clock), &self.db, &self.log).unwrap());
        self.verify();
    }

    fn crash(&mut self, images: impl FnOnce(&SimDisk, &SimDisk) -> (SimDisk, SimDisk)) {
        self.db.freeze();
        self.log.freeze();
        let (db, log) = images(&self.db, &self.log);
        drop(self.store.take());
        self.reopen(db, log);
    }

    fn run(&mut self, step: Step) {
        match step {
            Step::Reserve(i) => {
                let outcome = self
                    .store()
                    .reserve(&key(i), Fingerprint::of(b"req"))
                    .unwrap();
                match (&self.expected[i], outcome) {
                    (Expected::Absent, Reservation::Acquired(lease)) => {
                        assert!(lease.token() > self.max_token, "token reused");
                        self.max_token = lease.token();
                        self.expected[i] = Expected::Pending {
                            token: lease.token(),
                        };
                        self.leases.insert(i, lease);
                    }
                    (Expected::Pending { token }, Reservation::InProgress { .. }) => {
                        assert_eq!(self.leases[&i].token(), *token);
                    }
                    (Expected::Completed { result }, Reservation::Completed(done)) => {
                        assert_eq!(&done.result, result);
                    }
                    (expected, got) => panic!("key {i}: expected {expected:?}, got {got:?}"),
                }
            }
            Step::Complete(i) => {
                if let (Expected::Pending { token }, Some(lease)) =
                    (&self.expected[i], self.leases.get(&i))
                {
                    let result = result_for(i, *token);
                    self.store().complete(lease, result.clone()).unwrap();
                    self.expected[i] = Expected::Completed { result };
                }
            }
            Step::Release(i) => {
                if let (Expected::Pending { .. }, Some(lease)) =
                    (&self.expected[i], self.leases.get(&i))
                {
                    assert!(self.store().release_if_pending(lease).unwrap());
                    self.expected[i] = Expected::Absent;
                }
            }
            Step::Checkpoint => self.store().checkpoint().unwrap(),
            Step::Restart => {
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
        }
    }

    /// Every key holds exactly what was acknowledged.
    fn verify(&self) {
        for (i, expected) in self.expected.iter().enumerate() {
            let record = self.store().get(&key(i)).unwrap();
            match (expected, record.as_ref().map(|r| (r.token(), r.status()))) {
                (Expected::Absent, None) => {}
                (Expected::Pending { token }, Some((t, Status::Pending { .. }))) => {
                    assert_eq!(*token, t, "key {i}: pending under another token");
                }
                (
                    Expected::Completed { result },
                    Some((_, Status::Completed { result: got, .. })),
                ) => {
                    assert_eq!(result.as_slice(), got, "key {i}: completed result altered");
                }
                (expected, got) => {
                    panic!("key {i} after recovery: expected {expected:?}, got {got:?}")
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random operations with restarts, process crashes and power losses in between: after
    /// every recovery each key holds exactly what was acknowledged, and tokens keep rising.
    #[test]
    fn acknowledged_operations_survive_crashes(steps in proptest::collection::vec(step(), 1..160)) {
        let mut harness = Harness::new();
        for step in steps {
            harness.run(step);
        }
        harness.run(Step::PowerLoss(7));
        harness.run(Step::Reserve(0));
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

fn ops_then_process_crash(count: usize) -> (ManualClock, SimDisk, SimDisk) {
    let clock = ManualClock::new();
    let (db, log) = (SimDisk::new(), SimDisk::new());
    let mut b = builder(&clock);
    b.checkpoint_bytes(64 << 20);
    let store = Store::open_sim(&b, &db, &log).unwrap();
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
    let first = Store::open_sim(&b, &db.after_process_crash(), &log.after_process_crash()).unwrap();
    let second =
        Store::open_sim(&b, &db.after_process_crash(), &log.after_process_crash()).unwrap();
    for i in 0..50 {
        let key = Key::new("t", "op", format!("{i}")).unwrap();
        let a = first.get(&key).unwrap().expect("acknowledged reserve lost");
        assert_eq!(Some(a), second.get(&key).unwrap());
    }
}

#[test]
fn damaged_frame_followed_by_valid_frames_refuses_to_open() {
    let (clock, db, log) = ops_then_process_crash(50);
    // Byte 30 is inside the first frame's payload.
    log.flip_bit(30, 3);
    let err = Store::open_sim(&builder(&clock), &db, &log).unwrap_err();
    assert!(matches!(err, Error::Corruption { .. }), "{err}");
    assert!(err.to_string().contains("offset"), "{err}");
}

#[test]
fn torn_tail_ends_the_log() {
    let disk = SimDisk::new();
    let file: std::sync::Arc<dyn LogFile> = std::sync::Arc::new(disk.clone());
    let (mut wal, frames) = Wal::recover(file, "t.wal".into(), 0, true).unwrap();
    assert!(frames.is_empty());
    for i in 0..5u8 {
        let key = vec![1, b'a', 1, b'b', 1, i];
        let record = vec![i; 100];
        wal.append(
            10 + u64::from(i),
            std::iter::once((key.as_slice(), Some(record.as_slice()))),
        )
        .unwrap();
    }
    // Cut the last frame short, as a torn append would.
    let bytes = disk.bytes();
    let torn = SimDisk::new();
    torn.write_all_at(&bytes[..bytes.len() - 40], 0).unwrap();
    let (wal, frames) = Wal::recover(std::sync::Arc::new(torn), "t.wal".into(), 0, true).unwrap();
    assert_eq!(frames.len(), 4);
    assert_eq!(wal.last_seq(), 4);
    assert_eq!(frames[3].next_token, 13);
    // Frames at or below the checkpoint are skipped.
    let again = SimDisk::new();
    again.write_all_at(&bytes, 0).unwrap();
    let (_, frames) = Wal::recover(std::sync::Arc::new(again), "t.wal".into(), 3, true).unwrap();
    assert_eq!(frames.iter().map(|f| f.seq).collect::<Vec<_>>(), vec![4, 5]);
}

#[test]
fn failed_log_sync_poisons_and_reopen_recovers() {
    let clock = ManualClock::new();
    let (db, log) = (SimDisk::new(), SimDisk::new());
    let store = Store::open_sim(&builder(&clock), &db, &log).unwrap();
    let fp = Fingerprint::of(b"r");
    let Reservation::Acquired(kept) = store.reserve(&key(0), fp).unwrap() else {
        panic!()
    };
    log.fail_after(1);
    let err = store.reserve(&key(1), fp).unwrap_err();
    assert!(err.to_string().contains("injected"), "{err}");
    let later = store.reserve(&key(2), fp).unwrap_err();
    assert!(matches!(later, Error::Poisoned { .. }), "{later}");
    assert!(matches!(store.get(&key(0)), Err(Error::Poisoned { .. })));
    db.freeze();
    log.freeze();
    let (db, log) = (db.after_process_crash(), log.after_process_crash());
    drop(store);
    let store = Store::open_sim(&builder(&clock), &db, &log).unwrap();
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
    let store = Store::open_sim(&builder(&clock), &db, &log).unwrap();
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
        Err(Error::Poisoned { .. })
    ));
    db.freeze();
    log.freeze();
    let (db, log) = (db.after_process_crash(), log.after_process_crash());
    drop(store);
    let store = Store::open_sim(&builder(&clock), &db, &log).unwrap();
    for i in 0..KEYS {
        assert!(store.get(&key(i)).unwrap().is_some(), "key {i} lost");
    }
}
