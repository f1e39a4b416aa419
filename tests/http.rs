//! The `Idempotency-Key` middleware of `examples/http_service.rs`, over real HTTP: the service
//! runs on 127.0.0.1 (port 0) and a reqwest client sends concurrent duplicates.
//!
//! `cargo test --test integration http:: -- --nocapture` prints the figures of the concurrent
//! runs.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_service::{app, spawn_server, Idempotency, Shop};
use idemstore::Store;
use reqwest::StatusCode;

#[path = "../examples/http_service.rs"]
#[expect(
    dead_code,
    reason = "the example's own main and demo are not used here"
)]
mod http_service;

/// A running service with its own store, and a client for it.
struct Service {
    _dir: tempfile::TempDir,
    base: String,
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

impl Service {
    async fn start(work: Duration, configure: impl FnOnce(&mut Idempotency)) -> Service {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = Arc::new(Store::open(dir.path().join("http.idem")).expect("open store"));
        let mut config = Idempotency::new(store);
        configure(&mut config);
        let shop = Arc::new(Shop::new(work));
        let addr = spawn_server(
            "127.0.0.1:0".parse().unwrap(),
            app(config, Arc::clone(&shop)),
        )
        .await
        .expect("bind 127.0.0.1:0");
        Service {
            _dir: dir,
            base: format!("http://{addr}"),
            shop,
            client: reqwest::Client::new(),
        }
    }

    /// `POST route` as `user` (no Authorization when `None`) with `key` (no header when `None`).
    async fn post(&self, user: Option<&str>, route: &str, key: Option<&str>, body: &str) -> Reply {
        let mut request = self
            .client
            .post(format!("{}{route}", self.base))
            .body(body.to_string());
        if let Some(user) = user {
            request = request.header("authorization", format!("Bearer {user}"));
        }
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let response = request.send().await.expect("request sent");
        Reply {
            status: response.status(),
            headers: response.headers().clone(),
            body: response.bytes().await.expect("body read").to_vec(),
        }
    }

