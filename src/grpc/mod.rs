//! The guard for gRPC services: a tower layer for tonic servers, answering in gRPC statuses.
//! Feature `grpc`, off by default.
//!
//! A tonic server adds it in one line, before its services:
//!
//! ```
//! use std::sync::Arc;
//!
//! use idemstore::grpc::GrpcIdempotencyLayer;
//! use idemstore::Store;
//! use tonic::transport::Server;
//!
//! # let dir = tempfile::tempdir()?;
//! let store = Arc::new(Store::open(dir.path().join("rpc.idem"))?);
//! let server = Server::builder()
//!     .layer(GrpcIdempotencyLayer::new(store).method("/shop.v1.Orders/CreateOrder"));
//! // server.add_service(OrdersServer::new(orders)).serve(addr).await?;
//! # let _ = server;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! (`examples/grpc_service.rs` runs a whole service; `cargo run --example grpc_service
//! --features grpc`.)
//!
//! # Which RPCs
//! Only the RPCs named with [`method`](GrpcIdempotencyLayer::method) (key from the
//! `idempotency-key` metadata entry) or
//! [`method_with_request_id`](GrpcIdempotencyLayer::method_with_request_id) (key from a field
//! of the request message, Google's AIP-155 `request_id`) are guarded. Every other RPC passes
//! through untouched: streaming RPCs are not guarded unless named (a named streaming RPC is
//! guarded as a whole: both streams are buffered). The key is (scope, the RPC's path, the
//! client's key); the fingerprint is the request's encoded messages, as sent. The client's key
//! is the metadata entry's or the field's value as it is: gRPC metadata has no quoting, so
//! unlike the HTTP layer's `Idempotency-Key` header a value in double quotes keeps them.
//!
//! # What it answers
//! A refusal is a status whose details (`grpc-status-details-bin`, a `google.rpc.Status`)
//! hold an `ErrorInfo` (domain [`ERROR_DOMAIN`], reason the refusal in upper snake case:
//! `KEY_MISSING`, `IN_PROGRESS`, `KEY_REUSED`, ...) and the detail below. Any gRPC client reads
//! them with its `google.rpc` decoder (in Rust: `tonic_types::StatusExt`).
//!
//! | Request | Answer |
//! |---|---|
//! | no key (no metadata entry, or an empty request id) | `INVALID_ARGUMENT` with a `BadRequest` naming the field ([`require_key(false)`](GrpcIdempotencyLayer::require_key) lets it through, unguarded) |
//! | key empty, sent twice, or over [`Key::MAX_PART_LEN`](crate::Key::MAX_PART_LEN) bytes | `INVALID_ARGUMENT` naming the limit |
//! | no scope found ([`scope`](GrpcIdempotencyLayer::scope) returned `None`) | `UNAUTHENTICATED` |
//! | request over [`max_message`](GrpcIdempotencyLayer::max_message) | `RESOURCE_EXHAUSTED` naming the limit; the key is not reserved |
//! | a request id that cannot be read (not one uncompressed message, or it does not decode) | `INVALID_ARGUMENT` |
//! | a new key | the handler runs; its answer is stored if [`store_code`](GrpcIdempotencyLayer::store_code) says so (default: `OK` and the codes that blame the request), else the key is released so a retry runs the handler again |
//! | the same key, the first request still running | `ABORTED` with a `RetryInfo` (the delay: the lease left, at most [`max_retry_after`](GrpcIdempotencyLayer::max_retry_after)) |
//! | the same key, the first request done | its stored answer: the headers (initial metadata), the messages byte for byte and the trailers (`grpc-status`, `grpc-message`, details, trailing metadata), with `idempotent-replayed: true` added: to the initial metadata of an answer with messages (an `OK`), to the trailing metadata of an error (see below) |
//! | the same key with another request | `FAILED_PRECONDITION` with a `PreconditionFailure`, also while the first runs |
//! | the same key, the first answer done but over [`max_stored_response`](GrpcIdempotencyLayer::max_stored_response) (so not stored) | `FAILED_PRECONDITION`, reason `RESPONSE_NOT_STORED`: the work is done and is not run again |
//! | a key parked for review ([`mark_needs_review`](crate::Store::mark_needs_review)) | `FAILED_PRECONDITION` |
//! | the store fails | `UNAVAILABLE` with a `RetryInfo` of 1 s |
//!
//! The messages of refusals name what carried the key: the `request_id` field (e.g. "this
//! request_id was already used with a different request to this RPC; a new request needs a
//! new request_id") or the `idempotency-key` metadata entry.
//!
//! # On the wire, and what each client sees
//! Every answer of a guarded RPC is framed as a plain tonic service frames it, so any gRPC
//! client (tonic, the gRPC C core under Python, C++, Ruby, C# and PHP, grpc-go, grpc-java)
//! reads it the same way:
//!
//! - An error, the handler's or the layer's, first time or replayed, is a *Trailers-Only*
//!   answer: one HTTP/2 HEADERS frame that ends the stream and carries `grpc-status`,
//!   `grpc-message`, `grpc-status-details-bin` and the error's metadata. Clients read all of
//!   it as the status and its **trailing** metadata (Python: `e.code()`, `e.details()`,
//!   `rpc_status.from_call(e)`, `e.trailing_metadata()`; tonic: `Status::metadata()`), so a
//!   replayed error has `idempotent-replayed: true` there, beside the handler's own entries.
//! - An answer with messages is HEADERS (the **initial** metadata), DATA, then the trailers
//!   (`grpc-status: 0` and the trailing metadata); a replayed one has
//!   `idempotent-replayed: true` in its initial metadata (Python: `call.initial_metadata()`
//!   of `with_call`; tonic: `Response::metadata()`).
//! - No `content-length` (a plain tonic answer has none). `date` is the server's, fresh on a
//!   replay: a stored answer keeps no `date`.
//!
//! `tests/grpc.rs` compares a guarded and a plain service's answers frame by frame, and runs
//! Python's `grpcio` client through every row of the table above.
//!
//! Choices: `ABORTED` for a request in progress, because it is what gRPC names a concurrency
//! conflict the client retries at a higher level; `UNAVAILABLE` would make clients with a
//! retry policy retry at once, and is kept for the store itself failing. `FAILED_PRECONDITION`
//! for a reused key, because the request is refused for the state of the system (the key was
//! used before), not for its arguments alone, and retrying it unchanged never succeeds.
//!
//! The decisions behind this table are the framework-neutral [`guard`](crate::guard), the same
//! as the HTTP layer's: the key is reserved durably before the handler runs, by the store's
//! insert that only one caller wins; the lease is renewed while the handler runs; a handler
//! that panics, or an RPC the client cancels, releases the key so a retry runs again.

mod config;
mod key;
pub(crate) mod service;
mod status;

pub use crate::guard::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
pub use config::{GrpcIdempotencyLayer, DEFAULT_MAX_MESSAGE, DEFAULT_MAX_RETRY_AFTER};
pub use service::{GrpcIdempotency, ResponseFuture};
pub use status::{code_of, ERROR_DOMAIN};
