//! `idemstore::grpc::GrpcIdempotencyLayer` over real connections: a tonic server on 127.0.0.1
//! (port 0) with the layer added in one line, and the tonic client generated from the
//! example's proto (`examples/proto/shop.proto`), plus a client of raw message bytes for the
//! byte-for-byte checks.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BufMut};
use idemstore::grpc::GrpcIdempotencyLayer;

use crate::http::Faulty;
use idemstore::{Fingerprint, Key, Reservation, Reservations, Store};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::tokio_stream;
use tonic::metadata::MetadataMap;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status};
use tonic_types::StatusExt;

#[allow(clippy::all, missing_docs)]
mod shop {
    include!("../examples/proto/shop.rs");
}

use shop::orders_client::OrdersClient;
use shop::orders_server::{Orders, OrdersServer};
use shop::{CreateOrderRequest, Order, PayRequest, Payment, WatchRequest};

const CREATE: &str = "/shop.v1.Orders/CreateOrder";
const PAY: &str = "/shop.v1.Orders/Pay";

/// The handlers behind the layer. They count how often they run, per key.
#[derive(Default)]
struct Shop {
    runs: Mutex<HashMap<String, usize>>,
    orders: AtomicU64,
    work: Duration,
}

impl Shop {
    fn count(&self, key: &str) -> usize {
        let mut runs = self.runs.lock().expect("not poisoned");
        let n = runs.entry(key.to_owned()).or_default();
        *n += 1;
        *n
    }

    fn runs(&self, key: &str) -> usize {
        let runs = self.runs.lock().expect("not poisoned");
        runs.get(key).copied().unwrap_or(0)
    }
}

/// A status with details and metadata, as a handler refuses an order.
fn out_of_stock() -> Status {
    let mut details = tonic_types::ErrorDetails::new();
    details.add_precondition_failure_violation("STOCK", "ink", "no ink left");
    let mut status = Status::with_error_details(Code::FailedPrecondition, "out of stock", details);
    status
        .metadata_mut()
        .insert("x-stock", "0".parse().expect("ASCII"));
    status
}

/// The `date` the handler sets on the orders of item `dated`.
const OLD_DATE: &str = "Thu, 01 Jan 2015 00:00:00 GMT";

/// An INVALID_ARGUMENT with a `BadRequest` and a trailer, as a handler refuses a request.
fn bad_quantity() -> Status {
    let mut details = tonic_types::ErrorDetails::new();
    details.add_bad_request_violation("quantity", "must be positive");
    let mut status =
        Status::with_error_details(Code::InvalidArgument, "quantity must be positive", details);
    status
        .metadata_mut()
        .insert("x-field", "quantity".parse().expect("ASCII"));
    status
}

#[tonic::async_trait]
impl Orders for Arc<Shop> {
    /// By item: `panic` panics on its first run; `fail` is UNAVAILABLE on its first run;
    /// `internal` is INTERNAL on its first run; `refuse` is FAILED_PRECONDITION with details
    /// and metadata; `invalid` is INVALID_ARGUMENT with a `BadRequest` and an `x-field`
    /// trailer; `slow` works 1.5 s; anything else works for `work`, then creates an order
    /// (`dated` with a `date` of its own, [`OLD_DATE`]).
    async fn create_order(
        &self,
        request: Request<CreateOrderRequest>,
    ) -> Result<Response<Order>, Status> {
        let request = request.into_inner();
        let run = self.count(&request.request_id);
        match request.item.as_str() {
            "panic" => assert!(
                run > 1,
                "the handler panics on its first run (deliberately)"
            ),
            "fail" if run == 1 => return Err(Status::unavailable("gateway unavailable")),
            "internal" if run == 1 => return Err(Status::internal("a bug")),
            "refuse" => return Err(out_of_stock()),
            "invalid" => return Err(bad_quantity()),
            "slow" => tokio::time::sleep(Duration::from_millis(1500)).await,
            _ => {}
        }
        tokio::time::sleep(self.work).await;
        let id = self.orders.fetch_add(1, Ordering::SeqCst) + 1;
        let dated = request.item == "dated";
        let mut response = Response::new(Order {
            id,
            item: request.item,
            quantity: request.quantity,
        });
        let value = format!("orders/{id}").parse().expect("ASCII");
        response.metadata_mut().insert("x-order", value);
        if dated {
            // An answer whose service sets its own `date`.
            let date = OLD_DATE.parse().expect("ASCII");
            response.metadata_mut().insert("date", date);
        }
        let bin = tonic::metadata::MetadataValue::from_bytes(&[
            0,
            0xff,
            u8::try_from(id % 256).expect("byte"),
        ]);
        response.metadata_mut().insert_bin("x-trace-bin", bin);
        Ok(response)
    }

