//! The HTTP layer's options for production services, over real HTTP on 127.0.0.1: a duplicate
//! waiting for the first request (`wait_for_first`), responses streamed instead of stored
//! (`max_stored_response`, with the memory of a 200 MB stream measured in a child process),
//! the replay and fingerprint hooks, and the counters reaching the `metrics` facade.
//!
//! `cargo test --test integration http_knobs:: -- --nocapture` prints the figures.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode as AxumStatus};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body::Frame;
use idemstore::http::IdempotencyLayer;
use idemstore::{Builder, Fingerprint, Store};
use reqwest::StatusCode;

/// Set in the child that serves the streamed response: the store's directory.
const CHILD_ENV: &str = "IDEMSTORE_HTTP_STREAM_CHILD";
/// The streamed response of the memory test: 200 MB.
const STREAM_BYTES: usize = 200 * 1000 * 1000;
/// Its chunks.
const CHUNK: usize = 64 * 1024;

/// The handlers count their runs per idempotency key.
#[derive(Default)]
struct Shop {
    runs: Mutex<HashMap<String, usize>>,
    orders: AtomicUsize,
    /// How long `POST /orders` and the first run of `POST /flaky` work.
    work: Duration,
}

impl Shop {
    fn count(&self, headers: &HeaderMap) -> usize {
        let key = headers
            .get("idempotency-key")
            .map_or("-".into(), |v| v.to_str().expect("ASCII").to_owned());
        let mut runs = self.runs.lock().expect("not poisoned");
        let n = runs.entry(key).or_default();
        *n += 1;
        *n
    }

    fn runs(&self, key: &str) -> usize {
        let runs = self.runs.lock().expect("not poisoned");
        runs.get(key).copied().unwrap_or(0)
    }
}

/// `POST /orders`: 201 with a JSON body, after `work`.
async fn order(State(shop): State<Arc<Shop>>, headers: HeaderMap) -> Response {
    shop.count(&headers);
    tokio::time::sleep(shop.work).await;
    let n = shop.orders.fetch_add(1, Ordering::SeqCst) + 1;
    let mut response = (AxumStatus::CREATED, format!(r#"{{"order":{n}}}"#)).into_response();
    let json = HeaderValue::from_static("application/json");
    response.headers_mut().insert("content-type", json);
    response
}

/// `POST /flaky`: the first run of a key works, then fails with 500; later runs give 201.
async fn flaky(State(shop): State<Arc<Shop>>, headers: HeaderMap) -> Response {
    let run = shop.count(&headers);
    if run == 1 {
        tokio::time::sleep(shop.work).await;
        return (AxumStatus::INTERNAL_SERVER_ERROR, "failed").into_response();
    }
    (AxumStatus::CREATED, format!("done on run {run}")).into_response()
}

/// A body of `left` zero bytes in 64 KiB frames, made as it is read, of unknown length (as a
/// stream of server-sent events or a large export is).
struct Generated {
    left: usize,
}

impl http_body::Body for Generated {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        static ZEROS: [u8; CHUNK] = [0; CHUNK];
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = self.left.min(CHUNK);
        self.left -= n;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&ZEROS[..n])))))
    }
}

/// The `N` of a route's `?bytes=N`.
fn bytes_asked(uri: &axum::http::Uri) -> Option<usize> {
    let n = uri.query()?.strip_prefix("bytes=")?;
    Some(n.parse().expect("a number"))
}

/// `POST /download?bytes=N`: 200 streaming N bytes (default 200 MB).
async fn download(
    State(shop): State<Arc<Shop>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    shop.count(&headers);
    let bytes = bytes_asked(&uri).unwrap_or(STREAM_BYTES);
    (AxumStatus::OK, Body::new(Generated { left: bytes })).into_response()
}

/// `POST /stream-fails`: 503 with a streamed body on the first run, 201 later.
async fn stream_fails(State(shop): State<Arc<Shop>>, headers: HeaderMap) -> Response {
    let run = shop.count(&headers);
    if run == 1 {
        let body = Body::new(Generated { left: 3 * CHUNK });
        return (AxumStatus::SERVICE_UNAVAILABLE, body).into_response();
    }
    (AxumStatus::CREATED, format!("done on run {run}")).into_response()
}

