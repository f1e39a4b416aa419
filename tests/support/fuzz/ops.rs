//! The `ops` target: operations, clock steps, crashes and faults against a reference model.
//!
//! The model is written from docs/DESIGN.md, not from `decide/`: one plain state per key. Every
//! outcome is compared while the store is healthy. An injected write or sync failure (or a
//! full disk) makes the operation that hit it uncertain: the model then holds both the state
//! before and the state after it, every later call must fail as poisoned, and the next
//! restart, process crash or power loss must recover one of the two (and every acknowledged
//! operation). Fencing tokens must rise above every token acknowledged or seen before.

use std::time::Duration;

use crate::support::model::{body, Model};
use crate::support::sim::{Rng, SimDisk};
use idemstore::whitebox::to_millis;
use idemstore::whitebox::Millis;
use idemstore::{Error, LeaseLostReason};
use idemstore::{Key, Lease, ManualClock, Record, Reservation, Resolution, Store};

use super::{builder, clock, open_sim, Input, LEASE_MS, RETENTION_MS};

const KEYS: usize = 4;
/// Bounds one input's work.
const MAX_STEPS: usize = 400;
/// Leases kept per key (the latest and older, taken-over ones that must be fenced off).
const LEASES_KEPT: usize = 4;
/// Clock steps around the lease (1 s) and retention (5 s).
const STEPS_MS: [u64; 8] = [1, 250, 999, 1_000, 1_001, 2_500, 5_000, 7_000];

fn key(i: usize) -> Key {
    // Keys 0 and 3 differ only in scope: a result must never cross between them.
    match i {
        3 => Key::new("tenant-b", "charge", "k0"),
        i => Key::new("tenant-a", "charge", format!("k{i}")),
    }
    .expect("valid key")
}

/// A result naming its key and token, small or large enough to fill the log quickly.
fn result_for(k: usize, token: u64, large: bool) -> Vec<u8> {
    let mut result = format!("key {k} token {token};").into_bytes();
    result.resize(if large { 1_500 } else { 40 }, b'.');
    result
}

#[derive(Debug, Clone)]
enum Step {
    Reserve {
        k: usize,
        body: u8,
    },
    Complete {
        k: usize,
        lease: u8,
        large: bool,
    },
    Release {
        k: usize,
        lease: u8,
    },
    Extend {
        k: usize,
        lease: u8,
    },
    Mark {
        k: usize,
        lease: u8,
    },
    Resolve {
        k: usize,
        complete: bool,
    },
    Get {
        k: usize,
    },
    Advance(u64),
    Sweep(usize),
    Checkpoint,
    Restart,
    ProcessCrash,
    PowerLoss(u64),
    /// The `after`-th write or sync from now on one disk fails, and every later one.
    Fail {
        log: bool,
        after: u64,
    },
    /// One disk is full `room` bytes past its current length.
    Full {
        log: bool,
        room: u64,
    },
}

fn parse(data: &[u8]) -> Vec<Step> {
    let mut input = Input(data);
    let mut steps = Vec::new();
    while !input.is_empty() && steps.len() < MAX_STEPS {
        let op = input.byte();
        let arg = input.byte();
        let k = usize::from(arg) % KEYS;
        let lease = arg / 4;
        steps.push(match op % 24 {
            0..=4 => Step::Reserve { k, body: arg / 4 },
            5..=8 => Step::Complete {
                k,
                lease,
                large: op >= 128,
            },
            9 | 10 => Step::Release { k, lease },
            11 => Step::Extend { k, lease },
            12 => Step::Mark { k, lease },
            13 => Step::Resolve {
                k,
                complete: op >= 128,
            },
            14 => Step::Get { k },
            15 | 16 => Step::Advance(STEPS_MS[usize::from(arg) % STEPS_MS.len()]),
            17 => Step::Sweep(usize::from(arg % 8)),
            18 => Step::Checkpoint,
            19 => Step::Restart,
            20 => Step::ProcessCrash,
            21 => Step::PowerLoss(u64::from(input.u16()) << 8 | u64::from(arg)),
            22 => Step::Fail {
                log: arg & 1 == 1,
                after: u64::from(arg / 2 % 8) + 1,
            },
            _ => Step::Full {
                log: arg & 1 == 1,
                room: u64::from(input.u16()),
            },
        });
    }
    steps
}

