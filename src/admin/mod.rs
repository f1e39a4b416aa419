//! The admin socket: a live view of a running service's store, for operators.
//!
//! One process owns a store file (redb holds it exclusively, and the newest acknowledged
//! records may still be only in the write-ahead log), so a second process can neither open
//! it nor read it whole from the files: redb refuses a read-only open of a file another
//! process holds, and reading the log without its owner races the owner's rewinds. So the
//! owner answers instead. Unless [`Builder::admin_socket`](crate::Builder::admin_socket) is
//! [`AdminSocket::Off`], the store serves a Unix socket next to its file ([`socket_path`]: the file's name with
//! `.admin` appended), and [`AdminClient`] (which the `idemstore` command-line tool uses when
//! the file is held) asks it for what [`Store::file_info`](crate::Store::file_info),
//! [`counts`](crate::Store::counts), [`get`](crate::Store::get) and
//! [`scan`](crate::Store::scan) answer, and, when allowed, to expire, resolve, sweep and
//! checkpoint.
//!
//! # What it sees
//! Every acknowledged operation: the answers come from the same calls a caller in the
//! service would make (the record overlay and cache for `get`, a snapshot taken after the
//! writer's open transaction is committed for the others).
//!
//! # What it costs the service
//! One background thread, `idemstore-admin`, serving one request at a time. It checks for a
//! connection every 25 ms while idle, and after each answer rests four times as long as the
//! answer took, so it uses at most a fifth of one core however fast clients ask.
//!
//! - `get` never waits for the writer.
//! - `stats` and `list` take the writer once, between two batches, for what the committer
//!   does by itself every 250 ms: a commit of its open redb transaction, in memory, no sync.
//!   That is the bound on how long a writer waits for an admin read. They then read a
//!   snapshot that blocks no one, though reading every record of a large store takes CPU
//!   time: asked nonstop, it costs the service the admin thread's share of the CPU
//!   (`examples/admin_load`; the figures are in BENCHMARKS.md, "What an admin socket costs
//!   the service").
//! - Writes through the socket (expire, resolve, sweep slices) queue with the service's own
//!   writes like any caller's; a checkpoint through it (the tool asks for one after a sweep)
//!   holds the writer as the service's own checkpoints do.
//! - A client that stalls is dropped after 5 seconds without an answer.
//!
//! # Access
//! The socket is private to the service's user: its file has mode 0600 from the first instant
//! it is at its path (it is bound in a private directory and linked into place), whatever the
//! process's umask and [`Builder::file_mode`](crate::Builder::file_mode), and each connection's
//! credentials (Linux's `SO_PEERCRED`) are checked: a connection from a process of another user
//! is refused, with a message naming both users, logged (a `warn` event, feature `tracing`) and
//! counted ([`refused_connections`]), even one that could reach the file past its mode. Root's
//! connections are served, as root reads the store's files anyway (`sudo idemstore stats
//! FILE`). On other Unix systems than Linux no credentials are checked, and the file's mode is
//! the guard. [`AdminSocket::ReadOnly`], the default, serves reads only;
//! [`AdminSocket::ReadWrite`] also expire, resolve, sweep and checkpoint;
//! [`AdminSocket::Off`] serves nothing.

mod client;
pub(crate) mod peer;
pub(crate) mod protocol;
mod server;

use std::path::{Path, PathBuf};

pub use client::AdminClient;
pub use peer::refused_connections;
pub(crate) use server::Server;

pub use crate::store::builder::AdminSocket;

/// The admin socket of the store at `store_path`: its name with `.admin` appended.
pub fn socket_path(store_path: &Path) -> PathBuf {
    let mut name = store_path.as_os_str().to_os_string();
    name.push(".admin");
    PathBuf::from(name)
}
