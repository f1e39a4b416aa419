//! [`IdempotencyLayer`]: the layer and its options, with their defaults.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{header, HeaderName, HeaderValue, Method, Response, StatusCode};

use crate::guard::Guard;
pub use crate::guard::DEFAULT_MAX_RETRY_AFTER;
use crate::http::service::Idempotency;
use crate::{Fingerprint, Reservations};

/// Default for [`IdempotencyLayer::max_body`]: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1 << 20;
/// Default for [`IdempotencyLayer::problem_base`].
pub const DEFAULT_PROBLEM_BASE: &str = "https://docs.rs/idemstore/latest/idemstore/http/#";

/// Finds who a request belongs to (a user, a tenant); see [`IdempotencyLayer::scope`].
pub(crate) type ScopeFn = dyn Fn(&Parts) -> Option<Vec<u8>> + Send + Sync;
/// Says which response statuses are stored; see [`IdempotencyLayer::store_status`].
pub(crate) type StatusFn = dyn Fn(StatusCode) -> bool + Send + Sync;
/// Takes a request's fingerprint; see [`IdempotencyLayer::fingerprint`].
pub(crate) type FingerprintFn = dyn Fn(&Parts, &Bytes) -> Fingerprint + Send + Sync;
/// Adjusts a replayed response; see [`IdempotencyLayer::on_replay`].
pub(crate) type ReplayFn = dyn Fn(&Parts, &mut Response<Bytes>) + Send + Sync;

/// What the service reads on every request. Cloned only while the layer is configured.
#[derive(Clone)]
pub(crate) struct Options {
    pub(crate) scope: Arc<ScopeFn>,
    pub(crate) methods: Vec<Method>,
    pub(crate) require_key: bool,
    pub(crate) store_status: Arc<StatusFn>,
    pub(crate) replay_headers: Vec<HeaderName>,
    pub(crate) max_body: usize,
    pub(crate) body_too_large: StatusCode,
    pub(crate) problem_base: String,
    pub(crate) challenge: HeaderValue,
    pub(crate) fingerprint: Arc<FingerprintFn>,
    pub(crate) on_replay: Option<Arc<ReplayFn>>,
}

/// A tower [`Layer`](tower::Layer) that makes the requests it guards idempotent by their
/// `Idempotency-Key` header, on any [`Reservations`] backend. See the [module docs](crate::http)
/// for what it answers.
///
/// `new` takes the defaults; each setter documents its own and returns the layer, so the
/// configuration reads as one expression:
///
/// ```
/// use std::sync::Arc;
/// use idemstore::http::IdempotencyLayer;
/// use idemstore::Store;
///
/// # let dir = tempfile::tempdir()?;
/// let store = Arc::new(Store::open(dir.path().join("api.idem"))?);
/// let layer = IdempotencyLayer::new(store)
///     .scope(|request| {
///         let tenant = request.headers.get("x-tenant")?;
///         Some(tenant.as_bytes().to_vec())
///     })
///     .max_body(64 * 1024)
///     .store_status(|status| status.is_success());
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct IdempotencyLayer<R> {
    pub(crate) guard: Guard<R>,
    pub(crate) options: Arc<Options>,
}

impl<R> Clone for IdempotencyLayer<R> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            guard: self.guard.clone(),
            options: Arc::clone(&self.options),
        }
    }
}

impl<R> fmt::Debug for IdempotencyLayer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        f.debug_struct("IdempotencyLayer")
            .field("methods", &o.methods)
            .field("require_key", &o.require_key)
            .field("replay_headers", &o.replay_headers)
            .field("max_body", &o.max_body)
            .field("body_too_large", &o.body_too_large)
            .field("guard", &self.guard)
            .field("problem_base", &o.problem_base)
            .finish_non_exhaustive()
    }
}

