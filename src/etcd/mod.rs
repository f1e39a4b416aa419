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

pub use builder::EtcdBuilder;
pub use snapshot::EtcdSnapshot;
pub use store::EtcdStore;
pub use sweep::EtcdSweeper;

crate::reservations::forward_reservations!(
    /// The cluster store, through the same trait as the local one: code written against
    /// [`Reservations`](crate::Reservations) runs on either.
    EtcdStore {
        reserve: async reserve,
        reserve_many: async reserve_many,
        complete: async complete,
        release_if_pending: async release_if_pending,
        extend: async extend,
        mark_needs_review: async mark_needs_review,
        resolve: async resolve,
        get: async get,
        stale: async stale,
        sweep: async sweep,
        expire: async expire_with,
        record_step: async record_step,
        observe: async observe,
        observe_many: async observe_many,
        reserve_or_wait: async reserve_or_wait,
        complete_many: async complete_many,
        release_if_pending_many: async release_if_pending_many,
        extend_many: async extend_many,
        expire_many: async expire_many,
        complete_with_retention: async complete_with_retention,
        resolve_with_retention: async resolve_with_retention,
    }
);
