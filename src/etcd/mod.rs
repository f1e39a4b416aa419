//! The cluster-backed store (feature `etcd`): [`EtcdStore`] offers the operations and answers
//! of the local [`Store`](crate::Store) on an etcd v3 cluster, through the same
//! [`Reservations`] trait, the same [`decide`](crate::decide) state machine and the same
//! record encoding. The data model (keys, values, indexes, tokens) is in `docs/etcd.md`.
//!
//! - [`layout`]: etcd keys, value envelope, tokens from revisions.
//! - [`write`]: read (or guess), decide, conditional write, retry; ambiguous answers.
//!   [`hints`]: the pending records this process wrote, so a holder's next write needs no read.
//! - [`store`]: the store and its shared state, its dialect for the operations every
//!   cluster store shares ([`remote`](crate::remote)), and `complete_with`. [`batch`]: many keys per transaction.
//!   [`wait`]: `reserve_or_wait` through an etcd watch.
//! - [`sweep`]: expiry through the index entries, the background sweeper, `stale`.
//! - [`snapshot`]: counts and listings at one revision, read-only (the command line's
//!   `stats`, `list` and `get`).

mod batch;
mod builder;
mod hints;
mod layout;
mod snapshot;
mod store;
mod sweep;
mod wait;
mod write;

pub use builder::EtcdBuilder;
pub use snapshot::EtcdSnapshot;
pub use store::EtcdStore;
pub use sweep::EtcdSweeper;
