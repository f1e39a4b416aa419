//! The PostgreSQL-backed store (feature `postgres`): each test starts its own throwaway server
//! from PostgreSQL's binaries. The scenarios shared with the other backends are in
//! `scenarios.rs`.

mod fault;
pub mod server;
mod store;
