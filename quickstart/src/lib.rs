//! Nothing but a home for the README's quickstart (`examples/quickstart.rs` here, run with
//! `cargo run --release --example quickstart` from the workspace root), kept apart from the
//! library so that a newcomer's first build compiles the library and nothing of its test
//! suites.
#![forbid(unsafe_code)]