/// `POST /big`: 200 with a 4 KiB body of known length.
async fn big(State(shop): State<Arc<Shop>>, headers: HeaderMap) -> Response {
    shop.count(&headers);
    (AxumStatus::OK, vec![b'x'; 4096]).into_response()
}

/// `POST /sized?bytes=N`: 200, `application/octet-stream`, N bytes of known length.
async fn sized(
    State(shop): State<Arc<Shop>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    shop.count(&headers);
    let bytes = bytes_asked(&uri).expect("?bytes=N");
    let mut response = (AxumStatus::OK, vec![b'x'; bytes]).into_response();
    let octets = HeaderValue::from_static("application/octet-stream");
    response.headers_mut().insert("content-type", octets);
    response
}

/// `GET /memory`: this process's peak and current resident memory, `VmHWM VmRSS` in KiB.
async fn memory() -> String {
    let (hwm, rss) = resident_kib();
    format!("{hwm} {rss}")
}

fn resident_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/self/status"))
    };
    (field("VmHWM:"), field("VmRSS:"))
}

fn router(shop: Arc<Shop>, layer: IdempotencyLayer<Store>) -> Router {
    Router::new()
        .route("/orders", post(order))
        .route("/flaky", post(flaky))
        .route("/download", post(download))
        .route("/stream-fails", post(stream_fails))
        .route("/big", post(big))
        .route("/sized", post(sized))
        .route("/memory", get(memory))
        .layer(layer)
        .with_state(shop)
}

/// A running service with its own store, on this process's runtime.
struct Service {
    _dir: tempfile::TempDir,
    addr: std::net::SocketAddr,
    shop: Arc<Shop>,
    client: reqwest::Client,
}

