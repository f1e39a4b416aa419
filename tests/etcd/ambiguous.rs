//! Ambiguous answers: a TCP proxy between the store and one etcd member forwards a write
//! request, lets the member apply it, then cuts the connection before the answer comes back.
//! The store must learn from the cluster that its write landed, never guess. The proxy can
//! also hold a write (and everything sent after it) for as long as a test wants, so that it
//! lands late, after other writes of the same key.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemstore::{EtcdStore, Reservation, Status};

use super::cluster::Cluster;
use crate::common::{fp, key, Env, LEASE, RETENTION};

/// Forwards 127.0.0.1:<port> to `target`. When armed, the first request whose bytes contain
/// `pattern` is forwarded and its connection cut 300 ms later, its answer dropped. When
/// armed to hold, the first such request and every byte sent to the member after it, on any
/// connection, wait until [`Proxy::let_go`].
struct Proxy {
    port: u16,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
    hold_armed: Arc<AtomicBool>,
    holding: Arc<AtomicBool>,
}

impl Proxy {
    fn start(target: String, pattern: &'static [u8]) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicUsize::new(0));
        let hold_armed = Arc::new(AtomicBool::new(false));
        let holding = Arc::new(AtomicBool::new(false));
        let (armed2, cuts2) = (armed.clone(), cuts.clone());
        let (hold_armed2, holding2) = (hold_armed.clone(), holding.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                let doomed = Arc::new(AtomicBool::new(false));
                let streams = Arc::new(Mutex::new((
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                )));
                // Client to server: forward; a matching request while armed dooms the connection.
                let (mut from, mut to) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (armed, cuts, doomed_in, streams_in) = (
                    armed2.clone(),
                    cuts2.clone(),
                    doomed.clone(),
                    streams.clone(),
                );
                let (hold_armed, holding) = (hold_armed2.clone(), holding2.clone());
                std::thread::spawn(move || {
                    let mut buf = vec![0; 64 * 1024];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        let matched = buf[..n].windows(pattern.len()).any(|w| w == pattern);
                        if matched && hold_armed.swap(false, Ordering::SeqCst) {
                            holding.store(true, Ordering::SeqCst);
                        }
                        while holding.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        if matched && armed.swap(false, Ordering::SeqCst) {
                            doomed_in.store(true, Ordering::SeqCst);
                            cuts.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(300));
                            let streams = streams_in.lock().unwrap();
                            let _ = streams.0.shutdown(Shutdown::Both);
                            let _ = streams.1.shutdown(Shutdown::Both);
                            break;
                        }
                    }
                });
                // Server to client: forward unless the connection is doomed.
                let (mut from, mut to) = (server, client);
                std::thread::spawn(move || {
                    let mut buf = vec![0; 64 * 1024];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0
                            || doomed.load(Ordering::SeqCst)
                            || to.write_all(&buf[..n]).is_err()
                        {
                            break;
                        }
                    }
                });
            }
        });
        Proxy {
            port,
            armed,
            cuts,
            hold_armed,
            holding,
        }
    }

    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    fn arm_hold(&self) {
        self.hold_armed.store(true, Ordering::SeqCst);
    }

    fn holding(&self) -> bool {
        self.holding.load(Ordering::SeqCst)
    }

    fn let_go(&self) {
        self.holding.store(false, Ordering::SeqCst);
    }
}

#[test]
fn a_write_whose_answer_was_lost_is_recognized_as_landed() {
    let cluster = Cluster::start();
    // Every operation below goes out as its write at once (no read first: a new key is
    // guessed absent, a holder starts from what it wrote), so the first request that names
    // the record is the write.
    let proxy = Proxy::start(cluster.endpoints()[0].clone(), b"ambig/r/");
    let env = Env::new();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = EtcdStore::builder()
            .prefix("ambig/")
            .lease(LEASE)
            .retention(RETENTION)
            .clock(env.clock.clone())
            .connect(&[format!("127.0.0.1:{}", proxy.port)])
            .await
            .unwrap();
        let k = key("user-1", "POST /charges", "lost-answer");

        // The reservation lands, its answer is lost: the caller still learns it holds the key.
        proxy.arm();
        let lease = match store.reserve(&k, fp("body")).await.unwrap() {
            Reservation::Acquired(lease) => lease,
            other => panic!("the reservation landed but the caller was told {other:?}"),
        };
        assert_eq!(
            proxy.cuts.load(Ordering::SeqCst),
            1,
            "the answer was cut off"
        );
        assert!(store.resends() >= 1);
        let record = store.get(&k).await.unwrap().unwrap();
        assert_eq!(
            record.token(),
            lease.token(),
            "the caller got the stored token"
        );
        assert_eq!(lease.attempt(), 1);

        // The release lands, its answer is lost: the caller learns it released the key.
        proxy.arm();
        assert!(
            store.release_if_pending(&lease).await.unwrap(),
            "the release landed"
        );
        assert_eq!(proxy.cuts.load(Ordering::SeqCst), 2);
        assert_eq!(store.get(&k).await.unwrap(), None);

        // The completion of a new reservation: landed once, stored once.
        let lease = match store.reserve(&k, fp("body")).await.unwrap() {
            Reservation::Acquired(lease) => lease,
            other => panic!("expected to acquire, got {other:?}"),
        };
        proxy.arm();
        store.complete(&lease, b"done".to_vec()).await.unwrap();
        assert_eq!(proxy.cuts.load(Ordering::SeqCst), 3);
        let record = store.get(&k).await.unwrap().unwrap();
        assert!(matches!(
            record.status(),
            Status::Completed {
                result: b"done",
                ..
            }
        ));
    });
}

