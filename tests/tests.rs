//! Integration tests: one binary, one module per area.

mod common;
// What the crash, power-loss and fuzz harnesses share (the simulated disk, the reference
// model, the fuzz targets' entry points).
mod support;

mod across_time;
#[cfg(feature = "actix")]
mod actix;
mod admin;
mod bad_input;
mod batches;
mod cache;
mod checkpoint;
mod clean_close;
mod clock;
mod codec;
mod compact;
mod complete_with;
mod concurrency;
mod crash;
mod damage;
mod deadlines;
mod decide;
mod doc_snippets;
#[cfg(target_os = "linux")]
mod enospc;
mod errors;
#[cfg(feature = "etcd")]
mod etcd;
mod expiry;
mod features;
mod filters;
mod findings;
#[cfg(feature = "grpc")]
mod grpc;
#[cfg(feature = "http")]
mod guard;
#[cfg(feature = "http")]
mod http;
#[cfg(feature = "http")]
mod http_kill;
#[cfg(feature = "http")]
mod http_knobs;
mod inspect;
mod key;
mod kill;
mod linearizable;
mod log_identity;
mod log_size;
mod lost_log;
mod model;
mod model_backends;
mod no_pages;
mod open_errors;
#[cfg(feature = "postgres")]
mod postgres;
mod power;
#[cfg(target_os = "linux")]
mod private_files;
mod scenarios;
mod stale_reads;
mod stress;
mod tables;
mod windows;