/// The harness: the store on its simulated disks, and what it must hold.
struct Harness {
    clock: ManualClock,
    db: SimDisk,
    log: SimDisk,
    store: Option<Store>,
    /// Per key, the states it may be in: one, or two after an uncertain operation.
    models: Vec<Vec<Model>>,
    leases: Vec<Vec<Lease>>,
    /// The highest token acknowledged or seen so far.
    max_token: u64,
    /// A fault was injected since the last reopen: errors are allowed.
    faulty: bool,
    /// A call failed: every later one must fail too, until a reopen.
    poisoned: bool,
    /// The highest token acknowledged before the store was last opened: a reservation under
    /// it was made by an earlier owner, so its lease ended with that owner.
    earlier_owners: u64,
}

/// Runs the steps encoded in `data` (two bytes each, some with a little more), then a power
/// loss, and checks every outcome against the model. Panics on the first disagreement.
pub fn ops(data: &[u8]) {
    let mut harness = Harness::new();
    for step in parse(data) {
        harness.run(step);
    }
    harness.run(Step::PowerLoss(7));
    harness.run(Step::Reserve { k: 0, body: 0 });
}

impl Harness {
    fn new() -> Harness {
        let clock = clock();
        let (db, log) = (SimDisk::new(), SimDisk::new());
        let store = open_sim(&builder(&clock), &db, &log).expect("a new simulated store opens");
        Harness {
            clock,
            db,
            log,
            store: Some(store),
            models: vec![vec![Model::Absent]; KEYS],
            leases: vec![Vec::new(); KEYS],
            max_token: 0,
            faulty: false,
            poisoned: false,
            earlier_owners: 0,
        }
    }

    /// Whether a pending key under `token` with `lease_until` is stale at `now`: its lease
    /// ran out, or an earlier owner of the file granted it (a token of 0, acquired by a call
    /// that failed, is from this owner).
    fn ended(&self, token: u64, lease_until: Millis, now: Millis) -> bool {
        now >= lease_until || (token != 0 && token <= self.earlier_owners)
    }

    fn store(&self) -> &Store {
        self.store.as_ref().expect("open between steps")
    }

    fn now(&self) -> Millis {
        to_millis(self.clock.time())
    }

    fn lease(&self, k: usize, pick: u8) -> Option<Lease> {
        let leases = &self.leases[k];
        let back = usize::from(pick) % LEASES_KEPT;
        leases
            .len()
            .checked_sub(1 + back)
            .map(|i| leases[i].clone())
    }

