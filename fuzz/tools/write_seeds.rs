//! Writes the hand-made seed inputs of every fuzz target (`fuzz/corpus/<target>/seed-*`), the
//! base images of the `open` target (`fuzz/bases/`) and the known crashes, when the input
//! formats change. Run from the repository root:
//!
//! ```sh
//! cargo run --manifest-path fuzz/Cargo.toml --bin write_seeds
//! ```

// The harness shared with the crate's tests; this tool uses part of it.
#[allow(dead_code, unused_imports)]
#[path = "../../tests/support/mod.rs"]
mod support;

fn main() {
    let fuzz = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    support::fuzz::write_seeds(fuzz);
    println!("wrote the seeds under {}", fuzz.display());
}
