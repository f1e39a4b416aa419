//! The guard for actix-web services: a middleware with the same answers as the tower layer
//! ([`http::IdempotencyLayer`](crate::http::IdempotencyLayer)). Feature `actix`, off by
//! default.
//!
//! An actix-web app adds it in one line:
//!
//! ```
//! use std::sync::Arc;
//!
//! use actix_web::{test, web, App};
//! use idemstore::actix::Idempotency;
//! use idemstore::Store;
//!
//! # let dir = tempfile::tempdir()?;
//! let store = Arc::new(Store::open(dir.path().join("shop.idem"))?);
//! actix_web::rt::System::new().block_on(async {
//!     let app = test::init_service(
//!         App::new()
//!             .wrap(Idempotency::new(store).scope(|request| {
//!                 let user = request.headers().get("authorization")?; // verified upstream
//!                 Some(user.as_bytes().to_vec())
//!             }))
//!             .route("/orders", web::post().to(|item: String| async move { format!("ordered {item}") })),
//!     )
//!     .await;
//!     let order = || {
//!         test::TestRequest::post()
//!             .uri("/orders")
//!             .insert_header(("authorization", "Bearer alice"))
//!             .insert_header(("idempotency-key", "\"k-1\""))
//!             .set_payload("book")
//!             .to_request()
//!     };
//!     let first = test::call_service(&app, order()).await;
//!     let retry = test::call_service(&app, order()).await; // the handler does not run
//!     let replayed = retry.headers().get("idempotent-replayed");
//!     assert_eq!(replayed.map(|v| v.as_bytes()), Some(&b"true"[..]));
//!     assert_eq!(retry.status(), first.status());
//! });
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What it answers
//! The table of the [tower layer](crate::http#what-it-answers), the same statuses, headers and
//! RFC 9457 problems: 400 without a key or with an invalid one; 401 with `WWW-Authenticate`
//! without a scope; 413 (or [the status chosen](Idempotency::body_too_large_status)) for a
//! body over [`max_body`](Idempotency::max_body); 409 with `Retry-After` while the first
//! request runs; 422 for the same key with another body or query string; the stored status,
//! [chosen headers](Idempotency::replay_headers) and body with `Idempotent-Replayed: true` for
//! a retry; 5xx responses (by default) are not stored and release the key; 503 with
//! `Retry-After: 1` when the store fails; 410 for a key whose first response was streamed or
//! over [`max_stored_response`](Idempotency::max_stored_response), so not stored. The key is (scope, `"{method} {path}"`, client key),
//! as the tower layer builds it, so one store can serve both.
//!
//! The decisions are the framework-neutral [`guard`](crate::guard). A handler that panics, or
//! a request whose connection is dropped, releases the key (on the worker's runtime) so a retry
//! runs the handler again.
//!
//! # What is buffered
//! A guarded request's body is read (up to [`max_body`](Idempotency::max_body)) to be
//! fingerprinted, then handed to the handler; a guarded handler's response body is read in
//! full to be stored. Requests that pass through are not buffered.

use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use actix_web::body::{to_bytes, BodySize, BoxBody, EitherBody, MessageBody};
use actix_web::dev::{Payload, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::http::{Method, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};

use crate::guard::{
    builder_traits, client_key, encode_stored, guard_setters, http_defaults, http_setters,
    http_status, problem_json, request_key, retry_after_secs, stored_len, Begin, Guard,
    HttpOptions, Refusal, Refused, Release, Running, StoredResponse, PROBLEM_JSON,
};
pub use crate::guard::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
pub use crate::http::{DEFAULT_MAX_BODY, DEFAULT_MAX_RETRY_AFTER, DEFAULT_PROBLEM_BASE};
use crate::{Fingerprint, Reservations};

/// What the middleware reads on every request: the options every adapter shares and those of
/// the HTTP adapters, in actix-web's http types.
type Options = crate::guard::AdapterOptions<
    HttpRequest,
    StatusCode,
    HttpOptions<Method, HeaderName, HeaderValue, StatusCode>,
>;

/// The actix-web middleware ([`Transform`]) that makes the requests it guards idempotent by
/// their `Idempotency-Key` header, on any [`Reservations`] backend: `App::new().wrap(...)`.
/// The setters and their defaults are those of the tower layer; see the [module docs](self).
pub struct Idempotency<R> {
    guard: Guard<R>,
    options: Arc<Options>,
}

builder_traits!(Idempotency);

impl<R: Reservations + 'static> Idempotency<R> {
    /// A middleware over `store` with the defaults of every setter below (those of the tower
    /// layer).
    pub fn new(store: Arc<R>) -> Idempotency<R> {
        Idempotency {
            guard: Guard::new(store),
            options: Arc::new(http_defaults!(())),
        }
    }

    guard_setters!(
        options: Options,
        request: HttpRequest,
        no_scope: "401 and `WWW-Authenticate` ([`challenge`](Self::challenge))",
        no_key: "400, as the draft says",
        in_progress: "409 (`Retry-After`, rounded up to whole seconds, at least 1)",
    );

    http_setters!(
        method: Method,
        status: StatusCode,
        header_name: HeaderName,
        header_value: HeaderValue,
    );
}

