//! An HTTP service that implements the `Idempotency-Key` request header
//! (IETF draft-ietf-httpapi-idempotency-key-header) with axum middleware on an idemstore.
//!
//! ```text
//! cargo run --example http_service                  # a demo: starts, sends requests, prints, exits
//! cargo run --example http_service -- --serve 127.0.0.1:3000 --store shop.idem
//! curl -i -X POST localhost:3000/orders -H 'Authorization: Bearer alice' \
//!      -H 'Idempotency-Key: "k-1"' -d 'book x1'
//! ```
//!
//! The demo starts the service on a free port of 127.0.0.1 with a store in a temporary
//! directory, sends a handful of requests with reqwest, and prints one line per request: the
//! status, `Idempotent-Replayed`, `Retry-After` and the body. `tests/http.rs` includes this file
//! as a module and drives the same middleware with hundreds of concurrent requests.
//!
//! What the middleware does, on every route it guards ([`Idempotency::guard`]):
//! - the key is scoped by the caller (`Authorization: Bearer <user>`; none is 401) and the
//!   route (method and path), so one user's key never returns another's response;
//! - a missing key is 400 (configurable: [`Idempotency::missing_key`]); a key longer than 255
//!   bytes is 400; the key may be sent bare or as a quoted structured-field string;
//! - the request body's fingerprint is stored with the key: the same key with another body is
//!   422, also while the first request is running;
//! - while the first request runs, a duplicate gets 409 with `Retry-After`;
//! - the first request's response (status, a chosen subset of headers, body) is stored and
//!   replayed, byte for byte, to every duplicate, with `Idempotent-Replayed: true`;
//! - a server error (5xx) is not stored: the key is released, so a retry runs the handler
//!   again (configurable per status: [`Idempotency::store_status`]).
//!
//! Stored responses use a small encoding, see [`encode_response`].

use std::collections::HashMap;
use std::error::Error;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{to_bytes, Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use idemstore::{Fingerprint, Key, Lease, Reservation, Store, MAX_KEY_PART_LEN};

/// The request header that carries the client's key.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Set to `true` on a response replayed from the store.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// The problem type of every refusal by the middleware (RFC 9457 problem details).
pub const PROBLEM_TYPE: &str = "https://developer.example.com/idempotency";

/// Configuration of the `Idempotency-Key` middleware. [`Idempotency::new`] has the defaults.
#[derive(Clone)]
pub struct Idempotency {
    /// The store that holds keys and responses.
    pub store: Arc<Store>,
    /// The answer to a guarded request without a key; `None` lets it through unguarded.
    /// Default: `Some(400 Bad Request)`, as the draft says.
    pub missing_key: Option<StatusCode>,
    /// Which responses are stored and replayed; the key of any other response is released so
    /// that a retry runs the handler again. Default: everything but 5xx.
    pub store_status: fn(StatusCode) -> bool,
    /// The response headers stored with status and body and replayed. Default: `content-type`
    /// and `location`. Others (a request id, a date) belong to one response only.
    pub replay_headers: Vec<HeaderName>,
    /// The longest `Retry-After` on a 409. The store knows when the running request's lease
    /// ends, but most requests finish long before: default 1 s.
    pub max_retry_after: Duration,
    /// The largest request body read (and fingerprinted); larger is 413. Default: 1 MiB.
    pub max_body: usize,
}

impl Idempotency {
    /// The defaults described on each field.
    pub fn new(store: Arc<Store>) -> Idempotency {
        Idempotency {
            store,
            missing_key: Some(StatusCode::BAD_REQUEST),
            store_status: |status| !status.is_server_error(),
            replay_headers: vec![header::CONTENT_TYPE, header::LOCATION],
            max_retry_after: Duration::from_secs(1),
            max_body: 1 << 20,
        }
    }

    /// Guards every route of `router` (add it after the routes, as `route_layer` does).
    pub fn guard<S: Clone + Send + Sync + 'static>(self, router: Router<S>) -> Router<S> {
        router.route_layer(middleware::from_fn_with_state(Arc::new(self), idempotency))
    }
}

