//! The server of the guarded-service benchmark (`loadgen/guarded/run.sh`, BENCHMARKS.md): one
//! small axum service, `POST .../api` answering 200 with a 40-byte JSON body and counting an
//! order, under four routes that differ only in what guards them:
//!
//! | route | guard |
//! |---|---|
//! | `POST /plain/api` | none |
//! | `POST /await/api` | none, but the request waits once (`tokio::task::yield_now`) before the handler, as a service's own middleware or database call makes it wait |
//! | `POST /layer/api` | `IdempotencyLayer` over a store opened with `Store::open`'s defaults (durable) |
//! | `POST /buffered/api` | `IdempotencyLayer` over a store on `Durability::Buffered` (50 ms) |
//! | `POST /redis/api` | a Redis-backed guard written the way such middleware usually is: `SET key pending NX PX`, the handler, then `SET key response PX` (a duplicate: `GET key`) |
//!
//! `GET /stats` answers `cpu_us=<user + system CPU of this process, µs> orders=<orders>`, which
//! the benchmark reads before and after each run.
//!
//! ```text
//! cargo run --release -p idemstore-loadgen --bin guarded_service -- --listen 127.0.0.1:8088 \
//!     --dir /some/empty/dir [--redis redis://127.0.0.1:6390/]
//! curl -X POST localhost:8088/layer/api -H 'Idempotency-Key: "k-1"' -d '{"item":"book"}'
//! ```
//!
//! Without `--redis` the Redis route answers 503. It prints `listening on <address>` once it
//! serves, and runs until killed.

use std::error::Error;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use clap::Parser;
use idemstore::http::IdempotencyLayer;
use idemstore::{Durability, Fingerprint, Store};
use redis::aio::MultiplexedConnection;

#[derive(Parser)]
struct Args {
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:8088")]
    listen: SocketAddr,
    /// Folder for the two store files (`layer.idem`, `buffered.idem`).
    #[arg(long)]
    dir: PathBuf,
    /// The Redis server of the Redis-backed guard (`appendfsync always` in the benchmark).
    #[arg(long)]
    redis: Option<String>,
}

/// Orders counted by the handler, across every route.
static ORDERS: AtomicU64 = AtomicU64::new(0);

