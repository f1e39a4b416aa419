//! `idemstore::http::IdempotencyLayer` over real HTTP: an axum service on 127.0.0.1 (port 0)
//! with the layer added in one line, and a reqwest client (or a raw TCP socket, to drop a
//! connection mid-request) sending duplicates.
//!
//! `cargo test --test integration http:: -- --nocapture` prints the figures of the concurrent
//! runs.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode as AxumStatus};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use idemstore::http::IdempotencyLayer;
use idemstore::{
    Error, Fingerprint, Key, Lease, LiveLease, Record, RecordClass, Reservation, Reservations,
    Resolution, Seen, Store,
};
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The handlers behind the layer. They count how often they run, per caller and key.
#[derive(Default)]
struct Shop {
    /// Handler executions per `user key`.
    runs: Mutex<HashMap<String, usize>>,
    /// Every handler execution.
    total: AtomicUsize,
    /// How long `POST /orders` works, so that duplicates arrive while it runs.
    work: Duration,
    orders: AtomicU64,
}

impl Shop {
    /// Counts one execution for the request's caller and key; returns how many so far.
    fn count(&self, headers: &HeaderMap) -> usize {
        self.total.fetch_add(1, Ordering::SeqCst);
        let mut runs = self.runs.lock().expect("not poisoned");
        let n = runs.entry(id(headers)).or_default();
        *n += 1;
        *n
    }

    fn runs(&self, user: &str, key: &str) -> usize {
        let runs = self.runs.lock().expect("not poisoned");
        runs.get(&format!("{user} {key}")).copied().unwrap_or(0)
    }

    fn total(&self) -> usize {
        self.total.load(Ordering::SeqCst)
    }
}

/// `user key`, as the handlers count them.
fn id(headers: &HeaderMap) -> String {
    let text = |name: &str| {
        headers.get(name).map_or("-".into(), |v| {
            String::from_utf8_lossy(v.as_bytes()).into_owned()
        })
    };
    let user = text("authorization")
        .trim_start_matches("Bearer ")
        .to_owned();
    format!("{user} {}", text("idempotency-key").trim_matches('"'))
}

