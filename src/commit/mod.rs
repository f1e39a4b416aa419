//! The commit path: every write goes through here.
//!
//! Callers queue a request (one or many key operations) and wait. The batch's leader (a caller
//! that is alone, or else the committer thread) takes everything queued; the writer takes
//! each request's operations out as data (`queue.rs`: a request never calls the writer).
//! An operation its caller decided against the state it read in the current epoch
//! ([`Known`]) keeps that decision, given the writer's next token
//! ([`with_token`](crate::decide::with_token)), unless the writer changed the key since;
//! any other is decided with [`decide`](crate::decide::decide) against the latest state (the
//! changes since the last redb commit, the record cache, committed redb). The resulting
//! changes are appended to the log as one frame. The changes are queued for the applier thread (`apply.rs`), which
//! writes them into a redb write transaction kept open across batches, off the batch path.
//! The batch is then handed to the [`Syncer`]: one fdatasync makes every frame written so far
//! durable, after which the batch's changes are published to the [`Overlay`](crate::state::Overlay) (what readers see before redb commits) and its
//! callers are answered. Nobody hears an answer before its batch is durable.
//!
//! A lone caller (the committer idle, nothing else queued, no sync running) runs its batch and
//! the sync itself, with no hand-off between threads. Under load the committer thread takes
//! everything queued, writes it as one batch, syncs every frame written so far and loops,
//! while callers only wait to be woken with their answer: each sync covers everything queued
//! while the previous one ran, as in a bare group-commit log.
//!
//! The applier applies each batch once its frame is synced and commits its open redb
//! transaction every 250 ms (non-durably; the log is what makes it durable); the writer then
//! forgets the changes that commit holds (which ends the epoch), and their overlay entries
//! move to the record cache. A background checkpoint applies and commits on its own thread.
//! [`Store::checkpoint`](crate::Store::checkpoint), [`Store::complete_with`](crate::Store::complete_with)
//! and sweeps with something to delete take the writer between batches.
//!
//! Any failure of a write poisons the store: the failing batches are answered with the error
//! and every later call is refused until the store is reopened.

mod apply;
mod background;
mod checkpoint;
mod queue;
mod request;
mod sweep;
mod syncer;
mod writer;

pub(crate) use apply::Written;
#[cfg(feature = "__whitebox")]
pub(crate) use apply::{merged, DeferredBatch, TreeChange};
#[cfg(feature = "__whitebox")]
pub use background::Background;
pub(crate) use background::Schedule;
pub(crate) use checkpoint::CommitKind;
pub(crate) use queue::{first, Committer};
pub(crate) use request::{CallerDecision, Kind, Known};
pub(crate) use sweep::stale;
pub(crate) use syncer::Syncer;
pub(crate) use writer::Writer;
