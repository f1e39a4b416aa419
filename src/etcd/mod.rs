//! The cluster-backed store (feature `etcd`): [`EtcdStore`] offers the operations and answers
//! of the local [`Store`](crate::Store) on an etcd v3 cluster, through the same
//! [`Reservations`] trait, the same [`decide`](crate::decide) state machine and the same
//! record encoding. The data model (keys, values, indexes, tokens) is in `docs/etcd.md`.
//!
//! - [`layout`]: etcd keys, value envelope, tokens from revisions.
//! - [`write`]: read, decide, conditional write, retry; ambiguous answers.
//! - [`store`]: the public single-key operations. [`batch`]: `reserve_many`.
//! - [`expire`]: deleting a key now (`expire`, `expire_forced`).
//! - [`sweep`]: expiry through the expiry index, the background sweeper, `stale`.

mod batch;
mod builder;
mod expire;
mod layout;
mod store;
mod sweep;
mod write;

pub use builder::{
    EtcdBuilder, DEFAULT_ETCD_PREFIX, DEFAULT_MAX_TXN_OPS, DEFAULT_OP_DEADLINE,
    DEFAULT_REQUEST_TIMEOUT,
};
pub use store::EtcdStore;
pub use sweep::Sweeper;

use crate::{
    Error, Fingerprint, Key, Lease, LiveLease, Record, RecordClass, Reservation, Reservations,
    Resolution,
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
}