/// An RFC 9457 problem response.
fn problem(status: StatusCode, title: &str, detail: &str) -> Response {
    let body = format!(
        r#"{{"type":"{PROBLEM_TYPE}","title":"{title}","detail":"{}"}}"#,
        detail.replace('\\', "\\\\").replace('"', "\\\"")
    );
    let mut response = (status, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

/// The caller's identity: `Authorization: Bearer <user>`. A real service verifies a token here.
fn caller(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let user = value.strip_prefix("Bearer ")?.trim();
    (!user.is_empty()).then_some(user)
}

/// The key's value: a quoted structured-field string (`"abc"`, as the draft writes it) or a
/// bare token (`abc`, as most clients send it).
fn key_value(headers: &HeaderMap) -> Option<&[u8]> {
    let raw = headers.get(IDEMPOTENCY_KEY)?.as_bytes();
    Some(match raw {
        [b'"', inner @ .., b'"'] => inner,
        other => other,
    })
}

/// The middleware. See the module docs for what it answers.
pub async fn idempotency(
    State(config): State<Arc<Idempotency>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(user) = caller(request.headers()).map(str::to_owned) else {
        return problem(
            StatusCode::UNAUTHORIZED,
            "Authentication required",
            "send Authorization: Bearer <user>",
        );
    };
    let Some(id) = key_value(request.headers()).map(<[u8]>::to_vec) else {
        return match config.missing_key {
            Some(status) => problem(
                status,
                "Idempotency-Key is missing",
                "This operation is idempotent and it requires correct usage of Idempotency Key.",
            ),
            None => next.run(request).await,
        };
    };
    let operation = format!("{} {}", request.method(), request.uri().path());
    let key = match Key::new(&user, &operation, &id) {
        Ok(key) => key,
        Err(error) => {
            let detail = format!("{error} (at most {MAX_KEY_PART_LEN} bytes)");
            return problem(StatusCode::BAD_REQUEST, "Invalid Idempotency-Key", &detail);
        }
    };
    let (parts, body) = request.into_parts();
    let Ok(body) = to_bytes(body, config.max_body).await else {
        let detail = format!("the body is over {} bytes", config.max_body);
        return problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Request body too large",
            &detail,
        );
    };
    let reservation = match config
        .store
        .reserve_async(&key, Fingerprint::of(&body))
        .await
    {
        Ok(reservation) => reservation,
        Err(error) => return store_failure(&error),
    };
    match reservation {
        Reservation::Acquired(lease) => {
            let request = Request::from_parts(parts, Body::from(body));
            run_and_store(&config, lease, next.run(request).await).await
        }
        Reservation::Completed(done) => match decode_response(&done.result) {
            Some(mut response) => {
                response
                    .headers_mut()
                    .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
                response
            }
            None => problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Stored response unreadable",
                "the stored response for this key does not decode",
            ),
        },
        Reservation::InProgress { retry_after, .. } => {
            let secs = retry_after.min(config.max_retry_after).as_secs_f64().ceil();
            let mut response = problem(
                StatusCode::CONFLICT,
                "A request is outstanding for this Idempotency-Key",
                "A request with the same Idempotency-Key for the same operation is being processed or is outstanding.",
            );
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(secs.max(1.0) as u64),
            );
            response
        }
        Reservation::Mismatch => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Idempotency-Key is already used",
            "This operation is idempotent and it requires correct usage of Idempotency Key. Idempotency Key MUST not be reused across different payloads of this operation.",
        ),
        Reservation::NeedsReview { note } => problem(
            StatusCode::CONFLICT,
            "The request for this Idempotency-Key is under review",
            &format!("Its outcome is being checked by a person: {note}"),
        ),
        other => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Unexpected reservation",
            &format!("{other:?}"),
        ),
    }
}

