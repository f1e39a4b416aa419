//! [`GrpcIdempotencyLayer`]: the layer, the RPCs it guards and its options, with their defaults.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use tonic::Code;

use crate::grpc::key::KeySource;
use crate::grpc::service::GrpcIdempotency;
pub use crate::guard::DEFAULT_MAX_RETRY_AFTER;
use crate::guard::{guard_setters, Guard};
use crate::Reservations;

/// Default for [`GrpcIdempotencyLayer::max_message`]: 1 MiB.
pub const DEFAULT_MAX_MESSAGE: usize = 1 << 20;

/// What the service reads on every request: the options every adapter shares, and the RPCs
/// guarded with where each one's key is read.
pub(crate) type Options = crate::guard::AdapterOptions<Parts, Code, HashMap<String, KeySource>>;

/// A tower [`Layer`](tower::Layer) for tonic servers that makes the RPCs it guards idempotent,
/// by their `idempotency-key` metadata entry or by a request id in the request message
/// (AIP-155), on any [`Reservations`] backend. See the [module docs](crate::grpc) for what it
/// answers.
///
/// Only the RPCs named with [`method`](Self::method) or
/// [`method_with_request_id`](Self::method_with_request_id) are guarded; every other RPC
/// (streaming ones among them) passes through untouched.
///
/// ```
/// use std::sync::Arc;
/// use idemstore::grpc::GrpcIdempotencyLayer;
/// use idemstore::Store;
///
/// /// A request message as prost generates it, with an AIP-155 request id.
/// #[derive(Clone, PartialEq, prost::Message)]
/// struct CreateOrderRequest {
///     #[prost(string, tag = "1")]
///     request_id: String,
///     #[prost(string, tag = "2")]
///     item: String,
/// }
///
/// # let dir = tempfile::tempdir()?;
/// let store = Arc::new(Store::open(dir.path().join("rpc.idem"))?);
/// let layer = GrpcIdempotencyLayer::new(store)
///     // The key from the `idempotency-key` metadata entry.
///     .method("/shop.v1.Orders/Pay")
///     // The key from the request message's `request_id` field.
///     .method_with_request_id("/shop.v1.Orders/CreateOrder", |m: &CreateOrderRequest| {
///         &m.request_id
///     })
///     .scope(|request| Some(request.headers.get("x-tenant")?.as_bytes().to_vec()));
/// // tonic::transport::Server::builder().layer(layer).add_service(...)
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct GrpcIdempotencyLayer<R> {
    pub(crate) guard: Guard<R>,
    pub(crate) options: Arc<Options>,
}

impl<R> Clone for GrpcIdempotencyLayer<R> {
    fn clone(&self) -> Self {
        GrpcIdempotencyLayer {
            guard: self.guard.clone(),
            options: Arc::clone(&self.options),
        }
    }
}

impl<R> fmt::Debug for GrpcIdempotencyLayer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        let mut methods: Vec<&String> = o.adapter.keys().collect();
        methods.sort();
        f.debug_struct("GrpcIdempotencyLayer")
            .field("methods", &methods)
            .field("require_key", &o.require_key)
            .field("max_message", &o.max_request)
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}

impl<R: Reservations + 'static> GrpcIdempotencyLayer<R> {
    /// A layer over `store` that guards no RPC yet, with the defaults of every setter below.
    pub fn new(store: Arc<R>) -> GrpcIdempotencyLayer<R> {
        GrpcIdempotencyLayer {
            guard: Guard::new(store),
            options: Arc::new(Options::new(
                stored_by_default,
                DEFAULT_MAX_MESSAGE,
                HashMap::new(),
            )),
        }
    }

    guard_setters!(
        options: Options,
        request: Parts,
        no_scope: "`UNAUTHENTICATED`",
        no_key: "`INVALID_ARGUMENT`",
        in_progress: "`ABORTED` (in `google.rpc.RetryInfo`)",
    );

    /// Guards the RPC at `path` (`/package.Service/Method`, as tonic routes it) by the
    /// `idempotency-key` metadata entry.
    ///
    /// The request (every message the client sent) and the response (every message, with the
    /// headers and trailers) are buffered: name unary RPCs. A streaming RPC named here is
    /// guarded as a whole, its streams read to the end before anything is answered.
    pub fn method(self, path: impl Into<String>) -> Self {
        let path = path.into();
        self.with(|o| {
            o.adapter.insert(path, KeySource::Metadata);
        })
    }

    /// Guards the unary RPC at `path` by a request id read from its request message `M`, as
    /// Google's AIP-155 ("Request identification") asks of mutating RPCs: the layer decodes
    /// the message (prost) and `request_id` returns the field. An empty field is a request
    /// without a key (see [`require_key`](Self::require_key)); the `idempotency-key` metadata
    /// entry is not read for this RPC.
    ///
    /// Why a decode in the layer: a tower layer sees the encoded request, before tonic's codec
    /// and the handler; decoding it once more (a single message of at most
    /// [`max_message`](Self::max_message) bytes) keeps the guard in one `.layer(...)` line,
    /// with no change to the handlers. The request must be one uncompressed message; anything
    /// else is refused with `INVALID_ARGUMENT`.
    pub fn method_with_request_id<M, F>(self, path: impl Into<String>, request_id: F) -> Self
    where
        M: prost::Message + Default + 'static,
        F: Fn(&M) -> &str + Send + Sync + 'static,
    {
        let path = path.into();
        let read = move |bytes: &[u8]| -> Result<Option<Vec<u8>>, String> {
            let message = M::decode(bytes).map_err(|error| {
                format!("the request message does not decode, so its request id cannot be read: {error}")
            })?;
            let id = request_id(&message);
            Ok((!id.is_empty()).then(|| id.as_bytes().to_vec()))
        };
        self.with(|o| {
            o.adapter.insert(path, KeySource::RequestId(Arc::new(read)));
        })
    }

    /// Which final status codes are stored and replayed. The key of any other answer is
    /// released, so a retry runs the handler again.
    ///
    /// Default: `OK` and the codes that say the request itself is wrong, which a retry of the
    /// same request would get again (`INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`,
    /// `PERMISSION_DENIED`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `UNAUTHENTICATED`). Not
    /// stored: the server's failures and the transient codes (`UNAVAILABLE`, `INTERNAL`,
    /// `UNKNOWN`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `ABORTED`, `CANCELLED`,
    /// `UNIMPLEMENTED`, `DATA_LOSS`), and a response without a `grpc-status`.
    pub fn store_code(self, store: impl Fn(Code) -> bool + Send + Sync + 'static) -> Self {
        self.with(|o| o.stores = Arc::new(store))
    }

    /// The largest request read and fingerprinted, in bytes of the encoded stream (each
    /// message and its 5-byte prefix). A larger request is refused with `RESOURCE_EXHAUSTED`
    /// naming the limit, before the key is reserved.
    ///
    /// Default: [`DEFAULT_MAX_MESSAGE`], 1 MiB.
    pub fn max_message(self, bytes: usize) -> Self {
        self.with(|o| o.max_request = bytes)
    }
}

/// The default of [`GrpcIdempotencyLayer::store_code`].
fn stored_by_default(code: Code) -> bool {
    matches!(
        code,
        Code::Ok
            | Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::Unauthenticated
    )
}

impl<S, R> tower::Layer<S> for GrpcIdempotencyLayer<R> {
    type Service = GrpcIdempotency<S, R>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcIdempotency {
            inner,
            guard: self.guard.clone(),
            options: Arc::clone(&self.options),
        }
    }
}
