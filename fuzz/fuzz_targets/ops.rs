//! Fuzz target `ops`: see `idemstore::testing::fuzz::ops` for the input format and the checks.
//!
//! Run from the repository root: `RUSTC_BOOTSTRAP=1 cargo fuzz run ops` (fuzz/README.md).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idemstore::testing::fuzz::ops(data));
