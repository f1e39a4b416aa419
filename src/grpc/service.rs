//! [`GrpcIdempotency`]: the service the layer wraps a tonic server in, and what it does per RPC.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, DATE};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use tonic::body::Body;
use tonic::Code;

use crate::grpc::config::Options;
use crate::grpc::key::{metadata_key, request_id_key, KeySource};
use crate::grpc::status::refusal_response;
use crate::grpc::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use crate::guard::{
    encode_stored, request_key, Begin, Guard, Refusal, Refused, Release, Running, StoredResponse,
};
use crate::{Fingerprint, Reservations};

/// The future of [`GrpcIdempotency`]'s responses.
pub type ResponseFuture<E> = Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>;

/// The boxed error every tonic body carries.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The stored entry that separates the response's headers from its trailers: a pseudo-header
/// name, which no real header or metadata entry can have.
const TRAILERS: &str = ":trailers";

/// The service made by [`GrpcIdempotencyLayer`](crate::grpc::GrpcIdempotencyLayer) around a
/// tonic server's routes (or any service of `http` requests with tonic bodies).
pub struct GrpcIdempotency<S, R> {
    pub(crate) inner: S,
    pub(crate) guard: Guard<R>,
    pub(crate) options: Arc<Options>,
}

impl<S: Clone, R> Clone for GrpcIdempotency<S, R> {
    fn clone(&self) -> Self {
        GrpcIdempotency {
            inner: self.inner.clone(),
            guard: self.guard.clone(),
            options: Arc::clone(&self.options),
        }
    }
}

impl<S, R, RB> tower::Service<Request<Body>> for GrpcIdempotency<S, R>
where
    S: tower::Service<Request<Body>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    R: Reservations + 'static,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // The service that was polled ready handles this request; a fresh clone stays.
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        let guard = self.guard.clone();
        let options = Arc::clone(&self.options);
        Box::pin(handle(ready, guard, options, request))
    }
}

/// One RPC: the gRPC side of the steps of the [guard](crate::guard).
async fn handle<S, R, RB>(
    mut inner: S,
    guard: Guard<R>,
    o: Arc<Options>,
    request: Request<Body>,
) -> Result<Response<Body>, S::Error>
where
    S: tower::Service<Request<Body>, Response = Response<RB>>,
    R: Reservations + 'static,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    let path = request.uri().path();
    let Some(source) = o.adapter.get(path).cloned() else {
        return Ok(inner.call(request).await?.map(Body::new));
    };
    let (parts, body) = request.into_parts();
    let body = match read_request(&o, body).await {
        Ok(body) => body,
        Err(refused) => return Ok(refusal_response(&refused, &source)),
    };
    let id = match &source {
        KeySource::Metadata => {
            let values = parts.headers.get_all(IDEMPOTENCY_KEY);
            metadata_key(values.iter().map(HeaderValue::as_bytes))
        }
        KeySource::RequestId(read) => match single_message(&body).and_then(|m| read(m)) {
            Ok(id) => request_id_key(id, source.field()),
            Err(detail) => Err(Refused::with_detail(Refusal::BodyUnreadable, detail)),
        },
    };
    let id = match id {
        Ok(Some(id)) => id,
        Ok(None) if !o.require_key => {
            let request = Request::from_parts(parts, Body::new(Full::new(body)));
            return Ok(inner.call(request).await?.map(Body::new));
        }
        Ok(None) => {
            let detail = match source {
                KeySource::Metadata => {
                    "this RPC is idempotent: send its key in an idempotency-key metadata entry"
                }
                KeySource::RequestId(_) => {
                    "this RPC is idempotent: set the request_id field of the request message"
                }
            };
            let refused = Refused::with_detail(Refusal::KeyMissing, detail);
            return Ok(refusal_response(&refused, &source));
        }
        Err(refused) => return Ok(refusal_response(&refused, &source)),
    };
    let key = match request_key((o.scope)(&parts), parts.uri.path().as_bytes(), &id) {
        Ok(key) => key,
        Err(refused) => return Ok(refusal_response(&refused, &source)),
    };
    match guard.begin(&key, Fingerprint::of(&body)).await {
        Begin::Run(running) => {
            let request = Request::from_parts(parts, Body::new(Full::new(body)));
            run(inner, &guard, &o, &source, running, request).await
        }
        Begin::Replay(stored) => Ok(replay(&stored, &source)),
        Begin::Refuse(refused) => Ok(refusal_response(&refused, &source)),
    }
}

