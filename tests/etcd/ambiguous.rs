//! Ambiguous answers: a TCP proxy between the store and one etcd member forwards a write
//! request, lets the member apply it, then cuts the connection before the answer comes back.
//! The store must learn from the cluster that its write landed, never guess.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemstore::{EtcdStore, Reservation, Status};

use super::cluster::Cluster;
use crate::common::{fp, key, Env, LEASE, RETENTION};

/// Forwards 127.0.0.1:<port> to `target`. When armed, the first request whose bytes contain
/// `pattern` is forwarded and its connection cut 300 ms later, its answer dropped.
struct Proxy {
    port: u16,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
}

impl Proxy {
    fn start(target: String, pattern: &'static [u8]) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicUsize::new(0));
        let (armed2, cuts2) = (armed.clone(), cuts.clone());
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
                std::thread::spawn(move || {
                    let mut buf = vec![0; 64 * 1024];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 || to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        let matched = buf[..n].windows(pattern.len()).any(|w| w == pattern);
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
        Proxy { port, armed, cuts }
    }

    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }
}

#[test]
fn a_write_whose_answer_was_lost_is_recognized_as_landed() {
    let cluster = Cluster::start();
    // Only writes touch the lease index, so the reads before them pass.
    let proxy = Proxy::start(cluster.endpoints()[0].clone(), b"ambig/l/");
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
