//! The options every adapter reads on each request, in one type, and the setters that write
//! them, written once ([`guard_setters!`] for every adapter, [`http_setters!`] for the two HTTP
//! ones) and generated into each adapter's builder, so the tower layer, the gRPC layer and the
//! actix-web middleware offer the same setters with the same defaults and the same docs.
//!
//! The type is generic over what differs between frameworks: the request view a scope reads
//! (`http::request::Parts`, actix-web's `HttpRequest`), the answer whose storing is decided (an
//! HTTP status in either http crate's type, a gRPC code), and what one adapter alone reads.

use std::fmt;
use std::sync::Arc;

/// Finds who a request belongs to (a user, a tenant), from the framework's view `Q` of it.
pub(crate) type ScopeFn<Q> = dyn Fn(&Q) -> Option<Vec<u8>> + Send + Sync;
/// Says which answers (statuses `S`) are stored.
pub(crate) type StoresFn<S> = dyn Fn(S) -> bool + Send + Sync;

/// What an adapter reads on every request. Cloned only while the adapter is configured.
pub(crate) struct AdapterOptions<Q: ?Sized, S, A> {
    /// Who a request belongs to; default `*` for every request.
    pub(crate) scope: Arc<ScopeFn<Q>>,
    /// Whether a guarded request without a key is refused (default) or let through.
    pub(crate) require_key: bool,
    /// Which answers are stored and replayed; the key of any other is released.
    pub(crate) stores: Arc<StoresFn<S>>,
    /// The largest request read and fingerprinted, in bytes.
    pub(crate) max_request: usize,
    /// What this adapter alone reads.
    pub(crate) adapter: A,
}

impl<Q: ?Sized, S, A: Clone> Clone for AdapterOptions<Q, S, A> {
    fn clone(&self) -> Self {
        AdapterOptions {
            scope: Arc::clone(&self.scope),
            require_key: self.require_key,
            stores: Arc::clone(&self.stores),
            max_request: self.max_request,
            adapter: self.adapter.clone(),
        }
    }
}

impl<Q: ?Sized, S, A> AdapterOptions<Q, S, A> {
    /// The defaults every adapter shares (one scope `*`, a key required), with the adapter's
    /// own storing rule, request limit and options.
    pub(crate) fn new(
        stores: impl Fn(S) -> bool + Send + Sync + 'static,
        max_request: usize,
        adapter: A,
    ) -> Self {
        AdapterOptions {
            scope: Arc::new(|_: &Q| Some(b"*".to_vec())),
            require_key: true,
            stores: Arc::new(stores),
            max_request,
            adapter,
        }
    }
}

impl<Q: ?Sized, S, A: fmt::Debug> fmt::Debug for AdapterOptions<Q, S, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("require_key", &self.require_key)
            .field("max_request", &self.max_request)
            .field("adapter", &self.adapter)
            .finish_non_exhaustive()
    }
}

/// What the two HTTP adapters read beyond [`AdapterOptions`], in their http crate's types (the tower
/// layer's `http` 1, actix-web's own): the methods `M`, header names `N` and values `V`, the
/// status `S`, and what one of them alone reads (`O`).
#[derive(Clone)]
pub(crate) struct HttpOptions<M, N, V, S, O = ()> {
    pub(crate) methods: Vec<M>,
    pub(crate) replay_headers: Vec<N>,
    pub(crate) body_too_large: S,
    pub(crate) problem_base: String,
    pub(crate) challenge: V,
    pub(crate) own: O,
}

impl<M: fmt::Debug, N: fmt::Debug, V, S: fmt::Debug, O> fmt::Debug for HttpOptions<M, N, V, S, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpOptions")
            .field("methods", &self.methods)
            .field("replay_headers", &self.replay_headers)
            .field("body_too_large", &self.body_too_large)
            .field("problem_base", &self.problem_base)
            .finish_non_exhaustive()
    }
}

/// The options of an HTTP adapter with their defaults (those documented by [`http_setters!`])
/// and `$own`, the adapter's own. The framework's `Method`, `StatusCode`, `HeaderValue` and
/// `header` module are those in scope where it is used.
macro_rules! http_defaults {
    ($own:expr) => {
        $crate::guard::AdapterOptions::new(
            |status: StatusCode| !status.is_server_error(),
            $crate::http::DEFAULT_MAX_BODY,
            $crate::guard::HttpOptions {
                methods: vec![Method::POST, Method::PATCH],
                replay_headers: vec![header::CONTENT_TYPE, header::LOCATION],
                body_too_large: StatusCode::PAYLOAD_TOO_LARGE,
                problem_base: $crate::http::DEFAULT_PROBLEM_BASE.to_owned(),
                challenge: HeaderValue::from_static("Bearer"),
                own: $own,
            },
        )
    };
}

