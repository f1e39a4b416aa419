//! [`IdempotencyLayer`]: the layer and its options, with their defaults.

use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{header, HeaderName, HeaderValue, Method, Response, StatusCode};

pub use crate::guard::DEFAULT_MAX_RETRY_AFTER;
use crate::guard::{
    builder_traits, guard_setters, http_defaults, http_setters, Guard, HttpOptions,
};
use crate::http::service::Idempotency;
use crate::{Fingerprint, Reservations};

/// Default for [`IdempotencyLayer::max_body`]: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1 << 20;
/// Default for [`IdempotencyLayer::problem_base`].
pub const DEFAULT_PROBLEM_BASE: &str = "https://docs.rs/idemstore/latest/idemstore/http/#";

/// Takes a request's fingerprint; see [`IdempotencyLayer::fingerprint`].
pub(crate) type FingerprintFn = dyn Fn(&Parts, &Bytes) -> Fingerprint + Send + Sync;
/// Adjusts a replayed response; see [`IdempotencyLayer::on_replay`].
pub(crate) type ReplayFn = dyn Fn(&Parts, &mut Response<Bytes>) + Send + Sync;

/// What the service reads on every request: the options every adapter shares, those of the
/// HTTP adapters, and the tower layer's own.
pub(crate) type Options = crate::guard::AdapterOptions<
    Parts,
    StatusCode,
    HttpOptions<Method, HeaderName, HeaderValue, StatusCode, Own>,
>;

/// What only the tower layer reads: its two hooks over `http` request parts.
#[derive(Clone)]
pub(crate) struct Own {
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

builder_traits!(IdempotencyLayer);

impl<R: Reservations + 'static> IdempotencyLayer<R> {
    /// A layer over `store` with the defaults of every setter below.
    pub fn new(store: Arc<R>) -> IdempotencyLayer<R> {
        let own = Own {
            fingerprint: Arc::new(|request: &Parts, body: &Bytes| {
                let query = request.uri.query().unwrap_or("").as_bytes();
                Fingerprint::of_parts([query, &body[..]])
            }),
            on_replay: None,
        };
        IdempotencyLayer {
            guard: Guard::new(store),
            options: Arc::new(http_defaults!(own)),
        }
    }

    guard_setters!(
        options: Options,
        request: Parts,
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
        self.with(|o| o.adapter.own.fingerprint = Arc::new(fingerprint))
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
        self.with(|o| o.adapter.own.on_replay = Some(Arc::new(hook)))
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
