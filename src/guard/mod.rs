//! The guard: the decisions that make a request idempotent, independent of any web framework.
//! The tower layer ([`http::IdempotencyLayer`](crate::http::IdempotencyLayer)) is an adapter
//! over it, and any other server (gRPC, another web framework, a message consumer) can be one:
//! the adapter reads the request and writes the answer in its framework's types, the guard
//! decides.
//!
//! # What an adapter does, per request
//! 1. Decide whether the request is guarded at all (the HTTP layer: its method).
//! 2. Read the client's key with [`client_key`]: `Ok(None)` means none was sent (refuse with
//!    [`Refusal::KeyMissing`], or let the request through unguarded).
//! 3. Build the stored key with [`request_key`] from the caller's scope (who the request
//!    belongs to, a verified user or tenant), the operation (the HTTP layer uses
//!    `"{method} {path}"`) and the client's key.
//! 4. Read the request (bounded; refuse a larger one with [`Refused::body_too_large`]) and
//!    take its [`Fingerprint`]: the parts of the request that must match on a retry.
//! 5. [`Guard::begin`]: one of
//!    - [`Begin::Run`]: this request holds the key. Run the handler inside
//!      [`Running::work`] (which renews the lease while it runs), then either
//!      [`Running::complete`] with the encoded response ([`StoredResponse::encode`]) or
//!      [`Running::release`] (a response not worth storing, such as a server error). Dropping
//!      the `Running` releases the key, so a handler that panics or a client that goes away
//!      never leaves the key pending.
//!    - [`Begin::Replay`]: the stored result of the first request; decode it
//!      ([`StoredResponse::decode`]) and send it, marked as a replay.
//!    - [`Begin::Refuse`]: a [`Refused`] to answer in the framework's terms (the HTTP layer:
//!      a status and an RFC 9457 problem, see [`Refusal`]).
//!
//! Every step's outcome is a value; nothing here knows HTTP types, tower or a body type. The
//! guard needs a tokio runtime with timers (the lease renewal and the release on drop run on
//! it).
//!
//! ```
//! use std::sync::Arc;
//!
//! use idemstore::guard::{client_key, request_key, Begin, Guard, Release, StoredResponse};
//! use idemstore::{Fingerprint, Store};
//!
//! # let dir = tempfile::tempdir()?;
//! let guard = Guard::new(Arc::new(Store::open(dir.path().join("rpc.idem"))?));
//!
//! // One request, as an adapter sees it: a key, a caller, an operation and a payload.
//! async fn serve(guard: &Guard<Store>, key: &[u8], payload: &[u8]) -> (u16, Vec<u8>, bool) {
//!     let id = match client_key([key]) {
//!         Ok(Some(id)) => id,
//!         Ok(None) | Err(_) => return (400, b"bad key".to_vec(), false),
//!     };
//!     let key = match request_key(Some(b"alice".to_vec()), b"CreateOrder", &id) {
//!         Ok(key) => key,
//!         Err(refused) => return (400, refused.detail.into_bytes(), false),
//!     };
//!     match guard.begin(&key, Fingerprint::of(payload)).await {
//!         Begin::Run(running) => {
//!             let answer = running.work(async { b"order 1 created".to_vec() }).await;
//!             let stored = StoredResponse { status: 201, headers: vec![], body: answer.clone() };
//!             if running.complete(stored.encode()).await.is_err() {
//!                 // Not stored (too large, store failed): the key is released.
//!             }
//!             (201, answer, false)
//!         }
//!         Begin::Replay(bytes) => match StoredResponse::decode(&bytes) {
//!             Some(stored) => (stored.status, stored.body, true),
//!             None => (500, b"stored response unreadable".to_vec(), false),
//!         },
//!         Begin::Refuse(refused) => (409, refused.detail.into_bytes(), false),
//!         _ => (500, Vec::new(), false),
//!     }
//! }
//!
//! let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! let first = runtime.block_on(serve(&guard, b"k-1", b"book"));
//! let retry = runtime.block_on(serve(&guard, b"k-1", b"book"));
//! assert_eq!(first, (201, b"order 1 created".to_vec(), false));
//! assert_eq!(retry, (201, b"order 1 created".to_vec(), true));
//! # let _ = Release::NotStored;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod heartbeat;
mod key;
mod refusal;
mod release;
mod running;
mod stored;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use key::{client_key, request_key};
pub use refusal::{Refusal, Refused};
pub use running::{Release, Running};
pub(crate) use stored::encode as encode_stored;
pub use stored::StoredResponse;

use crate::{Fingerprint, Key, Reservation, Reservations};

