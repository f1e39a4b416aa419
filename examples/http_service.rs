//! An axum service that honours the `Idempotency-Key` request header: one `.layer(...)` line
//! with [`IdempotencyLayer`] (feature `http`, on by default).
//!
//! ```text
//! cargo run --example http_service                  # a demo: starts, sends requests, prints, exits
//! cargo run --example http_service -- --serve 127.0.0.1:3000 --store shop.idem
//! curl -i -X POST localhost:3000/orders -H 'Authorization: Bearer alice' \
//!      -H 'Idempotency-Key: "k-1"' -d 'book x1'
//! cargo run -- stats shop.idem                      # the live view, while it serves
//! cargo run -- list shop.idem --state completed
//! ```
//!
//! With `--serve` the store is opened with a read-only admin socket (`shop.idem.admin`), so
//! the `idemstore` tool can look at it while the service runs.
//!
//! The demo starts the service on a free port of 127.0.0.1 with a store in a temporary
//! directory, sends a handful of requests with reqwest, and prints one line per request: the
//! status, `Idempotent-Replayed`, `Retry-After`, `Location` and the body. The first request
//! creates order 1; its retry is replayed; the same key with another body is 422; the same key
//! from another user creates order 2; of two requests sent at once, one runs and the other is
//! 409; a request without a key is 400; a payment whose first attempt fails with 503 runs
//! again on retry, then is replayed. `tests/http.rs` tests the layer over real HTTP.

use std::error::Error;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, request::Parts, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use idemstore::http::IdempotencyLayer;
use idemstore::{AdminSocket, Store};

/// The caller: `Authorization: Bearer <user>`. A real service verifies a token here.
fn caller(request: &Parts) -> Option<Vec<u8>> {
    let value = request.headers.get(header::AUTHORIZATION)?.as_bytes();
    Some(value.strip_prefix(b"Bearer ")?.to_vec())
}

/// Orders and payments made so far.
#[derive(Default)]
struct Shop {
    orders: AtomicU64,
    payments: AtomicU64,
}

/// `POST /orders`: works for a while, then 201 with `Location` and a JSON body.
async fn create_order(State(shop): State<Arc<Shop>>, item: String) -> impl IntoResponse {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let n = shop.orders.fetch_add(1, Ordering::SeqCst) + 1;
    let location = [(header::LOCATION, format!("/orders/{n}"))];
    (
        StatusCode::CREATED,
        location,
        format!(r#"{{"order":{n},"item":{item:?}}}"#),
    )
}

/// `POST /payments`: every odd attempt fails with 503 (the gateway hiccups).
async fn pay(State(shop): State<Arc<Shop>>) -> impl IntoResponse {
    match shop.payments.fetch_add(1, Ordering::SeqCst) + 1 {
        n if n % 2 == 1 => (
            StatusCode::SERVICE_UNAVAILABLE,
            "gateway unavailable".into(),
        ),
        n => (
            StatusCode::CREATED,
            format!("payment captured on attempt {n}"),
        ),
    }
}

/// The service: every `POST` and `PATCH` needs an `Idempotency-Key`, scoped by the caller.
fn app(store: Arc<Store>) -> Router {
    Router::new()
        .route("/orders", post(create_order))
        .route("/payments", post(pay))
        .route("/health", get(|| async { "ok" }))
        .layer(IdempotencyLayer::new(store).scope(caller))
        .with_state(Arc::new(Shop::default()))
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
    let mut builder = Store::builder();
    if serve.is_some() {
        // Operators can run `idemstore stats|get|list` on the file while this process owns it.
        builder.admin_socket(AdminSocket::ReadOnly);
    }
    let store = Arc::new(builder.open(&path)?);
    let listener =
        tokio::net::TcpListener::bind(serve.unwrap_or(([127, 0, 0, 1], 0).into())).await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(axum::serve(listener, app(store)).into_future());
    if serve.is_some() {
        println!("serving on http://{addr} with store {}", path.display());
        println!("live view: idemstore stats {}", path.display());
        return Ok(server.await??);
    }

    println!("demo service on http://{addr}, store {}", path.display());
    let client = reqwest::Client::new();
    let send = |user: &str, route: &str, key: Option<&str>, body: &'static str| {
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
            Ok::<_, reqwest::Error>(format!("{line}  {}", response.text().await?))
        }
    };
    let steps = [
        ("first request", "alice", "/orders", Some("\"k-1\""), "book"),
        (
            "the client retries",
            "alice",
            "/orders",
            Some("\"k-1\""),
            "book",
        ),
        (
            "same key, other body",
            "alice",
            "/orders",
            Some("\"k-1\""),
            "pen",
        ),
        (
            "same key, other user",
            "bob",
            "/orders",
            Some("\"k-1\""),
            "book",
        ),
    ];
    for (what, user, route, key, body) in steps {
        println!("{what:>24}: {}", send(user, route, key, body).await?);
    }
    let (first, second) = tokio::join!(send("carol", "/orders", Some("k-2"), "ink"), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        send("carol", "/orders", Some("k-2"), "ink").await
    });
    println!("{:>24}: {}", "two at once (first)", first?);
    println!("{:>24}: {}", "two at once (second)", second?);
    let steps = [
        ("no key", "/orders", None),
        ("payment, gateway fails", "/payments", Some("p-1")),
        ("payment retried", "/payments", Some("p-1")),
        ("payment retried again", "/payments", Some("p-1")),
    ];
    for (what, route, key) in steps {
        println!("{what:>24}: {}", send("dave", route, key, "10 EUR").await?);
    }
    Ok(())
}
