//! [`Idempotency`]: the service the layer wraps a handler in, and what it does per request.

use std::borrow::Cow;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::request::Parts;
use http::{header, HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full, LengthLimitError, Limited};

use crate::guard::{
    client_key, encode_stored, http_status, request_key, retry_after_secs, stored_len, walk_stored,
    Begin, Guard, Refusal, Refused, Release, Running,
};
use crate::http::config::Options;
use crate::http::problem::problem;
use crate::http::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use crate::{Key, Reservations};

/// The body of every response of [`Idempotency`]: a buffered one (an answer of the layer, a
/// replay, or a handler response that was read to be stored) or the handler's own, untouched
/// (requests the layer lets through, and responses streamed without being stored, see
/// [`max_stored_response`](crate::http::IdempotencyLayer::max_stored_response)).
pub type IdempotencyBody<B> = Either<Full<Bytes>, B>;

/// The future of [`Idempotency`]'s responses.
pub type ResponseFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<IdempotencyBody<B>>, E>> + Send>>;

/// The service made by [`IdempotencyLayer`](crate::http::IdempotencyLayer) around `S`.
///
/// The request body type must be buildable from [`Bytes`] (axum's `Body` and
/// `http_body_util::Full<Bytes>` are), because a guarded request's body is read to be
/// fingerprinted and then handed to `S`.
pub struct Idempotency<S, R> {
    pub(crate) inner: S,
    pub(crate) guard: Guard<R>,
    pub(crate) options: Arc<Options>,
}

impl<S: Clone, R> Clone for Idempotency<S, R> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
            guard: self.guard.clone(),
            options: Arc::clone(&self.options),
        }
    }
}

impl<S, R, B, RB> tower::Service<Request<B>> for Idempotency<S, R>
where
    S: tower::Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    R: Reservations + 'static,
    B: Body + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    RB: Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<IdempotencyBody<RB>>;
    type Error = S::Error;
    type Future = ResponseFuture<RB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The service that was polled ready handles this request; a fresh clone stays.
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        let guard = self.guard.clone();
        let options = Arc::clone(&self.options);
        let (parts, body) = request.into_parts();
        Box::pin(handle(ready, guard, options, parts, body))
    }
}

/// One request, from its key to the stored response (an `async` block rather than an
/// `async fn`, here and in [`run`], so the arguments are held once in the request's future,
/// not twice): the HTTP side of the steps of the
/// [guard](crate::guard) (reading the key, scope, body and fingerprint from the request;
/// writing the guard's decisions as HTTP answers). See the module docs.
#[allow(clippy::manual_async_fn)] // The arguments held once (above).
fn handle<S, R, B, RB>(
    mut inner: S,
    guard: Guard<R>,
    o: Arc<Options>,
    parts: Parts,
    body: B,
) -> impl Future<Output = Result<Response<IdempotencyBody<RB>>, S::Error>>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    R: Reservations + 'static,
    B: Body + From<Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    RB: Body<Data = Bytes>,
{
    async move {
        if !o.adapter.methods.contains(&parts.method) {
            let request = Request::from_parts(parts, body);
            return Ok(inner.call(request).await?.map(Either::Right));
        }
        let id = client_key(
            parts
                .headers
                .get_all(IDEMPOTENCY_KEY)
                .iter()
                .map(HeaderValue::as_bytes),
        );
        let id = match id {
            Ok(Some(id)) => id,
            Ok(None) if !o.require_key => {
                let request = Request::from_parts(parts, body);
                return Ok(inner.call(request).await?.map(Either::Right));
            }
            Ok(None) => return Ok(answer(&o, Refused::new(Refusal::KeyMissing))),
            Err(refused) => return Ok(answer(&o, refused)),
        };
        // In blocks, so that nothing but the key is held across the awaits below.
        let key = {
            let mut buffer = [0; Key::MAX_PART_LEN];
            match request_key((o.scope)(&parts), &operation(&parts, &mut buffer), &id) {
                Ok(key) => key,
                Err(refused) => return Ok(answer(&o, refused)),
            }
        };
        drop(id);
        let body = match read_body(&o, &parts.headers, body).await {
            Ok(body) => body,
            Err(refused) => return Ok(answer(&o, refused)),
        };
        let fingerprint = (o.adapter.own.fingerprint)(&parts, &body);
        let running = match guard.begin(&key, fingerprint).await {
            Begin::Run(running) => running,
            Begin::Replay(stored) => return Ok(replay(&o, &parts, stored)),
            Begin::Refuse(refused) => return Ok(answer(&o, refused)),
        };
        drop(key);
        let request = Request::from_parts(parts, B::from(body));
        run(inner, &guard, &o, running, request).await
    }
}

