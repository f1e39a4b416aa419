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

/// The local store. Every write uses its `_async` form, so no thread blocks while a commit is
/// synced. Reads (`get`, `stale`) never wait for a commit and run on the calling task; so
/// does `sweep`, which holds the writer for one bounded slice.
impl Reservations for Store {
    async fn reserve(&self, key: &Key, fingerprint: Fingerprint) -> Result<Reservation, Error> {
        self.reserve_async(key, fingerprint).await
    }

    async fn reserve_many(
        &self,
        items: &[(Key, Fingerprint)],
    ) -> Result<Vec<Result<Reservation, Error>>, Error> {
        self.reserve_many_async(items).await
    }

    async fn complete(&self, lease: &Lease, result: Vec<u8>) -> Result<(), Error> {
        self.complete_async(lease, result).await
    }

    async fn release_if_pending(&self, lease: &Lease) -> Result<bool, Error> {
        self.release_if_pending_async(lease).await
    }

    async fn extend(&self, lease: &Lease) -> Result<Lease, Error> {
        self.extend_async(lease).await
    }

    async fn mark_needs_review(&self, lease: &Lease, note: &str) -> Result<(), Error> {
        self.mark_needs_review_async(lease, note).await
    }

    async fn resolve(&self, key: &Key, resolution: Resolution) -> Result<(), Error> {
        self.resolve_async(key, resolution).await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        Store::get(self, key)
    }

    async fn stale(&self, limit: usize) -> Result<Vec<(Key, Record)>, Error> {
        Store::stale(self, limit)
    }

    async fn sweep(&self, limit: usize) -> Result<usize, Error> {
        Store::sweep(self, limit)
    }

    async fn expire(&self, key: &Key, live: LiveLease) -> Result<Option<RecordClass>, Error> {
        self.expire_async(key, live).await
    }
    async fn record_step(&self, lease: &Lease, step: u32, data: &[u8]) -> Result<(), Error> {
        self.record_step_async(lease, step, data).await
    }

    async fn observe(&self, key: &Key, window: Duration) -> Result<Seen, Error> {
        let mut seen = self
            .observe_many_async(std::slice::from_ref(key), window)
            .await?;
        seen.remove(0)
    }

    async fn observe_many(
        &self,
        keys: &[Key],
        window: Duration,
    ) -> Result<Vec<Result<Seen, Error>>, Error> {
        self.observe_many_async(keys, window).await
    }

    async fn reserve_or_wait(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        timeout: Duration,
    ) -> Result<Reservation, Error> {
        self.reserve_or_wait_async(key, fingerprint, timeout).await
    }

    async fn complete_many(
        &self,
        items: Vec<(&Lease, Vec<u8>)>,
    ) -> Result<Vec<Result<(), Error>>, Error> {
        self.complete_many_async(items).await
    }

    async fn release_if_pending_many(
        &self,
        leases: &[&Lease],
    ) -> Result<Vec<Result<bool, Error>>, Error> {
        self.release_if_pending_many_async(leases).await
    }

    async fn extend_many(&self, leases: &[&Lease]) -> Result<Vec<Result<Lease, Error>>, Error> {
        self.extend_many_async(leases).await
    }

    async fn expire_many(
        &self,
        keys: &[Key],
        live: LiveLease,
    ) -> Result<Vec<Result<Option<RecordClass>, Error>>, Error> {
        self.expire_many_async(keys, live).await
    }

    async fn complete_with_retention(
        &self,
        lease: &Lease,
        result: Vec<u8>,
        retention: Duration,
    ) -> Result<(), Error> {
        self.complete_with_retention_async(lease, result, retention)
            .await
    }

    async fn resolve_with_retention(
        &self,
        key: &Key,
        resolution: Resolution,
        retention: Duration,
    ) -> Result<(), Error> {
        self.resolve_with_retention_async(key, resolution, retention)
            .await
    }
}
