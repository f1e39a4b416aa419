//! `idemstore::actix::Idempotency` over real HTTP: an actix-web server on 127.0.0.1 (port 0)
//! with the middleware added in one `.wrap(...)` line, driven by a plain HTTP client
//! (reqwest). The answers are those of the tower layer (`tests/http.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::http::header;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use idemstore::actix::Idempotency;
use idemstore::Store;
use reqwest::StatusCode;

/// The handlers behind the middleware. They count how often they run, per `user key`.
#[derive(Default)]
struct Shop {
    runs: Mutex<HashMap<String, usize>>,
    orders: AtomicU64,
    work: Duration,
}

impl Shop {
    fn count(&self, request: &HttpRequest) -> usize {
        let text = |name: &str| {
            request.headers().get(name).map_or("-".into(), |v| {
                String::from_utf8_lossy(v.as_bytes()).into_owned()
            })
        };
        let user = text("authorization")
            .trim_start_matches("Bearer ")
            .to_owned();
        let id = format!("{user} {}", text("idempotency-key").trim_matches('"'));
        let mut runs = self.runs.lock().expect("not poisoned");
        let n = runs.entry(id).or_default();
        *n += 1;
        *n
    }

    fn runs(&self, user: &str, key: &str) -> usize {
        let runs = self.runs.lock().expect("not poisoned");
        runs.get(&format!("{user} {key}")).copied().unwrap_or(0)
    }
}

