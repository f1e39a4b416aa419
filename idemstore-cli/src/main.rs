//! `idemstore`: look into and repair an idemstore file from the command line.
//!
//! ```text
//! idemstore init   keys.idem
//! idemstore stats  keys.idem
//! idemstore list   keys.idem --state stale --older-than 5m --key-prefix user-7/
//! idemstore get    keys.idem user-7 charge 4f0c-a1
//! idemstore resolve keys.idem user-7 charge 4f0c-a1 --complete response.bin
//! idemstore sweep  keys.idem
//! idemstore expire keys.idem user-7 charge 4f0c-a1 [--force]
//! idemstore check  keys.idem
//! idemstore export keys.idem > keys.jsonl
//! idemstore import copy.idem keys.jsonl
//! ```
//!
//! `stats`, `list`, `get`, `export` and `check` read a closed store without writing
//! ([`ReadOnlyStore`]: a store that was not closed cleanly is refused until `recover`); the
//! other commands open it like a service would ([`Store::open`]: one process owns a file, and
//! opening replays its log). When a running service holds the file and serves its admin
//! socket ([`idemstore::Builder::admin_socket`]), `stats`, `get`, `list`, `export`, and with a
//! read-write socket `expire`, `resolve` and `sweep`, ask the service instead and see its live
//! state; `check` always needs the store to itself. Keys print and parse as `keys.rs` says;
//! `export` and `import` are in `transfer.rs`. Tables by default, `--json`
//! for scripts. A closed output pipe ends the command quietly with status 0.
//!
//! With `--etcd ENDPOINTS --prefix P` (or `--etcd-config FILE`), `stats`, `list`, `get`,
//! `expire` and `resolve` work on a store on an etcd cluster instead (`cluster.rs`; a build
//! with the `etcd` feature): the reads at one etcd revision. With `--postgres CONFIG --table
//! T`, the same commands work on a store in a PostgreSQL table (`database.rs`; a build with
//! the `postgres` feature): the reads in one read-only transaction.

use std::fmt::Write as _;
use std::io::{self, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use idemstore::guard::StoredResponse;
use idemstore::{
    AdminClient, Error, Key, LiveLease, OpenError, ReadOnlyStore, Record, RecordClass, Resolution,
    ScanFilter, StateCounts, Status, StorageError, Store, Verification,
};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};

mod args;
mod cluster;
mod commands;
mod database;
mod keys;
#[cfg(any(feature = "etcd", feature = "postgres"))]
mod remote;
mod render;
mod transfer;
mod view;

use args::*;
use commands::*;
use keys::{part, show};
use render::*;
use view::View;

/// What a command reports when it succeeded but must exit 1 (`check` found problems).
struct ProblemsFound;

fn main() -> ExitCode {
    refuse_absent_features();
    let cli = Cli::parse(); // usage errors exit 2, --help and --version exit 0
    let json = cli.json;
    match run(cli) {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(ProblemsFound)) => ExitCode::FAILURE,
        Err(error) if is_broken_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            report(&error, json);
            ExitCode::FAILURE
        }
    }
}

/// `--etcd` or `--postgres` in a build without its feature: a usage error saying how to get
/// it, before clap asks for the store file those options replace (their help is hidden in
/// such a build).
fn refuse_absent_features() {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .take_while(|arg| arg != "--")
        .filter_map(|arg| arg.into_string().ok())
        .collect();
    let given = |flag: &str| {
        args.iter()
            .any(|arg| arg == flag || arg.starts_with(&format!("{flag}=")))
    };
    #[cfg(not(feature = "etcd"))]
    if given("--etcd") || given("--etcd-config") {
        cluster::unavailable()
    }
    #[cfg(not(feature = "postgres"))]
    if given("--postgres") {
        database::unavailable()
    }
    let _ = given;
}

fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    })
}

fn report(error: &anyhow::Error, json: bool) {
    // Opening the file fails with an `OpenError`, the store's operations with an `Error`.
    let already_open = matches!(
        error
            .downcast_ref::<OpenError>()
            .or_else(|| match error.downcast_ref::<Error>() {
                Some(Error::Open(open)) => Some(open),
                _ => None,
            }),
        Some(OpenError::AlreadyOpen { .. })
    );
    let hint = match error.downcast_ref::<Error>() {
        _ if already_open => Some(
            "stop the service that has the store open, then run this again (one process \
             owns a store file: the tool reads it only when no process has it open); or let \
             the service serve its admin socket (Builder::admin_socket: ReadOnly for stats, \
             get, list and export, ReadWrite also for expire, resolve and sweep), which this \
             tool then uses",
        ),
        Some(Error::LeaseLive { .. }) => {
            Some("add --force to take the key from its holder (its later complete fails)")
        }
        Some(Error::Storage(StorageError::Poisoned { .. })) => {
            Some("run the command again: reopening recovers")
        }
        _ if error.is::<UnderReview>() => Some(
            "settle it with `idemstore resolve ... --complete RESULT_FILE` (the work happened) \
             or `--release` (it did not); or add --force to delete it anyway",
        ),
        _ => None,
    };
    let mut stderr = io::stderr().lock();
    let _ = if json {
        let value = json!({ "error": format!("{error:#}"), "hint": hint });
        writeln!(stderr, "{value}")
    } else {
        writeln!(stderr, "idemstore: error: {error:#}").and_then(|()| match hint {
            Some(hint) => writeln!(stderr, "hint: {hint}"),
            None => Ok(()),
        })
    };
}
