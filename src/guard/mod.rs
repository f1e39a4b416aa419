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
//! # Options every adapter shares
//! - [`Guard::wait_for_first`]: a duplicate of a request this guard is running waits for its
//!   answer instead of being refused (off by default).
//! - [`Guard::max_stored_response`]: a response whose stored form is over it, or whose body
//!   is of unknown length (a stream), is streamed to its client and not stored; the key is
//!   completed with a marker answered by [`Refusal::ResponseNotStored`]. Adapters ask
//!   [`Guard::stores_response`]. A response the store itself refuses as too large gets the
//!   same marker ([`Running::complete`]): a handler never runs twice because its response
//!   did not fit.
//! - [`Guard::max_retry_after`]: the longest retry delay given with
//!   [`Refusal::InProgress`].
//!
//! # Metrics
//! With the `metrics` feature, the guard counts what it decides on the `metrics` facade
//! (the application installs the exporter):
//!
//! | counter | counts |
//! |---|---|
//! | `idemstore_guard_replays_total` | duplicates answered with the stored response (also after waiting) |
//! | `idemstore_guard_waits_total` | duplicates that waited for the first request |
//! | `idemstore_guard_in_progress_total` | duplicates refused because the first still runs (HTTP 409) |
//! | `idemstore_guard_mismatches_total` | keys reused with another request (HTTP 422) |
//! | `idemstore_guard_released_total` | keys released: label `reason="not_stored"` when the response was not worth storing (a 5xx by default), `reason="failed"` when the handler failed |
//! | `idemstore_guard_not_stored_total` | responses streamed and not stored, their key completed with a marker |
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
//!                 // Not stored: over the store's limit, the key holds a "not stored"
//!                 // marker; the store failed or the lease was lost, the key is released.
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

mod events;
mod heartbeat;
pub(crate) mod key;
mod options;
mod problem;
mod refusal;
mod release;
mod running;
pub(crate) mod stored;
mod waiting;

use std::fmt;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use events::{count, Event};
use waiting::Runs;

pub use key::{client_key, plain_key, request_key};
pub(crate) use options::{
    builder_traits, guard_setters, http_defaults, http_setters, AdapterOptions, HttpOptions,
};
pub use problem::PROBLEM_JSON;
pub(crate) use problem::{http_status, problem_json, retry_after_secs};
pub use refusal::{Refusal, Refused};
pub use running::{Release, Running};
pub use stored::StoredResponse;
pub(crate) use stored::{encode as encode_stored, encoded_len as stored_len, walk as walk_stored};

use crate::{Fingerprint, Key, Reservation, Reservations};

/// The request header (HTTP) or metadata entry (gRPC) that carries the client's key; every
/// adapter reads it by this name (the HTTP layer as a `HeaderName`,
/// [`http::IDEMPOTENCY_KEY`](crate::http::IDEMPOTENCY_KEY)).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Set to `true` on an answer replayed from the store, by every adapter: a response header
/// (HTTP); in gRPC, in the initial metadata of an answer with messages, in the trailing
/// metadata (with the status) of an error.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// Default for [`Guard::max_retry_after`]: 1 s.
pub const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(1);
/// Default for [`Guard::max_stored_response`]: 1 MiB of stored response (status, headers and
/// body), the store's default [`max_result_len`](crate::Builder::max_result_len).
pub const DEFAULT_MAX_STORED_RESPONSE: usize = crate::Builder::DEFAULT_MAX_RESULT_LEN;

/// What the guard reads on every request. Cloned only while it is configured.
#[derive(Debug, Clone)]
struct Options {
    max_retry_after: Duration,
    wait_for_first: Duration,
    max_stored_response: usize,
}

/// The framework-neutral guard over a [`Reservations`] backend: see the [module docs](self).
/// Cheap to clone (two `Arc`s); every clone shares the store and the options.
pub struct Guard<R> {
    store: Arc<R>,
    options: Arc<Options>,
    /// The keys this guard's requests are running, for the duplicates that wait.
    runs: Arc<Runs>,
}

impl<R> Clone for Guard<R> {
    fn clone(&self) -> Self {
        Guard {
            store: Arc::clone(&self.store),
            options: Arc::clone(&self.options),
            runs: Arc::clone(&self.runs),
        }
    }
}