    /// The first run of each key is UNAVAILABLE; later runs succeed.
    async fn pay(&self, request: Request<PayRequest>) -> Result<Response<Payment>, Status> {
        let key = request
            .metadata()
            .get("idempotency-key")
            .map_or("-".into(), |v| v.to_str().unwrap_or("?").to_owned());
        let attempt = self.count(&key);
        if attempt == 1 {
            return Err(Status::unavailable("gateway unavailable"));
        }
        let order_id = request.into_inner().order_id;
        Ok(Response::new(Payment {
            order_id,
            attempt: u32::try_from(attempt).expect("few"),
        }))
    }

    type WatchOrdersStream = tokio_stream::Iter<std::vec::IntoIter<Result<Order, Status>>>;

    async fn watch_orders(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchOrdersStream>, Status> {
        self.count("watch");
        let count = u64::from(request.into_inner().count);
        let orders: Vec<_> = (1..=count)
            .map(|id| {
                Ok(Order {
                    id,
                    item: "watched".into(),
                    quantity: 1,
                })
            })
            .collect();
        Ok(Response::new(tokio_stream::iter(orders)))
    }
}

/// A running server with its own store, and a channel to it.
struct Service {
    _dir: tempfile::TempDir,
    shop: Arc<Shop>,
    addr: SocketAddr,
    channel: Channel,
}

impl Service {
    /// The server with the layer guarding CreateOrder (by request id) and Pay (by metadata),
    /// over a store whose lease is one hour: a key released within a test was released by the
    /// layer, not by its lease.
    async fn start(work: Duration) -> Service {
        Service::start_with(work, |layer| layer).await
    }

    /// The server with the layer configured further by `configure`.
    async fn start_with(
        work: Duration,
        configure: impl FnOnce(GrpcIdempotencyLayer<Store>) -> GrpcIdempotencyLayer<Store>,
    ) -> Service {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = Store::builder()
            .lease(Duration::from_secs(3600))
            .open(dir.path().join("grpc.idem"))
            .expect("open store");
        let layer = configure(guarding(Arc::new(store)));
        Service::serve(dir, work, Some(layer)).await
    }

    /// The same handlers served by a plain tonic server, without the layer.
    async fn start_unguarded() -> Service {
        let dir = tempfile::tempdir().expect("temporary directory");
        Service::serve(dir, Duration::ZERO, None::<GrpcIdempotencyLayer<Store>>).await
    }