/// The interleaving behind the fault test's one double-owner report: a reserve whose write
/// is delayed (resent after timeouts) lands after another caller acquired the key, completed
/// it, and the result expired and was swept. The late write is the only owner when it lands,
/// but it was decided, and its lease counted, from when it was first sent: the caller would
/// be told a lease that ran out before the key was even its own (and the checker saw two
/// overlapping leases). Such a caller gets a lease counted from after its write landed:
/// extended when the landed record still holds the key, acquired again when the landed record
/// had already expired (it reads as absent).
#[test]
fn an_acquisition_that_lands_late_gets_a_lease_from_when_it_landed() {
    let cluster = Cluster::start();
    let proxy = Proxy::start(cluster.endpoints()[0].clone(), b"late/r/");
    let env = Env::new();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let connect = |endpoints: Vec<String>| {
            let clock = env.clock.clone();
            async move {
                EtcdStore::builder()
                    .prefix("late/")
                    .lease(LEASE)
                    .retention(RETENTION)
                    .clock(clock)
                    .request_timeout(Duration::from_millis(300))
                    .op_deadline(Duration::from_secs(30))
                    .connect(&endpoints)
                    .await
                    .unwrap()
            }
        };
        let late = connect(vec![format!("127.0.0.1:{}", proxy.port)]).await;
        let other = connect(cluster.endpoints()).await;
        // Half a lease later the late record still holds the key (its lease ran out); a
        // whole lease later it had expired when it landed.
        for (id, delay) in [("ran-out", LEASE / 2), ("expired", LEASE)] {
            let k = key("user-1", "POST /charges", id);
            // The late caller's reserve is held at the proxy (and resent after each timeout).
            proxy.arm_hold();
            let held = tokio::spawn({
                let (late, k) = (late.clone(), k.clone());
                async move { late.reserve(&k, fp("body")).await }
            });
            while !proxy.holding() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // Meanwhile another caller acquires the key, completes it, and the result expires
            // and is swept: the key is absent again.
            let first = match other.reserve(&k, fp("body")).await.unwrap() {
                Reservation::Acquired(lease) => lease,
                other => panic!("expected to acquire, got {other:?}"),
            };
            other.complete(&first, b"first".to_vec()).await.unwrap();
            env.advance(RETENTION + delay);
            assert_eq!(
                other.sweep(10).await.unwrap(),
                1,
                "the expired result is swept"
            );
            let resends = late.resends();
            tokio::time::sleep(Duration::from_millis(700)).await;
            assert!(
                late.resends() > resends,
                "{id}: the held reserve was resent"
            );

            // The held write lands now, on the absent key.
            proxy.let_go();
            let lease = match held.await.unwrap().unwrap() {
                Reservation::Acquired(lease) => lease,
                other => {
                    panic!("{id}: the held reserve landed on an absent key but was told {other:?}")
                }
            };
            assert!(
                lease.token() > first.token(),
                "{id}: a later write, a larger token"
            );
            assert!(
                lease.lease_until() >= env.now() + LEASE,
                "{id}: the late acquisition was told a lease until {:?}, counted from when it \
                 was first sent ({:?} before the first owner's lease ended at {:?}), not from \
                 when it landed ({:?})",
                lease.lease_until(),
                first
                    .lease_until()
                    .duration_since(lease.lease_until() - LEASE)
                    .unwrap_or_default(),
                first.lease_until(),
                env.now()
            );
            let record = other.get(&k).await.unwrap();
            assert_eq!(
                record.map(|r| r.token()),
                Some(lease.token()),
                "{id}: the stored owner is the late caller"
            );
            // Released, so that the next round's sweep finds only its own key.
            assert!(
                late.release_if_pending(&lease).await.unwrap(),
                "{id}: still its own"
            );
        }
    });
}
