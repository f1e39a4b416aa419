//! The B-tree: what the store keeps in redb, described in `docs/format.md`. The door names
//! what the rest of the crate uses; its rooms: the tables and their meta keys (`tables.rs`),
//! what an open reads of them first (`opening.rs`), the expiry windows records live in
//! (`windows.rs`) and their filters (`filter.rs`), the checksummed pages of the store file
//! under redb (`pages.rs`), and the white-box `Tree` the tests drive (`seam.rs`).

mod filter;
mod opening;
mod pages;
#[cfg(feature = "__whitebox")]
mod seam;
mod tables;
mod windows;

pub(crate) use filter::Probe;
#[cfg(feature = "__whitebox")]
pub(crate) use filter::{Filter, MIN_CAPACITY};
pub(crate) use opening::{open_windows, read_windows, store_id};
pub(crate) use pages::{check_header, PageFile};
#[cfg(feature = "__whitebox")]
pub use pages::{data_offset, logical_len, physical_len, BLOCK, GROUP, GROUP_BYTES};
#[cfg(feature = "__whitebox")]
pub(crate) use pages::{sum, work};
#[cfg(feature = "__whitebox")]
pub use seam::Tree;
pub(crate) use tables::{
    decode_record, new_salt, IndexEntries, Tables, CONVERTED_FORMAT, DEADLINES, FORMAT_VERSION,
    LEASE, META, META_CLOSED_CLEAN, META_FORMAT, META_LOG_START, META_NEXT_TOKEN, META_WAL_SEQ,
};
#[cfg(feature = "__whitebox")]
pub(crate) use windows::FilterSeed;
pub(crate) use windows::{span, Records, Windows};
