//! What the crash, power-loss and fuzz harnesses share. Also compiled into each fuzz target of
//! `fuzz/` (`#[path]`), so these files name each other as `crate::support::...`.
//!
//! - [`sim`]: the simulated disk (written vs synced bytes, process-crash and power-loss images,
//!   injected failures), under both redb and the log through the storage seam
//!   (`Builder::open_with_storage`).
//! - [`model`]: the one reference model of a key's state, shared by the crash model and the
//!   `ops` fuzz target.
//! - [`fuzz`]: the entry points of the fuzz targets, and the test that replays their corpus.

pub mod fuzz;
pub mod model;
pub mod sim;
