//! The PostgreSQL-backed store (feature `postgres`): [`PgStore`] offers the operations and
//! answers of the local [`Store`](crate::Store) on a PostgreSQL database, through the same
//! [`Reservations`] trait, the same [`decide`](crate::decide) state machine and the same
//! record encoding. The data model (table, indexes, sequence, version) is in
//! `docs/postgres.md`.
//!
//! - [`schema`]: the table, its indexes and token sequence, the version check at connect.
//! - [`write`]: the store's dialect for the operations every cluster store shares
//!   ([`remote`](crate::remote)): read (or guess absent), decide, conditional multi-row
//!   writes, retry; answers lost with a connection settled by the write's nonce.
//!   [`hints`]: the pending rows this process wrote, so a holder's next write needs no read.
//! - [`statement`]: one statement on a pooled connection and how it failed; a row's body.
//! - [`store`]: the store and its shared state, `complete_with` on the caller's transaction,
//!   `stale` and sweeping.
//! - [`wait`]: waking `reserve_or_wait` callers with `LISTEN`/`NOTIFY`.
//! - [`snapshot`]: counts and listings in one read-only transaction (the command line's
//!   `stats`, `list` and `get`).

mod builder;
mod hints;
mod schema;
mod snapshot;
mod statement;
mod store;
mod wait;
mod write;

pub use builder::PgBuilder;
pub use snapshot::PgSnapshot;
pub use store::{PgStore, PgWork};