/// Runs the handler under the running key, then stores its response (or releases the key) and
/// returns it. Dropping this future before that releases the key (see [`Running`]).
#[allow(clippy::manual_async_fn)] // The arguments held once (see `handle`).
fn run<'a, S, R, B, RB>(
    mut inner: S,
    guard: &'a Guard<R>,
    o: &'a Options,
    running: Running<R>,
    request: Request<B>,
) -> impl Future<Output = Result<Response<IdempotencyBody<RB>>, S::Error>> + use<'a, S, R, B, RB>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    R: Reservations + 'static,
    RB: Body<Data = Bytes>,
{
    async move {
        let response = match running.work(inner.call(request)).await {
            Ok(response) => response,
            Err(error) => {
                running.release(Release::Failed).await;
                return Err(error);
            }
        };
        let (parts, body) = response.into_parts();
        let headers = || {
            o.adapter.replay_headers.iter().flat_map(|name| {
                let values = parts.headers.get_all(name).iter();
                values.map(move |value| (name.as_str(), value.as_bytes()))
            })
        };
        let len = body
            .size_hint()
            .exact()
            .map(|len| stored_len(headers(), len));
        if !guard.stores_response(len) {
            // A stream, or over the limit: passed through as it comes, never held whole.
            if (o.stores)(parts.status) {
                // Completed with a marker: the work is done and must not run again. If even the
                // marker is not stored, the key is released; this client gets its answer anyway.
                let _ = running.complete_not_stored(parts.status.as_u16()).await;
            } else {
                running.release(Release::NotStored).await;
            }
            return Ok(Response::from_parts(parts, Either::Right(body)));
        }
        // `ok()`: the body's error need not be `Send`, and is not kept across the release.
        let body = match read_all(body).await.ok() {
            Some(body) => body,
            None => {
                running.release(Release::Failed).await;
                return Ok(answer(o, Refused::new(Refusal::ResponseUnreadable)));
            }
        };
        if (o.stores)(parts.status) {
            let encoded = encode_stored(parts.status.as_u16(), headers(), &body);
            // Over the store's own limit: completed with the not-stored marker. Not stored at
            // all (lease lost, store failed): the key is released so a retry runs the handler
            // again. This client gets its answer either way.
            let _ = running.complete(encoded).await;
        } else {
            running.release(Release::NotStored).await;
        }
        Ok(Response::from_parts(parts, Either::Left(Full::new(body))))
    }
}

/// The operation a key is scoped to: method and path (`POST /orders/7/refunds`), written in
/// `buffer` when it fits (a key part's most), so the usual request allocates nothing for it.
fn operation<'a>(parts: &Parts, buffer: &'a mut [u8; Key::MAX_PART_LEN]) -> Cow<'a, [u8]> {
    let (method, path) = (
        parts.method.as_str().as_bytes(),
        parts.uri.path().as_bytes(),
    );
    let len = method.len() + 1 + path.len();
    if len > buffer.len() {
        return Cow::Owned([method, b" ", path].concat());
    }
    buffer[..method.len()].copy_from_slice(method);
    buffer[method.len()] = b' ';
    buffer[method.len() + 1..len].copy_from_slice(path);
    Cow::Borrowed(&buffer[..len])
}

