//! The cluster-backed store (feature `etcd`): [`EtcdStore`] offers the operations and answers
//! of the local [`Store`](crate::Store) on an etcd v3 cluster, through the same
//! [`Reservations`] trait, the same [`decide`](crate::decide) state machine and the same
//! record encoding. The data model (keys, values, indexes, tokens) is in `docs/etcd.md`.
//!
//! - [`layout`]: etcd keys, value envelope, tokens from revisions.
//! - [`write`]: read (or guess), decide, conditional write, retry; ambiguous answers.
//!   [`hints`]: the pending records this process wrote, so a holder's next write needs no read.
//! - [`store`]: the public single-key operations. [`batch`]: many keys per transaction;
//!   [`many`]: the batch operations on it (`reserve_many`, `observe_many`, `complete_many`,
//!   `expire_many`, ...). [`wait`]: `reserve_or_wait` through an etcd watch.
//! - [`expire`]: deleting a key now (`expire`, `expire_forced`).
//! - [`sweep`]: expiry through the index entries, the background sweeper, `stale`.
//! - [`snapshot`]: counts and listings at one revision, read-only (the command line's
//!   `stats`, `list` and `get`).

mod batch;
mod builder;
mod expire;
mod hints;
mod layout;
mod many;
mod snapshot;
mod store;
mod sweep;
mod wait;
mod write;

pub use builder::{
    EtcdBuilder, DEFAULT_ETCD_PREFIX, DEFAULT_MAX_TXN_OPS, DEFAULT_OP_DEADLINE,
    DEFAULT_REQUEST_TIMEOUT,
};
pub use snapshot::EtcdSnapshot;
pub use store::EtcdStore;
pub use sweep::Sweeper;

use std::time::Duration;

use crate::{
    Error, Fingerprint, Key, Lease, LiveLease, Record, RecordClass, Reservation, Reservations,
    Resolution, Seen,
};

/// The cluster store, through the same trait as the local one: code written against
/// [`Reservations`] runs on either.
impl Reservations for EtcdStore {
    async fn reserve(&self, key: &Key, fingerprint: Fingerprint) -> Result<Reservation, Error> {
        EtcdStore::reserve(self, key, fingerprint).await
    }

    async fn reserve_many(
        &self,
        items: &[(Key, Fingerprint)],
    ) -> Result<Vec<Result<Reservation, Error>>, Error> {
        EtcdStore::reserve_many(self, items).await
    }

    async fn complete(&self, lease: &Lease, result: Vec<u8>) -> Result<(), Error> {
        EtcdStore::complete(self, lease, result).await
    }

    async fn release_if_pending(&self, lease: &Lease) -> Result<bool, Error> {
        EtcdStore::release_if_pending(self, lease).await
    }

    async fn extend(&self, lease: &Lease) -> Result<Lease, Error> {
        EtcdStore::extend(self, lease).await
    }

    async fn mark_needs_review(&self, lease: &Lease, note: &str) -> Result<(), Error> {
        EtcdStore::mark_needs_review(self, lease, note).await
    }

    async fn resolve(&self, key: &Key, resolution: Resolution) -> Result<(), Error> {
        EtcdStore::resolve(self, key, resolution).await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        EtcdStore::get(self, key).await
    }

    async fn stale(&self, limit: usize) -> Result<Vec<(Key, Record)>, Error> {
        EtcdStore::stale(self, limit).await
    }

    async fn sweep(&self, limit: usize) -> Result<usize, Error> {
        EtcdStore::sweep(self, limit).await
    }

    async fn expire(&self, key: &Key, live: LiveLease) -> Result<Option<RecordClass>, Error> {
        EtcdStore::expire_with(self, key, live).await
    }
    async fn record_step(&self, lease: &Lease, step: u32, data: &[u8]) -> Result<(), Error> {
        EtcdStore::record_step(self, lease, step, data).await
    }

    async fn observe(&self, key: &Key, window: Duration) -> Result<Seen, Error> {
        EtcdStore::observe(self, key, window).await
    }

    async fn observe_many(
        &self,
        keys: &[Key],
        window: Duration,
    ) -> Result<Vec<Result<Seen, Error>>, Error> {
        EtcdStore::observe_many(self, keys, window).await
    }

    async fn reserve_or_wait(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        timeout: Duration,
    ) -> Result<Reservation, Error> {
        EtcdStore::reserve_or_wait(self, key, fingerprint, timeout).await
    }

    async fn complete_many(
        &self,
        items: Vec<(&Lease, Vec<u8>)>,
    ) -> Result<Vec<Result<(), Error>>, Error> {
        EtcdStore::complete_many(self, items).await
    }

    async fn release_if_pending_many(
        &self,
        leases: &[&Lease],
    ) -> Result<Vec<Result<bool, Error>>, Error> {
        EtcdStore::release_if_pending_many(self, leases).await
    }

    async fn extend_many(&self, leases: &[&Lease]) -> Result<Vec<Result<Lease, Error>>, Error> {
        EtcdStore::extend_many(self, leases).await
    }

    async fn expire_many(
        &self,
        keys: &[Key],
        live: LiveLease,
    ) -> Result<Vec<Result<Option<RecordClass>, Error>>, Error> {
        EtcdStore::expire_many(self, keys, live).await
    }

    async fn complete_with_retention(
        &self,
        lease: &Lease,
        result: Vec<u8>,
        retention: Duration,
    ) -> Result<(), Error> {
        EtcdStore::complete_with_retention(self, lease, result, retention).await
    }

    async fn resolve_with_retention(
        &self,
        key: &Key,
        resolution: Resolution,
        retention: Duration,
    ) -> Result<(), Error> {
        EtcdStore::resolve_with_retention(self, key, resolution, retention).await
    }
}