    fn run(&mut self, step: Step) {
        if std::env::var_os("IDEMSTORE_FUZZ_TRACE").is_some() {
            eprintln!("step {step:?}  (model {:?})", self.models);
        }
        match step {
            Step::Reserve { k, body: b } => self.reserve(k, b % 2),
            Step::Complete { k, lease, large } => {
                if let Some(lease) = self.lease(k, lease) {
                    let result = result_for(k, lease.token(), large);
                    let got = self.store().complete(&lease, result.clone());
                    self.lease_op(k, &lease, got, |now, model| match model {
                        Model::Pending {
                            token,
                            attempt,
                            body,
                            ..
                        } => Model::Completed {
                            token,
                            attempt,
                            body,
                            result,
                            completed_at: now,
                            expires_at: now + RETENTION_MS,
                        },
                        other => other,
                    });
                }
            }
            Step::Release { k, lease } => {
                if let Some(lease) = self.lease(k, lease) {
                    self.release(k, &lease);
                }
            }
            Step::Extend { k, lease } => {
                if let Some(lease) = self.lease(k, lease) {
                    let got = self.store().extend(&lease);
                    let now = self.now();
                    if let Ok(renewed) = &got {
                        assert_eq!(to_millis(renewed.lease_until()), now + LEASE_MS);
                    }
                    self.lease_op(k, &lease, got.map(|_| ()), |now, model| match model {
                        Model::Pending {
                            token,
                            attempt,
                            body,
                            ..
                        } => Model::Pending {
                            token,
                            attempt,
                            body,
                            lease_until: now + LEASE_MS,
                        },
                        other => other,
                    });
                }
            }
            Step::Mark { k, lease } => {
                if let Some(lease) = self.lease(k, lease) {
                    let note = format!("review {}", lease.token());
                    let got = self.store().mark_needs_review(&lease, &note);
                    self.lease_op(k, &lease, got, |now, model| match model {
                        Model::Pending {
                            token,
                            attempt,
                            body,
                            ..
                        } => Model::Review {
                            token,
                            attempt,
                            body,
                            note,
                            since: now,
                        },
                        other => other,
                    });
                }
            }
            Step::Resolve { k, complete } => self.resolve(k, complete),
            Step::Get { k } => {
                let got = self.store().get(&key(k));
                if let Some(record) = self.healthy(got) {
                    self.expect_one(k, record.as_ref());
                }
            }
            Step::Advance(ms) => self.clock.advance(Duration::from_millis(ms)),
            Step::Sweep(limit) => {
                let got = self.store().sweep(limit);
                if let Some(swept) = self.healthy(got) {
                    assert!(swept <= limit, "swept {swept} records, limit {limit}");
                }
            }
            Step::Checkpoint => {
                let got = self.store().checkpoint();
                self.healthy(got);
            }
            Step::Restart => {
                drop(self.store.take());
                if self.faulty {
                    // A failed device is replaced by its contents.
                    self.db = self.db.after_process_crash();
                    self.log = self.log.after_process_crash();
                }
                self.reopen();
            }
            Step::ProcessCrash => {
                self.db.freeze();
                self.log.freeze();
                let (db, log) = (
                    self.db.after_process_crash(),
                    self.log.after_process_crash(),
                );
                drop(self.store.take());
                (self.db, self.log) = (db, log);
                self.reopen();
            }
            Step::PowerLoss(seed) => {
                self.db.freeze();
                self.log.freeze();
                let mut rng = Rng(seed | 1);
                let db = self.db.after_power_loss(&mut rng);
                let log = self.log.after_power_loss(&mut rng);
                drop(self.store.take());
                (self.db, self.log) = (db, log);
                self.reopen();
            }
            Step::Fail { log, after } => {
                self.faulty = true;
                self.disk(log).fail_after(after);
            }
            Step::Full { log, room } => {
                self.faulty = true;
                let disk = self.disk(log);
                let len = disk.bytes().len() as u64;
                disk.set_size_limit(Some(len + room));
            }
        }
    }

    fn disk(&self, log: bool) -> &SimDisk {
        if log {
            &self.log
        } else {
            &self.db
        }
    }

    /// `Some(value)` when the call succeeded and the model can follow it; `None` after an
    /// allowed failure (the store is poisoned from then on). Success after a failure, or a
    /// failure without an injected fault, is a finding.
    fn healthy<T: std::fmt::Debug>(&mut self, got: Result<T, Error>) -> Option<T> {
        match got {
            Ok(value) => {
                assert!(
                    !self.poisoned,
                    "a call succeeded after the store failed: {value:?}"
                );
                Some(value)
            }
            Err(e) => {
                assert!(self.faulty, "an error without an injected fault: {e}");
                if self.poisoned {
                    assert!(
                        matches!(e, Error::Storage(idemstore::StorageError::Poisoned { .. })),
                        "a call after a failure is not refused as poisoned: {e}"
                    );
                }
                self.poisoned = true;
                None
            }
        }
    }

    /// The one state of key `k`, while the store is healthy.
    fn current(&self, k: usize) -> Model {
        assert_eq!(self.models[k].len(), 1, "uncertain state while healthy");
        self.models[k][0].visible(self.now(), RETENTION_MS)
    }

    fn expect_one(&self, k: usize, record: Option<&Record>) {
        let model = self.current(k);
        assert!(
            model.matches(record, self.max_token),
            "key {k}: expected {model:?}, the store holds {record:?}"
        );
    }