/// Runs the handler under the running key, then stores its answer (or releases the key) and
/// returns it. Dropping this future before that (the client cancelled, the handler panicked)
/// releases the key (see [`Running`]).
async fn run<S, R, RB>(
    mut inner: S,
    guard: &Guard<R>,
    o: &Options,
    source: &KeySource,
    running: Running<R>,
    request: Request<Body>,
) -> Result<Response<Body>, S::Error>
where
    S: tower::Service<Request<Body>, Response = Response<RB>>,
    R: Reservations + 'static,
    RB: http_body::Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    let response = match running.work(inner.call(request)).await {
        Ok(response) => response,
        Err(error) => {
            running.release(Release::Failed).await;
            return Err(error);
        }
    };
    let (mut parts, body) = response.into_parts();
    // A plain tonic answer has none; the layer sends the data in a body of its own.
    parts.headers.remove(CONTENT_LENGTH);
    let Ok(collected) = running.work(body.collect()).await else {
        running.release(Release::Failed).await;
        let refused = Refused::new(Refusal::ResponseUnreadable);
        return Ok(refusal_response(&refused, source));
    };
    let trailers = collected.trailers().cloned();
    let data = collected.to_bytes();
    // A trailers-only answer (an error status) carries `grpc-status` in its headers.
    let status = trailers.as_ref().unwrap_or(&parts.headers);
    let code = status
        .get(tonic::Status::GRPC_STATUS)
        .map(|value| Code::from_bytes(value.as_bytes()));
    if code.filter(|code| (o.stores)(*code)).is_none() {
        running.release(Release::NotStored).await;
        return Ok(Response::from_parts(parts, Answer::body(data, trailers)));
    }
    let encoded = encode(
        parts.status,
        &stored(&parts.headers),
        trailers.as_ref(),
        &data,
    );
    let len = encoded.as_ref().map_or(data.len(), Vec::len);
    match encoded {
        // Over the limit: answered, and the key completed with a marker (the work is done).
        _ if !guard.stores_response(Some(len as u64)) => {
            drop(running.complete_not_stored(parts.status.as_u16()).await);
        }
        // Over the store's own limit: completed with the not-stored marker. Not stored at
        // all (lease lost, store failed): the key is released so a retry runs the handler
        // again. This client gets its answer either way.
        Some(encoded) => drop(running.complete(encoded).await),
        None => running.release(Release::NotStored).await,
    }
    Ok(Response::from_parts(parts, Answer::body(data, trailers)))
}

/// The headers of an answer as stored: without those that belong to one answer on one
/// connection, not to the answer itself: `date` (a replay gets a fresh one from the server, as
/// any answer does) and `content-length` (a plain tonic answer has none).
fn stored(headers: &HeaderMap) -> HeaderMap {
    let mut headers = headers.clone();
    headers.remove(DATE);
    headers.remove(CONTENT_LENGTH);
    headers
}

/// Reads the request stream, up to the limit.
async fn read_request(o: &Options, body: Body) -> Result<Bytes, Refused> {
    match Limited::new(body, o.max_request).collect().await {
        Ok(body) => Ok(body.to_bytes()),
        Err(error) if error.is::<LengthLimitError>() => Err(Refused::body_too_large(o.max_request)),
        Err(error) => {
            let detail = format!("the request stream could not be read: {error}");
            Err(Refused::with_detail(Refusal::BodyUnreadable, detail))
        }
    }
}

