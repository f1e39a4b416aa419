//! Floor 3, the format: every byte the store puts on disk, described in `docs/format.md`.
//! The redb tables and their meta keys ([`tables`]), the record codec ([`codec`]), the log's
//! frames ([`frame`]) and identity block ([`identity`]), and the positional file the log is
//! written through ([`log_file`]), and the checksummed blocks of the store file under redb
//! ([`pages`]). It imports the vocabulary alone.

pub(crate) mod codec;
pub(crate) mod frame;
pub(crate) mod identity;
pub(crate) mod log_file;
pub(crate) mod pages;
pub(crate) mod tables;
pub(crate) mod windows;