/// Default for [`Guard::max_retry_after`]: 1 s.
pub const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What the guard reads on every request. Cloned only while it is configured.
#[derive(Debug, Clone)]
struct Options {
    max_retry_after: Duration,
}

/// The framework-neutral guard over a [`Reservations`] backend: see the [module docs](self).
/// Cheap to clone (two `Arc`s); every clone shares the store and the options.
pub struct Guard<R> {
    store: Arc<R>,
    options: Arc<Options>,
}

impl<R> Clone for Guard<R> {
    fn clone(&self) -> Self {
        Guard {
            store: Arc::clone(&self.store),
            options: Arc::clone(&self.options),
        }
    }
}

impl<R> fmt::Debug for Guard<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("max_retry_after", &self.options.max_retry_after)
            .finish_non_exhaustive()
    }
}

/// What [`Guard::begin`] decided for a request.
#[non_exhaustive]
pub enum Begin<R: Reservations + 'static> {
    /// This request holds the key: run the handler.
    Run(Running<R>),
    /// The key's stored result (as the adapter stored it, e.g. [`StoredResponse::encode`]):
    /// send it, marked as a replay. The handler does not run.
    Replay(Vec<u8>),
    /// Answer the request with this refusal. The handler does not run.
    Refuse(Refused),
}

impl<R: Reservations + 'static> fmt::Debug for Begin<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Begin::Run(running) => f.debug_tuple("Run").field(running.lease()).finish(),
            Begin::Replay(bytes) => write!(f, "Replay({} bytes)", bytes.len()),
            Begin::Refuse(refused) => f.debug_tuple("Refuse").field(refused).finish(),
        }
    }
}

impl<R: Reservations + 'static> Guard<R> {
    /// A guard over `store` with the defaults of every setter below.
    pub fn new(store: Arc<R>) -> Guard<R> {
        Guard {
            store,
            options: Arc::new(Options {
                max_retry_after: DEFAULT_MAX_RETRY_AFTER,
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Options)) -> Self {
        change(Arc::make_mut(&mut self.options));
        self
    }

    /// The store the keys are reserved in.
    pub fn store(&self) -> &Arc<R> {
        &self.store
    }

    /// The longest retry delay given with [`Refusal::InProgress`]. The store knows when the
    /// running request's lease ends, but most requests finish long before.
    ///
    /// Default: [`DEFAULT_MAX_RETRY_AFTER`], 1 s.
    pub fn max_retry_after(self, max: Duration) -> Self {
        self.with(|o| o.max_retry_after = max)
    }

    /// Reserves `key` for a request with this fingerprint and says what to do with the
    /// request; see [`Begin`]. The key is durable before [`Begin::Run`] is returned, and only
    /// one caller at a time gets it ([`Reservations::reserve`]).
    ///
    /// | the store's answer | `Begin` |
    /// |---|---|
    /// | acquired (new, or taken over after its lease ran out) | `Run` |
    /// | completed | `Replay` with the stored bytes |
    /// | in progress | `Refuse`, [`Refusal::InProgress`], `retry_after` the lease left, at most [`max_retry_after`](Self::max_retry_after) |
    /// | another fingerprint | `Refuse`, [`Refusal::KeyReused`] (also while the first runs) |
    /// | parked for review | `Refuse`, [`Refusal::UnderReview`] |
    /// | an error | `Refuse`, [`Refusal::StoreUnavailable`]; the error goes to the logs (feature `tracing`), never to the client |
    pub async fn begin(&self, key: &Key, fingerprint: Fingerprint) -> Begin<R> {
        let reservation = match self.store.reserve(key, fingerprint).await {
            Ok(reservation) => reservation,
            Err(_error) => {
                #[cfg(feature = "tracing")]
                tracing::warn!(error = %_error, "idempotency store failed");
                return Begin::Refuse(Refused::new(Refusal::StoreUnavailable));
            }
        };
        match reservation {
            Reservation::Acquired(lease) => {
                Begin::Run(Running::new(Arc::clone(&self.store), lease))
            }
            Reservation::Completed(done) => Begin::Replay(done.result),
            Reservation::InProgress { retry_after, .. } => {
                let mut refused = Refused::new(Refusal::InProgress);
                refused.retry_after = Some(retry_after.min(self.options.max_retry_after));
                Begin::Refuse(refused)
            }
            Reservation::Mismatch => Begin::Refuse(Refused::new(Refusal::KeyReused)),
            Reservation::NeedsReview { .. } => Begin::Refuse(Refused::new(Refusal::UnderReview)),
        }
    }
}