    /// Sets key `k` to `next`, or, when the call failed, to either its old state or `next`.
    fn settle(&mut self, k: usize, succeeded: bool, next: Model) {
        if succeeded {
            self.models[k] = vec![next];
        } else if self.models[k].len() == 1 && self.models[k][0] != next {
            self.models[k].push(next);
        }
    }

    fn reserve(&mut self, k: usize, b: u8) {
        let got = self.store().reserve(&key(k), body(b));
        if self.poisoned {
            self.healthy(got);
            return;
        }
        let now = self.now();
        let model = self.current(k);
        let acquire = |attempt: u32| Model::Pending {
            token: 0,
            attempt,
            body: b,
            lease_until: now + LEASE_MS,
        };
        // What the call may have done, if it fails.
        let change = match &model {
            Model::Absent => Some(acquire(1)),
            Model::Pending {
                token,
                attempt,
                body,
                lease_until,
            } if *body == b && self.ended(*token, *lease_until, now) => Some(acquire(attempt + 1)),
            _ => None,
        };
        let Some(outcome) = self.healthy(got) else {
            if let Some(change) = change {
                self.settle(k, false, change);
            }
            return;
        };
        match (&model, outcome) {
            (_, Reservation::Mismatch) => assert!(
                model.body().is_some_and(|stored| stored != b),
                "key {k}: mismatch against {model:?}"
            ),
            (_, Reservation::Acquired(lease)) => {
                let Some(Model::Pending { attempt, .. }) = change else {
                    panic!("key {k}: acquired against {model:?}");
                };
                assert!(
                    lease.token() > self.max_token,
                    "key {k}: token {} not above {}",
                    lease.token(),
                    self.max_token
                );
                assert_eq!(lease.attempt(), attempt, "key {k}: attempt");
                assert_eq!(to_millis(lease.lease_until()), now + LEASE_MS);
                self.max_token = lease.token();
                self.settle(
                    k,
                    true,
                    Model::Pending {
                        token: lease.token(),
                        attempt,
                        body: b,
                        lease_until: now + LEASE_MS,
                    },
                );
                self.leases[k].push(lease);
            }
            (
                Model::Completed {
                    result,
                    attempt,
                    body,
                    ..
                },
                Reservation::Completed(done),
            ) if *body == b => {
                assert_eq!(&done.result, result, "key {k}: replayed result");
                assert_eq!(done.attempt, *attempt, "key {k}: replayed attempt");
            }
            (
                Model::Pending {
                    token,
                    attempt,
                    body,
                    lease_until,
                },
                Reservation::InProgress {
                    retry_after,
                    attempt: got,
                },
            ) if *body == b && !self.ended(*token, *lease_until, now) => {
                assert_eq!(retry_after, Duration::from_millis(lease_until - now));
                assert_eq!(got, *attempt);
            }
            (Model::Review { note, body, .. }, Reservation::NeedsReview { note: got })
                if *body == b =>
            {
                assert_eq!(&got, note);
            }
            (model, got) => panic!("key {k}: expected the outcome for {model:?}, got {got:?}"),
        }
    }

    /// An operation that needs the lease to own the key: on success the model moves by
    /// `change`; a refusal must name why the lease does not own it.
    fn lease_op(
        &mut self,
        k: usize,
        lease: &Lease,
        got: Result<(), Error>,
        change: impl FnOnce(Millis, Model) -> Model,
    ) {
        if self.poisoned {
            self.healthy(got);
            return;
        }
        let now = self.now();
        let model = self.current(k);
        // Completing again with the lease that completed is accepted and changes nothing.
        let already_done =
            matches!(&model, Model::Completed { token, .. } if *token == lease.token());
        let lost = model.lost(lease.token());
        let next = if lost.is_none() {
            change(now, model.clone())
        } else {
            model.clone()
        };
        match got {
            Err(Error::LeaseLost { reason, token, .. }) => {
                assert_eq!(token, lease.token());
                assert!(
                    !already_done || matches!(next, Model::Completed { .. }),
                    "key {k}: a repeated completion was refused"
                );
                assert_eq!(
                    Some(reason),
                    lost,
                    "key {k}: lease {} refused against {model:?}",
                    lease.token()
                );
            }
            got => {
                let ok = self.healthy(got).is_some();
                if ok {
                    assert!(
                        lost.is_none() || already_done,
                        "key {k}: lease {} acted against {model:?}",
                        lease.token()
                    );
                }
                self.settle(k, ok, next);
            }
        }
    }