    /// Sends until the answer is not 409 (as a client honouring `Retry-After`, but faster);
    /// returns the first answer, the final one and how many requests it took.
    async fn post_until_done(&self, user: &str, key: &str, body: &str) -> (Reply, Reply, usize) {
        let first = self.post(Some(user), "/orders", Some(key), body).await;
        let (mut last, mut sent) = (first.clone(), 1);
        while last.status == StatusCode::CONFLICT {
            assert_eq!(
                last.header("retry-after"),
                Some("1"),
                "409 without Retry-After"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
            last = self.post(Some(user), "/orders", Some(key), body).await;
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
async fn concurrent_duplicates_run_the_handler_once_per_key() {
    let service = Arc::new(Service::start(Duration::from_millis(150), |_| {}).await);

    // 50 concurrent requests with one key.
    let started = Instant::now();
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let service = Arc::clone(&service);
            tokio::spawn(async move {
                service
                    .post_until_done("alice", "same-key", "book x1")
                    .await
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let elapsed = started.elapsed();
    let sent: usize = results.iter().map(|(_, _, n)| n).sum();
    let conflicts = results
        .iter()
        .filter(|(first, _, _)| first.status == StatusCode::CONFLICT)
        .count();
    let finals: Vec<Reply> = results.into_iter().map(|(_, last, _)| last).collect();
    assert_one_original_and_identical_replays(&finals);
    assert_eq!(service.shop.runs("alice", "same-key"), 1);
    assert!(conflicts > 0, "no duplicate arrived while the first ran");
    println!(
        "50 concurrent duplicates of one key: {sent} requests, {conflicts} answered 409 first, \
         {} handler execution, {:.0} ms",
        service.shop.total_runs(),
        elapsed.as_secs_f64() * 1e3
    );

    // 20 distinct keys, 5 concurrent duplicates each.
    let before = service.shop.total_runs();
    let started = Instant::now();
    let tasks: Vec<_> = (0..20)
        .flat_map(|k| (0..5).map(move |_| k))
        .map(|k| {
            let service = Arc::clone(&service);
            tokio::spawn(async move {
                let key = format!("key-{k}");
                let body = format!("item {k}");
                (k, service.post_until_done("bob", &key, &body).await)
            })
        })
        .collect();
    let mut by_key: HashMap<usize, Vec<Reply>> = HashMap::new();
    let mut sent = 0;
    for task in tasks {
        let (k, (_, last, n)) = task.await.unwrap();
        sent += n;
        by_key.entry(k).or_default().push(last);
    }
    let elapsed = started.elapsed();
    let mut locations = HashSet::new();
    for (k, replies) in &by_key {
        assert_eq!(replies.len(), 5);
        assert_one_original_and_identical_replays(replies);
        assert_eq!(service.shop.runs("bob", &format!("key-{k}")), 1, "key-{k}");
        locations.insert(replies[0].header("location").unwrap().to_string());
    }
    assert_eq!(locations.len(), 20, "each key created its own order");
    let runs = service.shop.total_runs() - before;
    assert_eq!(runs, 20);
    println!(
        "20 keys x 5 concurrent duplicates: {sent} requests, {runs} handler executions, {:.0} ms",
        elapsed.as_secs_f64() * 1e3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_is_byte_identical_and_carries_only_the_stored_headers() {
    let service = Service::start(Duration::ZERO, |_| {}).await;
    let first = service
        .post(Some("alice"), "/orders", Some("\"k-1\""), "book x1")
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert!(first.header("x-request-id").is_some());
    // The quoted structured-field form and the bare form are the same key.
    for key in ["\"k-1\"", "k-1"] {
        let again = service
            .post(Some("alice"), "/orders", Some(key), "book x1")
            .await;
        assert!(again.replayed(), "{key}: {again:?}");
        assert_eq!((again.status, &again.body), (first.status, &first.body));
        assert_eq!(again.header("location"), Some("/orders/1"));
        assert_eq!(again.header("content-type"), Some("application/json"));
        assert_eq!(
            again.header("x-request-id"),
            None,
            "not in the replayed subset"
        );
    }
    assert_eq!(service.shop.runs("alice", "k-1"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_with_another_body_is_422_also_while_running() {
    let service = Arc::new(Service::start(Duration::from_millis(300), |_| {}).await);
    let running = tokio::spawn({
        let service = Arc::clone(&service);
        async move {
            service
                .post(Some("alice"), "/orders", Some("k"), "book x1")
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let in_progress = service
        .post(Some("alice"), "/orders", Some("k"), "book x1")
        .await;
    assert_eq!(in_progress.status, StatusCode::CONFLICT);
    assert_eq!(in_progress.header("retry-after"), Some("1"));
    assert_eq!(
        in_progress.header("content-type"),
        Some("application/problem+json")
    );
    let other = service
        .post(Some("alice"), "/orders", Some("k"), "book x9")
        .await;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        other.text()
    );
    assert!(other.text().contains("Idempotency-Key is already used"));
    assert_eq!(running.await.unwrap().status, StatusCode::CREATED);
    let other = service
        .post(Some("alice"), "/orders", Some("k"), "book x9")
        .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(service.shop.runs("alice", "k"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_bad_keys_are_400_and_anonymous_callers_401() {
    let service = Service::start(Duration::ZERO, |_| {}).await;
    let missing = service.post(Some("alice"), "/orders", None, "book").await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert!(
        missing.text().contains("Idempotency-Key is missing"),
        "{}",
        missing.text()
    );
    let long = "k".repeat(256);
    let bad = service
        .post(Some("alice"), "/orders", Some(&long), "book")
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.text().contains("256 bytes"), "{}", bad.text());
    let anonymous = service.post(None, "/orders", Some("k"), "book").await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert_eq!(service.shop.total_runs(), 0, "no handler ran");
    let health = service
        .client
        .get(format!("{}/health", service.base))
        .send()
        .await
        .unwrap();
    assert_eq!(
        health.status(),
        StatusCode::OK,
        "unguarded routes need no key"
    );

    // Configured to let keyless requests through, unguarded: they run every time.
    let open = Service::start(Duration::ZERO, |config| config.missing_key = None).await;
    for _ in 0..2 {
        let reply = open.post(Some("alice"), "/orders", None, "book").await;
        assert_eq!(
            (reply.status, reply.replayed()),
            (StatusCode::CREATED, false)
        );
    }
    assert_eq!(open.shop.runs("alice", "-"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_scoped_by_caller_and_route() {
    let service = Service::start(Duration::ZERO, |_| {}).await;
    let alice = service
        .post(Some("alice"), "/orders", Some("shared"), "book")
        .await;
    let bob = service
        .post(Some("bob"), "/orders", Some("shared"), "book")
        .await;
    assert_eq!((alice.replayed(), bob.replayed()), (false, false));
    assert_ne!(alice.body, bob.body, "bob must not get alice's order");
    let payment = service
        .post(Some("alice"), "/payments", Some("shared"), "book")
        .await;
    assert!(!payment.replayed(), "another route is another operation");
    assert_eq!(service.shop.runs("alice", "shared"), 2);
    assert_eq!(service.shop.runs("bob", "shared"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_is_released_and_a_retry_succeeds() {
    let service = Service::start(Duration::ZERO, |_| {}).await;
    let failed = service
        .post(Some("dave"), "/payments", Some("p-1"), "10 EUR")
        .await;
    assert_eq!(
        (failed.status, failed.replayed()),
        (StatusCode::SERVICE_UNAVAILABLE, false)
    );
    let retried = service
        .post(Some("dave"), "/payments", Some("p-1"), "10 EUR")
        .await;
    assert_eq!(
        (retried.status, retried.replayed()),
        (StatusCode::CREATED, false)
    );
    assert!(
        retried.text().contains("captured on attempt 2"),
        "{}",
        retried.text()
    );
    let replayed = service
        .post(Some("dave"), "/payments", Some("p-1"), "10 EUR")
        .await;
    assert!(replayed.replayed());
    assert_eq!(
        (replayed.status, &replayed.body),
        (retried.status, &retried.body)
    );
    assert_eq!(service.shop.runs("dave", "p-1"), 2);

    // Configured to store every status: the 503 itself is replayed.
    let strict = Service::start(Duration::ZERO, |config| config.store_status = |_| true).await;
    let failed = strict
        .post(Some("dave"), "/payments", Some("p-1"), "10 EUR")
        .await;
    let again = strict
        .post(Some("dave"), "/payments", Some("p-1"), "10 EUR")
        .await;
    assert_eq!(
        (again.status, again.replayed()),
        (StatusCode::SERVICE_UNAVAILABLE, true)
    );
    assert_eq!(again.body, failed.body);
    assert_eq!(strict.shop.runs("dave", "p-1"), 1);
}

#[test]
fn the_stored_response_encoding_round_trips_and_refuses_garbage() {
    use axum::http::{header, HeaderValue};
    let location = HeaderValue::from_static("/orders/7");
    let cookie_a = HeaderValue::from_static("a=1");
    let cookie_b = HeaderValue::from_static("b=2");
    let headers = [
        (&header::LOCATION, &location),
        (&header::SET_COOKIE, &cookie_a),
        (&header::SET_COOKIE, &cookie_b),
    ];
    let bytes = http_service::encode_response(axum::http::StatusCode::CREATED, &headers, b"\0body");
    let response = http_service::decode_response(&bytes).expect("decodes");
    assert_eq!(response.status(), axum::http::StatusCode::CREATED);
    assert_eq!(response.headers()["location"], "/orders/7");
    let cookies: Vec<_> = response.headers().get_all("set-cookie").iter().collect();
    assert_eq!(cookies, ["a=1", "b=2"]);
    for len in 0..bytes.len() - 5 {
        // Cut inside the header block: refused, never a partial response.
        assert!(
            http_service::decode_response(&bytes[..len]).is_none(),
            "{len}"
        );
    }
    assert!(
        http_service::decode_response(b"\x02\xc9\x00\x00").is_none(),
        "unknown version"
    );
}
