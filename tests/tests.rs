//! Integration tests: one binary, one module per area.

mod common;

mod bad_input;
#[cfg(feature = "cli")]
mod cli;
mod complete_with;
mod concurrency;
mod expire;
mod features;
mod http;
mod kill;
#[cfg(feature = "cli")]
mod live;
mod log_identity;
mod model;
mod seeds;
mod stress;