    /// Serves the shop on a free port of 127.0.0.1, behind `layer` when there is one.
    async fn serve<R: Reservations + 'static>(
        dir: tempfile::TempDir,
        work: Duration,
        layer: Option<GrpcIdempotencyLayer<R>>,
    ) -> Service {
        let shop = Arc::new(Shop {
            work,
            ..Shop::default()
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("bound address");
        let routes = OrdersServer::new(Arc::clone(&shop));
        let incoming = TcpIncoming::from(listener);
        match layer {
            Some(layer) => tokio::spawn(
                Server::builder()
                    .layer(layer)
                    .add_service(routes)
                    .serve_with_incoming(incoming),
            ),
            None => tokio::spawn(
                Server::builder()
                    .add_service(routes)
                    .serve_with_incoming(incoming),
            ),
        };
        let channel = Channel::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect()
            .await
            .expect("connect");
        Service {
            _dir: dir,
            shop,
            addr,
            channel,
        }
    }

    fn client(&self) -> OrdersClient<Channel> {
        OrdersClient::new(self.channel.clone())
    }

    async fn order(&self, id: &str, item: &str) -> Result<Response<Order>, Status> {
        let request = CreateOrderRequest {
            request_id: id.into(),
            item: item.into(),
            quantity: 2,
        };
        self.client().create_order(request).await
    }

    async fn pay(&self, key: Option<&str>) -> Result<Response<Payment>, Status> {
        let mut request = Request::new(PayRequest {
            order_id: 7,
            cents: 100,
        });
        if let Some(key) = key {
            request
                .metadata_mut()
                .insert("idempotency-key", key.parse().expect("ASCII"));
        }
        self.client().pay(request).await
    }

    /// A unary call of raw message bytes: the answer's message bytes as received.
    async fn raw(&self, path: &'static str, message: Vec<u8>) -> Result<Response<Vec<u8>>, Status> {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready().await.expect("ready");
        let path = http::uri::PathAndQuery::from_static(path);
        grpc.unary(Request::new(message), path, RawCodec).await
    }
}

/// The layer as every test server has it: CreateOrder keyed by its request id, Pay by the
/// `idempotency-key` metadata entry.
fn guarding<R: Reservations + 'static>(store: Arc<R>) -> GrpcIdempotencyLayer<R> {
    GrpcIdempotencyLayer::new(store)
        .method_with_request_id(CREATE, |m: &CreateOrderRequest| &m.request_id)
        .method(PAY)
}

/// A codec that passes message bytes through, so a test sees what was on the wire.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// The metadata a replay must repeat: all of it but what belongs to one answer (`date`) and
/// the replay marker, as sorted (name, value) text.
fn repeatable(metadata: &MetadataMap) -> Vec<(String, Vec<u8>)> {
    let headers = metadata.clone().into_headers();
    let mut out: Vec<(String, Vec<u8>)> = headers
        .iter()
        .filter(|(name, _)| !matches!(name.as_str(), "date" | "idempotent-replayed"))
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect();
    out.sort();
    out
}

fn replayed(metadata: &MetadataMap) -> bool {
    metadata
        .get("idempotent-replayed")
        .is_some_and(|v| v.to_str().ok() == Some("true"))
}

/// The `ErrorInfo` reason of a refusal.
fn reason(status: &Status) -> String {
    status
        .get_details_error_info()
        .map(|info| info.reason)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_run_the_handler_once_per_key() {
    let service = Arc::new(Service::start(Duration::from_millis(300)).await);
    let mut calls = Vec::new();
    for key in 0..4 {
        for _ in 0..25 {
            let service = Arc::clone(&service);
            calls.push(tokio::spawn(async move {
                let id = format!("dup-{key}");
                (key, service.order(&id, "book").await)
            }));
        }
    }
    let mut orders: HashMap<usize, Vec<Order>> = HashMap::new();
    let mut aborted = 0;
    for call in calls {
        let (key, result) = call.await.expect("task");
        match result {
            Ok(response) => orders.entry(key).or_default().push(response.into_inner()),
            Err(status) => {
                assert_eq!(status.code(), Code::Aborted, "{status:?}");
                assert_eq!(reason(&status), "IN_PROGRESS");
                let delay = status.get_details_retry_info().and_then(|r| r.retry_delay);
                assert!(
                    delay.is_some_and(|d| d <= Duration::from_secs(1)),
                    "{delay:?}"
                );
                aborted += 1;
            }
        }
    }
    for key in 0..4 {
        assert_eq!(service.shop.runs(&format!("dup-{key}")), 1, "key {key}");
        // Every OK answer of a key is the one order.
        let got = &orders[&key];
        assert!(got.iter().all(|o| o == &got[0]), "{got:?}");
    }
    assert!(aborted > 0, "some duplicates arrived while the first ran");
    // Once the first is done, every duplicate is a replay of it.
    for key in 0..4 {
        let retry = service
            .order(&format!("dup-{key}"), "book")
            .await
            .expect("replay");
        assert!(replayed(retry.metadata()));
        assert_eq!(retry.into_inner(), orders[&key][0]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_repeats_the_message_bytes_headers_and_trailers() {
    let service = Service::start(Duration::ZERO).await;
    let request = CreateOrderRequest {
        request_id: "r-1".into(),
        item: "book".into(),
        quantity: 2,
    }
    .encode_to_vec();
    let first = service.raw(CREATE, request.clone()).await.expect("created");
    let retry = service.raw(CREATE, request).await.expect("replayed");
    assert_eq!(service.shop.runs("r-1"), 1, "the handler ran once");
    assert!(!replayed(first.metadata()) && replayed(retry.metadata()));
    assert_eq!(repeatable(retry.metadata()), repeatable(first.metadata()));
    assert!(first.metadata().get("x-order").is_some());
    assert!(first.metadata().get_bin("x-trace-bin").is_some());
    assert_eq!(retry.get_ref(), first.get_ref(), "message bytes differ");

    // A stored error (FAILED_PRECONDITION, with details and metadata) is replayed whole.
    let first = service.order("r-2", "refuse").await.expect_err("refused");
    let retry = service.order("r-2", "refuse").await.expect_err("refused");
    assert_eq!(service.shop.runs("r-2"), 1, "the handler ran once");
    assert!(!replayed(first.metadata()) && replayed(retry.metadata()));
    assert_eq!(
        (retry.code(), retry.message(), retry.details()),
        (first.code(), first.message(), first.details())
    );
    assert_eq!(repeatable(retry.metadata()), repeatable(first.metadata()));
    assert_eq!(
        retry
            .metadata()
            .get("x-stock")
            .and_then(|v| v.to_str().ok()),
        Some("0")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_request_id_with_another_message_is_failed_precondition() {
    let service = Arc::new(Service::start(Duration::from_millis(500)).await);
    let running = tokio::spawn({
        let service = Arc::clone(&service);
        async move { service.order("m-1", "book").await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    // While the first runs, and after.
    for _ in 0..2 {
        let status = service.order("m-1", "pen").await.expect_err("refused");
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        assert_eq!(reason(&status), "KEY_REUSED");
        let failure = status.get_details_precondition_failure().expect("details");
        assert_eq!(failure.violations[0].subject, "request_id");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    running.await.expect("task").expect("first order");
    assert_eq!(service.shop.runs("m-1"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_of_a_running_request_is_aborted_with_a_retry_delay() {
    let service = Arc::new(Service::start(Duration::from_millis(600)).await);
    let running = tokio::spawn({
        let service = Arc::clone(&service);
        async move { service.order("p-1", "book").await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let status = service.order("p-1", "book").await.expect_err("in progress");
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(reason(&status), "IN_PROGRESS");
    let delay = status.get_details_retry_info().and_then(|r| r.retry_delay);
    assert_eq!(
        delay,
        Some(Duration::from_secs(1)),
        "capped at max_retry_after"
    );
    let first = running.await.expect("task").expect("first order");
    let retry = service.order("p-1", "book").await.expect("replayed");
    assert!(replayed(retry.metadata()));
    assert_eq!(retry.into_inner(), first.into_inner());
    assert_eq!(service.shop.runs("p-1"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_that_are_not_stored_release_the_key() {
    let service = Service::start(Duration::ZERO).await;
    for (id, item, code) in [
        ("f-1", "fail", Code::Unavailable),
        ("f-2", "internal", Code::Internal),
    ] {
        let status = service.order(id, item).await.expect_err("first run fails");
        assert_eq!(status.code(), code);
        assert!(!replayed(status.metadata()));
        let second = service.order(id, item).await.expect("the retry runs again");
        assert!(!replayed(second.metadata()));
        let third = service.order(id, item).await.expect("replayed");
        assert!(replayed(third.metadata()));
        assert_eq!(third.into_inner(), second.into_inner());
        assert_eq!(service.shop.runs(id), 2, "{id}");
    }
    // By metadata key too.
    assert_eq!(
        service.pay(Some("k-1")).await.expect_err("fails").code(),
        Code::Unavailable
    );
    let paid = service.pay(Some("k-1")).await.expect("paid");
    assert_eq!(
        (paid.get_ref().attempt, replayed(paid.metadata())),
        (2, false)
    );
    let again = service.pay(Some("k-1")).await.expect("replayed");
    assert_eq!(
        (again.get_ref().attempt, replayed(again.metadata())),
        (2, true)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_leaves_the_key_released() {
    let service = Service::start(Duration::ZERO).await;
    let crashed = service.order("x-1", "panic").await;
    assert!(crashed.is_err(), "the call fails: {crashed:?}");
    assert_eq!(service.shop.runs("x-1"), 1);
    // The store's lease is an hour: only the layer's release lets the retry run.
    let mut last = None;
    for _ in 0..100 {
        match service.order("x-1", "panic").await {
            Ok(order) => {
                last = Some(order);
                break;
            }
            Err(status) => assert_eq!(status.code(), Code::Aborted, "{status:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let order = last.expect("the retry ran the handler again");
    assert!(!replayed(order.metadata()));
    assert_eq!(service.shop.runs("x-1"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_required_and_unguarded_rpcs_pass() {
    let service = Service::start(Duration::ZERO).await;
    let status = service.order("", "book").await.expect_err("no request id");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(reason(&status), "KEY_MISSING");
    let bad = status.get_details_bad_request().expect("details");
    assert_eq!(bad.field_violations[0].field, "request_id");
    let status = service.pay(None).await.expect_err("no metadata key");
    assert_eq!(status.code(), Code::InvalidArgument);
    let bad = status.get_details_bad_request().expect("details");
    assert_eq!(bad.field_violations[0].field, "idempotency-key");
    let long = "k".repeat(256);
    let status = service.pay(Some(&long)).await.expect_err("key too long");
    assert_eq!(
        (status.code(), reason(&status).as_str()),
        (Code::InvalidArgument, "KEY_INVALID")
    );
    assert!(status.message().contains("255"), "{}", status.message());
    // A message that does not decode: its request id cannot be read.
    let status = service
        .raw(CREATE, vec![0xff; 8])
        .await
        .expect_err("garbage");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("does not decode"),
        "{}",
        status.message()
    );
    assert_eq!(service.shop.runs(""), 0, "no handler ran");
    // A key is taken as sent: gRPC has no HTTP quoting, so `"q-1"` and `q-1` are two keys.
    let quoted = service.order("\"q-1\"", "book").await.expect("created");
    let bare = service.order("q-1", "book").await.expect("another key");
    assert!(!replayed(bare.metadata()));
    assert_ne!(quoted.into_inner().id, bare.into_inner().id);
    // The streaming RPC is not guarded: no key needed, and it runs every time.
    for _ in 0..2 {
        let mut stream = service
            .client()
            .watch_orders(WatchRequest { count: 3 })
            .await
            .expect("streams")
            .into_inner();
        let mut n = 0;
        while stream.message().await.expect("message").is_some() {
            n += 1;
        }
        assert_eq!(n, 3);
    }
    assert_eq!(service.shop.runs("watch"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_the_stored_limit_is_sent_and_never_run_again() {
    let service = Service::start_with(Duration::ZERO, |layer| layer.max_stored_response(8)).await;
    let first = service
        .order("big-1", "a long item name")
        .await
        .expect("created");
    assert!(!replayed(first.metadata()));
    assert_eq!(first.get_ref().item, "a long item name");
    let status = service
        .order("big-1", "a long item name")
        .await
        .expect_err("not stored");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(reason(&status), "RESPONSE_NOT_STORED");
    assert_eq!(service.shop.runs("big-1"), 1, "the work is not run again");
}

/// What an HTTP/2 client receives for one unary call.
#[derive(Debug, Clone, PartialEq)]
struct Frames {
    /// The response's HEADERS frame ended the stream: gRPC's Trailers-Only answer.
    trailers_only: bool,
    /// The response headers, sorted; the value of `date` (one per answer) left out.
    headers: Vec<(String, Vec<u8>)>,
    /// The values of `date`.
    dates: Dates,
    /// The bytes of the DATA frames.
    data: Vec<u8>,
    /// The trailers, sorted, if a HEADERS frame followed the data.
    trailers: Option<Vec<(String, Vec<u8>)>>,
}

/// The `date` values of an answer, which two answers need not share: equal to any other.
#[derive(Debug, Clone)]
struct Dates(Vec<Vec<u8>>);

impl PartialEq for Dates {
    fn eq(&self, _: &Dates) -> bool {
        true
    }
}

fn sorted(map: &http::HeaderMap) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = map
        .iter()
        .map(|(name, value)| {
            let value = if name == "date" {
                b"*"
            } else {
                value.as_bytes()
            };
            (name.as_str().to_owned(), value.to_vec())
        })
        .collect();
    out.sort();
    out
}

/// One unary call of `message` over a raw HTTP/2 connection (the `h2` crate, below tonic and
/// hyper), with what came back frame by frame.
async fn h2_call(addr: SocketAddr, path: &str, message: Vec<u8>) -> Frames {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(connection);
    let mut client = client.ready().await.expect("ready");
    let request = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
    let (response, mut send) = client.send_request(request, false).expect("send");
    let mut framed = vec![0];
    framed.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    framed.extend_from_slice(&message);
    send.send_data(framed.into(), true).expect("data");
    let (parts, mut body) = response.await.expect("response").into_parts();
    let trailers_only = body.is_end_stream();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("data frame");
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.expect("trailers");
    Frames {
        trailers_only,
        headers: sorted(&parts.headers),
        dates: Dates(
            parts
                .headers
                .get_all("date")
                .iter()
                .map(|v| v.as_bytes().to_vec())
                .collect(),
        ),
        data,
        trailers: trailers.as_ref().map(sorted),
    }
}

/// `frames` with `idempotent-replayed: true` added where the layer documents it: the
/// initial metadata (headers) of an answer with messages, the trailing metadata of a
/// Trailers-Only one (whose one HEADERS frame is the trailers).
fn marked_replayed(frames: &Frames) -> Frames {
    let mut out = frames.clone();
    out.headers
        .push(("idempotent-replayed".into(), b"true".to_vec()));
    out.headers.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_answers_are_framed_as_a_plain_tonic_service_frames_them() {
    let guarded = Service::start(Duration::ZERO).await;
    let plain = Service::start_unguarded().await;
    let call = |service: &Service, id: &str, item: &str| {
        let message = CreateOrderRequest {
            request_id: id.into(),
            item: item.into(),
            quantity: 2,
        }
        .encode_to_vec();
        h2_call(service.addr, CREATE, message)
    };
    // An answer with a message (the first order of each server: the same order id).
    let ok = call(&plain, "h-1", "book").await;
    assert!(
        !ok.trailers_only && ok.trailers.is_some() && !ok.data.is_empty(),
        "{ok:?}"
    );
    let first = call(&guarded, "h-1", "book").await;
    assert_eq!(first, ok, "OK: guarded against plain");
    let replay = call(&guarded, "h-1", "book").await;
    assert_eq!(replay, marked_replayed(&first), "OK: replay against first");
    // A handler's error that is not stored (UNAVAILABLE), and one that is stored
    // (FAILED_PRECONDITION with details and metadata), first and replayed.
    for (id, item) in [("h-2", "fail"), ("h-3", "refuse")] {
        let error = call(&plain, id, item).await;
        assert!(
            error.trailers_only,
            "a plain error is Trailers-Only: {error:?}"
        );
        assert!(
            error.data.is_empty() && error.trailers.is_none(),
            "{error:?}"
        );
        let first = call(&guarded, id, item).await;
        assert_eq!(first, error, "{item}: guarded against plain");
    }
    let replay = call(&guarded, "h-3", "refuse").await;
    let first = call(&plain, "h-3", "refuse").await;
    assert_eq!(
        replay,
        marked_replayed(&first),
        "stored error: replay against first"
    );
    // No `content-length` on any of them (the comparisons above also say so).
    for frames in [&ok, &replay] {
        let names: Vec<&str> = frames.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert!(!names.contains(&"content-length"), "{names:?}");
    }
    // A `date` the service set itself is sent as a plain service sends it, and a replay gets
    // the server's own (one `date`, not the first answer's).
    let old = vec![OLD_DATE.as_bytes().to_vec()];
    let plain_dated = call(&plain, "h-4", "dated").await;
    assert_eq!(plain_dated.dates.0, old, "{plain_dated:?}");
    let first = call(&guarded, "h-4", "dated").await;
    assert_eq!((&first, &first.dates.0), (&plain_dated, &old));
    let replay = call(&guarded, "h-4", "dated").await;
    assert_eq!(replay, marked_replayed(&first));
    assert!(
        replay.dates.0.len() == 1 && replay.dates.0 != old,
        "a replay repeats a stale date: {:?}",
        replay.dates
    );
}

/// The variable that names the Python interpreter of a virtualenv with `grpcio`,
/// `grpcio-status` and `grpcio-tools` (tests/grpc_python/requirements.txt).
const PYTHON: &str = "IDEMSTORE_GRPC_PYTHON";

/// Python's official gRPC client, which nobody in this project wrote, against the layer: every
/// answer of the layer's table, handler errors first and replayed, and the metadata names
/// (tests/grpc_python/client.py says what it checks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_sees_every_answer() {
    let Some(python) = std::env::var_os(PYTHON) else {
        panic!(
            "{PYTHON} is not set: it names the python of a virtualenv with Python's gRPC \
             client. `bash .ci/run rpc` makes one and sets it; by hand: `python3 -m venv \
             target/grpc-venv && target/grpc-venv/bin/pip install -r \
             tests/grpc_python/requirements.txt`, then run the tests with \
             {PYTHON}=target/grpc-venv/bin/python (on Debian, `python3 -m venv` needs the \
             python3-venv package)"
        );
    };
    let dir = tempfile::tempdir().expect("temporary directory");
    let store = Store::builder()
        .lease(Duration::from_secs(3600))
        .open(dir.path().join("grpc.idem"))
        .expect("open store");
    // The key held for review, reserved for the request the client sends (the fingerprint is
    // of the encoded stream: a 5-byte prefix and the message) and marked as an operator's
    // tool does.
    let review = Key::new("Bearer py", CREATE, "review-1").expect("key");
    let message = CreateOrderRequest {
        request_id: "review-1".into(),
        item: "book".into(),
        quantity: 2,
    }
    .encode_to_vec();
    let mut stream = vec![0];
    stream.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    stream.extend_from_slice(&message);
    let Reservation::Acquired(lease) = store
        .reserve(&review, Fingerprint::of(&stream))
        .expect("reserve")
    else {
        panic!("the review key is new");
    };
    store
        .mark_needs_review(&lease, "checked by hand")
        .expect("mark");
    let layer = guarding(Arc::new(Faulty::fails_for(store, b"store-down")))
        .scope(|request| Some(request.headers.get("authorization")?.as_bytes().to_vec()))
        .max_message(1024)
        // The stored form counts the status, headers and trailers too: an error with its
        // details fits, a 700-byte answer does not.
        .max_stored_response(600);
    let service = Service::serve(dir, Duration::ZERO, Some(layer)).await;
    let stubs = tempfile::tempdir().expect("temporary directory");
    let root = env!("CARGO_MANIFEST_DIR");
    let mut command = std::process::Command::new(&python);
    command
        .arg(format!("{root}/tests/grpc_python/client.py"))
        .arg("--addr")
        .arg(service.addr.to_string())
        .arg("--proto")
        .arg(format!("{root}/examples/proto/shop.proto"))
        .arg("--out")
        .arg(stubs.path());
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("task")
        .unwrap_or_else(|error| {
            panic!("{PYTHON}={python:?} could not be run ({error}); see tests/grpc_python/")
        });
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains(" 0 failed"),
        "Python's gRPC client ({}):\n{stdout}\n{stderr}",
        output.status
    );
    // What the handlers saw: each ran as the answers say.
    let runs = |key: &str| service.shop.runs(key);
    assert_eq!(
        [runs("c-1"), runs("c-slow"), runs("c-inv"), runs("c-big")],
        [1, 1, 1, 1],
        "stored answers ran once"
    );
    assert_eq!(
        [runs("p-1"), runs("c-int")],
        [2, 2],
        "released keys ran again"
    );
    assert_eq!(
        [runs(""), runs("review-1"), runs("store-down"), runs("c-4")],
        [0, 0, 0, 0],
        "refused requests ran no handler"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_metadata_keys_are_invalid_argument_naming_the_rule() {
    let service = Service::start(Duration::ZERO).await;
    let mut sent = 0;
    for (value, rule) in crate::http::MALFORMED_KEYS {
        // Metadata carries visible ASCII only: the others cannot be sent.
        let Ok(value) = tonic::metadata::AsciiMetadataValue::try_from(*value) else {
            continue;
        };
        let mut request = Request::new(PayRequest {
            order_id: 7,
            cents: 100,
        });
        request
            .metadata_mut()
            .insert("idempotency-key", value.clone());
        let status = service.client().pay(request).await.expect_err("refused");
        assert_eq!(
            (status.code(), reason(&status).as_str()),
            (Code::InvalidArgument, "KEY_INVALID"),
            "{value:?}"
        );
        assert!(
            status.message().contains(rule),
            "{value:?}: {}",
            status.message()
        );
        sent += 1;
    }
    assert!(sent >= 12, "only {sent} malformed values could be sent");
    assert!(
        service.shop.runs.lock().expect("not poisoned").is_empty(),
        "no handler ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_id_from_the_message_is_taken_as_it_is_not_as_a_header() {
    let service = Service::start(Duration::ZERO).await;
    // Commas, spaces and quotes are not structured-field syntax in a message field.
    let id = r#"order 7, "blue""#;
    let first = service.order(id, "book").await.expect("created");
    let retry = service.order(id, "book").await.expect("replayed");
    assert!(!replayed(first.metadata()) && replayed(retry.metadata()));
    assert_eq!(first.get_ref().id, retry.get_ref().id);
    assert_eq!(service.shop.runs(id), 1);
    let long = "k".repeat(256);
    let status = service.order(&long, "book").await.expect_err("too long");
    assert_eq!(
        (status.code(), reason(&status).as_str()),
        (Code::InvalidArgument, "KEY_INVALID")
    );
    assert!(
        status.message().contains("256 bytes"),
        "{}",
        status.message()
    );
}

/// The stored form of an answer: status, headers, trailers and body come back as they went
/// in; an answer with a header too long to store whole is not stored.
#[test]
fn stored_answers_round_trip_with_their_trailers() {
    use idemstore::whitebox::grpc::{decode, encode};
    use tonic::codegen::http::{HeaderMap, HeaderValue, StatusCode};
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    headers.append("x-a", HeaderValue::from_static("1"));
    headers.append("x-a", HeaderValue::from_static("2"));
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let data = b"\0\0\0\0\x02hi";
    let bytes = encode(StatusCode::OK, &headers, Some(&trailers), data).expect("fits");
    let (status, h, t, d) = decode(&bytes).expect("decodes");
    assert_eq!(
        (status, &h, t.as_ref(), &d[..]),
        (StatusCode::OK, &headers, Some(&trailers), &data[..])
    );
    // Trailers-only: no marker, no trailers.
    let bytes = encode(StatusCode::OK, &headers, None, b"").expect("fits");
    assert_eq!(decode(&bytes).expect("decodes").2, None);
    // A value too long to store whole: not stored at all.
    let long = HeaderValue::from_bytes(&vec![b'a'; 70_000]).expect("value");
    headers.insert("x-long", long);
    assert!(encode(StatusCode::OK, &headers, None, b"").is_none());
}

#[test]
fn one_uncompressed_message_is_read() {
    use idemstore::whitebox::grpc::single_message;
    assert_eq!(single_message(b"\0\0\0\0\x02hi"), Ok(&b"hi"[..]));
    assert!(single_message(b"").unwrap_err().contains("no message"));
    assert!(single_message(b"\x01\0\0\0\x02hi")
        .unwrap_err()
        .contains("compressed"));
    let two = single_message(b"\0\0\0\0\x02hi\0\0\0\0\0").unwrap_err();
    assert!(two.contains("one message of 2 bytes; 7 bytes"), "{two}");
}
