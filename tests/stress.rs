//! Concurrency stress: many threads mix reserve, complete, release, extend,
//! mark_needs_review, resolve and get over a few keys in a few scopes for a bounded time,
//! while a clock thread moves time past leases and retentions so takeovers and expiries keep
//! happening. Results and review notes name their key and token, so every observation can be
//! checked against who may have written it:
//!
//! - fencing tokens are unique across the store, and each key's are handed out in increasing
//!   order: an acquisition is above every token acknowledged for that key before it started;
//! - at most one live owner per key at any moment: no acquisition is decided while another
//!   lease on the key is live, i.e. inside an acknowledged live interval of it (from its
//!   acquisition or an acknowledged extend to that lease deadline, cut short when its holder
//!   asks to complete, release or mark it); and once a newer token was acknowledged for a key,
//!   an older lease's complete, extend, mark or release is refused;
//! - a result (or note) always belongs to the key it is read from, and to the record's token,
//!   which was acquired for that key: nothing crosses keys or scopes;
//! - each thread's reads of a key never go back to an older token.
//!
//! 2.5 s by default; `IDEMSTORE_LONG=1` runs 30 s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idemstore::{
    Error, Fingerprint, Key, Lease, ManualClock, Record, Reservation, Resolution, Status, Store,
};

const SCOPES: [&str; 3] = ["tenant-a", "tenant-b", "tenant-c"];
/// The same ids in every scope, so that keys differ only in scope.
const IDS: [&str; 2] = ["k0", "k1"];
const KEYS: usize = SCOPES.len() * IDS.len();
const THREADS: usize = 8;
/// Clock time: a lease is a few milliseconds of real time, a retention a few dozen.
const LEASE: Duration = Duration::from_millis(100);
const RETENTION: Duration = Duration::from_millis(400);
/// Fewer acquisitions than this in a run test too little to mean anything.
const MIN_ACQUIRED: u64 = 50;

fn key(k: usize) -> Key {
    Key::new(SCOPES[k / IDS.len()], "stress", IDS[k % IDS.len()]).expect("valid key")
}

fn body(k: usize) -> Fingerprint {
    Fingerprint::of(format!("body of key {k}"))
}

/// What a result or note says: written by `token` for key `k`.
fn signed(k: usize, token: u64) -> String {
    format!("{}/{}/{token}", SCOPES[k / IDS.len()], IDS[k % IDS.len()])
}

/// The key and token a result or note names.
fn signer(bytes: &[u8]) -> (usize, u64) {
    let text = std::str::from_utf8(bytes).expect("results are text");
    let mut parts = text.split('/');
    let (scope, id, token) = (
        parts.next().expect("scope"),
        parts.next().expect("id"),
        parts.next().expect("token").parse().expect("token number"),
    );
    let s = SCOPES
        .iter()
        .position(|x| *x == scope)
        .expect("a known scope");
    let i = IDS.iter().position(|x| *x == id).expect("a known id");
    (s * IDS.len() + i, token)
}

/// The acknowledged live intervals of every lease, by token, to check that no two leases of
/// a key are ever live at the same moment.
#[derive(Default)]
struct Owners {
    leases: HashMap<u64, Owned>,
}

struct Owned {
    key: usize,
    /// From each acknowledged acquisition or extend (its decision time: the new deadline
    /// minus the lease) to its deadline.
    live: Vec<(SystemTime, SystemTime)>,
    /// When its holder first asked to complete, release or mark it (no later than that was
    /// decided): its live intervals end there.
    ending_from: Option<SystemTime>,
}

impl Owners {
    fn acquired(&mut self, k: usize, lease: &Lease) {
        let until = lease.lease_until();
        self.leases.insert(
            lease.token(),
            Owned {
                key: k,
                live: vec![(until - LEASE, until)],
                ending_from: None,
            },
        );
        self.check(lease.token());
    }

    fn extended(&mut self, lease: &Lease) {
        let until = lease.lease_until();
        if let Some(owned) = self.leases.get_mut(&lease.token()) {
            owned.live.push((until - LEASE, until));
        }
        self.check(lease.token());
    }