    fn release(&mut self, k: usize, lease: &Lease) {
        let got = self.store().release_if_pending(lease);
        if self.poisoned {
            self.healthy(got);
            return;
        }
        let model = self.current(k);
        let expected: Result<bool, LeaseLostReason> = match &model {
            Model::Absent | Model::Completed { .. } => Ok(false),
            other => match other.lost(lease.token()) {
                None => Ok(true),
                Some(reason) => Err(reason),
            },
        };
        match got {
            Err(Error::LeaseLost { reason, .. }) => {
                assert_eq!(Err(reason), expected, "key {k}: release against {model:?}");
            }
            got => match self.healthy(got) {
                Some(released) => {
                    assert_eq!(Ok(released), expected, "key {k}: release against {model:?}");
                    if released {
                        self.settle(k, true, Model::Absent);
                    }
                }
                None => {
                    if expected == Ok(true) {
                        self.settle(k, false, Model::Absent);
                    }
                }
            },
        }
    }

    fn resolve(&mut self, k: usize, complete: bool) {
        let token = self.models[k][0].token().unwrap_or(0);
        let result = result_for(k, token, false);
        let resolution = if complete {
            Resolution::Complete(result.clone())
        } else {
            Resolution::Release
        };
        let got = self.store().resolve(&key(k), resolution);
        if self.poisoned {
            self.healthy(got);
            return;
        }
        let now = self.now();
        let model = self.current(k);
        let next = match &model {
            Model::Review {
                token,
                attempt,
                body,
                ..
            } => Some((*token, *attempt, *body)),
            Model::Pending {
                token,
                attempt,
                body,
                lease_until,
            } if self.ended(*token, *lease_until, now) => Some((*token, *attempt, *body)),
            _ => None,
        }
        .map(|(_, attempt, body)| {
            if complete {
                // A resolution takes a new token (fencing off the holder), learnt below.
                Model::Completed {
                    token: 0,
                    attempt,
                    body,
                    result,
                    completed_at: now,
                    expires_at: now + RETENTION_MS,
                }
            } else {
                Model::Absent
            }
        });
        match got {
            Err(Error::NotResolvable { .. }) => {
                assert!(next.is_none(), "key {k}: resolve refused against {model:?}")
            }
            got => {
                let ok = self.healthy(got).is_some();
                let Some(mut next) = next else {
                    assert!(!ok, "key {k}: resolved against {model:?}");
                    return;
                };
                if let (true, Model::Completed { token, .. }) = (ok, &mut next) {
                    let got = self.store().get(&key(k));
                    let record = self
                        .healthy(got)
                        .flatten()
                        .expect("a resolved key is stored");
                    assert!(
                        record.token() > self.max_token,
                        "key {k}: resolved under token {}, not above {}",
                        record.token(),
                        self.max_token
                    );
                    *token = record.token();
                    self.max_token = record.token();
                }
                self.settle(k, ok, next);
            }
        }
    }

    /// Opens the store on the current disks and checks that every key holds one of the
    /// states the model allows, then follows what it holds.
    fn reopen(&mut self) {
        let store = match open_sim(&builder(&self.clock), &self.db, &self.log) {
            Ok(store) => store,
            Err(e) => panic!("the store does not open after a restart or crash: {e}"),
        };
        let now = self.now();
        for k in 0..KEYS {
            let record = store
                .get(&key(k))
                .unwrap_or_else(|e| panic!("key {k} does not read after recovery: {e}"));
            let candidates: Vec<Model> = self.models[k]
                .iter()
                .map(|m| m.visible(now, RETENTION_MS))
                .collect();
            assert!(
                candidates
                    .iter()
                    .any(|m| m.matches(record.as_ref(), self.max_token)),
                "key {k} after recovery: expected one of {candidates:?}, the store holds {record:?}"
            );
            let recovered = Model::of(record.as_ref(), now, &candidates, RETENTION_MS);
            if let Some(token) = recovered.token() {
                self.max_token = self.max_token.max(token);
            }
            // A recovered state keeps its full deadline (the model's, not the visible one).
            self.models[k] = vec![self.models[k]
                .iter()
                .find(|m| m.visible(now, RETENTION_MS) == recovered)
                .cloned()
                .unwrap_or(recovered)];
        }
        self.store = Some(store);
        self.faulty = false;
        self.poisoned = false;
        self.earlier_owners = self.max_token;
    }
}

