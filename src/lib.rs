//! idemstore: an embedded, crash-safe key-reservation store that makes retried,
//! double-clicked and redelivered requests safe.
//!
//! A service links it in-process and opens one file. Before doing non-idempotent work
//! (charging, creating, sending), it *reserves* the request's idempotency key; exactly one
//! caller acquires it, durably, before the work starts. When the work completes, the result is
//! stored and every duplicate gets it replayed; a duplicate that arrives while the work runs is
//! told it is in progress; the same key with a different request is refused as a mismatch.
//! Keys expire after a retention window.
//!
//! ```
//! use idemstore::{Fingerprint, Key, Reservation, Store};
//!
//! # let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path().join("payments.idem"))?;
//!
//! fn charge(store: &Store, user: &str, idem_key: &str, body: &[u8]) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
//!     let key = Key::new(user, "POST /charges", idem_key)?;
//!     match store.reserve(&key, Fingerprint::of(body))? {
//!         Reservation::Acquired(lease) => {
//!             let response = b"201 charge ch_1 created".to_vec(); // the real work
//!             store.complete(&lease, response.clone())?;
//!             Ok(response)
//!         }
//!         Reservation::Completed(done) => Ok(done.result),                // a retry: replay
//!         Reservation::InProgress { .. } => Ok(b"409 in progress".to_vec()),
//!         Reservation::Mismatch => Ok(b"422 key reused with another body".to_vec()),
//!         _ => Ok(b"409 needs review".to_vec()),
//!     }
//! }
//!
//! let first = charge(&store, "user-1", "a1", b"amount=100")?;
//! let retry = charge(&store, "user-1", "a1", b"amount=100")?;
//! assert_eq!(first, retry);
//! assert_eq!(charge(&store, "user-1", "a1", b"amount=999")?, b"422 key reused with another body");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Features
//! - Atomic reservation with fencing tokens that strictly increase, also across restarts.
//! - Outcomes ([`Reservation`]) kept apart from errors ([`Error`]).
//! - Leases that go stale when a worker dies: the next request takes over with
//!   [`Lease::is_retry`] set, or a recovery job lists them with [`Store::stale`]. A lease
//!   ends with its process: after a restart the first retry takes the key over at once
//!   ([`Builder::leases_survive_restart`]).
//! - [`Store::complete_with`] commits the caller's own redb tables with the completion.
//! - Durable before acknowledging by default; concurrent callers share one commit.
//! - Duplicates are answered from read transactions that never wait for writers.
//! - Expired keys swept in the background by default, in bounded slices through an expiry
//!   index ([`Builder::sweep_interval`], [`Store::sweep`]).
//! - Per-record checksums: damage is reported with the key, never returned as data.
//! - An `Idempotency-Key` guard for HTTP (tower, axum), gRPC (tonic) and actix-web services,
//!   on any [`Reservations`] backend (features below).
//! - [`Store::expire`] deletes a key now (a wrong stored response, a data-deletion request,
//!   reprocessing on purpose); a live lease is refused unless [`Store::expire_forced`].
//! - Retention per operation ([`Builder::retention_for`]) and per completion
//!   ([`Store::complete_with_retention`]).
//! - A live view for operators: by default the store serves a read-only Unix socket
//!   ([`Builder::admin_socket`]) that the `idemstore` tool ([`AdminClient`]) reads while the
//!   service runs ([`admin`]).
//!
//! The on-disk format is described in `docs/format.md`.
//!
//! # Features
//! The store alone needs none; each integration is off by default:
//!
//! | feature | what it adds |
//! |---|---|
//! | `http` | `http::IdempotencyLayer`, the `Idempotency-Key` header for any tower HTTP service (axum), and `guard`, its framework-neutral decisions for adapters to other servers |
//! | `grpc` | `grpc::GrpcIdempotencyLayer`, the guard for tonic servers, answering in gRPC statuses (implies `http`) |
//! | `actix` | `actix::Idempotency`, the guard as an actix-web middleware (implies `http`) |
//! | `postgres` | `PgStore`, the same reservations on a PostgreSQL table, shared by several processes; `complete_with` runs the caller's SQL in the completion's transaction |
//! | `etcd` | `EtcdStore`, the same reservations on an etcd v3 cluster, shared by several processes |
//! | `metrics` | every counter of [`Store::stats`] reported to the `metrics` facade |
//! | `tracing` | `tracing` events: recovery, checkpoints, poisoning, batches |
//!
//! The `idemstore` command-line tool is its own package, `idemstore-cli`.
//!
//! # Layout
//! The crate reads from the bottom up, in floors that import only from the floors below;
//! `CONTRIBUTING.md` ("The floors") describes them, with the walk of one reserve.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(clippy::host_endian_bytes)]