/// `POST /orders`: 201, `Location`, a cookie and a request id (not replayed), and a body with
/// bytes that are not UTF-8.
async fn create(shop: web::Data<Shop>, request: HttpRequest, item: web::Bytes) -> HttpResponse {
    shop.count(&request);
    tokio::time::sleep(shop.work).await;
    let n = shop.orders.fetch_add(1, Ordering::SeqCst) + 1;
    let mut body = format!(r#"{{"order":{n},"item":""#).into_bytes();
    body.extend(item.iter().filter(|b| b.is_ascii_alphanumeric()));
    body.extend_from_slice(b"\"}\0\xff\xfe");
    HttpResponse::Created()
        .content_type("application/json")
        .insert_header((header::LOCATION, n.to_string()))
        .insert_header((header::SET_COOKIE, "a=1"))
        .insert_header(("x-request-id", n.to_string()))
        .body(body)
}

/// `POST /payments`: the first run of each key fails with 503, later runs succeed.
async fn pay(shop: web::Data<Shop>, request: HttpRequest) -> HttpResponse {
    match shop.count(&request) {
        1 => HttpResponse::ServiceUnavailable().body("gateway unavailable"),
        n => HttpResponse::Created().body(format!("payment captured on run {n}")),
    }
}

/// `POST /panics`: the first run of each key panics, later runs succeed.
async fn panics(shop: web::Data<Shop>, request: HttpRequest) -> HttpResponse {
    let run = shop.count(&request);
    assert!(
        run > 1,
        "the handler panics on its first run (deliberately)"
    );
    HttpResponse::Created().body(format!("done on run {run}"))
}

/// The caller: `Authorization: Bearer <user>`.
fn bearer(request: &HttpRequest) -> Option<Vec<u8>> {
    let value = request.headers().get(header::AUTHORIZATION)?.as_bytes();
    Some(value.strip_prefix(b"Bearer ")?.to_vec())
}

/// A running server (on its own actix system thread) with its own store, and a client.
struct Service {
    _dir: tempfile::TempDir,
    addr: std::net::SocketAddr,
    shop: web::Data<Shop>,
    handle: ServerHandle,
    client: reqwest::Client,
}

impl Drop for Service {
    fn drop(&mut self) {
        drop(self.handle.stop(false));
    }
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
    /// The server over a store whose lease is one hour: a key released within a test was
    /// released by the middleware, not by its lease.
    fn start(work: Duration) -> Service {
        Service::start_with(work, |middleware| middleware)
    }

    /// The server with the middleware configured further by `configure`.
    fn start_with(
        work: Duration,
        configure: impl Fn(Idempotency<Store>) -> Idempotency<Store> + Send + Clone + 'static,
    ) -> Service {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = Arc::new(
            Store::builder()
                .lease(Duration::from_secs(3600))
                .open(dir.path().join("actix.idem"))
                .expect("open store"),
        );
        let shop = web::Data::new(Shop {
            work,
            ..Shop::default()
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let app_shop = shop.clone();
        std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let server = HttpServer::new(move || {
                    App::new()
                        .wrap(configure(
                            Idempotency::new(Arc::clone(&store))
                                .scope(bearer)
                                .max_body(64),
                        ))
                        .app_data(app_shop.clone())
                        .route("/orders", web::post().to(create))
                        .route("/payments", web::post().to(pay))
                        .route("/panics", web::post().to(panics))
                        .route("/health", web::get().to(|| async { "ok" }))
                })
                .workers(2)
                .bind(("127.0.0.1", 0))
                .expect("bind");
                let addr = server.addrs()[0];
                let server = server.run();
                tx.send((addr, server.handle())).expect("test waits");
                server.await.expect("server ran");
            });
        });
        let (addr, handle) = rx.recv().expect("server started");
        Service {
            _dir: dir,
            addr,
            shop,
            handle,
            client: reqwest::Client::new(),
        }
    }

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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_run_the_handler_once_per_key() {
    let service = Arc::new(Service::start(Duration::from_millis(300)));
    let mut calls = Vec::new();
    for key in 0..4 {
        for _ in 0..25 {
            let service = Arc::clone(&service);
            calls.push(tokio::spawn(async move {
                let key = format!("dup-{key}");
                (
                    key.clone(),
                    service.post("ann", "/orders", Some(&key), "book").await,
                )
            }));
        }
    }
    let mut created: HashMap<String, Vec<Reply>> = HashMap::new();
    let mut conflicts = 0;
    for call in calls {
        let (key, reply) = call.await.expect("task");
        match reply.status {
            StatusCode::CREATED => created.entry(key).or_default().push(reply),
            StatusCode::CONFLICT => {
                assert_eq!(reply.header("retry-after"), Some("1"));
                assert_eq!(
                    reply.header("content-type"),
                    Some("application/problem+json")
                );
                conflicts += 1;
            }
            other => panic!("unexpected {other}: {}", reply.text()),
        }
    }
    for key in 0..4 {
        let key = format!("dup-{key}");
        assert_eq!(service.shop.runs("ann", &key), 1, "{key}");
        let replies = &created[&key];
        assert!(replies.iter().all(|r| r.body == replies[0].body));
    }
    assert!(conflicts > 0, "some duplicates arrived while the first ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_is_byte_identical_with_the_chosen_headers_only() {
    let service = Service::start(Duration::ZERO);
    let first = service.post("bea", "/orders", Some("\"r-1\""), "pen").await;
    let retry = service.post("bea", "/orders", Some("r-1"), "pen").await;
    assert_eq!(service.shop.runs("bea", "r-1"), 1);
    assert_eq!(
        (first.status, first.replayed()),
        (StatusCode::CREATED, false)
    );
    assert_eq!(
        (retry.status, retry.replayed()),
        (StatusCode::CREATED, true)
    );
    assert_eq!(retry.body, first.body, "replayed body differs");
    assert!(first.body.ends_with(b"\0\xff\xfe"));
    for name in ["content-type", "location"] {
        assert_eq!(retry.header(name), first.header(name), "{name}");
    }
    assert!(first.header("set-cookie").is_some() && first.header("x-request-id").is_some());
    assert_eq!(
        (retry.header("set-cookie"), retry.header("x-request-id")),
        (None, None)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_with_another_body_is_422_also_while_running() {
    let service = Arc::new(Service::start(Duration::from_millis(500)));
    let running = tokio::spawn({
        let service = Arc::clone(&service);
        async move { service.post("cy", "/orders", Some("m-1"), "book").await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let during = service.post("cy", "/orders", Some("m-1"), "pen").await;
    let in_progress = service.post("cy", "/orders", Some("m-1"), "book").await;
    let first = running.await.expect("task");
    let after = service.post("cy", "/orders", Some("m-1"), "pen").await;
    for reply in [&during, &after] {
        assert_eq!(
            reply.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{}",
            reply.text()
        );
        assert!(reply.text().contains("#key-reused"), "{}", reply.text());
    }
    assert_eq!(in_progress.status, StatusCode::CONFLICT);
    assert_eq!(in_progress.header("retry-after"), Some("1"));
    assert!(in_progress.text().contains("#in-progress"));
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(service.shop.runs("cy", "m-1"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_releases_the_key_and_a_retry_runs_the_handler_again() {
    let service = Service::start(Duration::ZERO);
    let failed = service.post("dee", "/payments", Some("p-1"), "10").await;
    assert_eq!(
        (failed.status, failed.replayed()),
        (StatusCode::SERVICE_UNAVAILABLE, false)
    );
    let paid = service.post("dee", "/payments", Some("p-1"), "10").await;
    assert_eq!((paid.status, paid.replayed()), (StatusCode::CREATED, false));
    let again = service.post("dee", "/payments", Some("p-1"), "10").await;
    assert_eq!(
        (again.status, again.replayed()),
        (StatusCode::CREATED, true)
    );
    assert_eq!(again.text(), "payment captured on run 2");
    assert_eq!(service.shop.runs("dee", "p-1"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_leaves_the_key_released() {
    let service = Service::start(Duration::ZERO);
    let crashed = service.try_post("eve", "/panics", Some("x-1"), "job").await;
    assert!(crashed.is_err(), "the connection closes: {crashed:?}");
    assert_eq!(service.shop.runs("eve", "x-1"), 1);
    // The store's lease is an hour: only the middleware's release lets the retry run. (The
    // panic took down its worker thread: while actix-web starts another one, a connection may
    // be refused; a retry then tries again, as a client would.)
    let mut done = None;
    for _ in 0..100 {
        match service.try_post("eve", "/panics", Some("x-1"), "job").await {
            Ok(reply) if reply.status != StatusCode::CONFLICT => {
                done = Some(reply);
                break;
            }
            Ok(_) => {}
            Err(error) => assert!(error.is_connect(), "{error}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let done = done.expect("the key was released");
    assert_eq!((done.status, done.replayed()), (StatusCode::CREATED, false));
    assert_eq!(done.text(), "done on run 2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_problems_with_the_tower_layers_statuses() {
    let service = Service::start(Duration::ZERO);
    let missing = service.post("fay", "/orders", None, "book").await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.header("content-type"),
        Some("application/problem+json")
    );
    assert!(
        missing.text().contains(r#""status":400"#),
        "{}",
        missing.text()
    );
    let long = "k".repeat(256);
    let invalid = service.post("fay", "/orders", Some(&long), "book").await;
    assert_eq!(invalid.status, StatusCode::BAD_REQUEST);
    assert!(invalid.text().contains("255"), "{}", invalid.text());
    let large = service
        .post("fay", "/orders", Some("big"), &"x".repeat(65))
        .await;
    assert_eq!(large.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(large.text().contains(r#""limit":64"#), "{}", large.text());
    let anonymous = service
        .client
        .post(format!("http://{}/orders", service.addr))
        .header("idempotency-key", "a-1")
        .body("book")
        .send()
        .await
        .expect("answered");
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(anonymous.headers()["www-authenticate"], "Bearer");
    assert_eq!(service.shop.runs("fay", "-"), 0, "no handler ran");
    // Methods that are not guarded pass through.
    let health = service
        .client
        .get(format!("http://{}/health", service.addr))
        .send()
        .await
        .expect("answered");
    assert_eq!(health.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_stored_limit_is_sent_and_then_410() {
    let service = Service::start_with(Duration::ZERO, |m| m.max_stored_response(8));
    let first = service.post("gus", "/orders", Some("big-1"), "book").await;
    assert_eq!(
        (first.status, first.replayed()),
        (StatusCode::CREATED, false)
    );
    assert!(
        first.body.ends_with(b"\0\xff\xfe"),
        "sent whole: {}",
        first.text()
    );
    let retry = service.post("gus", "/orders", Some("big-1"), "book").await;
    assert_eq!(retry.status, StatusCode::GONE, "{}", retry.text());
    assert!(
        retry.text().contains("#response-not-stored"),
        "{}",
        retry.text()
    );
    assert_eq!(
        service.shop.runs("gus", "big-1"),
        1,
        "the work is not run again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_keys_are_400_naming_the_rule_as_with_the_tower_layer() {
    let service = Service::start(Duration::ZERO);
    for (value, rule) in crate::http::MALFORMED_KEYS {
        let shown = String::from_utf8_lossy(value);
        let value =
            reqwest::header::HeaderValue::from_bytes(value).expect("a value HTTP can carry");
        let response = service
            .client
            .post(format!("http://{}/orders", service.addr))
            .header("authorization", "Bearer alice")
            .header("idempotency-key", value)
            .body("book")
            .send()
            .await
            .expect("answered");
        assert_eq!(
            response.status(),
            reqwest::StatusCode::BAD_REQUEST,
            "{shown:?}"
        );
        let body = response.text().await.expect("body");
        assert!(
            body.contains("key-invalid") && body.contains(rule),
            "{shown:?}: {body}"
        );
    }
    assert!(
        service.shop.runs.lock().expect("not poisoned").is_empty(),
        "no handler ran"
    );
}
