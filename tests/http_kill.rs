//! A real `SIGKILL` at the HTTP level: a child process (this test binary, re-run with an
//! environment variable) serves an axum service behind `IdempotencyLayer` on a real store
//! file; several client threads send requests with distinct keys; the parent kills the child
//! with `SIGKILL` in the middle of them, restarts it on the same store, and checks:
//!
//! - every acknowledged response (a whole response read before the kill) replays byte for
//!   byte: status, `Location` and body, with `Idempotent-Replayed: true`;
//! - every request cut by the kill (no whole response) succeeds on its first retry after the
//!   restart: a 201, never a 409. Its key was left pending by the dead process, and a lease ends
//!   with its process, so the retry takes it over (or replays the response, when the handler
//!   had finished before the kill).
//!
//! The handler's body names the process and a counter, so a handler run twice cannot pass as a
//! replay. 5 rounds by default (about 2 s); `IDEMSTORE_LONG=1` runs 50. The counts are
//! printed (`cargo test --test integration http_kill -- --nocapture`); `IDEMSTORE_KILL_SEED`
//! repeats a run's kill moments.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, request::Parts, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use idemstore::http::IdempotencyLayer;
use idemstore::Store;

/// Set in the child: the store path.
const CHILD_ENV: &str = "IDEMSTORE_HTTP_KILL_CHILD";
const CLIENTS: usize = 8;

fn rounds() -> usize {
    if std::env::var_os("IDEMSTORE_LONG").is_some_and(|v| v != "0") {
        50
    } else {
        5
    }
}

/// The child's side: does nothing unless started by [`Server::start`].
#[test]
fn child() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(serve(Path::new(&path)));
}

/// This process's orders so far: the counter in every body.
struct Shop {
    orders: AtomicU64,
}

/// `POST /orders`: works 0 to 40 ms, then 201 with `Location` and a body naming this process,
/// the order number and the request.
async fn create(
    State(shop): State<Arc<Shop>>,
    headers: HeaderMap,
    item: Bytes,
) -> impl IntoResponse {
    let n = shop.orders.fetch_add(1, Ordering::SeqCst) + 1;
    let key = headers
        .get("idempotency-key")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    tokio::time::sleep(Duration::from_millis(u64::from(item.len() as u32 * 7 % 41))).await;
    let body = format!(
        "order {n} of process {} for key {key}: {}",
        std::process::id(),
        String::from_utf8_lossy(&item)
    );
    (
        StatusCode::CREATED,
        [(
            header::LOCATION,
            format!("/orders/{}/{n}", std::process::id()),
        )],
        body,
    )
}

fn caller(request: &Parts) -> Option<Vec<u8>> {
    let value = request.headers.get(header::AUTHORIZATION)?.as_bytes();
    Some(value.strip_prefix(b"Bearer ")?.to_vec())
}

async fn serve(path: &Path) {
    // Every default but the preallocated log: zero-filling and syncing 33 MiB at each of the
    // test's opens made a round take seconds on a busy machine.
    let store = Arc::new(
        Store::builder()
            .preallocate_log(false)
            .open(path)
            .expect("the child opens the store"),
    );
    let app = Router::new()
        .route("/orders", post(create))
        .layer(IdempotencyLayer::new(store).scope(caller))
        .with_state(Arc::new(Shop {
            orders: AtomicU64::new(0),
        }));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "LISTENING {addr}").expect("stdout");
        out.flush().expect("flush");
    }
    axum::serve(listener, app).await.expect("serve");
}

/// The child serving on a port of 127.0.0.1.
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start(path: &Path) -> Server {
        let mut child = Command::new(std::env::current_exe().expect("test binary path"))
            .args([
                "--exact",
                "http_kill::child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, path)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the child");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let addr = loop {
            let line = lines
                .next()
                .expect("the child exited before it listened")
                .expect("the child's stdout");
            // The test harness may have printed `test http_kill::child ... ` before it.
            if let Some((_, addr)) = line.split_once("LISTENING ") {
                break addr.trim().parse().expect("an address");
            }
        };
        // Keep draining its stdout, so it never blocks on a full pipe.
        thread::spawn(move || lines.for_each(drop));
        Server { child, addr }
    }

    fn kill(mut self) {
        self.child.kill().expect("SIGKILL the child");
        self.child.wait().expect("reap the child");
    }
}

/// A failing test must not leave its server running.
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A whole response: status, `Location`, whether it was replayed, and the body's bytes.
#[derive(Debug, Clone, PartialEq)]
struct Answer {
    status: u16,
    location: Option<String>,
    replayed: bool,
    body: Vec<u8>,
}

/// Why a request got no whole response.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cut {
    /// The connection was refused: the server was already gone.
    Refused,
    /// The request was sent (or being sent) when the connection broke.
    Midway,
}

/// `POST /orders` for `user` with `key` and `item`, on a new connection.
fn post_order(addr: SocketAddr, user: &str, key: &str, item: &str) -> Result<Answer, Cut> {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5));
    let mut stream = stream.map_err(|_| Cut::Refused)?;
    exchange(&mut stream, addr, user, key, item).ok_or(Cut::Midway)
}

