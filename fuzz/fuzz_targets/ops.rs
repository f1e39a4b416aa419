//! Fuzz target `ops`: see `tests/support/fuzz/ops.rs` for the input format and the checks.
//!
//! Run from the repository root: `RUSTC_BOOTSTRAP=1 cargo fuzz run ops` (fuzz/README.md).

#![no_main]

// The harness shared with the crate's tests (the simulated disk, the reference model, the
// entry points); each target uses part of it.
#[allow(dead_code, unused_imports)]
#[path = "../../tests/support/mod.rs"]
mod support;

libfuzzer_sys::fuzz_target!(|data: &[u8]| support::fuzz::ops(data));