    fn ending(&mut self, token: u64, now: SystemTime) {
        if let Some(owned) = self.leases.get_mut(&token) {
            owned.ending_from.get_or_insert(now);
        }
    }

    /// The lease `token` (just acquired or extended) against every other lease of its key: the
    /// later-acquired one's acquisition never falls inside the earlier one's live intervals.
    fn check(&self, token: u64) {
        let Some(this) = self.leases.get(&token) else {
            return;
        };
        for (&other, that) in self.leases.iter().filter(|(_, o)| o.key == this.key) {
            let ((t1, earlier), (t2, later)) = match other.cmp(&token) {
                std::cmp::Ordering::Less => ((other, that), (token, this)),
                std::cmp::Ordering::Greater => ((token, this), (other, that)),
                std::cmp::Ordering::Equal => continue,
            };
            let acquired_at = later.live[0].0;
            for &(from, until) in &earlier.live {
                let until = earlier.ending_from.map_or(until, |e| until.min(e));
                assert!(
                    !(from <= acquired_at && acquired_at < until),
                    "key {}: token {t2} acquired at {acquired_at:?} while token {t1} was live from {from:?} to {until:?}",
                    this.key
                );
            }
        }
    }
}

struct Shared {
    store: Store,
    clock: ManualClock,
    owners: Mutex<Owners>,
    /// Every token handed out, and the key it was handed out for.
    tokens: Mutex<HashMap<u64, usize>>,
    /// Per key, the highest token whose acquisition has been acknowledged.
    acquired: Vec<AtomicU64>,
    counts: Counts,
}

#[derive(Default)]
struct Counts {
    ops: AtomicU64,
    acquired: AtomicU64,
    takeovers: AtomicU64,
    completed: AtomicU64,
    fenced: AtomicU64,
    replayed: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Shared {
    /// Records that the lease's holder asks to end it now (before the call).
    fn ending(&self, lease: &Lease) {
        let now = self.clock.time();
        self.owners.lock().unwrap().ending(lease.token(), now);
    }

    /// Checks a record read from key `k` and returns its token. A pending record may be read
    /// before its acquirer has registered the token, so that check waits for the end.
    fn check_record(&self, k: usize, record: &Record, later: &mut Vec<(usize, u64)>) -> u64 {
        let token = record.token();
        later.push((k, token));
        match record.status() {
            Status::Completed { result, .. } => {
                assert_eq!(signer(result), (k, token), "key {k}: a foreign result")
            }
            Status::NeedsReview { note, .. } => {
                assert_eq!(
                    signer(note.as_bytes()),
                    (k, token),
                    "key {k}: a foreign note"
                )
            }
            _ => {}
        }
        token
    }
}

struct Worker {
    shared: Arc<Shared>,
    rng: u64,
    leases: Vec<Option<Lease>>,
    /// The highest token this thread has seen for each key.
    seen: Vec<u64>,
    /// (key, token) of records read, checked against the acquisitions at the end.
    observed: Vec<(usize, u64)>,
}

impl Worker {
    fn below(&mut self, n: usize) -> usize {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng % n as u64) as usize
    }

    fn saw(&mut self, k: usize, token: u64) {
        assert!(
            token >= self.seen[k],
            "key {k}: read token {token} after token {}",
            self.seen[k]
        );
        self.seen[k] = token;
    }

