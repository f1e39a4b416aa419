//! An `Idempotency-Key` layer for tower HTTP services (axum, or any tower stack whose request
//! body can be built from `Bytes`), on any [`Reservations`](crate::Reservations) backend.
//! Feature `http`, off by default.
//!
//! A service adds it in one line:
//!
//! ```
//! use std::sync::Arc;
//!
//! use axum::body::Body;
//! use axum::http::Request;
//! use axum::routing::post;
//! use axum::Router;
//! use idemstore::http::IdempotencyLayer;
//! use idemstore::Store;
//! use tower::ServiceExt;
//!
//! # let dir = tempfile::tempdir()?;
//! let store = Arc::new(Store::open(dir.path().join("shop.idem"))?);
//! let app = Router::new()
//!     .route("/orders", post(|item: String| async move { format!("ordered {item}") }))
//!     .layer(IdempotencyLayer::new(store).scope(|request| {
//!         let user = request.headers.get("authorization")?; // verified upstream
//!         Some(user.as_bytes().to_vec())
//!     }));
//!
//! let order = || {
//!     Request::post("/orders")
//!         .header("authorization", "Bearer alice")
//!         .header("idempotency-key", "\"k-1\"")
//!         .body(Body::from("book"))
//! };
//! let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! let first = runtime.block_on(app.clone().oneshot(order()?))?;
//! let retry = runtime.block_on(app.clone().oneshot(order()?))?; // the handler does not run
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! assert_eq!(retry.status(), first.status());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What it answers
//! It follows the IETF draft *The Idempotency-Key HTTP Header Field*
//! (draft-ietf-httpapi-idempotency-key-header). Requests with a method it does not guard
//! ([`methods`](IdempotencyLayer::methods), default `POST` and `PATCH`) pass through untouched.
//! For a guarded request:
//!
//! | Request | Answer |
//! |---|---|
//! | no `Idempotency-Key` | 400 ([`require_key(false)`](IdempotencyLayer::require_key) lets it through, unguarded) |
//! | a key that is not one RFC 8941 sf-string (`"k-1"`) or one bare key of token or UUID characters (`k-1`, the same key): a list, parameters, unbalanced quotes, a comma, space or control character outside quotes, more than one header field; or empty, or over [`Key::MAX_PART_LEN`](crate::Key::MAX_PART_LEN) bytes decoded | 400 naming the rule or the limit; the rules are [`client_key`](crate::guard::client_key)'s |
//! | no scope found ([`scope`](IdempotencyLayer::scope) returned `None`) | 401 with `WWW-Authenticate` ([`challenge`](IdempotencyLayer::challenge), default `Bearer`) |
//! | body over [`max_body`](IdempotencyLayer::max_body) | 413 (or [the status chosen](IdempotencyLayer::body_too_large_status)) naming the limit; the key is not reserved |
//! | a new key | the handler runs; its response is stored if [`store_status`](IdempotencyLayer::store_status) says so (default: all but 5xx), else the key is released so a retry runs the handler again |
//! | the same key, the first request still running | 409 with `Retry-After` (at most [`max_retry_after`](IdempotencyLayer::max_retry_after)); with [`wait_for_first`](IdempotencyLayer::wait_for_first), the first's response once it is stored (409 only after the wait) |
//! | the same key, the first request done | its stored status, [chosen headers](IdempotencyLayer::replay_headers) and body, byte for byte, with `Idempotent-Replayed: true` (then [adjusted](IdempotencyLayer::on_replay) if a hook is set) |
//! | the same key, the first response streamed or too large to store ([`max_stored_response`](IdempotencyLayer::max_stored_response), [below](#a-response-that-does-not-fit)) | 410 naming its status |
//! | the same key with another body or query string ([the fingerprint](IdempotencyLayer::fingerprint)) | 422, also while the first runs |
//! | a key parked for review ([`mark_needs_review`](crate::Store::mark_needs_review)) | 409 |
//! | the store fails | 503 with `Retry-After: 1` |
//!
//! Every refusal is an RFC 9457 problem (`application/problem+json`), see [`Refusal`]; its
//! `type` leads to its section under [Problem types](#problem-types).
//!
//! The decisions behind this table (the key, its scope, the fingerprint's use, reserve,
//! replay, release on failure, the lease renewal, the refusals) are the framework-neutral
//! [`guard`](crate::guard); this layer reads them from and writes them to HTTP.
//!
//! A key is (scope, operation, client key): the scope from the extractor, the operation from
//! the method and path (`POST /orders`), so one caller's key never replays another caller's
//! response and one key used on two routes is two keys. A scope or operation longer than
//! [`Key::MAX_PART_LEN`](crate::Key::MAX_PART_LEN) bytes is replaced by its BLAKE3 digest.
//!
//! # Exactly once
//! The key is *reserved* before the handler runs, by the store's insert that only one caller
//! can win ([`Reservations::reserve`](crate::Reservations::reserve)), and is durable before
//! the handler starts. There is no "look up, then insert" window: hundreds of concurrent
//! duplicates run the handler once (the tests send them over real HTTP).
//!
//! If the request future is dropped before the response is stored (the client disconnected
//! and the server dropped its work, or the handler panicked), a guard releases the key with
//! [`release_if_pending`](crate::Reservations::release_if_pending) on the tokio runtime the
//! request ran on, so a retry runs the handler again right away. When no release can run (the
//! process died, or no tokio runtime), the store's lease is the backstop: the key goes stale
//! when the lease runs out, and the next request takes it over. While the handler runs, the
//! layer renews its lease every third of the lease
//! ([`Reservations::extend`](crate::Reservations::extend)), so a handler that runs longer
//! than the store's lease ([`Builder::lease`](crate::Builder::lease), default 60 s) is not
//! taken over by a duplicate.
//!
//! The layer runs on tokio: the release and the renewals use the runtime the request runs on,
//! which must have timers enabled (`enable_all`, as `#[tokio::main]` sets).
//!
//! # What is buffered
//! A guarded request's body is read (up to [`max_body`](IdempotencyLayer::max_body)) to be
//! fingerprinted, then handed to the handler; the request body type must be buildable from
//! `Bytes` (axum's `Body` is). A guarded handler's response is read in full to be stored
//! when its body's length is known and its stored form (status, [replayed
//! headers](IdempotencyLayer::replay_headers) and body, 4 bytes plus 3 per header more than
//! their names, values and the body) is at most
//! [`max_stored_response`](IdempotencyLayer::max_stored_response) (1 MiB by default, the
//! store's default [`max_result_len`](crate::Builder::max_result_len), counted on the same
//! bytes); any other body (larger, or a stream such as server-sent events) is passed to the
//! client as it comes and not stored. Requests that pass through are not buffered.
//!
//! # A response that does not fit
//! A handler runs once per key, whatever the size of its response. A response over
//! [`max_stored_response`](IdempotencyLayer::max_stored_response), a stream, or one the store
//! refuses because it is over the store's own
//! [`max_result_len`](crate::Builder::max_result_len) (when that is the lower limit):
//! - the client of the first request gets the response whole, as the handler sent it;
//! - the key is completed with a "not stored" marker naming the response's status (not
//!   released: the handler's work is done and a retry must not redo it);
//! - every duplicate until the key expires gets 410 Gone,
//!   [`response-not-stored`](#response-not-stored), naming the first response's status;
//! - the counter `idemstore_guard_not_stored_total` counts it (feature `metrics`), and with
//!   feature `tracing` a warning names the store's limit when the store refused it;
//! - `idemstore get` shows the key as completed, "not stored (status 200)".
//!
//! A response whose status is not stored (a 5xx by default) is released instead, whatever
//! its size, so a retry runs the handler again.
//!
//! # Problem types
//! Each refusal's problem `type` is [`problem_base`](IdempotencyLayer::problem_base)
//! followed by its [`slug`](Refusal::slug); by default a link to one of these sections.
//!
//! ### key-missing
//! 400: a guarded request without `Idempotency-Key` ([`Refusal::KeyMissing`]). Send one
//! unique key per operation, and the same key on each retry of it.
//!
//! ### key-invalid
//! 400: the key is not one sf-string or bare token, is sent more than once, is empty or is
//! too long ([`Refusal::KeyInvalid`]); the detail names the rule or the limit.
//!
//! ### no-scope
//! 401 with `WWW-Authenticate`: the request carries no identity to scope its key by
//! ([`Refusal::NoScope`]).
//!
//! ### body-too-large
//! 413 (or the status chosen): the request body is over
//! [`max_body`](IdempotencyLayer::max_body) ([`Refusal::BodyTooLarge`]); the `limit` member
//! gives it in bytes. The key is not reserved.
//!
//! ### body-unreadable
//! 400: the request body failed while it was read ([`Refusal::BodyUnreadable`]). The key is
//! not reserved.
//!
//! ### in-progress
//! 409 with `Retry-After`: a request with this key is still running
//! ([`Refusal::InProgress`]). Retry after the delay given.
//!
//! ### key-reused
//! 422: the key was used before with another request body or query string
//! ([`Refusal::KeyReused`]). This is a client bug: use a new key for a new request.
//!
//! ### under-review
//! 409: the first request's outcome is unknown and the key is parked for a person
//! ([`Refusal::UnderReview`]); it stays so until resolved (`idemstore resolve`).
//!
//! ### store-unavailable
//! 503 with `Retry-After: 1`: the idempotency store failed ([`Refusal::StoreUnavailable`]).
//! The handler did not run.
//!
//! ### stored-response-unreadable
//! 500: the stored response for this key does not decode
//! ([`Refusal::StoredResponseUnreadable`]). The handler does not run again.
//!
//! ### response-unreadable
//! 500: the handler's response body failed while it was read to be stored
//! ([`Refusal::ResponseUnreadable`]); the key is released.
//!
//! ### response-not-stored
//! 410: the first request with this key was answered, but its response was not stored
//! because it streamed or did not fit ([`Refusal::ResponseNotStored`], [A response that does
//! not fit](#a-response-that-does-not-fit)); the detail names its status. The work is done:
//! retrying does not bring the response back.
//!
//! # Counters
//! With the `metrics` feature, replays, waits, 409s, 422s and released keys are counted on
//! the `metrics` facade; see [the guard's list](crate::guard#metrics).

mod config;
pub(crate) mod problem;
mod service;

pub use config::{
    IdempotencyLayer, DEFAULT_MAX_BODY, DEFAULT_MAX_RETRY_AFTER, DEFAULT_PROBLEM_BASE,
};
pub use problem::{Refusal, PROBLEM_JSON};
pub use service::{Idempotency, IdempotencyBody, ResponseFuture};

use ::http::HeaderName;

/// The request header that carries the client's key ([`guard::IDEMPOTENCY_KEY`](crate::guard::IDEMPOTENCY_KEY)).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static(crate::guard::IDEMPOTENCY_KEY);
/// Set to `true` on a response replayed from the store
/// ([`guard::IDEMPOTENT_REPLAYED`](crate::guard::IDEMPOTENT_REPLAYED)).
pub const IDEMPOTENT_REPLAYED: HeaderName =
    HeaderName::from_static(crate::guard::IDEMPOTENT_REPLAYED);
