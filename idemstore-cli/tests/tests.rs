//! The `idemstore` command-line tool, run as a user would against store files made by the
//! library: one binary, one module per area, sharing the library suite's helpers.

#[path = "../../tests/common/mod.rs"]
#[allow(
    dead_code,
    reason = "the library suite's helpers; this suite uses a few of them"
)]
mod common;

mod cli;
mod live;
mod run;

// A 3-member etcd cluster on loopback ports, the library suite's harness.
#[cfg(feature = "etcd")]
#[path = "../../tests/etcd/cluster.rs"]
#[allow(
    dead_code,
    reason = "the library suite's harness; the CLI's tests neither restart members nor ask for the leader"
)]
mod cluster;
#[cfg(feature = "etcd")]
mod etcd_cli;

// A throwaway PostgreSQL server, the library suite's harness.
#[cfg(feature = "postgres")]
mod pg_cli;
#[cfg(feature = "postgres")]
#[path = "../../tests/postgres/server.rs"]
#[allow(
    dead_code,
    reason = "the library suite's harness; the CLI's tests do not kill the server"
)]
mod server;