impl<R: Reservations + 'static> IdempotencyLayer<R> {
    /// A layer over `store` with the defaults of every setter below.
    pub fn new(store: Arc<R>) -> IdempotencyLayer<R> {
        IdempotencyLayer {
            guard: Guard::new(store),
            options: Arc::new(Options {
                scope: Arc::new(|_: &Parts| Some(b"*".to_vec())),
                methods: vec![Method::POST, Method::PATCH],
                require_key: true,
                store_status: Arc::new(|status: StatusCode| !status.is_server_error()),
                replay_headers: vec![header::CONTENT_TYPE, header::LOCATION],
                max_body: DEFAULT_MAX_BODY,
                body_too_large: StatusCode::PAYLOAD_TOO_LARGE,
                problem_base: DEFAULT_PROBLEM_BASE.to_owned(),
                challenge: HeaderValue::from_static("Bearer"),
                fingerprint: Arc::new(|request: &Parts, body: &Bytes| {
                    let query = request.uri.query().unwrap_or("").as_bytes();
                    Fingerprint::of_parts([query, &body[..]])
                }),
                on_replay: None,
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Options)) -> Self {
        change(Arc::make_mut(&mut self.options));
        self
    }

    /// Who a request belongs to: keys are scoped by it (and by method and path), so one
    /// caller's key never replays another caller's response. `None` refuses the request with
    /// 401 ([`Refusal::NoScope`](crate::http::Refusal::NoScope)).
    ///
    /// Set it whenever clients are distinct users or tenants, from the identity the service
    /// has verified (a token's subject, say). A scope longer than
    /// [`Key::MAX_PART_LEN`](crate::Key::MAX_PART_LEN) bytes is replaced by its BLAKE3 digest.
    ///
    /// Default: one scope, `*`, shared by every client.
    pub fn scope(self, scope: impl Fn(&Parts) -> Option<Vec<u8>> + Send + Sync + 'static) -> Self {
        self.with(|o| o.scope = Arc::new(scope))
    }

    /// The request methods guarded; every other method passes through untouched.
    ///
    /// Default: `POST` and `PATCH`, the methods the Idempotency-Key draft names as not
    /// idempotent.
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.with(|o| o.methods = methods.into_iter().collect())
    }

    /// Whether a guarded request must carry an `Idempotency-Key`. `false` lets a request
    /// without one through, unguarded (it runs every time it is sent).
    ///
    /// Default: `true`, a request without a key gets 400
    /// ([`Refusal::KeyMissing`](crate::http::Refusal::KeyMissing)), as the draft says.
    pub fn require_key(self, require: bool) -> Self {
        self.with(|o| o.require_key = require)
    }

    /// Which handler responses are stored and replayed. The key of any other response is
    /// released, so a retry runs the handler again.
    ///
    /// Default: every status but 5xx (a server error is worth retrying).
    pub fn store_status(self, store: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Self {
        self.with(|o| o.store_status = Arc::new(store))
    }

    /// The response headers stored with status and body, and replayed (every value of each).
    /// Others (a request id, a date) belong to one response only.
    ///
    /// Default: `content-type` and `location`.
    pub fn replay_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.with(|o| o.replay_headers = names.into_iter().collect())
    }

    /// The largest request body read and fingerprinted, in bytes. A larger body is refused
    /// before the key is reserved, with [`body_too_large_status`](Self::body_too_large_status)
    /// and a problem naming the limit. A `Content-Length` over it is refused unread.
    ///
    /// Default: [`DEFAULT_MAX_BODY`], 1 MiB.
    pub fn max_body(self, bytes: usize) -> Self {
        self.with(|o| o.max_body = bytes)
    }

    /// The status of the refusal of a body over [`max_body`](Self::max_body).
    ///
    /// Default: 413 Content Too Large. 400 is the other usual choice.
    pub fn body_too_large_status(self, status: StatusCode) -> Self {
        self.with(|o| o.body_too_large = status)
    }

    /// The longest `Retry-After` sent with a 409 while the first request runs. The store knows
    /// when the running request's lease ends, but most requests finish long before; the
    /// header is rounded up to whole seconds, at least 1.
    ///
    /// Default: [`DEFAULT_MAX_RETRY_AFTER`], 1 s.
    pub fn max_retry_after(mut self, max: Duration) -> Self {
        self.guard = self.guard.max_retry_after(max);
        self
    }

    /// The start of every problem `type` URI; the refusal's
    /// [`slug`](crate::http::Refusal::slug) is appended, e.g. `{base}key-missing`.
    ///
    /// Default: [`DEFAULT_PROBLEM_BASE`], this module's documentation.
    pub fn problem_base(self, base: impl Into<String>) -> Self {
        let base = base.into();
        self.with(|o| o.problem_base = base)
    }

    /// The `WWW-Authenticate` challenge sent with the 401 that refuses a request without a
    /// scope (HTTP requires one on every 401), e.g. `Bearer realm="shop"`.
    ///
    /// Default: `Bearer`.
    pub fn challenge(self, challenge: HeaderValue) -> Self {
        self.with(|o| o.challenge = challenge)
    }

    /// How long a duplicate of a request this layer is running waits for the first one's
    /// response, which it then replays; after `max` it gets 409 as without waiting. A
    /// duplicate of a request whose key is released meanwhile (a 5xx, a panic) runs the
    /// handler itself. `Duration::ZERO` turns waiting off.
    ///
    /// Default: off, the IETF draft's 409; see [`Guard::wait_for_first`](crate::guard::Guard::wait_for_first)
    /// for why, and for what is (and is not) waited for.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use idemstore::http::IdempotencyLayer;
    /// use idemstore::Store;
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let store = Arc::new(Store::open(dir.path().join("api.idem"))?);
    /// let layer = IdempotencyLayer::new(store).wait_for_first(Duration::from_secs(5));
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_for_first(mut self, max: Duration) -> Self {
        self.guard = self.guard.wait_for_first(max);
        self
    }

    /// The largest response body stored and replayed, in bytes. A response whose body is
    /// over it, or whose length is not known when the handler returns (a stream built with
    /// `Body::from_stream`, server-sent events), is passed to the client as it comes and not
    /// stored: the layer never holds more of it than the server does. Its key is completed
    /// with a marker (unless its status is not stored, a 5xx: then released), and a duplicate
    /// gets 410 Gone ([`Refusal::ResponseNotStored`](crate::http::Refusal::ResponseNotStored))
    /// naming the first response's status: the work is done and is not run again.
    ///
    /// Responses with a known length (axum's `String`, `Json`, `Vec<u8>` and `Bytes` bodies)
    /// up to the limit are read whole, stored and replayed. A compression layer inside this
    /// one makes lengths unknown; add it outside.
    ///
    /// Default: [`DEFAULT_MAX_STORED_RESPONSE`](crate::guard::DEFAULT_MAX_STORED_RESPONSE),
    /// 1 MiB, the store's default [`max_result_len`](crate::Builder::max_result_len); keep it
    /// at most the store's.
    pub fn max_stored_response(mut self, bytes: usize) -> Self {
        self.guard = self.guard.max_stored_response(bytes);
        self
    }

    /// Chooses a request's fingerprint from its parts and body: what must be the same when a
    /// key is sent again (another fingerprint gets 422). Leave out what a retry may change
    /// (a timestamp, a trace header); include what makes it another request.
    ///
    /// Default: the query string and the body, `Fingerprint::of_parts([query, body])`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idemstore::http::IdempotencyLayer;
    /// use idemstore::{Fingerprint, Store};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let store = Arc::new(Store::open(dir.path().join("api.idem"))?);
    /// // The body and the declared currency; the query string (tracking parameters) does
    /// // not count.
    /// let layer = IdempotencyLayer::new(store).fingerprint(|request, body| {
    ///     let currency = request.headers.get("x-currency").map(|v| v.as_bytes());
    ///     Fingerprint::of_parts([currency.unwrap_or(b""), &body[..]])
    /// });
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fingerprint(
        self,
        fingerprint: impl Fn(&Parts, &Bytes) -> Fingerprint + Send + Sync + 'static,
    ) -> Self {
        self.with(|o| o.fingerprint = Arc::new(fingerprint))
    }

    /// Adjusts every replayed response before it is sent: `hook` gets the duplicate request's
    /// parts and the stored response (status, [replayed headers](Self::replay_headers), body,
    /// and `Idempotent-Replayed: true`), and may change any of them: add a header, rewrite a
    /// field of the body. The stored response itself is not changed.
    ///
    /// Default: none, the stored response as it was stored.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use axum::http::HeaderValue;
    /// use idemstore::http::IdempotencyLayer;
    /// use idemstore::Store;
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let store = Arc::new(Store::open(dir.path().join("api.idem"))?);
    /// let layer = IdempotencyLayer::new(store).on_replay(|request, response| {
    ///     // Echo this request's id, not the first one's.
    ///     if let Some(id) = request.headers.get("x-request-id") {
    ///         response.headers_mut().insert("x-request-id", id.clone());
    ///     }
    ///     response.headers_mut().insert("cache-control", HeaderValue::from_static("no-store"));
    ///     // A field of a JSON body: mark the answer as a replay for clients that read it.
    ///     let body = String::from_utf8_lossy(response.body()).into_owned();
    ///     if let Some(rest) = body.strip_prefix('{') {
    ///         *response.body_mut() = format!("{{\"replayed\":true,{rest}").into();
    ///     }
    /// });
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_replay(
        self,
        hook: impl Fn(&Parts, &mut Response<Bytes>) + Send + Sync + 'static,
    ) -> Self {
        self.with(|o| o.on_replay = Some(Arc::new(hook)))
    }
}

impl<S, R> tower::Layer<S> for IdempotencyLayer<R> {
    type Service = Idempotency<S, R>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency {
            inner,
            guard: self.guard.clone(),
            options: Arc::clone(&self.options),
        }
    }
}