impl<R> fmt::Debug for Guard<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        f.debug_struct("Guard")
            .field("max_retry_after", &o.max_retry_after)
            .field("wait_for_first", &o.wait_for_first)
            .field("max_stored_response", &o.max_stored_response)
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
                wait_for_first: Duration::ZERO,
                max_stored_response: DEFAULT_MAX_STORED_RESPONSE,
            }),
            runs: Arc::default(),
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

    /// How long a duplicate of a request this guard is running waits for that request's
    /// answer: when the first completes within `max`, the duplicate gets its stored response
    /// ([`Begin::Replay`]); when the first's key is released (a server error, a panic), the
    /// duplicate takes the key and runs ([`Begin::Run`]); after `max`, it is refused with
    /// [`Refusal::InProgress`] as without waiting. `Duration::ZERO` turns waiting off.
    ///
    /// The wait needs no polling: the running request wakes its waiters once its key is
    /// completed or released. Only requests of this guard (the same layer, any clone) are
    /// waited for; a key held by another process (a cluster backend, or a process that
    /// died) is refused at once, since nothing here would wake the waiter.
    ///
    /// Default: off. The IETF draft answers a concurrent duplicate with 409 and its clients
    /// retry on it; a waiting duplicate holds its connection and a task for up to `max`, so
    /// a burst of duplicates of slow requests could tie up a server that never opted in.
    /// Turn it on (a few seconds, about the handler's usual time) when clients cannot retry
    /// a 409 well, e.g. browsers and webhooks.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use idemstore::guard::Guard;
    /// use idemstore::Store;
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let store = Arc::new(Store::open(dir.path().join("api.idem"))?);
    /// let guard = Guard::new(store).wait_for_first(Duration::from_secs(5));
    /// # let _ = guard;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_for_first(self, max: Duration) -> Self {
        self.with(|o| o.wait_for_first = max)
    }

    /// The largest response stored and replayed, in bytes of its stored form: status,
    /// replayed headers and body as [`StoredResponse::encode`] lays them out (4 bytes, 3 more
    /// per header plus its name and value, then the body). An adapter asks
    /// [`stores_response`](Self::stores_response) with that length (known from the headers and
    /// the body's declared length, before the body is read) when the handler's response
    /// arrives: a response over the limit, or one whose body length is not known yet (a
    /// stream, such as server-sent events), is passed to the client as it comes, with bounded
    /// memory, and not stored.
    ///
    /// The key of such a response is completed with a marker
    /// ([`Running::complete_not_stored`]) when its status would have been stored: the
    /// handler's work is done and must not run again, so a duplicate gets
    /// [`Refusal::ResponseNotStored`] (HTTP 410) naming the first response's status. A
    /// response whose status is not stored (a 5xx) is released as usual.
    ///
    /// # When the store's limit is lower
    /// The store has its own limit on a result
    /// ([`max_result_len`](crate::Builder::max_result_len), also 1 MiB by default, counted on
    /// the same bytes). A response within this limit but over the store's is refused by the
    /// store when it is completed; [`Running::complete`] then completes the key with the
    /// same marker instead, so the handler still runs once and a duplicate still gets
    /// [`Refusal::ResponseNotStored`]. The only cost of a limit above the store's is that
    /// such a response is read whole before it is found not to fit.
    ///
    /// Default: [`DEFAULT_MAX_STORED_RESPONSE`], 1 MiB, the store's default.
    pub fn max_stored_response(self, bytes: usize) -> Self {
        self.with(|o| o.max_stored_response = bytes)
    }

    /// Whether a response whose stored form ([`StoredResponse::encode`]) is `len` bytes long
    /// (`None`: its body's length is not known when the handler answers, a stream) is read
    /// whole and stored (`true`), or streamed and not stored (`false`); see
    /// [`max_stored_response`](Self::max_stored_response).
    pub fn stores_response(&self, len: Option<u64>) -> bool {
        len.is_some_and(|len| len <= self.options.max_stored_response as u64)
    }

    /// Reserves `key` for a request with this fingerprint and says what to do with the
    /// request; see [`Begin`]. The key is durable before [`Begin::Run`] is returned, and only
    /// one caller at a time gets it ([`Reservations::reserve`]).
    ///
    /// | the store's answer | `Begin` |
    /// |---|---|
    /// | acquired (new, or taken over after its lease ran out) | `Run` |
    /// | completed | `Replay` with the stored bytes |
    /// | completed with a marker ([`Running::complete_not_stored`]) | `Refuse`, [`Refusal::ResponseNotStored`] |
    /// | in progress | with [`wait_for_first`](Self::wait_for_first) on and the first running here: the answer once it is done; else `Refuse`, [`Refusal::InProgress`], `retry_after` the lease left, at most [`max_retry_after`](Self::max_retry_after) |
    /// | another fingerprint | `Refuse`, [`Refusal::KeyReused`] (also while the first runs) |
    /// | parked for review | `Refuse`, [`Refusal::UnderReview`] |
    /// | an error | `Refuse`, [`Refusal::StoreUnavailable`]; the error goes to the logs (feature `tracing`), never to the client |
    pub async fn begin(&self, key: &Key, fingerprint: Fingerprint) -> Begin<R> {
        let wait = self.options.wait_for_first;
        // The clock is read only by a guard that waits.
        let mut deadline = None;
        let mut waited = false;
        loop {
            let reservation = match self.store.reserve(key, fingerprint).await {
                Ok(reservation) => reservation,
                Err(_error) => {
                    #[cfg(feature = "tracing")]
                    tracing::warn!(error = %_error, "idempotency store failed");
                    return Begin::Refuse(Refused::new(Refusal::StoreUnavailable));
                }
            };
            let retry_after = match reservation {
                Reservation::InProgress { retry_after, .. } => retry_after,
                other => return self.decided(key, other),
            };
            let now = tokio::time::Instant::now();
            let deadline = *deadline.get_or_insert(now + wait);
            let running = (!wait.is_zero() && now < deadline)
                .then(|| self.runs.running(key))
                .flatten();
            let Some(notify) = running else {
                count(Event::InProgress);
                let mut refused = Refused::new(Refusal::InProgress);
                refused.retry_after = Some(retry_after.min(self.options.max_retry_after));
                return Begin::Refuse(refused);
            };
            // Registered before the key is read again, so a completion in between wakes it.
            let mut notified = pin!(notify.notified());
            notified.as_mut().enable();
            match self.store.reserve(key, fingerprint).await {
                Ok(Reservation::InProgress { .. }) => {}
                // Done meanwhile: its answer (an acquisition included, never dropped).
                Ok(other) => return self.decided(key, other),
                Err(_) => continue,
            }
            if !waited {
                waited = true;
                count(Event::Wait);
            }
            // At the latest when the holder's lease runs out (then it can be taken over).
            let until = deadline.min(now + retry_after + Duration::from_millis(1));
            let _ = tokio::time::timeout_at(until, notified).await;
        }
    }

    /// The answer to a reservation that is not in progress.
    fn decided(&self, key: &Key, reservation: Reservation) -> Begin<R> {
        match reservation {
            Reservation::Acquired(lease) => {
                let watch = (!self.options.wait_for_first.is_zero()).then(|| self.runs.start(key));
                Begin::Run(Running::new(Arc::clone(&self.store), lease, watch))
            }
            Reservation::Completed(done) => match stored::not_stored_status(&done.result) {
                Some(status) => {
                    let detail = format!(
                        "the response to the first request with this key (status {status}) was \
                         streamed to its client and not stored; it cannot be replayed"
                    );
                    Begin::Refuse(Refused::with_detail(Refusal::ResponseNotStored, detail))
                }
                None => {
                    count(Event::Replay);
                    Begin::Replay(done.result)
                }
            },
            Reservation::Mismatch => {
                count(Event::Mismatch);
                Begin::Refuse(Refused::new(Refusal::KeyReused))
            }
            Reservation::NeedsReview { .. } => Begin::Refuse(Refused::new(Refusal::UnderReview)),
            Reservation::InProgress { retry_after, .. } => {
                count(Event::InProgress);
                let mut refused = Refused::new(Refusal::InProgress);
                refused.retry_after = Some(retry_after.min(self.options.max_retry_after));
                Begin::Refuse(refused)
            }
        }
    }
}
