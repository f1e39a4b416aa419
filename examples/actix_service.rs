//! An actix-web service that honours the `Idempotency-Key` request header: one `.wrap(...)`
//! line with [`Idempotency`] (feature `actix`).
//!
//! ```text
//! cargo run --example actix_service --features actix   # a demo: starts, sends requests, prints, exits
//! ```
//!
//! The demo starts the service on a free port of 127.0.0.1 with a store in a temporary
//! directory, sends a handful of requests with reqwest, and prints one line per request: the
//! status, `Idempotent-Replayed`, `Retry-After`, `Location` and the body. The answers are those
//! of the tower layer (`examples/http_service.rs`): the first request creates order 1; its
//! retry is replayed; the same key with another body is 422; the same key from another user
//! creates order 2; of two requests sent at once, one runs and the other is 409; a request
//! without a key is 400; a payment whose first attempt fails with 503 runs again on retry,
//! then is replayed. `tests/actix.rs` tests the middleware over real HTTP.

use std::error::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use idemstore::actix::Idempotency;
use idemstore::Store;

/// The caller: `Authorization: Bearer <user>`. A real service verifies a token here.
fn caller(request: &HttpRequest) -> Option<Vec<u8>> {
    let value = request.headers().get(header::AUTHORIZATION)?.as_bytes();
    Some(value.strip_prefix(b"Bearer ")?.to_vec())
}

/// Orders and payments made so far.
#[derive(Default)]
struct Shop {
    orders: AtomicU64,
    payments: AtomicU64,
}

/// `POST /orders`: works for a while, then 201 with `Location` and a JSON body.
async fn create_order(shop: web::Data<Shop>, item: String) -> HttpResponse {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let n = shop.orders.fetch_add(1, Ordering::SeqCst) + 1;
    HttpResponse::Created()
        .insert_header((header::LOCATION, format!("/orders/{n}")))
        .content_type("application/json")
        .body(format!(r#"{{"order":{n},"item":{item:?}}}"#))
}

/// `POST /payments`: every odd attempt fails with 503 (the gateway hiccups).
async fn pay(shop: web::Data<Shop>) -> HttpResponse {
    match shop.payments.fetch_add(1, Ordering::SeqCst) + 1 {
        n if n % 2 == 1 => HttpResponse::ServiceUnavailable().body("gateway unavailable"),
        n => HttpResponse::Created().body(format!("payment captured on attempt {n}")),
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    actix_web::rt::System::new().block_on(demo())
}

async fn demo() -> Result<(), Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("shop.idem");
    let store = Arc::new(Store::open(&path)?);
    let shop = web::Data::new(Shop::default());
    let server = HttpServer::new(move || {
        App::new()
            .wrap(Idempotency::new(Arc::clone(&store)).scope(caller))
            .app_data(shop.clone())
            .route("/orders", web::post().to(create_order))
            .route("/payments", web::post().to(pay))
    })
    .workers(2)
    .bind(("127.0.0.1", 0))?;
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
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
        ("first request", "alice", Some("\"k-1\""), "book"),
        ("the client retries", "alice", Some("\"k-1\""), "book"),
        ("same key, other body", "alice", Some("\"k-1\""), "pen"),
        ("same key, other user", "bob", Some("\"k-1\""), "book"),
        ("no key", "alice", None, "book"),
    ];
    for (what, user, key, body) in steps {
        println!("{what:>24}: {}", send(user, "/orders", key, body).await?);
    }
    let (first, second) = tokio::join!(send("carol", "/orders", Some("k-2"), "ink"), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        send("carol", "/orders", Some("k-2"), "ink").await
    });
    println!("{:>24}: {}", "two at once (first)", first?);
    println!("{:>24}: {}", "two at once (second)", second?);
    for what in [
        "payment, gateway fails",
        "payment retried",
        "payment retried again",
    ] {
        println!(
            "{what:>24}: {}",
            send("dave", "/payments", Some("p-1"), "10 EUR").await?
        );
    }
    handle.stop(true).await;
    Ok(())
}
