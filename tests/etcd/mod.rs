//! The etcd-backed store (feature `etcd`): each test starts its own 3-member cluster from the
//! `etcd` binary. The scenarios shared with the local store are in `scenarios.rs`.

mod ambiguous;
pub mod cluster;
mod fault;
mod store;
