//! Declares `cfg(fuzzing)`, which `cargo fuzz` sets, so the compiler checks its spelling.
//! Under it the crate builds `fuzz_api`, the entry points of the fuzz targets in `fuzz/`.

fn main() {
    println!("cargo:rustc-check-cfg=cfg(fuzzing)");
}