/// The body of every response of the middleware: the handler's own, untouched (requests let
/// through), or a buffered one (an answer, a replay, a response read to be stored).
pub type IdempotencyBody<B> = EitherBody<B, BoxBody>;

impl<S, B, R> Transform<S, ServiceRequest> for Idempotency<R>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
    R: Reservations + 'static,
{
    type Response = ServiceResponse<IdempotencyBody<B>>;
    type Error = actix_web::Error;
    type Transform = IdempotencyService<S, R>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(IdempotencyService {
            inner: Rc::new(service),
            guard: self.guard.clone(),
            options: Arc::clone(&self.options),
        }))
    }
}

/// The service [`Idempotency`] wraps the app's service in.
pub struct IdempotencyService<S, R> {
    inner: Rc<S>,
    guard: Guard<R>,
    options: Arc<Options>,
}

/// The future of [`IdempotencyService`]'s responses.
pub type ResponseFuture<B> =
    Pin<Box<dyn Future<Output = Result<ServiceResponse<IdempotencyBody<B>>, actix_web::Error>>>>;

impl<S, B, R> Service<ServiceRequest> for IdempotencyService<S, R>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
    R: Reservations + 'static,
{
    type Response = ServiceResponse<IdempotencyBody<B>>;
    type Error = actix_web::Error;
    type Future = ResponseFuture<B>;

    actix_web::dev::forward_ready!(inner);

    fn call(&self, request: ServiceRequest) -> Self::Future {
        let inner = Rc::clone(&self.inner);
        let guard = self.guard.clone();
        let options = Arc::clone(&self.options);
        Box::pin(handle(inner, guard, options, request))
    }
}

/// One request: the actix-web side of the steps of the [guard](crate::guard).
async fn handle<S, B, R>(
    inner: Rc<S>,
    guard: Guard<R>,
    o: Arc<Options>,
    mut request: ServiceRequest,
) -> Result<ServiceResponse<IdempotencyBody<B>>, actix_web::Error>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody,
    R: Reservations + 'static,
{
    if !o.adapter.methods.contains(request.method()) {
        return Ok(inner.call(request).await?.map_into_left_body());
    }
    let values = request.headers().get_all(IDEMPOTENCY_KEY);
    let id = match client_key(values.map(HeaderValue::as_bytes)) {
        Ok(Some(id)) => id,
        Ok(None) if !o.require_key => return Ok(inner.call(request).await?.map_into_left_body()),
        Ok(None) => return Ok(answer(&o, request, Refused::new(Refusal::KeyMissing))),
        Err(refused) => return Ok(answer(&o, request, refused)),
    };
    let operation = format!("{} {}", request.method(), request.path()).into_bytes();
    let key = match request_key((o.scope)(request.request()), &operation, &id) {
        Ok(key) => key,
        Err(refused) => return Ok(answer(&o, request, refused)),
    };
    let body = match read_body(&o, &mut request).await {
        Ok(body) => body,
        Err(refused) => return Ok(answer(&o, request, refused)),
    };
    let fingerprint = Fingerprint::of_parts([request.query_string().as_bytes(), &body[..]]);
    match guard.begin(&key, fingerprint).await {
        Begin::Run(running) => {
            request.set_payload(Payload::from(body));
            run(inner, &guard, &o, running, request).await
        }
        Begin::Replay(stored) => Ok(replay(&o, request, &stored)),
        Begin::Refuse(refused) => Ok(answer(&o, request, refused)),
    }
}

