//! The log: every batch is appended here as one checksummed frame and made durable by one
//! fdatasync before any caller hears its answer. The identity block that ties a log to its
//! store file ([`identity`]), the frames, the positional file they are written through and
//! the writing ([`wal`]), replaying it on open ([`recovery`]), refusing an open
//! that lost its log ([`lost_log`]) and the clean-close marker ([`clean_close`]).
//! Region switching at a checkpoint is the checkpoint's (`commit/checkpoint.rs`).

mod clean_close;
mod identity;
mod lost_log;
mod recovery;
mod wal;

pub(crate) use clean_close::{mark, recorded, shrink_log};
#[cfg(feature = "__whitebox")]
pub use identity::{block, parse};
pub(crate) use identity::{claim as claim_identity, read as read_identity};
pub use identity::{Identity, LOG_HEADER_LEN};
pub(crate) use lost_log::{recorded_len, refuse, truncated};
pub(crate) use recovery::recover;
#[cfg(feature = "__whitebox")]
pub use recovery::{LogPosition, Recovered};
#[cfg(feature = "__whitebox")]
pub use wal::{
    decode_payload, encode, header_crc, padded, parse_header, Entry, EntryRecord, Frame, Header,
    ALIGN, HEADER_LEN,
};
pub(crate) use wal::{log_path, zero_fill, OsFile, PREALLOC_FIRST};
pub use wal::{LogFile, Wal};