    fn step(&mut self) {
        let shared = Arc::clone(&self.shared);
        let store = &shared.store;
        bump(&shared.counts.ops);
        let k = self.below(KEYS);
        let held = self.leases[k].clone();
        match (self.below(10), held) {
            (0..=3, _) => self.reserve(k),
            (4..=5, Some(lease)) => {
                let newer = shared.acquired[k].load(Ordering::SeqCst) > lease.token();
                shared.ending(&lease);
                match store.complete(&lease, signed(k, lease.token())) {
                    Ok(()) => {
                        assert!(
                            !newer,
                            "key {k}: token {} completed after a newer acquisition",
                            lease.token()
                        );
                        bump(&shared.counts.completed);
                        self.leases[k] = None;
                    }
                    Err(Error::LeaseLost { .. }) => {
                        bump(&shared.counts.fenced);
                        self.leases[k] = None;
                    }
                    Err(e) => panic!("complete: {e}"),
                }
            }
            (6, Some(lease)) => {
                let newer = shared.acquired[k].load(Ordering::SeqCst) > lease.token();
                shared.ending(&lease);
                match store.release_if_pending(&lease) {
                    Ok(released) => {
                        assert!(
                            !(newer && released),
                            "key {k}: token {} released after a newer acquisition",
                            lease.token()
                        );
                        self.leases[k] = None;
                    }
                    Err(Error::LeaseLost { .. }) => {
                        bump(&shared.counts.fenced);
                        self.leases[k] = None;
                    }
                    Err(e) => panic!("release: {e}"),
                }
            }
            (7, Some(lease)) => {
                let newer = shared.acquired[k].load(Ordering::SeqCst) > lease.token();
                match store.extend(&lease) {
                    Ok(renewed) => {
                        assert!(
                            !newer,
                            "key {k}: token {} extended after a newer acquisition",
                            lease.token()
                        );
                        shared.owners.lock().unwrap().extended(&renewed);
                        self.leases[k] = Some(renewed);
                    }
                    Err(Error::LeaseLost { .. }) => {
                        bump(&shared.counts.fenced);
                        self.leases[k] = None;
                    }
                    Err(e) => panic!("extend: {e}"),
                }
            }
            (8, Some(lease)) if self.below(4) == 0 => {
                let newer = shared.acquired[k].load(Ordering::SeqCst) > lease.token();
                shared.ending(&lease);
                match store.mark_needs_review(&lease, &signed(k, lease.token())) {
                    Ok(()) => assert!(
                        !newer,
                        "key {k}: token {} marked after a newer acquisition",
                        lease.token()
                    ),
                    Err(Error::LeaseLost { .. }) => bump(&shared.counts.fenced),
                    Err(e) => panic!("mark: {e}"),
                }
                self.leases[k] = None;
            }
            _ => self.get(k),
        }
    }

    fn reserve(&mut self, k: usize) {
        let shared = Arc::clone(&self.shared);
        let before = shared.acquired[k].load(Ordering::SeqCst);
        // Now and then the wrong request body: a mismatch, never a write.
        let fp = if self.below(50) == 0 {
            body(k + 1)
        } else {
            body(k)
        };
        match shared.store.reserve(&key(k), fp).expect("reserve") {
            Reservation::Acquired(lease) => {
                let token = lease.token();
                assert!(
                    token > before,
                    "key {k}: token {token} acquired after token {before} was acknowledged"
                );
                let previous = shared.tokens.lock().unwrap().insert(token, k);
                assert_eq!(previous, None, "token {token} handed out twice");
                shared.acquired[k].fetch_max(token, Ordering::SeqCst);
                shared.owners.lock().unwrap().acquired(k, &lease);
                self.saw(k, token);
                bump(&shared.counts.acquired);
                if lease.is_retry() {
                    bump(&shared.counts.takeovers);
                }
                self.leases[k] = Some(lease);
            }
            Reservation::Completed(done) => {
                let (signed_k, token) = signer(&done.result);
                assert_eq!(signed_k, k, "key {k}: replayed another key's result");
                assert_eq!(
                    shared.tokens.lock().unwrap().get(&token),
                    Some(&k),
                    "key {k}: replayed a result of token {token}, not acquired for it"
                );
                self.saw(k, token);
                bump(&shared.counts.replayed);
            }
            Reservation::NeedsReview { note } => {
                let (signed_k, token) = signer(note.as_bytes());
                assert_eq!(signed_k, k, "key {k}: another key's review note");
                self.saw(k, token);
                // The operator settles it now and then.
                if self.below(3) == 0 {
                    match shared.store.resolve(&key(k), Resolution::Release) {
                        Ok(()) | Err(Error::NotResolvable { .. }) => {}
                        Err(e) => panic!("resolve: {e}"),
                    }
                }
            }
            Reservation::InProgress { .. } | Reservation::Mismatch => {}
            other => panic!("unexpected reservation {other:?}"),
        }
    }