/// Writes into an adapter's builder (a type with a `guard: Guard<R>` and an
/// `options: Arc<AdapterOptions<..>>` field, inside its `impl<R: Reservations + 'static>` block) the
/// setters every adapter shares: `scope`, `require_key`, `max_retry_after`, `wait_for_first`,
/// `max_stored_response`, and the private `with` the others use. The arguments name the
/// options type, the request view the scope reads, and the adapter's answers (as doc text).
macro_rules! guard_setters {
    (
        options: $options:ty,
        request: $request:ty,
        no_scope: $no_scope:literal,
        no_key: $no_key:literal,
        in_progress: $in_progress:literal $(,)?
    ) => {
        fn with(mut self, change: impl FnOnce(&mut $options)) -> Self {
            change(::std::sync::Arc::make_mut(&mut self.options));
            self
        }

        #[doc = concat!(
            "Who a request belongs to: keys are scoped by it (and by the operation: the method \
             and path over HTTP, the RPC's path in gRPC), so one caller's key never replays \
             another caller's response. `None` refuses the request \
             ([`Refusal::NoScope`](crate::guard::Refusal::NoScope)): ", $no_scope, ".\n\n",
            "Set it whenever clients are distinct users or tenants, from the identity the \
             service has verified (a token's subject, say). A scope longer than \
             [`Key::MAX_PART_LEN`](crate::Key::MAX_PART_LEN) bytes is replaced by its BLAKE3 \
             digest.\n\n",
            "Default: one scope, `*`, shared by every client."
        )]
        pub fn scope(
            self,
            scope: impl Fn(&$request) -> Option<Vec<u8>> + Send + Sync + 'static,
        ) -> Self {
            self.with(|o| o.scope = ::std::sync::Arc::new(scope))
        }

        #[doc = concat!(
            "Whether a guarded request must carry a key. `false` lets a request without one \
             through, unguarded (it runs every time it is sent).\n\n",
            "Default: `true`: a request without a key is refused \
             ([`Refusal::KeyMissing`](crate::guard::Refusal::KeyMissing)): ", $no_key, "."
        )]
        pub fn require_key(self, require: bool) -> Self {
            self.with(|o| o.require_key = require)
        }

        #[doc = concat!(
            "The longest retry delay sent with the ", $in_progress, " that answers a duplicate \
             while the first request runs. The store knows when the running request's lease \
             ends, but most requests finish long before; see \
             [`Guard::max_retry_after`](crate::guard::Guard::max_retry_after).\n\n",
            "Default: [`DEFAULT_MAX_RETRY_AFTER`](crate::guard::DEFAULT_MAX_RETRY_AFTER), 1 s."
        )]
        pub fn max_retry_after(mut self, max: ::std::time::Duration) -> Self {
            self.guard = self.guard.max_retry_after(max);
            self
        }

        #[doc = concat!(
            "How long a duplicate of a request this adapter is running waits for the first \
             one's answer, which it then replays; after `max` it gets ", $in_progress,
            " as without waiting. A duplicate of a request whose key is released meanwhile (a \
             server error, a panic) runs the handler itself. `Duration::ZERO` turns waiting \
             off.\n\n",
            "Default: off; see [`Guard::wait_for_first`](crate::guard::Guard::wait_for_first) \
             for why, and for what is (and is not) waited for."
        )]
        pub fn wait_for_first(mut self, max: ::std::time::Duration) -> Self {
            self.guard = self.guard.wait_for_first(max);
            self
        }

        /// The largest response stored and replayed, in bytes of its stored form (status,
        /// replayed headers and body). A response over it, or whose body's length is not known
        /// when the handler returns (a stream), is passed to the client as it comes and not
        /// stored: the adapter never holds more of it than the server does. Its key is
        /// completed with a marker (unless its status is not stored: then released), and a
        /// duplicate is refused with
        /// [`Refusal::ResponseNotStored`](crate::guard::Refusal::ResponseNotStored) naming the
        /// first response's status: the work is done and is not run again. A response within
        /// this limit that the store refuses (over its own
        /// [`max_result_len`](crate::Builder::max_result_len)) gets the same marker. See
        /// [`Guard::max_stored_response`](crate::guard::Guard::max_stored_response).
        ///
        /// Default: [`DEFAULT_MAX_STORED_RESPONSE`](crate::guard::DEFAULT_MAX_STORED_RESPONSE),
        /// 1 MiB, the store's default [`max_result_len`](crate::Builder::max_result_len).
        pub fn max_stored_response(mut self, bytes: usize) -> Self {
            self.guard = self.guard.max_stored_response(bytes);
            self
        }
    };
}

