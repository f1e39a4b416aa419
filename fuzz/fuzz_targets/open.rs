//! Fuzz target `open`: see `idemstore::testing::fuzz::open` for the input format and the checks.
//!
//! Run from the repository root: `RUSTC_BOOTSTRAP=1 cargo fuzz run open` (fuzz/README.md).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idemstore::testing::fuzz::open(data));