#[derive(Debug, Clone)]
struct Reply {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().expect("ASCII"))
    }

    fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl Service {
    async fn start(
        work: Duration,
        configure: impl FnOnce(IdempotencyLayer<Store>) -> IdempotencyLayer<Store>,
    ) -> Service {
        Service::start_with(Builder::DEFAULT_MAX_RESULT_LEN, work, configure).await
    }

    /// [`start`](Self::start) over a store whose results are limited to `max_result_len`.
    async fn start_with(
        max_result_len: usize,
        work: Duration,
        configure: impl FnOnce(IdempotencyLayer<Store>) -> IdempotencyLayer<Store>,
    ) -> Service {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = Store::builder()
            .lease(Duration::from_secs(3600))
            .max_result_len(max_result_len)
            .open(dir.path().join("knobs.idem"))
            .expect("open store");
        let layer = configure(IdempotencyLayer::new(Arc::new(store)));
        let shop = Arc::new(Shop {
            work,
            ..Shop::default()
        });
        let app = router(Arc::clone(&shop), layer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("bound address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Service {
            _dir: dir,
            addr,
            shop,
            client: reqwest::Client::new(),
        }
    }

    async fn post(&self, route: &str, key: &str, body: &str) -> Reply {
        self.post_with(route, key, body, &[]).await
    }

    async fn post_with(
        &self,
        route: &str,
        key: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut request = self
            .client
            .post(format!("http://{}{route}", self.addr))
            .header("idempotency-key", key)
            .body(body.to_string());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.expect("answered");
        Reply {
            status: response.status(),
            headers: response.headers().clone(),
            body: response.bytes().await.expect("body").to_vec(),
        }
    }

    /// Waits until the handler of `key` has started.
    async fn running(&self, key: &str) {
        let started = Instant::now();
        while self.shop.runs(key) == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{key} never ran"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_waits_for_the_first_and_replays_its_response() {
    let work = Duration::from_millis(400);
    let layer = |layer: IdempotencyLayer<Store>| layer.wait_for_first(Duration::from_secs(5));
    let service = Arc::new(Service::start(work, layer).await);
    let first = tokio::spawn({
        let service = Arc::clone(&service);
        async move { service.post("/orders", "w-1", "book").await }
    });
    service.running("w-1").await;
    let started = Instant::now();
    let duplicates: Vec<_> = (0..20)
        .map(|_| {
            let service = Arc::clone(&service);
            tokio::spawn(async move { service.post("/orders", "w-1", "book").await })
        })
        .collect();
    let original = first.await.expect("task");
    assert_eq!(original.status, StatusCode::CREATED, "{}", original.text());
    assert!(!original.replayed());
    for duplicate in duplicates {
        let reply = duplicate.await.expect("task");
        assert_eq!(
            (reply.status, reply.replayed()),
            (StatusCode::CREATED, true),
            "a duplicate was not answered with the replay: {}",
            reply.text()
        );
        assert_eq!(reply.body, original.body);
        assert_eq!(reply.header("content-type"), Some("application/json"));
    }
    let waited = started.elapsed();
    assert_eq!(service.shop.runs("w-1"), 1, "the handler ran once");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    println!(
        "wait_for_first: 20 duplicates of a 400 ms request all replayed its 201 after {:.0} ms",
        waited.as_secs_f64() * 1e3
    );

    // The first fails (500, released): one waiting duplicate takes the key and runs.
    let first = tokio::spawn({
        let service = Arc::clone(&service);
        async move { service.post("/flaky", "w-2", "x").await }
    });
    service.running("w-2").await;
    let duplicate = service.post("/flaky", "w-2", "x").await;
    assert_eq!(
        first.await.expect("task").status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(
        (duplicate.status, duplicate.replayed(), duplicate.text()),
        (StatusCode::CREATED, false, "done on run 2".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_wait_a_duplicate_gets_409_and_without_it_at_once() {
    let work = Duration::from_millis(1500);
    let short = |layer: IdempotencyLayer<Store>| layer.wait_for_first(Duration::from_millis(200));
    let service = Arc::new(Service::start(work, short).await);
    let first = tokio::spawn({
        let service = Arc::clone(&service);
        async move { service.post("/orders", "w-3", "book").await }
    });
    service.running("w-3").await;
    let started = Instant::now();
    let duplicate = service.post("/orders", "w-3", "book").await;
    let waited = started.elapsed();
    assert_eq!(
        duplicate.status,
        StatusCode::CONFLICT,
        "{}",
        duplicate.text()
    );
    assert_eq!(duplicate.header("retry-after"), Some("1"));
    assert!(
        waited >= Duration::from_millis(190),
        "did not wait: {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(1400),
        "waited too long: {waited:?}"
    );
    // Another body is refused at once, waiting or not.
    let mismatch = service.post("/orders", "w-3", "another").await;
    assert_eq!(mismatch.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(first.await.expect("task").status, StatusCode::CREATED);

    // Off by default: 409 at once.
    let plain = Arc::new(Service::start(work, |layer| layer).await);
    let first = tokio::spawn({
        let service = Arc::clone(&plain);
        async move { service.post("/orders", "w-4", "book").await }
    });
    plain.running("w-4").await;
    let started = Instant::now();
    let duplicate = plain.post("/orders", "w-4", "book").await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert!(started.elapsed() < Duration::from_millis(1000));
    assert_eq!(first.await.expect("task").status, StatusCode::CREATED);
}

/// The child's side of the memory test: serves the routes over a store in `$CHILD_ENV`,
/// prints its port and serves until killed.
#[test]
fn stream_child() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let store = Store::open(std::path::Path::new(&dir).join("stream.idem")).expect("open");
        let layer = IdempotencyLayer::new(Arc::new(store));
        let app = router(Arc::new(Shop::default()), layer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("address").port();
        // Straight to stdout (not the harness's capture), flushed: the parent waits for it.
        let mut out = std::io::stdout().lock();
        writeln!(out, "port {port}").expect("stdout");
        out.flush().expect("stdout");
        drop(out);
        axum::serve(listener, app).await.expect("serve");
    });
}

/// The child serving the memory test, killed when dropped.
struct ChildServer(Child);

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_response_passes_with_bounded_memory_and_is_not_replayed() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut child = Command::new(std::env::current_exe().expect("test binary path"))
        .args(["--exact", "http_knobs::stream_child", "--nocapture"])
        .args(["--test-threads=1"])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child");
    let stdout = child.stdout.take().expect("piped stdout");
    let child = ChildServer(child);
    let read_port = tokio::task::spawn_blocking(move || {
        let mut lines = std::io::BufReader::new(stdout).lines();
        loop {
            let line = lines
                .next()
                .expect("the child prints its port")
                .expect("line");
            // The harness's "test ... " may precede it on the line.
            if let Some((_, port)) = line.rsplit_once("port ") {
                return port.parse::<u16>().expect("a port");
            }
        }
    });
    let port = tokio::time::timeout(Duration::from_secs(60), read_port)
        .await
        .expect("the child prints its port within a minute")
        .expect("task");
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let memory = || async {
        let text = client
            .get(format!("{base}/memory"))
            .send()
            .await
            .expect("answered")
            .text()
            .await
            .expect("text");
        let mut fields = text.split(' ').map(|n| n.parse::<u64>().expect("KiB"));
        (fields.next().expect("VmHWM"), fields.next().expect("VmRSS"))
    };
    let (before, _) = memory().await;

    let started = Instant::now();
    let mut response = client
        .post(format!("{base}/download"))
        .header("idempotency-key", "s-1")
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().get("idempotent-replayed").is_none());
    let mut received = 0;
    while let Some(chunk) = response.chunk().await.expect("a chunk") {
        assert!(chunk.iter().all(|&b| b == 0), "the bytes as sent");
        received += chunk.len();
    }
    let elapsed = started.elapsed();
    assert_eq!(received, STREAM_BYTES, "every byte streamed");
    let (after, rss) = memory().await;
    let grew = after.saturating_sub(before);
    println!(
        "streamed {} MB through the guarded route in {:.2} s: the server's peak resident \
         memory went from {before} KiB to {after} KiB (+{grew} KiB), {rss} KiB resident after",
        STREAM_BYTES / 1_000_000,
        elapsed.as_secs_f64()
    );
    // What docs/2-http-grpc-actix.md states: under 2 MiB (0.6 to 1.1 MiB measured).
    assert!(
        grew < 2 * 1024,
        "the server's peak memory grew by {grew} KiB while streaming {STREAM_BYTES} bytes"
    );

    // Not stored, and the work is not run again: a duplicate gets 410 naming the status.
    let again = client
        .post(format!("{base}/download"))
        .header("idempotency-key", "s-1")
        .send()
        .await
        .expect("answered");
    assert_eq!(again.status(), StatusCode::GONE);
    let problem = again.text().await.expect("text");
    assert!(
        problem.contains("response-not-stored") && problem.contains("status 200"),
        "{problem}"
    );
    drop(child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_limit_a_response_is_sent_not_stored_and_a_failed_stream_is_released() {
    let layer = |layer: IdempotencyLayer<Store>| layer.max_stored_response(1024);
    let service = Service::start(Duration::ZERO, layer).await;
    // Known length, over the limit: sent whole, not stored.
    let first = service.post("/big", "b-1", "").await;
    assert_eq!((first.status, first.body.len()), (StatusCode::OK, 4096));
    let again = service.post("/big", "b-1", "").await;
    assert_eq!(
        again.status,
        StatusCode::GONE,
        "replayed: {}",
        again.replayed()
    );
    assert!(again.text().contains("status 200"), "{}", again.text());
    assert_eq!(
        service.shop.runs("b-1"),
        1,
        "the handler does not run again"
    );
    // Under the limit: stored and replayed as before.
    let small = service.post("/orders", "b-2", "").await;
    let replay = service.post("/orders", "b-2", "").await;
    assert!(replay.replayed());
    assert_eq!(replay.body, small.body);
    // A streamed server error: sent, and the key released, so a retry runs the handler.
    let failed = service.post("/stream-fails", "b-3", "").await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(failed.body.len(), 3 * CHUNK);
    let retried = service.post("/stream-fails", "b-3", "").await;
    assert_eq!(
        (retried.status, retried.text()),
        (StatusCode::CREATED, "done on run 2".into())
    );
    // A small stream is a stream too: not stored.
    let stream = service.post("/download?bytes=10", "b-4", "").await;
    assert_eq!((stream.status, stream.body.len()), (StatusCode::OK, 10));
    let again = service.post("/download?bytes=10", "b-4", "").await;
    assert_eq!(again.status, StatusCode::GONE);
}

/// A response whose stored form is within a few bytes of the limits, the layer's and the
/// store's, each way round: the handler runs once per key, and the retry replays it (at most
/// the lower limit) or gets 410 naming its status (over it). Before the layer counted the
/// status and headers, a body just under the store's limit was refused by the store, its key
/// released, and the retry ran the handler again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_around_the_limits_runs_its_handler_once_and_then_replays_or_is_gone() {
    // The stored form of `/sized`'s response: 4 bytes, then `content-type` and its value.
    const HEAD: usize = 4 + 1 + "content-type".len() + 2 + "application/octet-stream".len();
    const MIB: usize = 1 << 20;
    // (the store's limit, the layer's): the defaults, the store's lower, the layer's lower.
    for (store, layer) in [(MIB, MIB), (4096, MIB), (MIB, 4096)] {
        let limit = store.min(layer);
        let service =
            Service::start_with(store, Duration::ZERO, |l| l.max_stored_response(layer)).await;
        let lengths = (limit - 64..=limit + 64).step_by(4).chain([limit + 1]);
        for stored in lengths {
            let key = format!("z-{store}-{layer}-{stored}");
            let route = format!("/sized?bytes={}", stored - HEAD);
            let first = service.post(&route, &key, "").await;
            assert_eq!(
                (first.status, first.body.len()),
                (StatusCode::OK, stored - HEAD),
                "{key}: the first client gets the response whole"
            );
            let retry = service.post(&route, &key, "").await;
            if stored <= limit {
                assert!(retry.replayed(), "{key}: not replayed, {}", retry.status);
                assert_eq!((retry.status, &retry.body), (StatusCode::OK, &first.body));
            } else {
                let replayed = retry.replayed();
                assert_eq!(retry.status, StatusCode::GONE, "{key}: replayed {replayed}");
                assert!(retry.text().contains("status 200"), "{}", retry.text());
            }
            assert_eq!(service.shop.runs(&key), 1, "{key}: the handler ran once");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_hook_adjusts_replays_and_the_fingerprint_hook_chooses_what_counts() {
    let layer = |layer: IdempotencyLayer<Store>| {
        layer
            .on_replay(|request, response| {
                if let Some(id) = request.headers.get("x-request-id") {
                    response.headers_mut().insert("x-request-id", id.clone());
                }
                let body = String::from_utf8_lossy(response.body()).into_owned();
                if let Some(rest) = body.strip_prefix('{') {
                    *response.body_mut() = format!(r#"{{"replayed":true,{rest}"#).into();
                }
            })
            // The body and the currency header count; the query string does not.
            .fingerprint(|request, body| {
                let currency = request.headers.get("x-currency").map(|v| v.as_bytes());
                Fingerprint::of_parts([currency.unwrap_or(b""), &body[..]])
            })
    };
    let service = Service::start(Duration::ZERO, layer).await;
    let eur = [("x-currency", "EUR"), ("x-request-id", "r-1")];
    let first = service.post_with("/orders", "h-1", "10", &eur).await;
    assert_eq!(first.text(), r#"{"order":1}"#);
    assert_eq!(first.header("x-request-id"), None);
    for id in ["r-2", "r-3"] {
        let headers = [("x-currency", "EUR"), ("x-request-id", id)];
        let replay = service
            .post_with("/orders?utm=mail", "h-1", "10", &headers)
            .await;
        assert!(replay.replayed(), "{}", replay.text());
        assert_eq!(replay.header("x-request-id"), Some(id));
        // Adjusted per replay; what is stored stays as it was.
        assert_eq!(replay.text(), r#"{"replayed":true,"order":1}"#);
    }
    let usd = service
        .post_with("/orders", "h-1", "10", &[("x-currency", "USD")])
        .await;
    assert_eq!(
        usd.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        usd.text()
    );
    assert_eq!(service.shop.runs("h-1"), 1);
}

/// The counters reach the `metrics` facade: the server and its client run on one thread, so a
/// recorder local to it sees every count.
#[cfg(feature = "metrics")]
#[test]
fn the_counters_reach_the_metrics_facade() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let work = Duration::from_millis(200);
            let layer =
                |layer: IdempotencyLayer<Store>| layer.wait_for_first(Duration::from_millis(50));
            let service = Arc::new(Service::start(work, layer).await);
            service.post("/orders", "m-1", "a").await; // acquired
            service.post("/orders", "m-1", "a").await; // replay
            service.post("/orders", "m-1", "b").await; // 422
            let first = tokio::spawn({
                let service = Arc::clone(&service);
                async move { service.post("/orders", "m-2", "a").await }
            });
            service.running("m-2").await;
            let refused = service.post("/orders", "m-2", "a").await; // waits, then 409
            assert_eq!(refused.status, StatusCode::CONFLICT);
            first.await.expect("task");
            let failed = service.post("/stream-fails", "m-3", "").await; // released
            assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
            let stream = service.post("/download?bytes=10", "m-4", "").await; // not stored
            assert_eq!(stream.status, StatusCode::OK);
        });
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let counter = |name: &str, label: Option<&str>| {
        snapshot
            .iter()
            .find(|(key, ..)| {
                let key = key.key();
                key.name() == name && label.is_none_or(|l| key.labels().any(|x| x.value() == l))
            })
            .and_then(|(.., value)| match value {
                DebugValue::Counter(n) => Some(*n),
                _ => None,
            })
    };
    assert_eq!(counter("idemstore_guard_replays_total", None), Some(1));
    assert_eq!(counter("idemstore_guard_mismatches_total", None), Some(1));
    assert_eq!(counter("idemstore_guard_waits_total", None), Some(1));
    assert_eq!(counter("idemstore_guard_in_progress_total", None), Some(1));
    assert_eq!(
        counter("idemstore_guard_released_total", Some("not_stored")),
        Some(1)
    );
    assert_eq!(counter("idemstore_guard_not_stored_total", None), Some(1));
}

/// A store whose `reserve` number `release_on` first releases `lease` (as if the first request
/// failed at that very moment), then answers.
struct ReleasesOnCall {
    store: Store,
    calls: AtomicUsize,
    release_on: usize,
    lease: Mutex<Option<idemstore::Lease>>,
}

impl idemstore::Reservations for ReleasesOnCall {
    async fn reserve(
        &self,
        key: &idemstore::Key,
        fingerprint: Fingerprint,
    ) -> Result<idemstore::Reservation, idemstore::Error> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let lease = self.lease.lock().expect("not poisoned").clone();
        if let (true, Some(lease)) = (call == self.release_on, lease) {
            assert!(self.store.release_if_pending(&lease).expect("released"));
        }
        self.store.reserve_async(key, fingerprint).await
    }
    async fn reserve_many(
        &self,
        items: &[(idemstore::Key, Fingerprint)],
    ) -> Result<Vec<Result<idemstore::Reservation, idemstore::Error>>, idemstore::Error> {
        self.store.reserve_many_async(items).await
    }
    async fn complete(
        &self,
        lease: &idemstore::Lease,
        result: Vec<u8>,
    ) -> Result<(), idemstore::Error> {
        self.store.complete_async(lease, result).await
    }
    async fn release_if_pending(&self, lease: &idemstore::Lease) -> Result<bool, idemstore::Error> {
        self.store.release_if_pending_async(lease).await
    }
    async fn extend(&self, lease: &idemstore::Lease) -> Result<idemstore::Lease, idemstore::Error> {
        self.store.extend_async(lease).await
    }
    async fn mark_needs_review(
        &self,
        lease: &idemstore::Lease,
        note: &str,
    ) -> Result<(), idemstore::Error> {
        self.store.mark_needs_review_async(lease, note).await
    }
    async fn resolve(
        &self,
        key: &idemstore::Key,
        resolution: idemstore::Resolution,
    ) -> Result<(), idemstore::Error> {
        self.store.resolve_async(key, resolution).await
    }
    async fn get(
        &self,
        key: &idemstore::Key,
    ) -> Result<Option<idemstore::Record>, idemstore::Error> {
        self.store.get(key)
    }
    async fn stale(
        &self,
        limit: usize,
    ) -> Result<Vec<(idemstore::Key, idemstore::Record)>, idemstore::Error> {
        self.store.stale(limit)
    }
    async fn sweep(&self, limit: usize) -> Result<usize, idemstore::Error> {
        self.store.sweep(limit)
    }
    async fn expire(
        &self,
        key: &idemstore::Key,
        live: idemstore::LiveLease,
    ) -> Result<Option<idemstore::RecordClass>, idemstore::Error> {
        self.store.expire_async(key, live).await
    }
    async fn record_step(
        &self,
        lease: &idemstore::Lease,
        step: u32,
        data: &[u8],
    ) -> Result<(), idemstore::Error> {
        self.store.record_step_async(lease, step, data).await
    }
    async fn observe(
        &self,
        key: &idemstore::Key,
        window: Duration,
    ) -> Result<idemstore::Seen, idemstore::Error> {
        idemstore::Reservations::observe(&self.store, key, window).await
    }
    async fn observe_many(
        &self,
        keys: &[idemstore::Key],
        window: Duration,
    ) -> Result<Vec<Result<idemstore::Seen, idemstore::Error>>, idemstore::Error> {
        self.store.observe_many_async(keys, window).await
    }
    async fn reserve_or_wait(
        &self,
        key: &idemstore::Key,
        fingerprint: Fingerprint,
        timeout: Duration,
    ) -> Result<idemstore::Reservation, idemstore::Error> {
        self.store
            .reserve_or_wait_async(key, fingerprint, timeout)
            .await
    }
    async fn complete_many(
        &self,
        items: Vec<(&idemstore::Lease, Vec<u8>)>,
    ) -> Result<Vec<Result<(), idemstore::Error>>, idemstore::Error> {
        self.store.complete_many_async(items).await
    }
    async fn release_if_pending_many(
        &self,
        leases: &[&idemstore::Lease],
    ) -> Result<Vec<Result<bool, idemstore::Error>>, idemstore::Error> {
        self.store.release_if_pending_many_async(leases).await
    }
    async fn extend_many(
        &self,
        leases: &[&idemstore::Lease],
    ) -> Result<Vec<Result<idemstore::Lease, idemstore::Error>>, idemstore::Error> {
        self.store.extend_many_async(leases).await
    }
    async fn expire_many(
        &self,
        keys: &[idemstore::Key],
        live: idemstore::LiveLease,
    ) -> Result<Vec<Result<Option<idemstore::RecordClass>, idemstore::Error>>, idemstore::Error>
    {
        self.store.expire_many_async(keys, live).await
    }
    async fn complete_with_retention(
        &self,
        lease: &idemstore::Lease,
        result: Vec<u8>,
        retention: Duration,
    ) -> Result<(), idemstore::Error> {
        self.store
            .complete_with_retention_async(lease, result, retention)
            .await
    }
    async fn resolve_with_retention(
        &self,
        key: &idemstore::Key,
        resolution: idemstore::Resolution,
        retention: Duration,
    ) -> Result<(), idemstore::Error> {
        self.store
            .resolve_with_retention_async(key, resolution, retention)
            .await
    }
}

/// The first request's key is released just as a waiting duplicate reads it again (after it
/// registered for the wake-up): the duplicate keeps the acquisition and runs, rather than
/// dropping it and finding its own dropped lease pending.
#[tokio::test(flavor = "current_thread")]
async fn a_duplicate_that_finds_the_key_released_as_it_starts_waiting_runs() {
    use idemstore::guard::{Begin, Guard, Release};
    let dir = tempfile::tempdir().expect("temporary directory");
    let store = Store::builder()
        .lease(Duration::from_secs(3600))
        .open(dir.path().join("race.idem"))
        .expect("open store");
    // Call 1: the first request acquires. Call 2: the duplicate finds it running. Call 3: the
    // duplicate's re-read, just after the first's key is released.
    let backend = Arc::new(ReleasesOnCall {
        store,
        calls: AtomicUsize::new(0),
        release_on: 3,
        lease: Mutex::new(None),
    });
    let guard = Guard::new(Arc::clone(&backend)).wait_for_first(Duration::from_millis(300));
    let key = idemstore::Key::new("u", "POST /orders", "r-1").expect("key");
    let fingerprint = Fingerprint::of(b"book");
    let Begin::Run(first) = guard.begin(&key, fingerprint).await else {
        panic!("the first request acquires");
    };
    *backend.lease.lock().expect("not poisoned") = Some(first.lease().clone());
    let answer = guard.begin(&key, fingerprint).await;
    let Begin::Run(second) = answer else {
        panic!("the duplicate should hold the released key, got {answer:?}");
    };
    assert_eq!(second.lease().key(), &key);
    second.release(Release::Failed).await;
    drop(first);
}
