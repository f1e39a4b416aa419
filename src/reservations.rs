//! [`Reservations`]: the operations every backend offers, so that services, the HTTP layer and
//! tests are written once and run against the local [`Store`] or a cluster-backed store.
//!
//! The trait is async first (a cluster backend answers over the network). Every method returns
//! a `Send` future, so generic code can run on a multi-threaded executor. The answers are the
//! same types and the same decisions ([`decide`](crate::decide)) whichever backend gives them.

use std::future::Future;
use std::time::Duration;

use crate::{
    Error, Fingerprint, Key, Lease, LiveLease, Record, RecordClass, Reservation, Resolution, Seen,
    Store,
};

/// The key-reservation operations, implemented by [`Store`] and by every other backend.
///
/// Write generic code against it:
///
/// ```
/// use idemstore::{Fingerprint, Key, Reservation, Reservations, Store};
///
/// async fn charge<R: Reservations>(store: &R, id: &str) -> Result<Vec<u8>, idemstore::Error> {
///     let key = Key::new("user-1", "POST /charges", id)?;
///     match store.reserve(&key, Fingerprint::of(b"amount=100")).await? {
///         Reservation::Acquired(lease) => {
///             let response = b"201 created".to_vec(); // the real work
///             store.complete(&lease, response.clone()).await?;
///             Ok(response)
///         }
///         Reservation::Completed(done) => Ok(done.result),
///         _ => Ok(b"409".to_vec()),
///     }
/// }
///
/// # let dir = tempfile::tempdir()?;
/// let store = Store::open(dir.path().join("generic.idem"))?;
/// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
/// let first = runtime.block_on(charge(&store, "a1"))?;
/// assert_eq!(runtime.block_on(charge(&store, "a1"))?, first);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Each method has the meaning, answers and errors of the [`Store`] method of the same name.
pub trait Reservations: Send + Sync {
    /// Reserves `key` for a request with this fingerprint; see [`Store::reserve`].
    fn reserve(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
    ) -> impl Future<Output = Result<Reservation, Error>> + Send;

    /// Reserves many keys at once; see [`Store::reserve_many`].
    fn reserve_many(
        &self,
        items: &[(Key, Fingerprint)],
    ) -> impl Future<Output = Result<Vec<Result<Reservation, Error>>, Error>> + Send;