#[cfg(feature = "actix")]
pub mod actix;
pub mod admin;
mod answers;
mod clock;
mod commit;
mod decide;
mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod fingerprint;
#[cfg(feature = "grpc")]
pub mod grpc;
#[cfg(feature = "http")]
pub mod guard;
#[cfg(feature = "http")]
pub mod http;
mod key;
mod log;
#[cfg(feature = "postgres")]
mod postgres;
mod record;
// The operations the etcd and PostgreSQL stores share, over each one's dialect.
#[cfg(any(feature = "etcd", feature = "postgres"))]
mod remote;
mod reservations;
mod state;
mod store;
mod tree;
// The guides' Rust blocks, compiled as doctests: by `cargo test`, and with the features they
// need by `.ci/run`'s `etcd` and `postgres` steps.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct Readme;
#[cfg(doctest)]
#[doc = include_str!("../docs/1-getting-started.md")]
struct GuideStart;
#[cfg(doctest)]
#[doc = include_str!("../docs/2-http-grpc-actix.md")]
struct GuideHttp;
#[cfg(all(doctest, feature = "postgres"))]
#[doc = include_str!("../docs/postgres.md")]
struct GuidePostgres;
#[cfg(all(doctest, any(feature = "etcd", feature = "postgres")))]
#[doc = include_str!("../docs/6-more-than-one-machine.md")]
struct GuideMachines;
// The internals the crate's own tests and fuzz targets reach (hidden feature, CONTRIBUTING.md).
#[cfg(feature = "__whitebox")]
#[doc(hidden)]
pub mod whitebox;

pub use admin::{AdminClient, AdminSocket};
pub use answers::{Completed, Lease, LeaseLostReason, LiveLease, Reservation, Seen};
pub use clock::{Clock, ManualClock, SystemClock};
pub use decide::Resolution;
pub use error::{Error, OpenError, Result, StorageError};
#[cfg(feature = "etcd")]
pub use etcd::{EtcdBuilder, EtcdSnapshot, EtcdStore, EtcdSweeper};
pub use fingerprint::Fingerprint;
pub use key::{Key, KeyError, KeyPart};
pub use log::LogFile;
#[cfg(feature = "postgres")]
pub use postgres::{PgBuilder, PgSnapshot, PgStore, PgWork};
pub use record::{Progress, Record, RecordClass, Status};
pub use reservations::Reservations;
pub use state::Stats;
pub use store::builder::{Builder, Durability};
pub use store::inspect::{
    FileInfo, Problem, ProblemKind, ReadOnlyStore, ScanFilter, StateCounts, Verification,
};
pub use store::{compact, import, open_redb, open_redb_read_only, Imported, Store};

/// The redb crate this store is built on, for [`Store::complete_with`] callers.
pub use redb;

/// The etcd client crate, for [`EtcdStore::complete_with`] callers' own operations.
#[cfg(feature = "etcd")]
pub use etcd_client;

/// The PostgreSQL client crate, for [`PgStore::complete_with`] callers' own statements.
#[cfg(feature = "postgres")]
pub use tokio_postgres;
