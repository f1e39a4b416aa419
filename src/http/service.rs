//! [`Idempotency`]: the service the layer wraps a handler in, and what it does per request.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full, LengthLimitError, Limited};

use crate::http::config::Options;
use crate::http::heartbeat;
use crate::http::problem::{problem, Refusal};
use crate::http::release::ReleaseGuard;
use crate::http::stored;
use crate::http::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use crate::{Fingerprint, Key, Lease, Reservation, Reservations, MAX_KEY_PART_LEN};

/// The body of every response of [`Idempotency`]: a buffered one (an answer of the layer, a
/// replay, or a handler response that was read to be stored) or the handler's own, untouched
/// (requests the layer lets through).
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
    pub(crate) store: Arc<R>,
    pub(crate) options: Arc<Options>,
}

impl<S: Clone, R> Clone for Idempotency<S, R> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
            store: Arc::clone(&self.store),
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
        let store = Arc::clone(&self.store);
        let options = Arc::clone(&self.options);
        Box::pin(handle(ready, store, options, request))
    }
}

/// One request, from its key to the stored response. See the module docs.
async fn handle<S, R, B, RB>(
    mut inner: S,
    store: Arc<R>,
    o: Arc<Options>,
    request: Request<B>,
) -> Result<Response<IdempotencyBody<RB>>, S::Error>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    R: Reservations + 'static,
    B: Body + From<Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    RB: Body<Data = Bytes>,
{
    if !o.methods.contains(request.method()) {
        return Ok(inner.call(request).await?.map(Either::Right));
    }
    let id = match key_of(request.headers()) {
        Ok(Some(id)) => id,
        Ok(None) if !o.require_key => return Ok(inner.call(request).await?.map(Either::Right)),
        Ok(None) => {
            let detail = "This operation is idempotent and it requires correct usage of \
                          Idempotency Key: send an Idempotency-Key header.";
            return Ok(refuse(
                &o,
                Refusal::KeyMissing,
                StatusCode::BAD_REQUEST,
                detail,
            ));
        }
        Err(detail) => {
            return Ok(refuse(
                &o,
                Refusal::KeyInvalid,
                StatusCode::BAD_REQUEST,
                &detail,
            ));
        }
    };
    let (parts, body) = request.into_parts();
    let Some(scope) = (o.scope)(&parts).filter(|scope| !scope.is_empty()) else {
        let detail = "the request carries no identity to scope its Idempotency-Key by";
        let mut response = refuse(&o, Refusal::NoScope, StatusCode::UNAUTHORIZED, detail);
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, o.challenge.clone());
        return Ok(response);
    };
    let key = match Key::new(bounded(scope), bounded(operation(&parts)), &id) {
        Ok(key) => key,
        Err(error) => {
            let detail = error.to_string();
            return Ok(refuse(
                &o,
                Refusal::KeyInvalid,
                StatusCode::BAD_REQUEST,
                &detail,
            ));
        }
    };
    let body = match read_body(&o, &parts.headers, body).await {
        Ok(body) => body,
        Err(refusal) => return Ok(refusal),
    };
    let query = parts.uri.query().unwrap_or("").as_bytes();
    let fingerprint = Fingerprint::of_parts([query, &body[..]]);
    let reservation = match store.reserve(&key, fingerprint).await {
        Ok(reservation) => reservation,
        Err(error) => return Ok(unavailable(&o, &error)),
    };
    match reservation {
        Reservation::Acquired(lease) => {
            let request = Request::from_parts(parts, B::from(body));
            run(inner, store, &o, lease, request).await
        }
        Reservation::Completed(done) => Ok(replay(&o, &done.result)),
        Reservation::InProgress { retry_after, .. } => {
            let detail = "A request with the same Idempotency-Key for the same operation is \
                          being processed or is outstanding.";
            let mut response = refuse(&o, Refusal::InProgress, StatusCode::CONFLICT, detail);
            let secs = retry_after
                .min(o.max_retry_after)
                .as_secs_f64()
                .ceil()
                .max(1.0);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs as u64));
            Ok(response)
        }
        Reservation::Mismatch => {
            let detail = "This operation is idempotent and it requires correct usage of \
                          Idempotency Key. Idempotency Key MUST not be reused across different \
                          payloads of this operation.";
            Ok(refuse(
                &o,
                Refusal::KeyReused,
                StatusCode::UNPROCESSABLE_ENTITY,
                detail,
            ))
        }
        Reservation::NeedsReview { .. } => {
            let detail = "The outcome of the first request with this key is being checked.";
            Ok(refuse(
                &o,
                Refusal::UnderReview,
                StatusCode::CONFLICT,
                detail,
            ))
        }
    }
}

