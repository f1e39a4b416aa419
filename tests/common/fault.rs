//! The fault test's clients, history and checker, shared by every backend's fault test
//! (`tests/etcd/fault.rs`, `tests/postgres/fault.rs`), generic over the [`Reservations`] store:
//! concurrent clients reserve (one at a time and in batches), complete, release, take over
//! stale leases and force-expire keys on a few hot keys, observe messages in a dedup window,
//! and complete keys of a short retention that then expire, while a sweeper runs and the
//! backend's test kills its servers ([`exercise`]). The history of what each client was told
//! is then checked against the store's final state ([`check`]): every acknowledged reservation
//! or completion is present afterwards or superseded by a higher token (or was released or
//! expired after), no token is handed out twice, never two live owners of a key, a replay
//! never answers a result past its expiry (expired or swept), and an observed message is new
//! at most once per window.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use idemstore::{Fingerprint, Key, Reservation, Reservations, Seen, Status};

pub const LEASE: Duration = Duration::from_millis(300);
/// The retention of the `short` operation: its completions expire during the run.
pub const SHORT: Duration = Duration::from_millis(500);
/// The dedup window of observed messages.
const WINDOW: Duration = Duration::from_millis(400);
const CLIENTS: usize = 8;
const HOT_KEYS: usize = 3;
/// Clients move to fresh keys every so often, so that completed keys do not end the contest.
const KEY_EPOCH: Duration = Duration::from_millis(1500);

#[derive(Debug, Clone)]
struct Acquired {
    key: Key,
    token: u64,
    attempt: u32,
    started: Instant,
    acked: Instant,
    /// When the store decided (lease_until less the lease) and until when it owns the key.
    decided_at: SystemTime,
    lease_until: SystemTime,
}

#[derive(Debug, Clone)]
struct Done {
    key: Key,
    token: u64,
    started: Instant,
    result: Vec<u8>,
}

/// A replay of a stored result: what it answered and when it was asked.
#[derive(Debug, Clone)]
struct Replay {
    key: Key,
    started: SystemTime,
    expires_at: SystemTime,
    /// The token of the acquisition whose result it is.
    token: Option<u64>,
}

/// An `observe` that answered `New`.
#[derive(Debug, Clone)]
struct Observed {
    key: Key,
    started: Instant,
    acked: Instant,
}

#[derive(Default)]
pub struct History {
    acquired: Vec<Acquired>,
    /// Forced expiries attempted (whatever the answer), by key, with when they started and
    /// were answered.
    expired: Vec<(Key, Instant, Instant)>,
    /// Every replay (`Reservation::Completed`) answered.
    replayed: Vec<Replay>,
    observed: Vec<Observed>,
    batches: usize,
    swept: usize,
    /// Completions acknowledged with `Ok`.
    completed: Vec<Done>,
    /// Releases attempted (whatever the answer: an error may still have landed), by key and
    /// token, with when the attempt started.
    releases: Vec<(Key, u64, Instant)>,
    /// Errors by kind: "lease lost" is expected (work past the lease), "no answer" is a
    /// request without a definite answer within the deadline.
    errors: HashMap<&'static str, usize>,
    replays: usize,
}

impl History {
    fn error(&mut self, error: &idemstore::Error) {
        let kind = match error {
            idemstore::Error::LeaseLost { .. } => "lease lost",
            idemstore::Error::Cluster { .. } | idemstore::Error::Database { .. } => "no answer",
            _ => "other",
        };
        *self.errors.entry(kind).or_default() += 1;
    }
}

/// A small deterministic generator, one per client.
/// A xorshift generator: the clients' choices (and the etcd test's victims).
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The token a result names ("done by <token>").
fn token_of(result: &[u8]) -> Option<u64> {
    std::str::from_utf8(result)
        .ok()?
        .strip_prefix("done by ")?
        .parse()
        .ok()
}

struct Client<S> {
    id: usize,
    store: S,
    history: Arc<Mutex<History>>,
    rng: Rng,
    epoch0: Instant,
}

