//! Integration tests: one binary, one module per area.

mod common;

mod bad_input;
mod complete_with;
mod concurrency;
mod features;
mod model;
mod seeds;