/// Runs the handler under `lease`, then stores its response (or releases the key) and returns
/// it. The guard releases the key if this future is dropped or unwinds before that.
async fn run<S, R, B, RB>(
    mut inner: S,
    store: Arc<R>,
    o: &Options,
    lease: Lease,
    request: Request<B>,
) -> Result<Response<IdempotencyBody<RB>>, S::Error>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    R: Reservations + 'static,
    RB: Body<Data = Bytes>,
{
    let guard = ReleaseGuard::new(Arc::clone(&store), lease);
    let call = inner.call(request);
    let response = match heartbeat::while_running(&*store, guard.lease(), call).await {
        Ok(response) => response,
        Err(error) => {
            guard.release().await;
            return Err(error);
        }
    };
    let (parts, body) = response.into_parts();
    // `ok()`: the body's error need not be `Send`, and is not kept across the release.
    let body = match body.collect().await.ok() {
        Some(body) => body.to_bytes(),
        None => {
            guard.release().await;
            let detail = "the handler's response body failed while it was read";
            let status = StatusCode::INTERNAL_SERVER_ERROR;
            return Ok(refuse(o, Refusal::ResponseUnreadable, status, detail));
        }
    };
    if (o.store_status)(parts.status) {
        let encoded = stored::encode(parts.status, &parts.headers, &o.replay_headers, &body);
        match store.complete(guard.lease(), encoded).await {
            Ok(()) => guard.disarm(),
            Err(_error) => {
                // Too large to store, or the lease was lost: this client still gets its
                // answer, and a retry runs the handler again.
                #[cfg(feature = "tracing")]
                tracing::warn!(error = %_error, "response not stored; the key is released");
                guard.release().await;
            }
        }
    } else {
        guard.release().await;
    }
    Ok(Response::from_parts(parts, Either::Left(Full::new(body))))
}

/// The client's key: a quoted structured-field string (`"abc"`, as the draft writes it) or a
/// bare token (`abc`, as most clients send it). `Err` names what is wrong with it.
fn key_of(headers: &HeaderMap) -> Result<Option<Vec<u8>>, String> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err("send one Idempotency-Key header, not several".into());
    }
    let id = match value.as_bytes() {
        [b'"', inner @ .., b'"'] => inner,
        other => other,
    };
    if id.is_empty() {
        return Err("the Idempotency-Key is empty".into());
    }
    if id.len() > MAX_KEY_PART_LEN {
        return Err(format!(
            "the Idempotency-Key is {} bytes long; at most {MAX_KEY_PART_LEN} bytes are accepted",
            id.len()
        ));
    }
    Ok(Some(id.to_vec()))
}

/// The operation a key is scoped to: method and path (`POST /orders/7/refunds`).
fn operation(parts: &Parts) -> Vec<u8> {
    format!("{} {}", parts.method, parts.uri.path()).into_bytes()
}

/// `part` itself when it fits in a key, else `#` and the hex of its BLAKE3 digest.
fn bounded(part: Vec<u8>) -> Vec<u8> {
    if part.len() <= MAX_KEY_PART_LEN {
        return part;
    }
    let mut out = b"#".to_vec();
    for byte in Fingerprint::of(&part).as_bytes() {
        out.extend_from_slice(format!("{byte:02x}").as_bytes());
    }
    out
}