fn exchange(
    stream: &mut TcpStream,
    addr: SocketAddr,
    user: &str,
    key: &str,
    item: &str,
) -> Option<Answer> {
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .ok()?;
    let request = format!(
        "POST /orders HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {user}\r\n\
         idempotency-key: \"{key}\"\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{item}",
        item.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    parse(&raw)
}

/// Parses a whole HTTP/1.1 response with a `content-length`; `None` if it is cut short.
fn parse(raw: &[u8]) -> Option<Answer> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let len: usize = headers.get("content-length")?.parse().ok()?;
    let body = raw.get(end + 4..)?;
    (body.len() == len).then(|| Answer {
        status,
        location: headers.get("location").cloned(),
        replayed: headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true"),
        body: body.to_vec(),
    })
}

/// A tiny deterministic generator for kill moments.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// What the clients of one round saw, per (user, key, item).
#[derive(Default)]
struct Seen {
    acknowledged: Vec<((String, String, String), Answer)>,
    cut: Vec<((String, String, String), Cut)>,
}

/// Asserts that each acknowledged response replays byte for byte: status, `Location`, body.
fn replay_all(addr: SocketAddr, acknowledged: &[((String, String, String), Answer)], round: usize) {
    for ((user, key, item), answer) in acknowledged {
        let again = post_order(addr, user, key, item)
            .unwrap_or_else(|e| panic!("round {round}: no answer to the replay of {key}: {e:?}"));
        assert!(
            again.replayed,
            "round {round}: {key} was not replayed: {again:?}"
        );
        assert_eq!(
            (again.status, &again.location, &again.body),
            (answer.status, &answer.location, &answer.body),
            "round {round}: {user} {key} replayed differently"
        );
    }
}

#[test]
fn after_a_kill_acknowledged_responses_replay_and_cut_requests_succeed_on_first_retry() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("http.idem");
    let seed = std::env::var("IDEMSTORE_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("after 1970")
                .as_nanos() as u64
        });
    eprintln!("http kill test seed: IDEMSTORE_KILL_SEED={seed}");
    let mut rng = Rng(seed | 1);
    let mut acknowledged: Vec<((String, String, String), Answer)> = Vec::new();
    let (mut midway, mut refused) = (0usize, 0usize);
    let (mut retried_ok, mut retried_replayed) = (0usize, 0usize);
    let mut server = Server::start(&path);
    for round in 0..rounds() {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let addr = server.addr;
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (seen, stop) = (Arc::clone(&seen), Arc::clone(&stop));
                thread::spawn(move || {
                    let user = format!("user-{c}");
                    for i in 0u64.. {
                        if stop.load(Ordering::Acquire) {
                            return;
                        }
                        let key = format!("r{round}-c{c}-{i}");
                        let item = "x".repeat(1 + (i as usize * 3 + c) % 11);
                        let request = (user.clone(), key.clone(), item.clone());
                        match post_order(addr, &user, &key, &item) {
                            Ok(answer) => seen.lock().unwrap().acknowledged.push((request, answer)),
                            Err(cut) => {
                                seen.lock().unwrap().cut.push((request, cut));
                                return; // the server is gone
                            }
                        }
                    }
                })
            })
            .collect();
        // Kill while requests are in flight: after some have been answered.
        let deadline = Instant::now() + Duration::from_secs(20);
        while seen.lock().unwrap().acknowledged.len() < CLIENTS {
            assert!(
                Instant::now() < deadline,
                "round {round}: nothing was answered"
            );
            thread::sleep(Duration::from_millis(2));
        }
        thread::sleep(Duration::from_millis(rng.below(300)));
        server.kill();
        stop.store(true, Ordering::Release);
        for client in clients {
            client.join().expect("client thread");
        }
        server = Server::start(&path);
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        for ((user, key, _), answer) in &seen.acknowledged {
            assert_eq!(
                answer.status, 201,
                "round {round}: {user} {key} before the kill: {answer:?}"
            );
            assert!(!answer.replayed, "round {round}: a fresh key was replayed");
        }
        let checked_before = acknowledged.len();
        acknowledged.extend(seen.acknowledged);
        // Every request cut by the kill succeeds on its first retry.
        for ((user, key, item), _) in &seen.cut {
            let answer = post_order(server.addr, user, key, item).unwrap_or_else(|e| {
                panic!("round {round}: no answer to the retry of {key}: {e:?}")
            });
            assert_eq!(
                answer.status,
                201,
                "round {round}: the first retry of {user} {key}, cut by the kill, got {} {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            );
            retried_ok += 1;
            retried_replayed += usize::from(answer.replayed);
            acknowledged.push(((user.clone(), key.clone(), item.clone()), answer));
        }
        midway += seen.cut.iter().filter(|(_, c)| *c == Cut::Midway).count();
        refused += seen.cut.iter().filter(|(_, c)| *c == Cut::Refused).count();
        // Every response acknowledged in this round replays byte for byte after the kill.
        replay_all(server.addr, &acknowledged[checked_before..], round);
    }
    // And every one of every round, after all the later kills.
    replay_all(server.addr, &acknowledged, rounds());
    server.kill();
    eprintln!(
        "http kill test: {} kills, {} responses acknowledged and replayed byte for byte after every later kill; {midway} requests cut midway by a kill and {refused} refused (server gone), all {retried_ok} succeeded on their first retry ({retried_replayed} of them replayed: the handler had finished before the kill)",
        rounds(),
        acknowledged.len() - retried_ok,
    );
    assert!(
        midway >= rounds(),
        "only {midway} requests were cut midway by {} kills: their retries went unchecked",
        rounds()
    );
}