/// `POST /orders` (and `/invoices`): 201, `Location`, two cookies, a request id, and a body
/// with bytes that are not UTF-8.
async fn create(State(shop): State<Arc<Shop>>, headers: HeaderMap, item: Bytes) -> Response {
    shop.count(&headers);
    tokio::time::sleep(shop.work).await;
    let n = shop.orders.fetch_add(1, Ordering::SeqCst) + 1;
    let mut body = format!(r#"{{"order":{n},"for":"{}","item":""#, id(&headers)).into_bytes();
    body.extend(item.iter().filter(|b| b.is_ascii_alphanumeric()));
    body.extend_from_slice(b"\"}\0\xff\xfe");
    let mut response = (AxumStatus::CREATED, body).into_response();
    let out = response.headers_mut();
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    out.insert(header::LOCATION, HeaderValue::from(n));
    out.append(header::SET_COOKIE, HeaderValue::from_static("a=1"));
    out.append(header::SET_COOKIE, HeaderValue::from_static("b=2"));
    out.insert("x-request-id", HeaderValue::from(n));
    response
}

/// `POST /payments`: the first run of each key fails with 503 (a gateway hiccup), later runs
/// succeed with 201.
async fn pay(State(shop): State<Arc<Shop>>, headers: HeaderMap) -> Response {
    let run = shop.count(&headers);
    if run == 1 {
        return (AxumStatus::SERVICE_UNAVAILABLE, "gateway unavailable").into_response();
    }
    (
        AxumStatus::CREATED,
        format!("payment captured on run {run}"),
    )
        .into_response()
}

/// `POST /panics`: the first run of each key panics, later runs succeed.
async fn panics(State(shop): State<Arc<Shop>>, headers: HeaderMap) -> Response {
    let run = shop.count(&headers);
    assert!(
        run > 1,
        "the handler panics on its first run (deliberately)"
    );
    (AxumStatus::CREATED, format!("done on run {run}")).into_response()
}

/// `POST /slow`: the first run of each key works for a minute (the client leaves), later
/// runs answer at once.
async fn slow(State(shop): State<Arc<Shop>>, headers: HeaderMap) -> Response {
    let run = shop.count(&headers);
    if run == 1 {
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    (AxumStatus::CREATED, format!("done on run {run}")).into_response()
}

/// A running service with its own store, and a client for it.
struct Service {
    _dir: tempfile::TempDir,
    addr: std::net::SocketAddr,
    shop: Arc<Shop>,
    client: reqwest::Client,
}

/// What came back, fully read.
#[derive(Debug, Clone)]
struct Reply {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ASCII header"))
    }

    fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The caller: `Authorization: Bearer <user>` (a real service verifies a token first).
fn bearer(request: &axum::http::request::Parts) -> Option<Vec<u8>> {
    let value = request.headers.get(header::AUTHORIZATION)?.as_bytes();
    let user = value.strip_prefix(b"Bearer ")?;
    Some(user.to_vec())
}

impl Service {
    /// The service with the layer configured by `configure`, over a store whose lease is one
    /// hour: a key released within a test was released by the layer, not by its lease.
    async fn start(
        work: Duration,
        configure: impl FnOnce(IdempotencyLayer<Store>) -> IdempotencyLayer<Store>,
    ) -> Service {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = Store::builder()
            .lease(Duration::from_secs(3600))
            .open(dir.path().join("http.idem"))
            .expect("open store");
        Service::serve(dir, store, work, configure).await
    }

    /// The service over any backend.
    async fn serve<R: Reservations + 'static>(
        dir: tempfile::TempDir,
        store: R,
        work: Duration,
        configure: impl FnOnce(IdempotencyLayer<R>) -> IdempotencyLayer<R>,
    ) -> Service {
        let layer = configure(IdempotencyLayer::new(Arc::new(store)).scope(bearer));
        let shop = Arc::new(Shop {
            work,
            ..Shop::default()
        });
        let app = Router::new()
            .route("/orders", post(create))
            .route("/invoices", post(create))
            .route("/payments", post(pay))
            .route("/panics", post(panics))
            .route("/slow", post(slow))
            .route("/health", get(|| async { "ok" }))
            .layer(layer)
            .with_state(Arc::clone(&shop));
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

    /// `POST route` as `user` with `key` (no header when `None`); `Err` when the connection
    /// failed (a handler that panicked closes it).
    async fn try_post(
        &self,
        user: &str,
        route: &str,
        key: Option<&str>,
        body: &str,
    ) -> Result<Reply, reqwest::Error> {
        let mut request = self
            .client
            .post(format!("http://{}{route}", self.addr))
            .header("authorization", format!("Bearer {user}"))
            .body(body.to_string());
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let response = request.send().await?;
        Ok(Reply {
            status: response.status(),
            headers: response.headers().clone(),
            body: response.bytes().await?.to_vec(),
        })
    }

    async fn post(&self, user: &str, route: &str, key: Option<&str>, body: &str) -> Reply {
        self.try_post(user, route, key, body)
            .await
            .expect("request answered")
    }

    /// Sends until the answer is not 409, as a client honouring `Retry-After` would (but
    /// faster); gives up after `patience`. Returns the first answer, the last and how many
    /// requests it took.
    async fn post_until_done(
        &self,
        user: &str,
        route: &str,
        key: &str,
        body: &str,
        patience: Duration,
    ) -> (Reply, Reply, usize) {
        let started = Instant::now();
        let first = self.post(user, route, Some(key), body).await;
        let (mut last, mut sent) = (first.clone(), 1);
        while last.status == StatusCode::CONFLICT {
            assert_eq!(
                last.header("retry-after"),
                Some("1"),
                "409 without Retry-After"
            );
            assert!(
                started.elapsed() < patience,
                "{user} {key}: still 409 after {patience:?}: {}",
                last.text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
            last = self.post(user, route, Some(key), body).await;
            sent += 1;
        }
        (first, last, sent)
    }
}

/// Every duplicate of one key: one original 201, the rest replays of it, byte for byte.
#[track_caller]
fn assert_one_original_and_identical_replays(replies: &[Reply]) {
    let originals: Vec<&Reply> = replies.iter().filter(|r| !r.replayed()).collect();
    assert_eq!(originals.len(), 1, "exactly one response is not a replay");
    let original = originals[0];
    assert_eq!(original.status, StatusCode::CREATED, "{}", original.text());
    for reply in replies {
        assert_eq!(reply.status, original.status);
        assert_eq!(reply.body, original.body, "replayed body differs");
        for name in ["content-type", "location"] {
            assert_eq!(reply.header(name), original.header(name), "{name} differs");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hundreds_of_concurrent_duplicates_run_the_handler_once_per_key() {
    let service = Arc::new(Service::start(Duration::from_millis(200), |layer| layer).await);
    let patience = Duration::from_secs(30);

    // 300 concurrent requests with one key.
    let started = Instant::now();
    let tasks: Vec<_> = (0..300)
        .map(|_| {
            let service = Arc::clone(&service);
            tokio::spawn(async move {
                service
                    .post_until_done("alice", "/orders", "same-key", "book", patience)
                    .await
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.expect("task"));
    }
    let elapsed = started.elapsed();
    let sent: usize = results.iter().map(|(_, _, n)| n).sum();
    let conflicts = results
        .iter()
        .filter(|(first, _, _)| first.status == StatusCode::CONFLICT)
        .count();
    let finals: Vec<Reply> = results.into_iter().map(|(_, last, _)| last).collect();
    assert_eq!(
        service.shop.runs("alice", "same-key"),
        1,
        "one key, one execution"
    );
    assert_eq!(service.shop.total(), 1);
    assert_one_original_and_identical_replays(&finals);
    assert!(conflicts > 0, "no duplicate arrived while the first ran");
    println!(
        "300 concurrent duplicates of one key: {sent} requests, {conflicts} answered 409 \
         first, 1 handler execution, {:.0} ms",
        elapsed.as_secs_f64() * 1e3
    );

    // 50 distinct keys, 8 concurrent duplicates each, all at once.
    let started = Instant::now();
    let tasks: Vec<_> = (0..50)
        .flat_map(|k| (0..8).map(move |_| k))
        .map(|k| {
            let service = Arc::clone(&service);
            tokio::spawn(async move {
                let (key, body) = (format!("key-{k}"), format!("item {k}"));
                let reply = service
                    .post_until_done("bob", "/orders", &key, &body, patience)
                    .await;
                (k, reply)
            })
        })
        .collect();
    let mut by_key: HashMap<usize, Vec<Reply>> = HashMap::new();
    let mut sent = 0;
    for task in tasks {
        let (k, (_, last, n)) = task.await.expect("task");
        sent += n;
        by_key.entry(k).or_default().push(last);
    }
    let elapsed = started.elapsed();
    let mut locations = HashSet::new();
    for (k, replies) in &by_key {
        assert_eq!(service.shop.runs("bob", &format!("key-{k}")), 1, "key-{k}");
        assert_eq!(replies.len(), 8);
        assert_one_original_and_identical_replays(replies);
        locations.insert(replies[0].header("location").expect("location").to_owned());
    }
    assert_eq!(locations.len(), 50, "each key created its own order");
    assert_eq!(service.shop.total(), 1 + 50);
    println!(
        "50 keys x 8 concurrent duplicates: {sent} requests, 50 handler executions, {:.0} ms",
        elapsed.as_secs_f64() * 1e3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_is_byte_identical_with_the_chosen_headers_only() {
    let service = Service::start(Duration::ZERO, |layer| {
        layer.replay_headers([header::CONTENT_TYPE, header::LOCATION, header::SET_COOKIE])
    })
    .await;
    let first = service
        .post("alice", "/orders", Some("\"k-1\""), "book")
        .await;
    assert_eq!(
        (first.status, first.replayed()),
        (StatusCode::CREATED, false)
    );
    assert!(first.body.ends_with(b"\0\xff\xfe"), "{:?}", first.body);
    // The quoted structured-field form and the bare form are the same key.
    for key in ["\"k-1\"", "k-1"] {
        let again = service.post("alice", "/orders", Some(key), "book").await;
        assert!(again.replayed(), "{key}: {again:?}");
        assert_eq!((again.status, &again.body), (first.status, &first.body));
        for name in ["content-type", "location"] {
            assert_eq!(again.header(name), first.header(name), "{name}");
        }
        let cookies: Vec<_> = again.headers.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert_eq!(again.header("x-request-id"), None, "not chosen for replay");
    }
    assert_eq!(service.shop.runs("alice", "k-1"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_and_routes_never_share_a_key() {
    let service = Service::start(Duration::ZERO, |layer| layer).await;
    let alice = service
        .post("alice", "/orders", Some("shared"), "book")
        .await;
    let bob = service.post("bob", "/orders", Some("shared"), "book").await;
    assert_eq!((alice.replayed(), bob.replayed()), (false, false));
    assert_ne!(alice.body, bob.body, "bob must not get alice's order");
    let invoice = service
        .post("alice", "/invoices", Some("shared"), "book")
        .await;
    assert!(!invoice.replayed(), "another route is another operation");
    assert_ne!(invoice.body, alice.body);
    // Each one replays its own.
    let bob_again = service.post("bob", "/orders", Some("shared"), "book").await;
    assert_eq!((bob_again.replayed(), &bob_again.body), (true, &bob.body));
    assert_eq!(service.shop.runs("alice", "shared"), 2);
    assert_eq!(service.shop.runs("bob", "shared"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_releases_the_key_and_a_retry_runs_the_handler_again() {
    let service = Service::start(Duration::ZERO, |layer| layer).await;
    let failed = service
        .post("dave", "/payments", Some("p-1"), "10 EUR")
        .await;
    assert_eq!(
        (failed.status, failed.replayed()),
        (StatusCode::SERVICE_UNAVAILABLE, false)
    );
    let retried = service
        .post("dave", "/payments", Some("p-1"), "10 EUR")
        .await;
    assert_eq!(
        (retried.status, retried.replayed()),
        (StatusCode::CREATED, false)
    );
    assert_eq!(retried.text(), "payment captured on run 2");
    let replayed = service
        .post("dave", "/payments", Some("p-1"), "10 EUR")
        .await;
    assert!(replayed.replayed());
    assert_eq!(
        (replayed.status, &replayed.body),
        (retried.status, &retried.body)
    );
    assert_eq!(service.shop.runs("dave", "p-1"), 2);

    // Configured to store every status: the 503 itself is replayed.
    let strict = Service::start(Duration::ZERO, |layer| layer.store_status(|_| true)).await;
    let failed = strict
        .post("dave", "/payments", Some("p-1"), "10 EUR")
        .await;
    let again = strict
        .post("dave", "/payments", Some("p-1"), "10 EUR")
        .await;
    assert_eq!(
        (again.status, again.replayed()),
        (StatusCode::SERVICE_UNAVAILABLE, true)
    );
    assert_eq!(again.body, failed.body);
    assert_eq!(strict.shop.runs("dave", "p-1"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_leaves_the_key_released_not_pending() {
    let service = Service::start(Duration::ZERO, |layer| layer).await;
    let crashed = service
        .try_post("erin", "/panics", Some("x-1"), "job")
        .await;
    assert!(crashed.is_err(), "the connection closes: {crashed:?}");
    assert_eq!(service.shop.runs("erin", "x-1"), 1);
    // The store's lease is an hour: only the layer's release lets this through in time.
    let patience = Duration::from_secs(5);
    let (_, done, sent) = service
        .post_until_done("erin", "/panics", "x-1", "job", patience)
        .await;
    assert_eq!((done.status, done.replayed()), (StatusCode::CREATED, false));
    assert_eq!(done.text(), "done on run 2");
    assert_eq!(service.shop.runs("erin", "x-1"), 2);
    println!("after a panic, the retry ran the handler after {sent} request(s)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_request_leaves_the_key_released() {
    let service = Service::start(Duration::ZERO, |layer| layer).await;
    let mut socket = TcpStream::connect(service.addr).await.expect("connect");
    let request = "POST /slow HTTP/1.1\r\nhost: test\r\nauthorization: Bearer frank\r\n\
                   idempotency-key: d-1\r\ncontent-length: 3\r\n\r\njob";
    socket.write_all(request.as_bytes()).await.expect("send");
    let started = Instant::now();
    while service.shop.runs("frank", "d-1") == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the handler never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // While the first run works, a duplicate is told to come back.
    let busy = service.post("frank", "/slow", Some("d-1"), "job").await;
    assert_eq!(busy.status, StatusCode::CONFLICT, "{}", busy.text());
    drop(socket); // the client goes away; the handler would work for another minute

    let patience = Duration::from_secs(5);
    let started = Instant::now();
    let (_, done, sent) = service
        .post_until_done("frank", "/slow", "d-1", "job", patience)
        .await;
    assert_eq!((done.status, done.replayed()), (StatusCode::CREATED, false));
    assert_eq!(done.text(), "done on run 2");
    assert_eq!(service.shop.runs("frank", "d-1"), 2);
    println!(
        "after a disconnect, the retry acquired the key after {sent} request(s), {:.0} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_with_another_body_is_422_also_while_running() {
    let service = Arc::new(Service::start(Duration::from_millis(300), |layer| layer).await);
    let running = tokio::spawn({
        let service = Arc::clone(&service);
        async move { service.post("alice", "/orders", Some("k"), "book").await }
    });
    while service.shop.runs("alice", "k") == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let in_progress = service.post("alice", "/orders", Some("k"), "book").await;
    assert_eq!(in_progress.status, StatusCode::CONFLICT);
    assert_eq!(in_progress.header("retry-after"), Some("1"));
    assert_eq!(
        in_progress.header("content-type"),
        Some("application/problem+json")
    );
    assert!(
        in_progress.text().contains("in-progress"),
        "{}",
        in_progress.text()
    );
    let other = service.post("alice", "/orders", Some("k"), "pen").await;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        other.text()
    );
    assert!(other.text().contains("\"status\":422"), "{}", other.text());
    assert_eq!(running.await.expect("task").status, StatusCode::CREATED);
    let other = service.post("alice", "/orders", Some("k"), "pen").await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(service.shop.runs("alice", "k"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_oversized_keys_are_400_and_unguarded_methods_pass() {
    let service = Service::start(Duration::ZERO, |layer| layer).await;
    let missing = service.post("alice", "/orders", None, "book").await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.header("content-type"),
        Some("application/problem+json")
    );
    assert!(missing.text().contains("key-missing"), "{}", missing.text());
    let long = "k".repeat(256);
    let bad = service.post("alice", "/orders", Some(&long), "book").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(
        bad.text().contains("256 bytes") && bad.text().contains("255"),
        "{}",
        bad.text()
    );
    assert_eq!(service.shop.total(), 0, "no handler ran");
    let longest = "k".repeat(255);
    let fits = service
        .post("alice", "/orders", Some(&longest), "book")
        .await;
    assert_eq!(fits.status, StatusCode::CREATED, "{}", fits.text());
    let health = service
        .client
        .get(format!("http://{}/health", service.addr))
        .send()
        .await;
    assert_eq!(
        health.expect("answered").status(),
        StatusCode::OK,
        "GET needs no key"
    );

    // Configured to let keyless requests through, unguarded: they run every time.
    let open = Service::start(Duration::ZERO, |layer| layer.require_key(false)).await;
    for _ in 0..2 {
        let reply = open.post("alice", "/orders", None, "book").await;
        assert_eq!(
            (reply.status, reply.replayed()),
            (StatusCode::CREATED, false)
        );
    }
    assert_eq!(open.shop.runs("alice", "-"), 2);
}

/// Every malformed `Idempotency-Key` value (draft-ietf-httpapi-idempotency-key-header-07: one
/// RFC 8941 sf-string, or a bare key of token or UUID characters), with a piece of the rule its
/// refusal must name. The actix-web and gRPC tests send the same values.
pub(crate) const MALFORMED_KEYS: &[(&[u8], &str)] = &[
    (b"key,with,commas", "a comma"),
    (b"a, b", "a comma"),
    (b"\"x\", \"y\"", "a list of 2 members"),
    (b"\"abc", "unterminated string"),
    (b"abc\"", "an unbalanced quote at byte 3"),
    (b"a\"b\"", "an unbalanced quote at byte 1"),
    (b"a b", "a space at byte 1"),
    (b"\"k\";v=1", "parameters"),
    (b"k;v=1", "a `;`"),
    (b"a\tb", "the control character 0x09"),
    (b"\"a\tb\"", "invalid string character"),
    (b"caf\xc3\xa9", "the non-ASCII byte 0xc3"),
    (b"\"caf\xc3\xa9\"", "invalid string character"),
    (b"\"a\\qb\"", "invalid escape sequence"),
    (b"\"a\\\"", "unterminated"),
    (b"(a b)", "the character `(`"),
    (b"\"\"", "empty"),
];

#[test]
fn the_key_is_one_sf_string_with_its_escapes_decoded_or_a_bare_token() {
    use idemstore::guard::client_key;
    let key =
        |value: &[u8]| client_key([value]).map(|id| id.map(|id| String::from_utf8(id).unwrap()));
    assert_eq!(key(br#""a\"b""#), Ok(Some(r#"a"b"#.into())));
    assert_eq!(key(br#""a\\b""#), Ok(Some(r"a\b".into())));
    assert_eq!(
        key(br#""key,with, commas""#),
        Ok(Some("key,with, commas".into()))
    );
    assert_eq!(key(b"\"k-1\""), key(b"k-1"), "bare and quoted: one key");
    let uuid = "4a5c0b6e-8f3d-4b1e-9c2a-7d6e5f4a3b2c";
    assert_eq!(key(uuid.as_bytes()), Ok(Some(uuid.into())));
    assert_eq!(
        key(b"Ab9!#$%&'*+-.^_`|~:/"),
        Ok(Some("Ab9!#$%&'*+-.^_`|~:/".into()))
    );
    for (value, rule) in MALFORMED_KEYS {
        let shown = String::from_utf8_lossy(value);
        let refused = client_key([*value]).expect_err(&format!("{shown:?} is refused"));
        assert!(
            refused.detail.contains(rule),
            "{shown:?}: {}",
            refused.detail
        );
    }
    let twice = client_key([&b"a"[..], b"a"]).expect_err("two fields are refused");
    assert!(
        twice.detail.contains("one Idempotency-Key header field"),
        "{}",
        twice.detail
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_keys_are_400_naming_the_rule_and_run_nothing() {
    let service = Service::start(Duration::ZERO, |layer| layer).await;
    let send = |values: &[&[u8]]| {
        let mut request = service
            .client
            .post(format!("http://{}/orders", service.addr))
            .header("authorization", "Bearer alice")
            .body("book");
        for value in values {
            let value = HeaderValue::from_bytes(value).expect("a value HTTP can carry");
            request = request.header("idempotency-key", value);
        }
        async move {
            let response = request.send().await.expect("answered");
            let status = response.status();
            let kind = response.headers().get("content-type").cloned();
            (status, kind, response.text().await.expect("body"))
        }
    };
    let mut cases: Vec<(Vec<&[u8]>, &str)> = MALFORMED_KEYS
        .iter()
        .map(|(value, rule)| (vec![*value], *rule))
        .collect();
    cases.push((vec![b"\"a\"", b"\"b\""], "one Idempotency-Key header field"));
    cases.push((vec![b"a", b"a"], "one Idempotency-Key header field"));
    for (values, rule) in cases {
        let shown: Vec<_> = values.iter().map(|v| String::from_utf8_lossy(v)).collect();
        let (status, kind, body) = send(&values).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{shown:?}: {body}");
        assert_eq!(
            kind.as_ref().map(|v| v.as_bytes()),
            Some(&b"application/problem+json"[..]),
            "{shown:?}"
        );
        assert!(
            body.contains("key-invalid") && body.contains(rule),
            "{shown:?}: {body}"
        );
    }
    assert_eq!(service.shop.total(), 0, "no handler ran");

    // A bare key and its quoted form are one key; escapes are decoded before the key is built.
    let first = service.post("alice", "/orders", Some("k-1"), "book").await;
    let quoted = service
        .post("alice", "/orders", Some("\"k-1\""), "book")
        .await;
    assert_eq!(
        (first.status, first.replayed()),
        (StatusCode::CREATED, false)
    );
    assert_eq!(
        (quoted.status, quoted.replayed()),
        (StatusCode::CREATED, true)
    );
    let escaped = service
        .post("alice", "/orders", Some(r#""k\"2""#), "book")
        .await;
    let again = service
        .post("alice", "/orders", Some(r#" "k\"2" "#), "pen")
        .await;
    assert_eq!(escaped.status, StatusCode::CREATED, "{}", escaped.text());
    assert_eq!(
        again.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "the same key, another body"
    );
    assert_eq!(service.shop.total(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_an_identity_is_401_with_a_challenge() {
    let service = Service::start(Duration::ZERO, |layer| layer).await;
    let anonymous = service
        .client
        .post(format!("http://{}/orders", service.addr))
        .header("idempotency-key", "a-1")
        .body("book")
        .send()
        .await
        .expect("answered");
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let header = |name: &str| anonymous.headers().get(name).cloned();
    assert_eq!(
        header("www-authenticate").as_ref().map(|v| v.as_bytes()),
        Some(&b"Bearer"[..])
    );
    assert_eq!(
        header("content-type").as_ref().map(|v| v.as_bytes()),
        Some(&b"application/problem+json"[..])
    );
    assert_eq!(service.shop.total(), 0, "no handler ran");

    let realm = Service::start(Duration::ZERO, |layer| {
        layer.challenge(HeaderValue::from_static("Bearer realm=\"shop\""))
    })
    .await;
    let anonymous = realm
        .client
        .post(format!("http://{}/orders", realm.addr))
        .header("idempotency-key", "a-1")
        .send()
        .await
        .expect("answered");
    assert_eq!(
        anonymous.headers().get("www-authenticate"),
        Some(&HeaderValue::from_static("Bearer realm=\"shop\""))
    );
}

/// Sends `request` on a fresh connection and reads the answer until the server closes it.
async fn raw(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut socket = TcpStream::connect(addr).await.expect("connect");
    // The server may answer and close before the whole body is sent: that is the point.
    let _ = socket.write_all(request).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_refused_naming_the_limit() {
    let service = Service::start(Duration::ZERO, |layer| layer.max_body(1024)).await;
    // Declared too large: refused before the body is read.
    let big = "x".repeat(1025);
    let refused = service.post("alice", "/orders", Some("b-1"), &big).await;
    assert_eq!(refused.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    assert!(
        refused.text().contains("\"limit\":1024"),
        "{}",
        refused.text()
    );
    // Chunked, no length declared: refused once the limit is crossed.
    let chunk = "y".repeat(600);
    let chunked = format!(
        "POST /orders HTTP/1.1\r\nhost: test\r\nauthorization: Bearer alice\r\n\
         idempotency-key: b-2\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n\
         258\r\n{chunk}\r\n258\r\n{chunk}\r\n0\r\n\r\n"
    );
    let answer = raw(service.addr, chunked.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("\"limit\":1024"), "{answer}");
    // At the limit: served. Neither refusal reserved its key.
    let fits = service
        .post("alice", "/orders", Some("b-1"), &"x".repeat(1024))
        .await;
    assert_eq!(fits.status, StatusCode::CREATED, "{}", fits.text());
    assert_eq!(service.shop.total(), 1);

    // 400 instead of 413, when configured.
    let service = Service::start(Duration::ZERO, |layer| {
        layer
            .max_body(10)
            .body_too_large_status(AxumStatus::BAD_REQUEST)
    })
    .await;
    let refused = service
        .post("alice", "/orders", Some("b-1"), "eleven byte")
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(
        refused.text().contains("over 10 bytes"),
        "{}",
        refused.text()
    );
}

/// A [`Store`] with the faults the guard's tests need, shared by the HTTP and gRPC suites:
/// every reservation of one client key fails (as a store whose disk failed would), and
/// releases can be dropped (as when the process dies before it can release: the store's lease
/// is then the only way out). Every other call is the store's.
pub(crate) struct Faulty {
    store: Store,
    fails_for: Option<&'static [u8]>,
    releases: bool,
}

impl Faulty {
    /// Releases change nothing.
    pub(crate) fn never_releases(store: Store) -> Faulty {
        Faulty {
            store,
            fails_for: None,
            releases: false,
        }
    }

    /// Reservations of the client key `id` fail.
    #[cfg_attr(not(feature = "grpc"), allow(dead_code))] // The gRPC suite's.
    pub(crate) fn fails_for(store: Store, id: &'static [u8]) -> Faulty {
        Faulty {
            store,
            fails_for: Some(id),
            releases: true,
        }
    }

    fn check(&self, key: &Key) -> Result<(), Error> {
        if self.fails_for == Some(key.id()) {
            return Err(idemstore::OpenError::InvalidConfig {
                setting: "test",
                reason: "the store fails for this key (deliberately)".into(),
            }
            .into());
        }
        Ok(())
    }
}

impl Reservations for Faulty {
    async fn reserve(&self, key: &Key, fingerprint: Fingerprint) -> Result<Reservation, Error> {
        self.check(key)?;
        Reservations::reserve(&self.store, key, fingerprint).await
    }
    async fn reserve_many(
        &self,
        items: &[(Key, Fingerprint)],
    ) -> Result<Vec<Result<Reservation, Error>>, Error> {
        Reservations::reserve_many(&self.store, items).await
    }
    async fn complete(&self, lease: &Lease, result: Vec<u8>) -> Result<(), Error> {
        Reservations::complete(&self.store, lease, result).await
    }
    async fn release_if_pending(&self, lease: &Lease) -> Result<bool, Error> {
        if !self.releases {
            return Ok(false);
        }
        Reservations::release_if_pending(&self.store, lease).await
    }
    async fn extend(&self, lease: &Lease) -> Result<Lease, Error> {
        Reservations::extend(&self.store, lease).await
    }
    async fn mark_needs_review(&self, lease: &Lease, note: &str) -> Result<(), Error> {
        Reservations::mark_needs_review(&self.store, lease, note).await
    }
    async fn resolve(&self, key: &Key, resolution: Resolution) -> Result<(), Error> {
        Reservations::resolve(&self.store, key, resolution).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        Reservations::get(&self.store, key).await
    }
    async fn stale(&self, limit: usize) -> Result<Vec<(Key, Record)>, Error> {
        Reservations::stale(&self.store, limit).await
    }
    async fn sweep(&self, limit: usize) -> Result<usize, Error> {
        Reservations::sweep(&self.store, limit).await
    }
    async fn expire(&self, key: &Key, live: LiveLease) -> Result<Option<RecordClass>, Error> {
        Reservations::expire(&self.store, key, live).await
    }
    async fn record_step(&self, lease: &Lease, step: u32, data: &[u8]) -> Result<(), Error> {
        Reservations::record_step(&self.store, lease, step, data).await
    }
    async fn observe(&self, key: &Key, window: Duration) -> Result<Seen, Error> {
        Reservations::observe(&self.store, key, window).await
    }
    async fn observe_many(
        &self,
        keys: &[Key],
        window: Duration,
    ) -> Result<Vec<Result<Seen, Error>>, Error> {
        Reservations::observe_many(&self.store, keys, window).await
    }
    async fn reserve_or_wait(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        timeout: Duration,
    ) -> Result<Reservation, Error> {
        self.check(key)?;
        Reservations::reserve_or_wait(&self.store, key, fingerprint, timeout).await
    }
    async fn complete_many(
        &self,
        items: Vec<(&Lease, Vec<u8>)>,
    ) -> Result<Vec<Result<(), Error>>, Error> {
        Reservations::complete_many(&self.store, items).await
    }
    async fn release_if_pending_many(
        &self,
        leases: &[&Lease],
    ) -> Result<Vec<Result<bool, Error>>, Error> {
        if !self.releases {
            return Ok(leases.iter().map(|_| Ok(false)).collect());
        }
        Reservations::release_if_pending_many(&self.store, leases).await
    }
    async fn extend_many(&self, leases: &[&Lease]) -> Result<Vec<Result<Lease, Error>>, Error> {
        Reservations::extend_many(&self.store, leases).await
    }
    async fn expire_many(
        &self,
        keys: &[Key],
        live: LiveLease,
    ) -> Result<Vec<Result<Option<RecordClass>, Error>>, Error> {
        Reservations::expire_many(&self.store, keys, live).await
    }
    async fn complete_with_retention(
        &self,
        lease: &Lease,
        result: Vec<u8>,
        retention: Duration,
    ) -> Result<(), Error> {
        Reservations::complete_with_retention(&self.store, lease, result, retention).await
    }
    async fn resolve_with_retention(
        &self,
        key: &Key,
        resolution: Resolution,
        retention: Duration,
    ) -> Result<(), Error> {
        Reservations::resolve_with_retention(&self.store, key, resolution, retention).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_no_release_runs_the_lease_is_the_backstop() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let lease = Duration::from_millis(500);
    let store = Store::builder()
        .lease(lease)
        .open(dir.path().join("http.idem"))
        .expect("open store");
    let service = Service::serve(
        dir,
        Faulty::never_releases(store),
        Duration::ZERO,
        |layer| layer,
    )
    .await;
    let started = Instant::now();
    let crashed = service
        .try_post("gina", "/panics", Some("y-1"), "job")
        .await;
    assert!(crashed.is_err(), "the connection closes: {crashed:?}");
    let (first, done, sent) = service
        .post_until_done("gina", "/panics", "y-1", "job", Duration::from_secs(5))
        .await;
    let waited = started.elapsed();
    assert_eq!(
        first.status,
        StatusCode::CONFLICT,
        "pending until the lease runs out"
    );
    assert_eq!(
        (done.status, done.text()),
        (StatusCode::CREATED, "done on run 2".into())
    );
    assert!(waited >= lease - Duration::from_millis(50), "{waited:?}");
    assert_eq!(service.shop.runs("gina", "y-1"), 2);
    println!(
        "no release: the key was taken over when its {lease:?} lease ran out, after {sent} \
         request(s), {:.0} ms",
        waited.as_secs_f64() * 1e3
    );
}

#[tokio::test(flavor = "current_thread")]
async fn the_layer_serves_a_plain_tower_stack_too() {
    use http_body_util::{BodyExt, Full};
    use std::convert::Infallible;
    use tower::{ServiceBuilder, ServiceExt};

    let dir = tempfile::tempdir().expect("temporary directory");
    let store = Arc::new(Store::open(dir.path().join("tower.idem")).expect("open store"));
    let runs = Arc::new(AtomicUsize::new(0));
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store))
        .service_fn({
            let runs = Arc::clone(&runs);
            move |request: axum::http::Request<Full<Bytes>>| {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    let body = request.into_body().collect().await?.to_bytes();
                    let text = format!("run {run} got {}", String::from_utf8_lossy(&body));
                    Ok::<_, Infallible>(axum::http::Response::new(Full::new(Bytes::from(text))))
                }
            }
        });
    let request = || {
        axum::http::Request::post("/jobs")
            .header("idempotency-key", "t-1")
            .body(Full::new(Bytes::from_static(b"payload")))
            .expect("a request")
    };
    let first = service.clone().oneshot(request()).await.expect("answered");
    let again = service.clone().oneshot(request()).await.expect("answered");
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let first = first.into_body().collect().await.expect("body").to_bytes();
    let again = again.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&first[..], b"run 1 got payload", "the handler saw the body");
    assert_eq!(first, again);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_longer_than_the_lease_keeps_its_key() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let lease = Duration::from_millis(300);
    let store = Store::builder()
        .lease(lease)
        .open(dir.path().join("http.idem"))
        .expect("open store");
    let work = Duration::from_millis(1500); // five leases
    let service = Arc::new(Service::serve(dir, store, work, |layer| layer).await);
    let first = tokio::spawn({
        let service = Arc::clone(&service);
        async move { service.post("hana", "/orders", Some("l-1"), "book").await }
    });
    while service.shop.runs("hana", "l-1") == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Duplicates keep coming while it works; none may take the key over.
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let service = Arc::clone(&service);
            tokio::spawn(async move {
                let patience = Duration::from_secs(10);
                service
                    .post_until_done("hana", "/orders", "l-1", "book", patience)
                    .await
            })
        })
        .collect();
    let mut replies = vec![first.await.expect("task")];
    for task in tasks {
        let (_, last, _) = task.await.expect("task");
        replies.push(last);
    }
    assert_eq!(
        service.shop.runs("hana", "l-1"),
        1,
        "taken over while running"
    );
    assert_one_original_and_identical_replays(&replies);
}

/// Every problem `type` the layer emits, `DEFAULT_PROBLEM_BASE` followed by a refusal's slug,
/// leads to a section of the module docs: a `### slug` heading, whose anchor rustdoc names by
/// the slug.
#[test]
fn every_problem_type_names_a_section_of_the_module_docs() {
    use idemstore::guard::Refusal;
    let docs = include_str!("../src/http/mod.rs");
    let base = idemstore::http::DEFAULT_PROBLEM_BASE;
    assert!(base.ends_with("/idemstore/http/#"), "{base}");
    for refusal in [
        Refusal::KeyMissing,
        Refusal::KeyInvalid,
        Refusal::NoScope,
        Refusal::BodyTooLarge,
        Refusal::BodyUnreadable,
        Refusal::InProgress,
        Refusal::KeyReused,
        Refusal::UnderReview,
        Refusal::StoreUnavailable,
        Refusal::StoredResponseUnreadable,
        Refusal::ResponseUnreadable,
        Refusal::ResponseNotStored,
    ] {
        let heading = format!("//! ### {}\n", refusal.slug());
        assert!(
            docs.contains(&heading),
            "no section for {base}{}",
            refusal.slug()
        );
    }
}