/// After the handler ran under `lease`: store its response (or release the key) and return it.
///
/// If this future is dropped while the handler runs (the client went away), the reservation is
/// left as it is: it goes stale when its lease ends, and a retry then takes it over with
/// `attempt > 1`. Releasing it blindly could repeat work that already had effects.
async fn run_and_store(config: &Idempotency, lease: Lease, response: Response) -> Response {
    let (parts, body) = response.into_parts();
    let body = match to_bytes(body, usize::MAX).await {
        Ok(body) => body,
        Err(error) => {
            release(config, lease).await;
            let detail = format!("reading the response failed: {error}");
            return problem(StatusCode::INTERNAL_SERVER_ERROR, "Handler failed", &detail);
        }
    };
    if (config.store_status)(parts.status) {
        let headers: Vec<(&HeaderName, &HeaderValue)> = config
            .replay_headers
            .iter()
            .flat_map(|name| parts.headers.get_all(name).iter().map(move |v| (name, v)))
            .collect();
        let stored = encode_response(parts.status, &headers, &body);
        if let Err(error) = config.store.complete_async(&lease, stored).await {
            // Too large to store, or the lease was lost: this client still gets its answer.
            eprintln!("not stored: {error}");
            release(config, lease).await;
        }
    } else {
        release(config, lease).await;
    }
    Response::from_parts(parts, Body::from(body))
}

/// Releases the key if it is still pending under `lease`, off the runtime's threads (the
/// release waits for a sync, and the store has no async release).
async fn release(config: &Idempotency, lease: Lease) {
    let store = Arc::clone(&config.store);
    let released = tokio::task::spawn_blocking(move || store.release_if_pending(&lease)).await;
    if let Ok(Err(error)) = released {
        eprintln!("release failed: {error}");
    }
}

fn store_failure(error: &idemstore::Error) -> Response {
    let mut response = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "Idempotency store unavailable",
        &error.to_string(),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(1));
    response
}

/// Version byte of [`encode_response`]'s layout.
const RESPONSE_FORMAT: u8 = 1;