/// Runs the handler under the running key, then stores its response (or releases the key) and
/// returns it. Dropping this future before that releases the key (see [`Running`]).
async fn run<S, B, R>(
    inner: Rc<S>,
    guard: &Guard<R>,
    o: &Options,
    running: Running<R>,
    request: ServiceRequest,
) -> Result<ServiceResponse<IdempotencyBody<B>>, actix_web::Error>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody,
    R: Reservations + 'static,
{
    let response = match running.work(inner.call(request)).await {
        Ok(response) => response,
        Err(error) => {
            running.release(Release::Failed).await;
            return Err(error);
        }
    };
    let (request, response) = response.into_parts();
    let (head, body) = response.into_parts();
    let headers = || {
        o.adapter.replay_headers.iter().flat_map(|name| {
            let values = head.headers().get_all(name);
            values.map(move |value| (name.as_str(), value.as_bytes()))
        })
    };
    let len = match body.size() {
        BodySize::None => Some(0),
        BodySize::Sized(len) => Some(len),
        BodySize::Stream => None,
    };
    if !guard.stores_response(len.map(|len| stored_len(headers(), len))) {
        // A stream, or over the limit: passed through as it comes, never held whole.
        if (o.stores)(head.status()) {
            // Completed with a marker: the work is done and must not run again. If even the
            // marker is not stored, the key is released; this client gets its answer anyway.
            let _ = running.complete_not_stored(head.status().as_u16()).await;
        } else {
            running.release(Release::NotStored).await;
        }
        let response = head.set_body(body);
        return Ok(ServiceResponse::new(request, response).map_into_left_body());
    }
    // `ok()`: the body's error is not kept across the release.
    let Some(body) = running.work(to_bytes(body)).await.ok() else {
        running.release(Release::Failed).await;
        let refused = Refused::new(Refusal::ResponseUnreadable);
        return Ok(answer_parts(o, request, refused));
    };
    let status = head.status();
    if (o.stores)(status) {
        let encoded = encode_stored(status.as_u16(), headers(), &body);
        // Over the store's own limit: completed with the not-stored marker. Not stored at all
        // (lease lost, store failed): the key is released so a retry runs the handler again.
        // This client gets its answer either way.
        let _ = running.complete(encoded).await;
    } else {
        running.release(Release::NotStored).await;
    }
    let response = head.set_body(body).map_into_boxed_body();
    Ok(ServiceResponse::new(request, response).map_into_right_body())
}

/// Reads the request body, up to the limit.
async fn read_body(o: &Options, request: &mut ServiceRequest) -> Result<web::Bytes, Refused> {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > o.max_request as u64) {
        return Err(Refused::body_too_large(o.max_request));
    }
    let payload = match request.extract::<web::Payload>().await {
        Ok(payload) => payload,
        Err(error) => {
            let detail = format!("the request body could not be read: {error}");
            return Err(Refused::with_detail(Refusal::BodyUnreadable, detail));
        }
    };
    match payload.to_bytes_limited(o.max_request).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(error)) => {
            let detail = format!("the request body could not be read: {error}");
            Err(Refused::with_detail(Refusal::BodyUnreadable, detail))
        }
        Err(_) => Err(Refused::body_too_large(o.max_request)),
    }
}

/// The stored response, marked as a replay.
fn replay<B>(
    o: &Options,
    request: ServiceRequest,
    bytes: &[u8],
) -> ServiceResponse<IdempotencyBody<B>> {
    let Some(stored) = StoredResponse::decode(bytes) else {
        return answer(o, request, Refused::new(Refusal::StoredResponseUnreadable));
    };
    let Ok(status) = StatusCode::from_u16(stored.status) else {
        return answer(o, request, Refused::new(Refusal::StoredResponseUnreadable));
    };
    let mut response = HttpResponse::new(status);
    for (name, value) in stored.headers {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(&value),
        ) else {
            return answer(o, request, Refused::new(Refusal::StoredResponseUnreadable));
        };
        response.headers_mut().append(name, value);
    }
    response.headers_mut().insert(
        HeaderName::from_static(IDEMPOTENT_REPLAYED),
        HeaderValue::from_static("true"),
    );
    let response = response.set_body(BoxBody::new(stored.body));
    request.into_response(response).map_into_right_body()
}

/// A refusal as the tower layer answers it; see [`answer_parts`].
fn answer<B>(
    o: &Options,
    request: ServiceRequest,
    refused: Refused,
) -> ServiceResponse<IdempotencyBody<B>> {
    let (request, _) = request.into_parts();
    answer_parts(o, request, refused)
}

/// A refusal as an RFC 9457 problem with its status and headers: `Retry-After` in whole
/// seconds (at least 1) when the guard gave a delay, `WWW-Authenticate` with a 401,
/// `Connection: close` with a body too large (the rest of it is not read).
fn answer_parts<B>(
    o: &Options,
    request: HttpRequest,
    refused: Refused,
) -> ServiceResponse<IdempotencyBody<B>> {
    let status = http_status(refused.refusal, o.adapter.body_too_large.as_u16());
    let json = problem_json(
        &o.adapter.problem_base,
        refused.refusal,
        status,
        &refused.detail,
        refused.limit,
    );
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::build(status);
    response.insert_header((header::CONTENT_TYPE, PROBLEM_JSON));
    if let Some(secs) = retry_after_secs(&refused) {
        response.insert_header((header::RETRY_AFTER, secs));
    }
    match refused.refusal {
        Refusal::NoScope => {
            response.insert_header((header::WWW_AUTHENTICATE, o.adapter.challenge.clone()));
        }
        Refusal::BodyTooLarge => {
            response.insert_header((header::CONNECTION, "close"));
        }
        _ => {}
    }
    ServiceResponse::new(request, response.body(json)).map_into_right_body()
}