    /// Stores the lease's result; see [`Store::complete`].
    fn complete(
        &self,
        lease: &Lease,
        result: Vec<u8>,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Deletes the key if this lease still holds it pending; see [`Store::release_if_pending`].
    fn release_if_pending(&self, lease: &Lease)
        -> impl Future<Output = Result<bool, Error>> + Send;

    /// Renews the lease; see [`Store::extend`].
    fn extend(&self, lease: &Lease) -> impl Future<Output = Result<Lease, Error>> + Send;

    /// Parks the key for a person; see [`Store::mark_needs_review`].
    fn mark_needs_review(
        &self,
        lease: &Lease,
        note: &str,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Settles a key under review or a stale reservation; see [`Store::resolve`].
    fn resolve(
        &self,
        key: &Key,
        resolution: Resolution,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// The stored record, absent when expired; see [`Store::get`].
    fn get(&self, key: &Key) -> impl Future<Output = Result<Option<Record>, Error>> + Send;

    /// Reservations whose lease ran out, oldest first; see [`Store::stale`].
    fn stale(&self, limit: usize)
        -> impl Future<Output = Result<Vec<(Key, Record)>, Error>> + Send;

    /// Deletes up to `limit` expired records; see [`Store::sweep`].
    fn sweep(&self, limit: usize) -> impl Future<Output = Result<usize, Error>> + Send;

    /// Deletes whatever is stored for `key` now; see [`Store::expire`] and
    /// [`Store::expire_forced`].
    fn expire(
        &self,
        key: &Key,
        live: LiveLease,
    ) -> impl Future<Output = Result<Option<RecordClass>, Error>> + Send;

    /// Records a recovery point for multi-step work; see [`Store::record_step`].
    fn record_step(
        &self,
        lease: &Lease,
        step: u32,
        data: &[u8],
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// The dedup window: records `key` as seen for `window` if nothing is stored for it, and
    /// says whether it was new; see [`Store::observe`].
    fn observe(
        &self,
        key: &Key,
        window: Duration,
    ) -> impl Future<Output = Result<Seen, Error>> + Send;

    /// [`observe`](Reservations::observe) for many keys at once; see [`Store::observe_many`].
    fn observe_many(
        &self,
        keys: &[Key],
        window: Duration,
    ) -> impl Future<Output = Result<Vec<Result<Seen, Error>>, Error>> + Send;

    /// Reserves `key`, waiting (without polling) while another caller holds it, up to
    /// `timeout`; see [`Store::reserve_or_wait`]. The local store wakes the task when a commit
    /// changes the key; a cluster store watches the key.
    fn reserve_or_wait(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        timeout: Duration,
    ) -> impl Future<Output = Result<Reservation, Error>> + Send;

    /// Completes many leases at once; see [`Store::complete_many`].
    fn complete_many(
        &self,
        items: Vec<(&Lease, Vec<u8>)>,
    ) -> impl Future<Output = Result<Vec<Result<(), Error>>, Error>> + Send;

    /// Releases many leases at once; see [`Store::release_if_pending_many`].
    fn release_if_pending_many(
        &self,
        leases: &[&Lease],
    ) -> impl Future<Output = Result<Vec<Result<bool, Error>>, Error>> + Send;

    /// Renews many leases at once; see [`Store::extend_many`].
    fn extend_many(
        &self,
        leases: &[&Lease],
    ) -> impl Future<Output = Result<Vec<Result<Lease, Error>>, Error>> + Send;

    /// Expires many keys at once; see [`Store::expire_many`].
    fn expire_many(
        &self,
        keys: &[Key],
        live: LiveLease,
    ) -> impl Future<Output = Result<Vec<Result<Option<RecordClass>, Error>>, Error>> + Send;

    /// Stores the lease's result, kept for `retention` instead of the key's operation's
    /// retention; see [`Store::complete_with_retention`].
    fn complete_with_retention(
        &self,
        lease: &Lease,
        result: Vec<u8>,
        retention: Duration,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Settles a key, a completed result kept for `retention`; see
    /// [`Store::resolve_with_retention`].
    fn resolve_with_retention(
        &self,
        key: &Key,
        resolution: Resolution,
        retention: Duration,
    ) -> impl Future<Output = Result<(), Error>> + Send;
}

forward_reservations!(
    /// The local store. Every write uses its `_async` form, so no thread blocks while a commit
    /// is synced. Reads (`get`, `stale`) never wait for a commit and run on the calling task;
    /// so does `sweep`, which holds the writer for one bounded slice.
    Store {
        reserve: async reserve_async,
        reserve_many: async reserve_many_async,
        complete: async complete_async,
        release_if_pending: async release_if_pending_async,
        extend: async extend_async,
        mark_needs_review: async mark_needs_review_async,
        resolve: async resolve_async,
        get: sync get,
        stale: sync stale,
        sweep: sync sweep,
        expire: async expire_async,
        record_step: async record_step_async,
        observe: async observe_async,
        observe_many: async observe_many_async,
        reserve_or_wait: async reserve_or_wait_async,
        complete_many: async complete_many_async,
        release_if_pending_many: async release_if_pending_many_async,
        extend_many: async extend_many_async,
        expire_many: async expire_many_async,
        complete_with_retention: async complete_with_retention_async,
        resolve_with_retention: async resolve_with_retention_async,
    }
);

/// Implements [`Reservations`] for a backend by forwarding each method to one of the
/// backend's own, so the trait's signatures are written here once, for every backend:
///
/// ```text
/// forward_reservations!(Store {
///     reserve: async reserve_async,   // awaited
///     get: sync get,                  // called, its result ready at once
///     ...
/// });
/// ```
///
/// Every method of the trait is named, in the trait's order; a missing or misspelt one is a
/// compile error.
macro_rules! forward_reservations {
    (@call async $($call:tt)*) => { $($call)*.await };
    (@call sync $($call:tt)*) => { $($call)* };
    (@method reserve $how:ident $target:ident) => {
        async fn reserve(&self, key: &$crate::Key, fingerprint: $crate::Fingerprint) -> Result<$crate::Reservation, $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, key, fingerprint))
        }
    };
    (@method reserve_many $how:ident $target:ident) => {
        async fn reserve_many(&self, items: &[($crate::Key, $crate::Fingerprint)]) -> Result<Vec<Result<$crate::Reservation, $crate::Error>>, $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, items))
        }
    };
    (@method complete $how:ident $target:ident) => {
        async fn complete(&self, lease: &$crate::Lease, result: Vec<u8>) -> Result<(), $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, lease, result))
        }
    };
    (@method release_if_pending $how:ident $target:ident) => {
        async fn release_if_pending(&self, lease: &$crate::Lease) -> Result<bool, $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, lease))
        }
    };
    (@method extend $how:ident $target:ident) => {
        async fn extend(&self, lease: &$crate::Lease) -> Result<$crate::Lease, $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, lease))
        }
    };
    (@method mark_needs_review $how:ident $target:ident) => {
        async fn mark_needs_review(&self, lease: &$crate::Lease, note: &str) -> Result<(), $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, lease, note))
        }
    };
    (@method resolve $how:ident $target:ident) => {
        async fn resolve(&self, key: &$crate::Key, resolution: $crate::Resolution) -> Result<(), $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, key, resolution))
        }
    };
    (@method get $how:ident $target:ident) => {
        async fn get(&self, key: &$crate::Key) -> Result<Option<$crate::Record>, $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, key))
        }
    };
    (@method stale $how:ident $target:ident) => {
        async fn stale(&self, limit: usize) -> Result<Vec<($crate::Key, $crate::Record)>, $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, limit))
        }
    };
    (@method sweep $how:ident $target:ident) => {
        async fn sweep(&self, limit: usize) -> Result<usize, $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, limit))
        }
    };
    (@method expire $how:ident $target:ident) => {
        async fn expire(&self, key: &$crate::Key, live: $crate::LiveLease) -> Result<Option<$crate::RecordClass>, $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, key, live))
        }
    };
    (@method record_step $how:ident $target:ident) => {
        async fn record_step(&self, lease: &$crate::Lease, step: u32, data: &[u8]) -> Result<(), $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, lease, step, data))
        }
    };
    (@method observe $how:ident $target:ident) => {
        async fn observe(&self, key: &$crate::Key, window: std::time::Duration) -> Result<$crate::Seen, $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, key, window))
        }
    };
    (@method observe_many $how:ident $target:ident) => {
        async fn observe_many(&self, keys: &[$crate::Key], window: std::time::Duration) -> Result<Vec<Result<$crate::Seen, $crate::Error>>, $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, keys, window))
        }
    };
    (@method reserve_or_wait $how:ident $target:ident) => {
        async fn reserve_or_wait(&self, key: &$crate::Key, fingerprint: $crate::Fingerprint, timeout: std::time::Duration) -> Result<$crate::Reservation, $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, key, fingerprint, timeout))
        }
    };
    (@method complete_many $how:ident $target:ident) => {
        async fn complete_many(&self, items: Vec<(&$crate::Lease, Vec<u8>)>) -> Result<Vec<Result<(), $crate::Error>>, $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, items))
        }
    };
    (@method release_if_pending_many $how:ident $target:ident) => {
        async fn release_if_pending_many(&self, leases: &[&$crate::Lease]) -> Result<Vec<Result<bool, $crate::Error>>, $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, leases))
        }
    };
    (@method extend_many $how:ident $target:ident) => {
        async fn extend_many(&self, leases: &[&$crate::Lease]) -> Result<Vec<Result<$crate::Lease, $crate::Error>>, $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, leases))
        }
    };
    (@method expire_many $how:ident $target:ident) => {
        async fn expire_many(&self, keys: &[$crate::Key], live: $crate::LiveLease) -> Result<Vec<Result<Option<$crate::RecordClass>, $crate::Error>>, $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, keys, live))
        }
    };
    (@method complete_with_retention $how:ident $target:ident) => {
        async fn complete_with_retention(&self, lease: &$crate::Lease, result: Vec<u8>, retention: std::time::Duration) -> Result<(), $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, lease, result, retention))
        }
    };
    (@method resolve_with_retention $how:ident $target:ident) => {
        async fn resolve_with_retention(&self, key: &$crate::Key, resolution: $crate::Resolution, retention: std::time::Duration) -> Result<(), $crate::Error> {
            $crate::reservations::forward_reservations!(@call $how Self::$target(self, key, resolution, retention))
        }
    };
    ($(#[$doc:meta])* $store:ty { $($method:ident: $how:ident $target:ident,)* }) => {
        $(#[$doc])*
        impl $crate::Reservations for $store {
            $($crate::reservations::forward_reservations!(@method $method $how $target);)*
        }
    };
}
pub(crate) use forward_reservations;
