//! The PostgreSQL-backed store (feature `postgres`): [`PgStore`] offers the operations and
//! answers of the local [`Store`](crate::Store) on a PostgreSQL database, through the same
//! [`Reservations`] trait, the same [`decide`](crate::decide) state machine and the same
//! record encoding. The data model (table, indexes, sequence, version) is in
//! `docs/postgres.md`.
//!
//! - [`schema`]: the table, its indexes and token sequence, the version check at connect.
//! - [`write`]: read (or guess absent), decide, conditional multi-row writes, retry; answers
//!   lost with a connection settled by the write's nonce.
//! - [`store`]: the public operations, `complete_with` on the caller's transaction, sweeping.
//! - [`wait`]: waking `reserve_or_wait` callers with `LISTEN`/`NOTIFY`.
//! - [`snapshot`]: counts and listings in one read-only transaction (the command line's
//!   `stats`, `list` and `get`).

mod builder;
mod schema;
mod snapshot;
mod store;
mod wait;
mod write;

pub use builder::PgBuilder;
pub use snapshot::PgSnapshot;
pub use store::{PgStore, PgWork};

use std::time::Duration;

use crate::{
    Error, Fingerprint, Key, Lease, LiveLease, Record, RecordClass, Reservation, Reservations,
    Resolution, Seen,
};

/// The PostgreSQL store, through the same trait as the local one: code written against
/// [`Reservations`] runs on any backend.
impl Reservations for PgStore {
    async fn reserve(&self, key: &Key, fingerprint: Fingerprint) -> Result<Reservation, Error> {
        PgStore::reserve(self, key, fingerprint).await
    }

    async fn reserve_many(
        &self,
        items: &[(Key, Fingerprint)],
    ) -> Result<Vec<Result<Reservation, Error>>, Error> {
        PgStore::reserve_many(self, items).await
    }

    async fn complete(&self, lease: &Lease, result: Vec<u8>) -> Result<(), Error> {
        PgStore::complete(self, lease, result).await
    }

    async fn release_if_pending(&self, lease: &Lease) -> Result<bool, Error> {
        PgStore::release_if_pending(self, lease).await
    }

    async fn extend(&self, lease: &Lease) -> Result<Lease, Error> {
        PgStore::extend(self, lease).await
    }

    async fn mark_needs_review(&self, lease: &Lease, note: &str) -> Result<(), Error> {
        PgStore::mark_needs_review(self, lease, note).await
    }

    async fn resolve(&self, key: &Key, resolution: Resolution) -> Result<(), Error> {
        PgStore::resolve(self, key, resolution).await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        PgStore::get(self, key).await
    }

    async fn stale(&self, limit: usize) -> Result<Vec<(Key, Record)>, Error> {
        PgStore::stale(self, limit).await
    }

    async fn sweep(&self, limit: usize) -> Result<usize, Error> {
        PgStore::sweep(self, limit).await
    }

    async fn expire(&self, key: &Key, live: LiveLease) -> Result<Option<RecordClass>, Error> {
        PgStore::expire_with(self, key, live).await
    }
    async fn record_step(&self, lease: &Lease, step: u32, data: &[u8]) -> Result<(), Error> {
        PgStore::record_step(self, lease, step, data).await
    }

    async fn observe(&self, key: &Key, window: Duration) -> Result<Seen, Error> {
        PgStore::observe(self, key, window).await
    }

    async fn observe_many(
        &self,
        keys: &[Key],
        window: Duration,
    ) -> Result<Vec<Result<Seen, Error>>, Error> {
        PgStore::observe_many(self, keys, window).await
    }

    async fn reserve_or_wait(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        timeout: Duration,
    ) -> Result<Reservation, Error> {
        PgStore::reserve_or_wait(self, key, fingerprint, timeout).await
    }

    async fn complete_many(
        &self,
        items: Vec<(&Lease, Vec<u8>)>,
    ) -> Result<Vec<Result<(), Error>>, Error> {
        PgStore::complete_many(self, items).await
    }

    async fn release_if_pending_many(
        &self,
        leases: &[&Lease],
    ) -> Result<Vec<Result<bool, Error>>, Error> {
        PgStore::release_if_pending_many(self, leases).await
    }

    async fn extend_many(&self, leases: &[&Lease]) -> Result<Vec<Result<Lease, Error>>, Error> {
        PgStore::extend_many(self, leases).await
    }

    async fn expire_many(
        &self,
        keys: &[Key],
        live: LiveLease,
    ) -> Result<Vec<Result<Option<RecordClass>, Error>>, Error> {
        PgStore::expire_many(self, keys, live).await
    }

    async fn complete_with_retention(
        &self,
        lease: &Lease,
        result: Vec<u8>,
        retention: Duration,
    ) -> Result<(), Error> {
        PgStore::complete_with_retention(self, lease, result, retention).await
    }

    async fn resolve_with_retention(
        &self,
        key: &Key,
        resolution: Resolution,
        retention: Duration,
    ) -> Result<(), Error> {
        PgStore::resolve_with_retention(self, key, resolution, retention).await
    }
}
