//! Integration tests: one binary, one module per area.

mod common;

#[cfg(feature = "actix")]
mod actix;
mod bad_input;
#[cfg(feature = "cli")]
mod cli;
mod complete_with;
mod concurrency;
mod damage;
#[cfg(feature = "etcd")]
mod etcd;
mod expire;
mod features;
#[cfg(feature = "grpc")]
mod grpc;
#[cfg(feature = "http")]
mod http;
#[cfg(feature = "http")]
mod http_kill;
#[cfg(feature = "http")]
mod http_knobs;
mod kill;
#[cfg(feature = "cli")]
mod live;
mod log_identity;
mod lost_log;
mod model;
mod scenarios;
mod seeds;
mod stress;