impl<S: Reservations> Client<S> {
    fn hot_key(&mut self) -> Key {
        let epoch = self.epoch0.elapsed().as_millis() / KEY_EPOCH.as_millis();
        let hot = self.rng.below(HOT_KEYS as u64);
        Key::new("fault", format!("epoch-{epoch}"), format!("hot-{hot}")).unwrap()
    }

    fn replayed(&self, key: &Key, started: SystemTime, done: &idemstore::Completed) {
        let mut history = self.history.lock().unwrap();
        history.replays += 1;
        history.replayed.push(Replay {
            key: key.clone(),
            started,
            expires_at: done.expires_at,
            token: token_of(&done.result),
        });
    }

    /// Records an acquisition, works for a while (sometimes past the lease), then completes,
    /// releases or abandons it.
    async fn work(&mut self, key: Key, lease: idemstore::Lease, started: Instant, acked: Instant) {
        self.history.lock().unwrap().acquired.push(Acquired {
            key: key.clone(),
            token: lease.token(),
            attempt: lease.attempt(),
            started,
            acked,
            decided_at: lease.lease_until() - LEASE,
            lease_until: lease.lease_until(),
        });
        tokio::time::sleep(Duration::from_millis(self.rng.below(400))).await;
        match self.rng.below(10) {
            0..=5 => {
                let result = format!("done by {}", lease.token()).into_bytes();
                let started = Instant::now();
                match self.store.complete(&lease, result.clone()).await {
                    Ok(()) => self.history.lock().unwrap().completed.push(Done {
                        key,
                        token: lease.token(),
                        started,
                        result,
                    }),
                    Err(error) => self.history.lock().unwrap().error(&error),
                }
            }
            6..=7 => {
                self.history
                    .lock()
                    .unwrap()
                    .releases
                    .push((key, lease.token(), Instant::now()));
                if let Err(error) = self.store.release_if_pending(&lease).await {
                    self.history.lock().unwrap().error(&error);
                }
            }
            // Abandoned: the lease runs out and another client takes the key over.
            _ => {}
        }
    }

    async fn reserve(&mut self, key: Key) {
        let fingerprint = Fingerprint::of(b"same request");
        let started = Instant::now();
        let wall = SystemTime::now();
        let answer = self.store.reserve(&key, fingerprint).await;
        let acked = Instant::now();
        match answer {
            Ok(Reservation::Acquired(lease)) => self.work(key, lease, started, acked).await,
            Ok(Reservation::Completed(done)) => {
                self.replayed(&key, wall, &done);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(self.rng.below(30))).await,
            Err(error) => self.history.lock().unwrap().error(&error),
        }
    }

    /// `reserve_many` of every hot key and one fresh key; the acquired ones are worked on.
    async fn reserve_batch(&mut self) {
        let epoch = self.epoch0.elapsed().as_millis() / KEY_EPOCH.as_millis();
        let fresh = format!("fresh-{}-{}", self.id, self.rng.below(u64::MAX));
        let mut keys: Vec<Key> = (0..HOT_KEYS)
            .map(|hot| Key::new("fault", format!("epoch-{epoch}"), format!("hot-{hot}")).unwrap())
            .collect();
        keys.push(Key::new("fault", format!("epoch-{epoch}"), fresh).unwrap());
        let items: Vec<(Key, Fingerprint)> = keys
            .iter()
            .map(|key| (key.clone(), Fingerprint::of(b"same request")))
            .collect();
        let started = Instant::now();
        let wall = SystemTime::now();
        let answers = self.store.reserve_many(&items).await;
        let acked = Instant::now();
        let answers = match answers {
            Ok(answers) => answers,
            Err(error) => return self.history.lock().unwrap().error(&error),
        };
        self.history.lock().unwrap().batches += 1;
        let mut leases = Vec::new();
        for (key, answer) in keys.into_iter().zip(answers) {
            match answer {
                Ok(Reservation::Acquired(lease)) => leases.push((key, lease)),
                Ok(Reservation::Completed(done)) => self.replayed(&key, wall, &done),
                Ok(_) => {}
                Err(error) => self.history.lock().unwrap().error(&error),
            }
        }
        for (key, lease) in leases {
            self.work(key, lease, started, acked).await;
        }
    }

