//! The fault test: concurrent clients reserve, complete, release and take over stale leases on
//! a few hot keys while the leader, then a random member, is killed with SIGKILL and restarted,
//! three rounds, one member down at a time. The history of what each client was told is then
//! checked against the cluster's final state.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use idemstore::{EtcdStore, Fingerprint, Key, Reservation, Status};

use super::cluster::Cluster;

const LEASE: Duration = Duration::from_millis(300);
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

#[derive(Default)]
struct History {
    acquired: Vec<Acquired>,
    /// Completions acknowledged with `Ok`.
    completed: Vec<Done>,
    /// Releases attempted (whatever the answer: an error may still have landed), by key and
    /// token, with when the attempt started.
    releases: Vec<(Key, u64, Instant)>,
    /// Errors by kind: "lease lost" is expected (work past the lease), "cluster" is a
    /// request without a definite answer within the deadline.
    errors: HashMap<&'static str, usize>,
    replays: usize,
}

impl History {
    fn error(&mut self, error: &idemstore::Error) {
        let kind = match error {
            idemstore::Error::LeaseLost { .. } => "lease lost",
            idemstore::Error::Cluster { .. } => "cluster",
            _ => "other",
        };
        *self.errors.entry(kind).or_default() += 1;
    }
}

/// A small deterministic generator, one per client.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

async fn client(
    id: usize,
    store: EtcdStore,
    history: Arc<Mutex<History>>,
    stop: Arc<AtomicBool>,
    epoch0: Instant,
) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((id as u64 + 1) * 0x1000_0001));
    let fingerprint = Fingerprint::of(b"same request");
    while !stop.load(Ordering::Relaxed) {
        let epoch = epoch0.elapsed().as_millis() / KEY_EPOCH.as_millis();
        let key = Key::new(
            "fault",
            format!("epoch-{epoch}"),
            format!("hot-{}", rng.below(HOT_KEYS as u64)),
        )
        .unwrap();
        let started = Instant::now();
        let answer = store.reserve(&key, fingerprint).await;
        let acked = Instant::now();
        let lease = match answer {
            Ok(Reservation::Acquired(lease)) => lease,
            Ok(Reservation::Completed(_)) => {
                history.lock().unwrap().replays += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Ok(_) => {
                tokio::time::sleep(Duration::from_millis(rng.below(30))).await;
                continue;
            }
            Err(error) => {
                history.lock().unwrap().error(&error);
                continue;
            }
        };
        history.lock().unwrap().acquired.push(Acquired {
            key: key.clone(),
            token: lease.token(),
            attempt: lease.attempt(),
            started,
            acked,
            decided_at: lease.lease_until() - LEASE,
            lease_until: lease.lease_until(),
        });
        // Work for a while, sometimes past the lease so that the key is taken over.
        tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
        match rng.below(10) {
            0..=5 => {
                let result = format!("done by {}", lease.token()).into_bytes();
                let started = Instant::now();
                match store.complete(&lease, result.clone()).await {
                    Ok(()) => history.lock().unwrap().completed.push(Done {
                        key,
                        token: lease.token(),
                        started,
                        result,
                    }),
                    Err(error) => history.lock().unwrap().error(&error),
                }
            }
            6..=7 => {
                history
                    .lock()
                    .unwrap()
                    .releases
                    .push((key, lease.token(), Instant::now()));
                if let Err(error) = store.release_if_pending(&lease).await {
                    history.lock().unwrap().error(&error);
                }
            }
            // Abandoned: the lease runs out and another client takes the key over.
            _ => {}
        }
    }
}

#[test]
fn acknowledged_work_survives_killed_members_and_fencing_holds() {
    let mut cluster = Cluster::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let connect = |cluster: &Cluster| {
        runtime
            .block_on(
                EtcdStore::builder()
                    .prefix("fault/")
                    .lease(LEASE)
                    .retention(Duration::from_secs(3600))
                    .request_timeout(Duration::from_millis(700))
                    .op_deadline(Duration::from_secs(20))
                    .connect(&cluster.endpoints()),
            )
            .expect("connect to the test cluster")
    };
    let store = connect(&cluster);
    let history = Arc::new(Mutex::new(History::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let epoch0 = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| {
            runtime.spawn(client(
                id,
                store.clone(),
                history.clone(),
                stop.clone(),
                epoch0,
            ))
        })
        .collect();

    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    for round in 0..3 {
        std::thread::sleep(Duration::from_millis(800));
        let leader = cluster.leader().expect("a leader before the kill");
        let random = rng.below(3) as usize;
        for victim in [leader, random] {
            eprintln!("round {round}: SIGKILL member {victim}");
            cluster.kill(victim);
            std::thread::sleep(Duration::from_millis(1200));
            cluster.restart(victim);
            std::thread::sleep(Duration::from_millis(600));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        runtime.block_on(client).expect("client task");
    }

    let history = history.lock().unwrap();
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
        "fault test: {} acquisitions, {} completions, {} releases, {} replays, errors {:?}, {} keys",
        history.acquired.len(),
        history.completed.len(),
        history.releases.len(),
        history.replays,
        history.errors,
        final_state.len()
    );
    eprintln!(
        "fault test: {} requests resent after no definite answer",
        store.resends()
    );
    check(&history, &final_state);
}

fn check(history: &History, final_state: &HashMap<Key, Option<idemstore::Record>>) {
    assert!(
        history.acquired.len() >= 20,
        "too little happened to test anything"
    );
    assert_eq!(history.errors.get("other"), None, "unexpected errors");
    assert_eq!(
        history.errors.get("cluster"),
        None,
        "with one member down at a time every operation gets a definite answer"
    );
    assert!(history.completed.len() >= 5, "too few completions");
    let takeovers = history
        .acquired
        .iter()
        .filter(|a| {
            final_state[&a.key]
                .as_ref()
                .is_some_and(|r| r.attempt() > 1)
        })
        .count();
    assert!(takeovers > 0, "no stale lease was taken over");

    // No (key, token) was acquired twice.
    let mut seen = HashSet::new();
    for a in &history.acquired {
        assert!(
            seen.insert((a.key.clone(), a.token)),
            "({}, {}) acquired twice",
            a.key,
            a.token
        );
    }

    let mut by_key: HashMap<&Key, Vec<&Acquired>> = HashMap::new();
    for a in &history.acquired {
        by_key.entry(&a.key).or_default().push(a);
    }
    for (key, acquisitions) in &mut by_key {
        acquisitions.sort_by_key(|a| a.token);
        for pair in acquisitions.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            // No two live owners: b took the key while a's lease was live only if a released it.
            let released = history
                .releases
                .iter()
                .any(|(k, t, at)| k == *key && *t == a.token && *at < b.acked);
            assert!(
                b.decided_at >= a.lease_until || released,
                "key {key}: token {} acquired while token {} held a live lease and had not released it",
                b.token,
                a.token
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
        // Nothing acknowledged is lost: the key holds the latest acquisition or a later one,
        // unless that one was released.
        let last = acquisitions.last().unwrap();
        match &final_state[*key] {
            Some(record) => assert!(
                record.token() >= last.token,
                "key {key}: acquisition {} lost",
                last.token
            ),
            None => assert!(
                history
                    .releases
                    .iter()
                    .any(|(k, t, _)| k == *key && *t == last.token),
                "key {key}: acquisition {} lost, and it was never released",
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
        // Durability: an acknowledged completion is the key's final state (nothing replaces a
        // completion within the retention).
        let record = final_state[&done.key]
            .as_ref()
            .unwrap_or_else(|| panic!("key {}: acknowledged completion lost", done.key));
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
}