/// Encodes a response as the key's stored result. All integers are little-endian:
///
/// | bytes | field |
/// |---|---|
/// | 1 | format version, 1 |
/// | 2 | status code |
/// | 1 | number of headers, n (at most 255 are stored) |
/// | n × (1 + name + 2 + value) | each header: name length, name (lowercase), value length, value |
/// | rest | the body, as sent |
pub fn encode_response(
    status: StatusCode,
    headers: &[(&HeaderName, &HeaderValue)],
    body: &[u8],
) -> Vec<u8> {
    let headers: Vec<_> = headers
        .iter()
        .filter(|(name, value)| name.as_str().len() <= 255 && value.len() <= usize::from(u16::MAX))
        .take(255)
        .collect();
    let mut out = Vec::with_capacity(4 + body.len());
    out.push(RESPONSE_FORMAT);
    out.extend_from_slice(&status.as_u16().to_le_bytes());
    out.push(headers.len() as u8);
    for (name, value) in headers {
        out.push(name.as_str().len() as u8);
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(&(value.len() as u16).to_le_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out.extend_from_slice(body);
    out
}

/// Decodes [`encode_response`]'s bytes; `None` when they are not in that layout.
pub fn decode_response(bytes: &[u8]) -> Option<Response> {
    fn take<'a>(rest: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, tail) = rest.split_at_checked(n)?;
        *rest = tail;
        Some(head)
    }
    let mut rest = bytes;
    if take(&mut rest, 1)? != [RESPONSE_FORMAT] {
        return None;
    }
    let status = u16::from_le_bytes(take(&mut rest, 2)?.try_into().ok()?);
    let count = take(&mut rest, 1)?[0];
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::from_u16(status).ok()?;
    for _ in 0..count {
        let name_len = usize::from(take(&mut rest, 1)?[0]);
        let name = HeaderName::from_bytes(take(&mut rest, name_len)?).ok()?;
        let value_len = usize::from(u16::from_le_bytes(take(&mut rest, 2)?.try_into().ok()?));
        let value = HeaderValue::from_bytes(take(&mut rest, value_len)?).ok()?;
        response.headers_mut().append(name, value);
    }
    *response.body_mut() = Body::from(Bytes::copy_from_slice(rest));
    Some(response)
}

/// The demo shop behind the middleware. It counts how often its handlers run per caller and
/// key, so the tests can check that each key's work runs once.
#[derive(Default)]
pub struct Shop {
    /// Handler executions per `user key` (the key as the client sent it).
    pub executions: Mutex<HashMap<String, usize>>,
    /// How long a handler "works", so that duplicates arrive while it runs.
    pub work: Duration,
    orders: AtomicU64,
    /// Payments attempted per key: the first attempt of each key fails with 503.
    payment_attempts: Mutex<HashMap<String, usize>>,
}

impl Shop {
    /// A shop whose handlers take `work` each.
    pub fn new(work: Duration) -> Shop {
        Shop {
            work,
            ..Shop::default()
        }
    }

    /// How many times a handler ran for `user`'s `key`.
    pub fn runs(&self, user: &str, key: &str) -> usize {
        let executions = self.executions.lock().expect("not poisoned");
        executions
            .get(&format!("{user} {key}"))
            .copied()
            .unwrap_or(0)
    }

    /// Every handler execution.
    pub fn total_runs(&self) -> usize {
        self.executions.lock().expect("not poisoned").values().sum()
    }

    fn count(&self, headers: &HeaderMap) -> String {
        let user = caller(headers).unwrap_or("-");
        let key = key_value(headers).map_or("-".into(), String::from_utf8_lossy);
        let id = format!("{user} {key}");
        *self
            .executions
            .lock()
            .expect("not poisoned")
            .entry(id.clone())
            .or_default() += 1;
        id
    }
}

/// `POST /orders`: creates an order (201, `Location`, a JSON body).
async fn create_order(State(shop): State<Arc<Shop>>, headers: HeaderMap, body: Bytes) -> Response {
    shop.count(&headers);
    tokio::time::sleep(shop.work).await;
    let n = shop.orders.fetch_add(1, Ordering::SeqCst) + 1;
    let user = caller(&headers).unwrap_or("-");
    let item = String::from_utf8_lossy(&body).replace('"', "'");
    let json = format!(r#"{{"order":{n},"user":"{user}","item":"{item}"}}"#);
    let mut response = (StatusCode::CREATED, json).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/orders/{n}")).expect("ascii"),
    );
    // Not in the replayed subset: it belongs to this response only.
    headers.insert("x-request-id", HeaderValue::from(n));
    response
}

/// `POST /payments`: the first attempt of each key fails with 503 (a gateway hiccup); a retry
/// with the same key succeeds with 201.
async fn create_payment(State(shop): State<Arc<Shop>>, headers: HeaderMap) -> Response {
    let id = shop.count(&headers);
    tokio::time::sleep(shop.work).await;
    let attempt = {
        let mut attempts = shop.payment_attempts.lock().expect("not poisoned");
        let attempt = attempts.entry(id).or_default();
        *attempt += 1;
        *attempt
    };
    if attempt == 1 {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "payment gateway unavailable",
        )
            .into_response();
    }
    let n = shop.orders.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        format!("payment {n} captured on attempt {attempt}"),
    )
        .into_response()
}

/// `GET /health`: not guarded.
async fn health() -> &'static str {
    "ok"
}

/// The service: `POST /orders` and `POST /payments` guarded by `config`, `GET /health` not.
pub fn app(config: Idempotency, shop: Arc<Shop>) -> Router {
    let guarded = Router::new()
        .route("/orders", post(create_order))
        .route("/payments", post(create_payment));
    config
        .guard(guarded)
        .route("/health", get(health))
        .with_state(shop)
}

