//! Test scaffolding, built only for the crate's own tests and for `cargo fuzz` (`cfg(fuzzing)`,
//! declared in `build.rs`); a normal build has no trace of it.
//!
//! - [`sim`]: the simulated disk (written vs synced bytes, process-crash and power-loss images,
//!   injected failures) under both redb and the log.
//! - `crash` (tests only): the crash model on the simulated disk.
//! - [`fuzz`]: the entry points of the fuzz targets in `fuzz/`, and the test that replays
//!   their corpus.
//! - `model`: the one reference model of a key's state, shared by the crash model and the
//!   `ops` fuzz target.
//! - `power` (tests only): the concurrent power-loss model; `findings` (tests only):
//!   reproductions of fixed findings; `seen` (tests only): a state read by a reserve going
//!   stale before the writer decides it.

#[cfg(test)]
mod crash;
#[cfg(test)]
mod findings;
pub mod fuzz;
mod model;
#[cfg(test)]
mod power;
#[cfg(test)]
mod seen;
pub(crate) mod sim;
