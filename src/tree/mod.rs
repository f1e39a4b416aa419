//! The B-tree: what the store keeps in redb, described in `docs/format.md`. The tables and
//! their meta keys ([`tables`]), the expiry windows records live in and their filters
//! ([`windows`]), and the checksummed pages of the store file under redb ([`pages`]).

pub(crate) mod pages;
#[cfg(feature = "__whitebox")]
pub(crate) mod seam;
pub(crate) mod tables;
pub(crate) mod windows;