/// Hand-made starting inputs, one scenario each (pairs of operation and argument bytes).
pub(super) fn seeds() -> Vec<(String, Vec<u8>)> {
    const RESERVE: u8 = 0;
    const COMPLETE: u8 = 5;
    const COMPLETE_LARGE: u8 = 5 + 24 * 6;
    const RELEASE: u8 = 9;
    const EXTEND: u8 = 11;
    const MARK: u8 = 12;
    const RESOLVE: u8 = 13;
    const GET: u8 = 14;
    const ADVANCE: u8 = 15;
    const SWEEP: u8 = 17;
    const CHECKPOINT: u8 = 18;
    const RESTART: u8 = 19;
    const CRASH: u8 = 20;
    const POWER: u8 = 21;
    const FAIL: u8 = 22;
    const FULL: u8 = 23;
    let power = |seed: u8| vec![POWER, seed, 0, 0];
    let mut seeds: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add = |name: &str, steps: &[&[u8]]| seeds.push((name.to_string(), steps.concat()));
    add(
        "reserve-complete-power",
        &[&[RESERVE, 0, COMPLETE, 0], &power(3), &[RESERVE, 0, GET, 0]],
    );
    let churn: Vec<u8> = (0..60u8)
        .flat_map(|i| {
            [
                RESERVE,
                i % 4,
                COMPLETE_LARGE,
                i % 4,
                RESERVE,
                i % 4,
                RELEASE,
                i % 4,
            ]
        })
        .collect();
    add("log-fills-past-checkpoint", &[&churn, &power(5)]);
    add(
        "takeover-fences-old-lease",
        &[
            &[
                RESERVE,
                1,
                ADVANCE,
                3,
                RESERVE,
                1,
                COMPLETE,
                1 + 4,
                COMPLETE,
                1,
            ],
            &[CRASH, 0, RESERVE, 1],
        ],
    );
    add(
        "review-and-resolve",
        &[&[
            RESERVE, 2, MARK, 2, RESERVE, 2, RESOLVE, 2, GET, 2, RESTART, 0,
        ]],
    );
    add(
        "expiry-and-sweep",
        &[&[
            RESERVE, 0, COMPLETE, 0, ADVANCE, 6, ADVANCE, 7, SWEEP, 7, GET, 0, RESERVE, 0,
        ]],
    );
    add(
        "extend-then-power-loss",
        &[
            &[RESERVE, 3, ADVANCE, 2, EXTEND, 3, CHECKPOINT, 0],
            &power(9),
        ],
    );
    add(
        "log-sync-fails",
        &[
            &[RESERVE, 0, COMPLETE, 0, FAIL, 1, RESERVE, 1, GET, 0],
            &power(11),
        ],
    );
    add(
        "db-write-fails-at-checkpoint",
        &[&[RESERVE, 0, RESERVE, 1, FAIL, 0, CHECKPOINT, 0, RESTART, 0]],
    );
    add(
        "log-disk-full",
        &[&[RESERVE, 0, FULL, 1, 0, 1], &churn[..80], &[RESTART, 0]],
    );
    add(
        "db-disk-full",
        &[&[FULL, 0, 0, 0], &churn[..80], &[CHECKPOINT, 0, CRASH, 0]],
    );
    add(
        "mismatch",
        &[&[RESERVE, 0, RESERVE, 4, COMPLETE, 0, RESERVE, 4, RESERVE, 0]],
    );
    seeds
}
