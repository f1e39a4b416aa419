//! A tonic gRPC service whose mutating RPCs are idempotent: one `.layer(...)` line with
//! [`GrpcIdempotencyLayer`] (feature `grpc`).
//!
//! ```text
//! cargo run --example grpc_service --features grpc     # a demo: starts, calls, prints, exits
//! ```
//!
//! The service (`examples/proto/shop.proto`) has `CreateOrder`, keyed by its `request_id` field
//! as Google's AIP-155 asks, `Pay`, keyed by the `idempotency-key` metadata entry, and
//! `WatchOrders`, a server-streaming RPC that is not guarded. The demo starts it on a free port
//! of 127.0.0.1 with a store in a temporary directory, calls it with the generated client and
//! prints one line per call: the status (or the message), `idempotent-replayed` (in the initial
//! metadata of an `OK`, in the trailing metadata of an error), and the refusal's details
//! (`ErrorInfo` reason, `RetryInfo` delay). The first order is created; its
//! retry is replayed; the same request id with another item is FAILED_PRECONDITION; of two
//! calls sent at once, one runs and the other is ABORTED with a retry delay; a call without a
//! request id is INVALID_ARGUMENT; a payment whose first attempt fails with UNAVAILABLE runs
//! again on retry, then is replayed. `tests/grpc.rs` tests the layer over real connections.

use std::error::Error;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idemstore::grpc::GrpcIdempotencyLayer;
use idemstore::Store;
use tonic::codegen::tokio_stream;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use tonic::{Request, Response, Status};
use tonic_types::StatusExt;

/// The code generated from `examples/proto/shop.proto`.
#[allow(clippy::all, missing_docs)]
mod shop {
    include!("proto/shop.rs");
}

use shop::orders_client::OrdersClient;
use shop::orders_server::{Orders, OrdersServer};
use shop::{CreateOrderRequest, Order, PayRequest, Payment, WatchRequest};

/// Orders and payment attempts made so far.
#[derive(Default)]
struct Shop {
    orders: AtomicU64,
    payments: AtomicU32,
}

#[tonic::async_trait]
impl Orders for Shop {
    /// Works for a while, then creates the order.
    async fn create_order(
        &self,
        request: Request<CreateOrderRequest>,
    ) -> Result<Response<Order>, Status> {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let request = request.into_inner();
        let id = self.orders.fetch_add(1, Ordering::SeqCst) + 1;
        let mut response = Response::new(Order {
            id,
            item: request.item,
            quantity: request.quantity,
        });
        let location = format!("orders/{id}").parse().expect("ASCII");
        response.metadata_mut().insert("x-order", location);
        Ok(response)
    }

    /// Every odd attempt fails with UNAVAILABLE (the gateway hiccups).
    async fn pay(&self, request: Request<PayRequest>) -> Result<Response<Payment>, Status> {
        let attempt = self.payments.fetch_add(1, Ordering::SeqCst) + 1;
        if attempt % 2 == 1 {
            return Err(Status::unavailable("gateway unavailable"));
        }
        let order_id = request.into_inner().order_id;
        Ok(Response::new(Payment { order_id, attempt }))
    }

    type WatchOrdersStream = tokio_stream::Iter<std::vec::IntoIter<Result<Order, Status>>>;

    /// Streams `count` orders: a streaming RPC passes through the layer unguarded.
    async fn watch_orders(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchOrdersStream>, Status> {
        let count = request.into_inner().count;
        let orders = (1..=u64::from(count)).map(|id| {
            Ok(Order {
                id,
                item: "watched".into(),
                quantity: 1,
            })
        });
        Ok(Response::new(tokio_stream::iter(
            orders.collect::<Vec<_>>(),
        )))
    }
}

/// The layer: `CreateOrder` keyed by its request id, `Pay` by its metadata, both scoped by the
/// caller (the `authorization` metadata; a real service verifies a token here).
fn idempotency(store: Arc<Store>) -> GrpcIdempotencyLayer<Store> {
    GrpcIdempotencyLayer::new(store)
        .method_with_request_id("/shop.v1.Orders/CreateOrder", |m: &CreateOrderRequest| {
            &m.request_id
        })
        .method("/shop.v1.Orders/Pay")
        .scope(|request| Some(request.headers.get("authorization")?.as_bytes().to_vec()))
}

/// One line for a call's outcome.
fn line<T: std::fmt::Debug>(result: Result<Response<T>, Status>) -> String {
    match result {
        Ok(response) => {
            let replayed = response.metadata().get("idempotent-replayed");
            let replayed = replayed.map_or(String::new(), |v| {
                format!("  idempotent-replayed: {}", v.to_str().unwrap_or("?"))
            });
            format!("OK {:?}{replayed}", response.into_inner())
        }
        Err(status) => {
            let mut out = format!("{:?}: {}", status.code(), status.message());
            // An error's metadata, a replay's marker among it, is its trailing metadata.
            if let Some(v) = status.metadata().get("idempotent-replayed") {
                out += &format!("  idempotent-replayed: {}", v.to_str().unwrap_or("?"));
            }
            if let Some(info) = status.get_details_error_info() {
                out += &format!("  reason: {}", info.reason);
            }
            if let Some(delay) = status.get_details_retry_info().and_then(|r| r.retry_delay) {
                out += &format!("  retry in: {delay:?}");
            }
            out
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("shop.idem");
    let store = Arc::new(Store::open(&path)?);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(
        Server::builder()
            .layer(idempotency(store))
            .add_service(OrdersServer::new(Shop::default()))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    println!("demo service on http://{addr}, store {}", path.display());

    let client = OrdersClient::connect(format!("http://{addr}")).await?;
    let order = |user: &str, id: &str, item: &str| {
        let mut request = Request::new(CreateOrderRequest {
            request_id: id.into(),
            item: item.into(),
            quantity: 1,
        });
        let user = format!("Bearer {user}").parse().expect("ASCII");
        request.metadata_mut().insert("authorization", user);
        let mut client = client.clone();
        async move { client.create_order(request).await }
    };
    let steps = [
        ("first request", "alice", "r-1", "book"),
        ("the client retries", "alice", "r-1", "book"),
        ("same id, other item", "alice", "r-1", "pen"),
        ("same id, other user", "bob", "r-1", "book"),
        ("no request id", "alice", "", "book"),
    ];
    for (what, user, id, item) in steps {
        println!("{what:>24}: {}", line(order(user, id, item).await));
    }
    let (first, second) = tokio::join!(order("carol", "r-2", "ink"), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        order("carol", "r-2", "ink").await
    });
    println!("{:>24}: {}", "two at once (first)", line(first));
    println!("{:>24}: {}", "two at once (second)", line(second));

    for what in [
        "payment, gateway fails",
        "payment retried",
        "payment retried again",
    ] {
        let mut request = Request::new(PayRequest {
            order_id: 1,
            cents: 1000,
        });
        request
            .metadata_mut()
            .insert("authorization", "Bearer dave".parse()?);
        request
            .metadata_mut()
            .insert("idempotency-key", "p-1".parse()?);
        println!("{what:>24}: {}", line(client.clone().pay(request).await));
    }
    let mut stream = client
        .clone()
        .watch_orders(WatchRequest { count: 2 })
        .await?
        .into_inner();
    let mut watched = 0;
    while stream.message().await?.is_some() {
        watched += 1;
    }
    println!("{:>24}: {watched} orders streamed", "streaming, unguarded");
    Ok(())
}