/// Binds `addr` and serves `app` in a background task; returns the bound address.
pub async fn spawn_server(addr: SocketAddr, app: Router) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            eprintln!("server stopped: {error}");
        }
    });
    Ok(bound)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let (mut serve, mut store_path): (Option<SocketAddr>, Option<PathBuf>) = (None, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--serve" => serve = Some(args.next().ok_or("--serve ADDR")?.parse()?),
            "--store" => store_path = Some(args.next().ok_or("--store PATH")?.into()),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let dir = tempfile::tempdir()?;
    let path = store_path.unwrap_or_else(|| dir.path().join("shop.idem"));
    let store = Arc::new(Store::open(&path)?);
    let shop = Arc::new(Shop::new(Duration::from_millis(300)));
    let app = app(Idempotency::new(Arc::clone(&store)), Arc::clone(&shop));

    if let Some(addr) = serve {
        let bound = spawn_server(addr, app).await?;
        println!(
            "serving on http://{bound} with store {}; Ctrl-C stops",
            path.display()
        );
        tokio::signal::ctrl_c().await?;
        return Ok(());
    }

    let addr = spawn_server("127.0.0.1:0".parse()?, app).await?;
    println!("demo service on http://{addr}, store {}", path.display());
    let client = reqwest::Client::new();
    let send =
        |user: &'static str, route: &'static str, key: Option<&'static str>, body: &'static str| {
            let mut request = client
                .post(format!("http://{addr}{route}"))
                .header("authorization", format!("Bearer {user}"))
                .body(body);
            if let Some(key) = key {
                request = request.header("idempotency-key", key);
            }
            async move {
                let response = request.send().await?;
                let mut line = response.status().as_u16().to_string();
                for name in ["idempotent-replayed", "retry-after", "location"] {
                    if let Some(value) = response.headers().get(name) {
                        line += &format!("  {name}: {}", value.to_str().unwrap_or("?"));
                    }
                }
                let body = response.text().await?;
                Ok::<_, reqwest::Error>(format!("{line}  {body}"))
            }
        };
    let steps: [(
        &str,
        &'static str,
        &'static str,
        Option<&'static str>,
        &'static str,
    ); 4] = [
        (
            "first request",
            "alice",
            "/orders",
            Some("\"k-1\""),
            "book x1",
        ),
        (
            "the client retries",
            "alice",
            "/orders",
            Some("\"k-1\""),
            "book x1",
        ),
        (
            "same key, other body",
            "alice",
            "/orders",
            Some("\"k-1\""),
            "book x9",
        ),
        (
            "same key, other user",
            "bob",
            "/orders",
            Some("\"k-1\""),
            "book x1",
        ),
    ];
    for (what, user, route, key, body) in steps {
        println!("{what:>28}: {}", send(user, route, key, body).await?);
    }
    let (first, second) = tokio::join!(send("carol", "/orders", Some("k-2"), "pen x2"), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        send("carol", "/orders", Some("k-2"), "pen x2").await
    });
    println!("{:>28}: {}", "two at once (first)", first?);
    println!("{:>28}: {}", "two at once (second)", second?);
    println!(
        "{:>28}: {}",
        "no key",
        send("alice", "/orders", None, "book x1").await?
    );
    println!(
        "{:>28}: {}",
        "payment, gateway fails",
        send("dave", "/payments", Some("p-1"), "10 EUR").await?
    );
    println!(
        "{:>28}: {}",
        "payment retried",
        send("dave", "/payments", Some("p-1"), "10 EUR").await?
    );
    println!(
        "{:>28}: {}",
        "payment retried again",
        send("dave", "/payments", Some("p-1"), "10 EUR").await?
    );
    println!("handler executions: {}", shop.total_runs());
    Ok(())
}