/// Writes into an HTTP adapter's builder (after [`guard_setters!`]) the setters the tower layer
/// and the actix-web middleware share: `methods`, `store_status`, `replay_headers`,
/// `max_body`, `body_too_large_status`, `problem_base`, `challenge`. The arguments are the
/// framework's http types.
macro_rules! http_setters {
    (
        method: $method:ty,
        status: $status:ty,
        header_name: $name:ty,
        header_value: $value:ty $(,)?
    ) => {
        /// The request methods guarded; every other method passes through untouched.
        ///
        /// Default: `POST` and `PATCH`, the methods the Idempotency-Key draft names as not
        /// idempotent.
        pub fn methods(self, methods: impl IntoIterator<Item = $method>) -> Self {
            self.with(|o| o.adapter.methods = methods.into_iter().collect())
        }

        /// Which handler responses are stored and replayed. The key of any other response is
        /// released, so a retry runs the handler again.
        ///
        /// Default: every status but 5xx (a server error is worth retrying).
        pub fn store_status(self, store: impl Fn($status) -> bool + Send + Sync + 'static) -> Self {
            self.with(|o| o.stores = ::std::sync::Arc::new(store))
        }

        /// The response headers stored with status and body, and replayed (every value of
        /// each). Others (a request id, a date) belong to one response only.
        ///
        /// Default: `content-type` and `location`.
        pub fn replay_headers(self, names: impl IntoIterator<Item = $name>) -> Self {
            self.with(|o| o.adapter.replay_headers = names.into_iter().collect())
        }

        /// The largest request body read and fingerprinted, in bytes. A larger body is refused
        /// before the key is reserved, with
        /// [`body_too_large_status`](Self::body_too_large_status) and a problem naming the
        /// limit. A `Content-Length` over it is refused unread.
        ///
        /// Default: [`DEFAULT_MAX_BODY`](crate::http::DEFAULT_MAX_BODY), 1 MiB.
        pub fn max_body(self, bytes: usize) -> Self {
            self.with(|o| o.max_request = bytes)
        }

        /// The status of the refusal of a body over [`max_body`](Self::max_body).
        ///
        /// Default: 413 Content Too Large. 400 is the other usual choice.
        pub fn body_too_large_status(self, status: $status) -> Self {
            self.with(|o| o.adapter.body_too_large = status)
        }

        /// The start of every problem `type` URI; the refusal's
        /// [`slug`](crate::guard::Refusal::slug) is appended, e.g. `{base}key-missing`.
        ///
        /// Default: [`DEFAULT_PROBLEM_BASE`](crate::http::DEFAULT_PROBLEM_BASE), the HTTP
        /// layer's documentation.
        pub fn problem_base(self, base: impl Into<String>) -> Self {
            let base = base.into();
            self.with(|o| o.adapter.problem_base = base)
        }

        /// The `WWW-Authenticate` challenge sent with the 401 that refuses a request without a
        /// scope (HTTP requires one on every 401), e.g. `Bearer realm="shop"`.
        ///
        /// Default: `Bearer`.
        pub fn challenge(self, challenge: $value) -> Self {
            self.with(|o| o.adapter.challenge = challenge)
        }
    };
}

/// `Clone` (the guard's and the options' `Arc`s) and `Debug` (the options and the guard) for
/// an adapter's builder, a type `$name<R>` with a `guard` and an `options` field.
macro_rules! builder_traits {
    ($name:ident) => {
        impl<R> Clone for $name<R> {
            fn clone(&self) -> Self {
                $name {
                    guard: self.guard.clone(),
                    options: ::std::sync::Arc::clone(&self.options),
                }
            }
        }

        impl<R> ::std::fmt::Debug for $name<R> {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("options", &self.options)
                    .field("guard", &self.guard)
                    .finish_non_exhaustive()
            }
        }
    };
}

pub(crate) use {builder_traits, guard_setters, http_defaults, http_setters};