/// The service's one handler: counts an order and answers a 40-byte JSON body.
async fn create_order(_body: Bytes) -> Response {
    let n = ORDERS.fetch_add(1, Ordering::Relaxed) + 1;
    let body = format!(r#"{{"order":{n:010},"status":"accepted"}}"#);
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A middleware that holds the request across one wait (the task yields once) before the
/// handler runs: the plain service as it is when something before its handler awaits.
async fn wait_once(request: Request, next: Next) -> Response {
    tokio::task::yield_now().await;
    next.run(request).await
}

/// `cpu_us=… orders=…`: this process's CPU time so far (getrusage) and the orders counted.
async fn stats() -> String {
    // SAFETY: getrusage writes the struct it is given; a zeroed rusage is a valid value.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    let cpu = micros(usage.ru_utime) + micros(usage.ru_stime);
    format!("cpu_us={cpu} orders={}\n", ORDERS.load(Ordering::Relaxed))
}

/// How long the Redis guard holds a key while its handler runs, and keeps a response.
const REDIS_LEASE_MS: u64 = 60_000;
const REDIS_RETENTION_MS: u64 = 24 * 3600 * 1000;

/// A Redis-backed idempotency guard as such middleware is usually written: reserve the key
/// with `SET NX PX` (the value marks it pending, with the request's fingerprint), run the
/// handler, store the response with `SET PX`; a duplicate reads the key with `GET` and gets
/// 409 (pending), 422 (another fingerprint) or the stored response. A 5xx deletes the key.
async fn redis_guard(
    State(redis): State<Option<MultiplexedConnection>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(mut redis) = redis else {
        return (StatusCode::SERVICE_UNAVAILABLE, "no --redis given").into_response();
    };
    let Some(key) = request.headers().get("idempotency-key") else {
        return (StatusCode::BAD_REQUEST, "send an Idempotency-Key").into_response();
    };
    let key = format!(
        "idem:{}",
        String::from_utf8_lossy(key.as_bytes()).trim_matches('"')
    );
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 1 << 20).await else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "body too large").into_response();
    };
    let fingerprint = Fingerprint::of(&body);
    let pending = [b"P", &fingerprint.as_bytes()[..]].concat();
    let reserved: redis::RedisResult<Option<String>> = redis::cmd("SET")
        .arg(&key)
        .arg(&pending)
        .arg("NX")
        .arg("PX")
        .arg(REDIS_LEASE_MS)
        .query_async(&mut redis)
        .await;
    match reserved {
        Ok(Some(_)) => {}
        Ok(None) => return redis_duplicate(&mut redis, &key, fingerprint).await,
        Err(_) => return (StatusCode::SERVICE_UNAVAILABLE, "redis failed").into_response(),
    }
    let response = next.run(Request::from_parts(parts, Body::from(body))).await;
    let (parts, body) = response.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 1 << 20).await else {
        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(&key).query_async(&mut redis).await;
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let outcome: redis::RedisResult<()> = if parts.status.is_server_error() {
        redis::cmd("DEL").arg(&key).query_async(&mut redis).await
    } else {
        let mut stored = Vec::with_capacity(35 + body.len());
        stored.push(b'D');
        stored.extend_from_slice(fingerprint.as_bytes());
        stored.extend_from_slice(&parts.status.as_u16().to_le_bytes());
        stored.extend_from_slice(&body);
        redis::cmd("SET")
            .arg(&key)
            .arg(stored)
            .arg("PX")
            .arg(REDIS_RETENTION_MS)
            .query_async(&mut redis)
            .await
    };
    let _ = outcome; // Not stored: this client still gets its answer.
    Response::from_parts(parts, Body::from(body))
}

/// The answer to a key already in Redis.
async fn redis_duplicate(
    redis: &mut MultiplexedConnection,
    key: &str,
    fingerprint: Fingerprint,
) -> Response {
    let stored: redis::RedisResult<Option<Vec<u8>>> =
        redis::cmd("GET").arg(key).query_async(redis).await;
    let Ok(Some(stored)) = stored else {
        // Gone meanwhile (released): the client retries.
        return (StatusCode::CONFLICT, "retry").into_response();
    };
    let same = stored.get(1..33) == Some(&fingerprint.as_bytes()[..]);
    match stored.first() {
        _ if !same => (StatusCode::UNPROCESSABLE_ENTITY, "key reused").into_response(),
        Some(b'P') => (StatusCode::CONFLICT, "in progress").into_response(),
        Some(b'D') if stored.len() >= 35 => {
            let status = u16::from_le_bytes([stored[33], stored[34]]);
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            let mut response = Response::new(Body::from(stored[35..].to_vec()));
            *response.status_mut() = status;
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
            response
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.dir)?;
    let durable = Arc::new(Store::open(args.dir.join("layer.idem"))?);
    let buffered = Arc::new(
        Store::builder()
            .durability(Durability::Buffered {
                flush_interval: Duration::from_millis(50),
            })
            .open(args.dir.join("buffered.idem"))?,
    );
    let redis = match &args.redis {
        Some(url) => Some(
            redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?,
        ),
        None => None,
    };
    let route = || Router::new().route("/api", post(create_order));
    let app = Router::new()
        .nest("/plain", route())
        .nest("/await", route().layer(middleware::from_fn(wait_once)))
        .nest("/layer", route().layer(IdempotencyLayer::new(durable)))
        .nest("/buffered", route().layer(IdempotencyLayer::new(buffered)))
        .nest(
            "/redis",
            route().layer(middleware::from_fn_with_state(redis, redis_guard)),
        )
        .route("/stats", get(stats));
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