/// Reads the request body, up to the limit.
async fn read_body<B, RB>(
    o: &Options,
    headers: &HeaderMap,
    body: B,
) -> Result<Bytes, Response<IdempotencyBody<RB>>>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let too_large = |o: &Options| {
        let detail = format!(
            "the request body is over {} bytes, the most this operation reads",
            o.max_body
        );
        let mut response = problem(
            &o.problem_base,
            Refusal::BodyTooLarge,
            o.body_too_large,
            &detail,
            Some(o.max_body),
        );
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        response.map(Either::Left)
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > o.max_body as u64) {
        return Err(too_large(o));
    }
    match Limited::new(body, o.max_body).collect().await {
        Ok(body) => Ok(body.to_bytes()),
        Err(error) if error.is::<LengthLimitError>() => Err(too_large(o)),
        Err(error) => {
            let detail = format!("the request body could not be read: {error}");
            let status = StatusCode::BAD_REQUEST;
            Err(refuse(o, Refusal::BodyUnreadable, status, &detail))
        }
    }
}

/// The stored response, marked as a replay.
fn replay<RB>(o: &Options, bytes: &[u8]) -> Response<IdempotencyBody<RB>> {
    let Some(stored) = stored::decode(bytes) else {
        let detail = "the stored response for this key does not decode";
        let status = StatusCode::INTERNAL_SERVER_ERROR;
        return refuse(o, Refusal::StoredResponseUnreadable, status, detail);
    };
    let mut response = Response::new(Either::Left(Full::new(stored.body)));
    *response.status_mut() = stored.status;
    *response.headers_mut() = stored.headers;
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// 503 with `Retry-After`: the store failed. The error stays in the server's logs (feature
/// `tracing`); it can name files, so the client is not shown it.
fn unavailable<RB>(o: &Options, _error: &crate::Error) -> Response<IdempotencyBody<RB>> {
    #[cfg(feature = "tracing")]
    tracing::warn!(error = %_error, "idempotency store failed");
    let detail = "the idempotency store failed; retry later";
    let status = StatusCode::SERVICE_UNAVAILABLE;
    let mut response = refuse(o, Refusal::StoreUnavailable, status, detail);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(1));
    response
}

fn refuse<RB>(
    o: &Options,
    refusal: Refusal,
    status: StatusCode,
    detail: &str,
) -> Response<IdempotencyBody<RB>> {
    problem(&o.problem_base, refusal, status, detail, None).map(Either::Left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_read_quoted_or_bare_and_refused_with_the_limit() {
        let mut headers = HeaderMap::new();
        assert_eq!(key_of(&headers), Ok(None));
        headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_static("\"k-1\""));
        assert_eq!(key_of(&headers), Ok(Some(b"k-1".to_vec())));
        headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_static("k-1"));
        assert_eq!(key_of(&headers), Ok(Some(b"k-1".to_vec())));
        headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_static("\"\""));
        assert!(key_of(&headers).unwrap_err().contains("empty"));
        let long = HeaderValue::from_str(&"k".repeat(256)).unwrap();
        headers.insert(IDEMPOTENCY_KEY, long);
        let error = key_of(&headers).unwrap_err();
        assert!(
            error.contains("256 bytes") && error.contains("255"),
            "{error}"
        );
        headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_static("a"));
        headers.append(IDEMPOTENCY_KEY, HeaderValue::from_static("b"));
        assert!(key_of(&headers).unwrap_err().contains("one"));
    }

    #[test]
    fn long_parts_are_replaced_by_their_digest() {
        let short = b"POST /orders".to_vec();
        assert_eq!(bounded(short.clone()), short);
        let a = bounded(vec![b'a'; 300]);
        let b = bounded([vec![b'a'; 299], vec![b'b']].concat());
        assert_eq!((a.len(), a[0]), (65, b'#'));
        assert_ne!(a, b, "distinct long parts stay distinct");
        assert!(Key::new(&a, "op", "id").is_ok());
    }
}