/// The one message of a unary request's stream: a 5-byte prefix (compressed flag, length,
/// big-endian) and the message.
pub fn single_message(stream: &[u8]) -> Result<&[u8], String> {
    let Some((&[compressed, a, b, c, d], message)) = stream.split_first_chunk::<5>() else {
        return Err("the request holds no message, so its request id cannot be read".into());
    };
    if compressed != 0 {
        return Err(
            "the request message is compressed; send it uncompressed so its request id can be read"
                .into(),
        );
    }
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    if message.len() != len {
        return Err(format!(
            "the request must be one message of {len} bytes; {} bytes follow its prefix",
            message.len()
        ));
    }
    Ok(message)
}

/// The answer as stored: the HTTP status, the headers, [`TRAILERS`] and the trailers, and
/// the data frames as sent. `None` when some header would not be stored whole (over 255
/// entries, or a value over 64 KiB): such an answer is not stored rather than replayed cut.
pub fn encode(
    status: StatusCode,
    headers: &HeaderMap,
    trailers: Option<&HeaderMap>,
    data: &[u8],
) -> Option<Vec<u8>> {
    fn pairs(map: &HeaderMap) -> Vec<(&str, &[u8])> {
        map.iter()
            .map(|(name, value)| (name.as_str(), value.as_bytes()))
            .collect()
    }
    let mut entries = pairs(headers);
    if let Some(trailers) = trailers {
        entries.push((TRAILERS, b""));
        entries.extend(pairs(trailers));
    }
    let fits = entries.len() <= 255
        && entries
            .iter()
            .all(|(name, value)| name.len() <= 255 && value.len() <= usize::from(u16::MAX));
    fits.then(|| encode_stored(status.as_u16(), entries, data))
}

/// The stored answer, marked as a replay in its headers: the initial metadata of an answer
/// with messages, the trailing metadata (with the status) of a Trailers-Only one.
fn replay(bytes: &[u8], source: &KeySource) -> Response<Body> {
    let Some((status, mut headers, trailers, data)) = decode(bytes) else {
        let refused = Refused::new(Refusal::StoredResponseUnreadable);
        return refusal_response(&refused, source);
    };
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    let mut response = Response::new(Answer::body(data, trailers));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// [`encode`]'s parts in `http` types; `None` when something does not convert.
pub fn decode(bytes: &[u8]) -> Option<(StatusCode, HeaderMap, Option<HeaderMap>, Bytes)> {
    let stored = StoredResponse::decode(bytes)?;
    let status = StatusCode::from_u16(stored.status).ok()?;
    let mut headers = HeaderMap::new();
    let mut trailers: Option<HeaderMap> = None;
    for (name, value) in stored.headers {
        if name == TRAILERS {
            trailers = Some(HeaderMap::new());
            continue;
        }
        let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
        let value = HeaderValue::from_bytes(&value).ok()?;
        trailers
            .as_mut()
            .unwrap_or(&mut headers)
            .append(name, value);
    }
    Some((status, headers, trailers, Bytes::from(stored.body)))
}

/// The body of an answer the layer read whole (from the handler, or from the store): its data
/// frames as one frame, then its trailers.
///
/// Framed as a plain tonic answer is. With neither data nor trailers (an error status in the
/// headers) it is at its end before it is polled, so the server ends the stream with the
/// headers: gRPC's Trailers-Only answer, one HEADERS frame with END_STREAM, which every gRPC
/// client reads as the status (an empty DATA frame after it makes clients on the gRPC C core
/// report `UNKNOWN`). It tells no exact size, so the server adds no `content-length`.
struct Answer {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Answer {
    fn body(data: Bytes, trailers: Option<HeaderMap>) -> Body {
        let data = (!data.is_empty()).then_some(data);
        Body::new(Answer { data, trailers })
    }
}

impl http_body::Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(data) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
}