    fn get(&mut self, k: usize) {
        let shared = Arc::clone(&self.shared);
        if let Some(record) = shared.store.get(&key(k)).expect("get") {
            let token = shared.check_record(k, &record, &mut self.observed);
            self.saw(k, token);
        }
    }
}

#[test]
fn many_threads_on_few_keys_keep_one_owner_and_results_in_their_keys() {
    let long = std::env::var_os("IDEMSTORE_LONG").is_some_and(|v| v != "0");
    let duration = if long {
        Duration::from_secs(30)
    } else {
        Duration::from_millis(2_500)
    };
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("stress.idem");
    let clock = ManualClock::starting_at(UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    let open = || {
        Store::builder()
            .clock(clock.clone())
            .lease(LEASE)
            .retention(RETENTION)
            .cache_records(4)
            .open(&path)
            .expect("open the store")
    };
    let shared = Arc::new(Shared {
        store: open(),
        clock: clock.clone(),
        owners: Mutex::new(Owners::default()),
        tokens: Mutex::new(HashMap::new()),
        acquired: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
        counts: Counts::default(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let ticker = {
        let (clock, stop) = (clock.clone(), Arc::clone(&stop));
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                clock.advance(Duration::from_millis(7));
                thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let sweeper = {
        let (shared, stop) = (Arc::clone(&shared), Arc::clone(&stop));
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                shared.store.sweep(4).expect("sweep");
                if shared.counts.ops.load(Ordering::Relaxed) % 7 == 0 {
                    shared.store.checkpoint().expect("checkpoint");
                }
                thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let started = Instant::now();
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let shared = Arc::clone(&shared);
            thread::spawn(move || {
                let mut worker = Worker {
                    shared,
                    rng: 0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1),
                    leases: vec![None; KEYS],
                    seen: vec![0; KEYS],
                    observed: Vec::new(),
                };
                // At least `duration`, and on a loaded machine until the run has done
                // enough to mean something (the assertions below), within a minute.
                let enough = |c: &Counts| {
                    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
                    load(&c.acquired) > 2 * MIN_ACQUIRED
                        && load(&c.takeovers) > 0
                        && load(&c.fenced) > 0
                        && load(&c.completed) > 0
                        && load(&c.replayed) > 0
                };
                while (started.elapsed() < duration || !enough(&worker.shared.counts))
                    && started.elapsed() < Duration::from_secs(60)
                {
                    worker.step();
                }
                worker.observed
            })
        })
        .collect();
    let observed: Vec<(usize, u64)> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("a worker failed"))
        .collect();
    stop.store(true, Ordering::Relaxed);
    ticker.join().expect("clock thread");
    sweeper.join().expect("sweeper");
    let counts = &shared.counts;
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    eprintln!(
        "{:.1} s, {THREADS} threads, {KEYS} keys: {} operations, {} acquisitions ({} takeovers), {} completions, {} replays, {} fenced off",
        started.elapsed().as_secs_f64(),
        load(&counts.ops),
        load(&counts.acquired),
        load(&counts.takeovers),
        load(&counts.completed),
        load(&counts.replayed),
        load(&counts.fenced),
    );
    assert!(
        load(&counts.acquired) > MIN_ACQUIRED,
        "too few acquisitions to mean anything"
    );
    assert!(load(&counts.takeovers) > 0, "no lease ever went stale");
    assert!(load(&counts.fenced) > 0, "no old owner was ever fenced off");
    assert!(load(&counts.completed) > 0 && load(&counts.replayed) > 0);

    // After a reopen every record still belongs to its key.
    let shared = Arc::into_inner(shared).expect("every thread finished");
    let tokens = shared.tokens.into_inner().unwrap();
    for (k, token) in observed {
        assert_eq!(
            tokens.get(&token),
            Some(&k),
            "key {k} held token {token}, which was not acquired for it"
        );
    }
    drop(shared.store);
    let store = open();
    for k in 0..KEYS {
        if let Some(record) = store.get(&key(k)).expect("get after reopen") {
            assert_eq!(
                tokens.get(&record.token()),
                Some(&k),
                "key {k} after reopen"
            );
            if let Status::Completed { result, .. } = record.status() {
                assert_eq!(signer(result), (k, record.token()));
            }
        }
    }
}