/// Reads the request body, up to the limit.
async fn read_body<B>(o: &Options, headers: &HeaderMap, body: B) -> Result<Bytes, Refused>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > o.max_request as u64) {
        return Err(Refused::body_too_large(o.max_request));
    }
    match read_all(Limited::new(body, o.max_request)).await {
        Ok(body) => Ok(body),
        Err(error) if error.is::<LengthLimitError>() => Err(Refused::body_too_large(o.max_request)),
        Err(error) => {
            let detail = format!("the request body could not be read: {error}");
            Err(Refused::with_detail(Refusal::BodyUnreadable, detail))
        }
    }
}

/// A body's bytes, read whole. A body of one data frame (the usual case) is that frame's
/// bytes, taken as they are; only a body of several frames is copied into one buffer.
/// Trailers are dropped, as `collect().to_bytes()` drops them.
async fn read_all<B: Body>(body: B) -> Result<Bytes, B::Error> {
    let mut body = pin!(body);
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    while let Some(frame) = body.frame().await {
        let Ok(mut data) = frame?.into_data() else {
            continue;
        };
        let data = data.copy_to_bytes(data.remaining());
        match (&first, &mut joined) {
            (None, _) => first = Some(data),
            (Some(_), Some(joined)) => joined.extend_from_slice(&data),
            (Some(first), None) => {
                let mut both = BytesMut::with_capacity(first.len() + data.len());
                both.extend_from_slice(first);
                both.extend_from_slice(&data);
                joined = Some(both);
            }
        }
    }
    Ok(joined.map_or_else(|| first.unwrap_or_default(), BytesMut::freeze))
}

/// The stored response, marked as a replay, then adjusted by the replay hook. Header values
/// and the body are slices of the stored bytes, not copies.
fn replay<RB>(o: &Options, request: &Parts, bytes: Vec<u8>) -> Response<IdempotencyBody<RB>> {
    let Some((status, headers, body)) = to_http(Bytes::from(bytes)) else {
        return answer(o, Refused::new(Refusal::StoredResponseUnreadable));
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    if let Some(hook) = &o.adapter.own.on_replay {
        hook(request, &mut response);
    }
    response.map(|body| Either::Left(Full::new(body)))
}

/// A stored response ([`StoredResponse::encode`](crate::guard::StoredResponse::encode)'s layout) in `http` types; `None` when it does
/// not decode, or a status or header does not convert.
fn to_http(bytes: Bytes) -> Option<(StatusCode, HeaderMap, Bytes)> {
    let mut headers = HeaderMap::new();
    let mut valid = true;
    let (status, body) = walk_stored(&bytes, |name, value| {
        let name = HeaderName::from_bytes(name.as_bytes());
        let value = HeaderValue::from_maybe_shared(bytes.slice_ref(value));
        match (name, value) {
            (Ok(name), Ok(value)) => {
                headers.append(name, value);
            }
            _ => valid = false,
        }
    })?;
    let status = StatusCode::from_u16(status).ok().filter(|_| valid)?;
    Some((status, headers, bytes.slice(body..)))
}

/// The HTTP status of each refusal.
fn status_of(o: &Options, refusal: Refusal) -> StatusCode {
    let status = http_status(refusal, o.adapter.body_too_large.as_u16());
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// A refusal as an RFC 9457 problem with its status and headers: `Retry-After` in whole
/// seconds (at least 1) when the guard gave a delay, `WWW-Authenticate` with a 401,
/// `Connection: close` with a body too large (the rest of it is not read).
fn answer<RB>(o: &Options, refused: Refused) -> Response<IdempotencyBody<RB>> {
    let status = status_of(o, refused.refusal);
    let mut response = problem(
        &o.adapter.problem_base,
        refused.refusal,
        status,
        &refused.detail,
        refused.limit,
    );
    let headers = response.headers_mut();
    if let Some(secs) = retry_after_secs(&refused) {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    match refused.refusal {
        Refusal::NoScope => {
            headers.insert(header::WWW_AUTHENTICATE, o.adapter.challenge.clone());
        }
        Refusal::BodyTooLarge => {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        _ => {}
    }
    response.map(Either::Left)
}
