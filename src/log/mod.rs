//! The log: every batch is appended here as one checksummed frame and made durable by one
//! fdatasync before any caller hears its answer. The identity block that ties a log to its
//! store file ([`identity`]), the frames, the positional file they are written through and
//! the writing ([`wal`]), replaying it on open ([`recovery`]), refusing an open
//! that lost its log ([`lost_log`]) and the clean-close marker ([`clean_close`]).
//! Region switching at a checkpoint is the checkpoint's (`commit/checkpoint.rs`).

pub(crate) mod clean_close;
pub(crate) mod identity;
pub(crate) mod lost_log;
pub(crate) mod recovery;
pub(crate) mod wal;