    /// Takes a hot key from whoever holds it, now.
    async fn expire(&mut self) {
        let key = self.hot_key();
        let started = Instant::now();
        match self.store.expire(&key, idemstore::LiveLease::Take).await {
            Ok(_) => self
                .history
                .lock()
                .unwrap()
                .expired
                .push((key, started, Instant::now())),
            // Every error fails the test (a forced expiry is never refused for a live lease).
            Err(error) => self.history.lock().unwrap().error(&error),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    /// One message of a small set, observed in the dedup window.
    async fn observe(&mut self) {
        let key = Key::new("fault", "consume", format!("msg-{}", self.rng.below(4))).unwrap();
        let started = Instant::now();
        match self.store.observe(&key, WINDOW).await {
            Ok(Seen::New) => self.history.lock().unwrap().observed.push(Observed {
                key,
                started,
                acked: Instant::now(),
            }),
            Ok(Seen::Duplicate) => {}
            Err(error) => self.history.lock().unwrap().error(&error),
        }
        tokio::time::sleep(Duration::from_millis(self.rng.below(40))).await;
    }

    async fn run(mut self, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::Relaxed) {
            match self.rng.below(20) {
                0..=1 => self.observe().await,
                2..=3 => {
                    // A key of the short retention: completed, replayed, expired, again.
                    let key = Key::new("fault", "short", format!("s-{}", self.rng.below(3)));
                    self.reserve(key.unwrap()).await;
                }
                4 => self.expire().await,
                5..=6 => self.reserve_batch().await,
                _ => {
                    let key = self.hot_key();
                    self.reserve(key).await;
                }
            }
        }
    }
}

/// Sweeps expired records every 100 ms until stopped.
async fn sweeper<S: Reservations>(store: S, history: Arc<Mutex<History>>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        match store.sweep(50).await {
            Ok(swept) => history.lock().unwrap().swept += swept,
            Err(error) => history.lock().unwrap().error(&error),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs the clients and the sweeper on `store` while `faults` runs on this thread (killing
/// and restarting the backend's servers), then one second more; returns the history and the
/// final state of every key acquired.
pub fn exercise<S>(
    runtime: &tokio::runtime::Runtime,
    store: &S,
    faults: impl FnOnce(),
) -> (History, HashMap<Key, Option<idemstore::Record>>)
where
    S: Reservations + Clone + 'static,
{
    let history = Arc::new(Mutex::new(History::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let epoch0 = Instant::now();
    let mut clients: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let client = Client {
                id,
                store: store.clone(),
                history: history.clone(),
                rng: Rng(0x9E37_79B9_7F4A_7C15 ^ ((id as u64 + 1) * 0x1000_0001)),
                epoch0,
            };
            runtime.spawn(client.run(stop.clone()))
        })
        .collect();
    clients.push(runtime.spawn(sweeper(store.clone(), history.clone(), stop.clone())));
    faults();
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        runtime.block_on(client).expect("client task");
    }
    let history = std::mem::take(&mut *history.lock().unwrap());
    let final_state = runtime.block_on(async {
        let mut keys: Vec<&Key> = history.acquired.iter().map(|a| &a.key).collect();
        keys.sort();
        keys.dedup();
        let mut out = HashMap::new();
        for key in keys {
            out.insert(key.clone(), store.get(key).await.expect("final read"));
        }
        out
    });
    eprintln!(
        "fault test: {} acquisitions ({} batches), {} completions, {} releases, \
         {} forced expiries, {} replays, {} new observations, {} swept, errors {:?}, {} keys",
        history.acquired.len(),
        history.batches,
        history.completed.len(),
        history.releases.len(),
        history.expired.len(),
        history.replays,
        history.observed.len(),
        history.swept,
        history.errors,
        final_state.len()
    );
    (history, final_state)
}

/// How many kill rounds to run: 3, or 20 with `IDEMSTORE_LONG=1`.
pub fn rounds() -> usize {
    let long = std::env::var_os("IDEMSTORE_LONG").is_some_and(|v| v != "0");
    if long {
        20
    } else {
        3
    }
}

fn short(key: &Key) -> bool {
    key.operation() == b"short"
}

/// Checks the whole history against the final state.
pub fn check(history: &History, final_state: &HashMap<Key, Option<idemstore::Record>>) {
    assert!(
        history.acquired.len() >= 20,
        "too little happened to test anything"
    );
    assert_eq!(history.errors.get("other"), None, "unexpected errors");
    assert_eq!(
        history.errors.get("no answer"),
        None,
        "the servers are back within the operation deadline: every operation gets a definite answer"
    );
    assert!(history.completed.len() >= 5, "too few completions");
    assert!(history.batches > 0, "no batch was reserved");
    assert!(!history.expired.is_empty(), "no key was expired");
    assert!(!history.observed.is_empty(), "no message was observed");
    assert!(history.swept > 0, "the sweeper deleted nothing");
    let takeovers = history.acquired.iter().filter(|a| a.attempt > 1).count();
    assert!(takeovers > 0, "no stale lease was taken over");

    // No token was handed out twice, on any key: tokens are store-wide.
    let mut seen = HashSet::new();
    for a in &history.acquired {
        assert!(
            seen.insert(a.token),
            "token {} handed out twice (the second time for key {})",
            a.token,
            a.key
        );
    }

    let mut by_key: HashMap<&Key, Vec<&Acquired>> = HashMap::new();
    for a in &history.acquired {
        by_key.entry(&a.key).or_default().push(a);
    }
    let expired_between = |key: &Key, after: Instant, before: Instant| {
        history
            .expired
            .iter()
            .any(|(k, started, acked)| k == key && *started < before && *acked > after)
    };
    for (key, acquisitions) in &mut by_key {
        acquisitions.sort_by_key(|a| a.token);
        for pair in acquisitions.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            // Never two live owners: b took the key while a's lease was live only if a
            // released it or someone expired the key meanwhile.
            let released = history
                .releases
                .iter()
                .any(|(k, t, at)| k == *key && *t == a.token && *at < b.acked);
            let ms = |d: Result<Duration, _>| d.map_or(0, |d: Duration| d.as_millis());
            let completed = history
                .completed
                .iter()
                .find(|d| &d.key == *key && d.token == a.token)
                .map(|d| d.started.saturating_duration_since(a.acked).as_millis());
            assert!(
                b.decided_at >= a.lease_until || released || expired_between(key, a.started, b.acked),
                "key {key}: token {} acquired while token {} held a live lease and had not released it \
                 (b decided {} ms before a's lease ended, asked {} ms, answered after {} ms, \
                 attempts {} and {}; a answered after {} ms, completed {completed:?} ms after)",
                b.token,
                a.token,
                ms(a.lease_until.duration_since(b.decided_at)),
                b.started.saturating_duration_since(a.acked).as_millis(),
                b.acked.saturating_duration_since(b.started).as_millis(),
                a.attempt,
                b.attempt,
                a.acked.saturating_duration_since(a.started).as_millis(),
            );
        }
        // Every caller learned whether it holds the key: a takeover (attempt n > 1) follows an
        // acquisition of attempt n - 1 that some caller was told about.
        for b in acquisitions.iter().filter(|b| b.attempt > 1) {
            assert!(
                acquisitions
                    .iter()
                    .any(|a| a.attempt == b.attempt - 1 && a.token < b.token),
                "key {key}: token {} took over attempt {} that no caller was told it acquired",
                b.token,
                b.attempt - 1
            );
        }
        // Tokens rose: an acquisition acknowledged before another began has the smaller token.
        for a in acquisitions.iter() {
            for b in acquisitions.iter() {
                if a.acked < b.started {
                    assert!(
                        a.token < b.token,
                        "key {key}: token {} acknowledged before token {} was asked for",
                        a.token,
                        b.token
                    );
                }
            }
        }
        if short(key) {
            // Its completions expire: what is left is checked by the replays below.
            continue;
        }
        // Nothing acknowledged is lost: the key holds the latest acquisition or a later one,
        // unless that one was released or the key expired after it.
        let last = acquisitions.last().unwrap();
        match &final_state[*key] {
            Some(record) => assert!(
                record.token() >= last.token,
                "key {key}: acquisition {} lost (the key holds token {})",
                last.token,
                record.token()
            ),
            None => assert!(
                history
                    .releases
                    .iter()
                    .any(|(k, t, _)| k == *key && *t == last.token)
                    || expired_between(key, last.started, Instant::now()),
                "key {key}: acquisition {} lost, and it was never released or expired",
                last.token
            ),
        }
    }

    for done in &history.completed {
        // Fencing: an old owner's completion never succeeded after a newer owner was told it
        // had the key.
        for a in &by_key[&done.key] {
            assert!(
                !(a.token > done.token && a.acked < done.started),
                "key {}: token {} completed after token {} had taken over",
                done.key,
                done.token,
                a.token
            );
        }
        if short(&done.key) {
            continue;
        }
        // Durability: an acknowledged completion is the key's final state or was superseded
        // by a higher token after a forced expiry (nothing else replaces a completion within
        // the retention).
        let record = final_state[&done.key].as_ref();
        if expired_between(&done.key, done.started, Instant::now()) {
            if let Some(record) = record {
                assert!(
                    record.token() >= done.token,
                    "key {}: completion by {} lost (the key holds token {})",
                    done.key,
                    done.token,
                    record.token()
                );
            }
            continue;
        }
        let record =
            record.unwrap_or_else(|| panic!("key {}: acknowledged completion lost", done.key));
        assert_eq!(
            record.token(),
            done.token,
            "key {}: completion by {} lost",
            done.key,
            done.token
        );
        match record.status() {
            Status::Completed { result, .. } => assert_eq!(result, done.result.as_slice()),
            other => panic!(
                "key {}: completed by {} but holds {other:?}",
                done.key, done.token
            ),
        }
    }

    // An expired or swept key never answers its old result: no replay was answered at or
    // after its result's expiry, and none after a forced expiry of the key answered a result
    // of an acquisition acknowledged before that expiry began.
    assert!(
        history.replayed.iter().any(|r| short(&r.key)),
        "no result of the short retention was replayed"
    );
    for replay in &history.replayed {
        assert!(
            replay.expires_at > replay.started,
            "key {}: a replay asked at {:?} answered a result that expired at {:?}",
            replay.key,
            replay.started,
            replay.expires_at
        );
    }
    for (key, started, acked) in &history.expired {
        let before: Vec<u64> = by_key
            .get(key)
            .map(|a| {
                a.iter()
                    .filter(|a| a.acked < *started)
                    .map(|a| a.token)
                    .collect()
            })
            .unwrap_or_default();
        let Some(newest_before) = before.iter().max() else {
            continue;
        };
        for replay in history.replayed.iter().filter(|r| &r.key == key) {
            let asked = replay.started;
            let after = replay.started.elapsed().ok();
            // Replays asked after the expiry was answered (wall clock against the monotonic
            // one: both measured back from now).
            if after.is_some_and(|ago| ago < acked.elapsed()) {
                assert!(
                    replay.token.is_some_and(|t| t > *newest_before),
                    "key {key}: replayed the result of token {:?} asked at {asked:?}, after a \
                     forced expiry that removed every acquisition up to token {newest_before}",
                    replay.token
                );
            }
        }
    }

    // An observed message is new at most once per window: two `New` answers for one key were
    // decided at least the window apart.
    for (i, a) in history.observed.iter().enumerate() {
        for b in &history.observed[i + 1..] {
            if a.key != b.key {
                continue;
            }
            let furthest = b
                .acked
                .saturating_duration_since(a.started)
                .max(a.acked.saturating_duration_since(b.started));
            assert!(
                furthest >= WINDOW,
                "message {}: observed as new twice within {furthest:?}, inside its {WINDOW:?} window",
                a.key
            );
        }
    }
}
