//! `idemstore`: look into and repair an idemstore file from the command line.
//!
//! ```text
//! idemstore stats  keys.idem
//! idemstore list   keys.idem --state stale --older-than 5m
//! idemstore get    keys.idem user-7 charge 4f0c-a1
//! idemstore resolve keys.idem user-7 charge 4f0c-a1 --complete response.bin
//! idemstore sweep  keys.idem
//! idemstore expire keys.idem user-7 charge 4f0c-a1 [--force]
//! idemstore check  keys.idem
//! ```
//!
//! A command opens the store like a service would ([`Store::open`]: one process owns a file,
//! and opening replays its write-ahead log). When a running service holds the file and
//! serves its admin socket ([`idemstore::Builder::admin_socket`]), `stats`, `get`, `list`,
//! and with a read-write socket `expire`, `resolve` and `sweep`, ask the service instead and
//! see its live state; `check` always needs the store to itself. Tables by default, `--json`
//! for scripts. A closed output pipe ends the command quietly with status 0.

mod args;
mod commands;
mod render;
mod view;

use std::io::{self, Read, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Parser;
use idemstore::{AdminClient, Error, LiveLease, Resolution, ScanFilter, Store};
use serde_json::json;

use args::{Cli, Command};
use commands::{check, expire, get, list, resolve, stats, sweep};
use view::View;

/// What a command reports when it succeeded but must exit 1 (`check` found problems).
struct ProblemsFound;

fn main() -> ExitCode {
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

fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    })
}

fn report(error: &anyhow::Error, json: bool) {
    let hint = match error.downcast_ref::<Error>() {
        Some(Error::AlreadyOpen { .. }) => Some(
            "stop the service that has the store open, then run this again \
             (the tool opens the store itself to replay its log); or let the service serve \
             its admin socket (Builder::admin_socket: ReadOnly for stats, get and list, \
             ReadWrite also for expire, resolve and sweep), which this tool then uses",
        ),
        Some(Error::LeaseLive { .. }) => {
            Some("add --force to take the key from its holder (its later complete fails)")
        }
        Some(Error::Poisoned { .. }) => Some("run the command again: reopening recovers"),
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

fn run(cli: Cli) -> Result<Option<ProblemsFound>> {
    let mut out = io::stdout().lock();
    let json = cli.json;
    match cli.command {
        Command::Stats { file } => stats(&*open_view(&file)?, &mut out, json)?,
        Command::Get { key, raw } => {
            get(&*open_view(&key.file)?, &key.key()?, &mut out, json, raw)?
        }
        Command::List {
            file,
            state,
            older_than,
            limit,
        } => {
            let mut filter = state.map_or_else(ScanFilter::any, |s| ScanFilter::of(s.into()));
            if let Some(age) = older_than {
                filter = filter.older_than(age);
            }
            list(&*open_view(&file)?, &filter, limit, &mut out, json)?
        }
        Command::Resolve {
            key,
            action,
            retention,
        } => {
            let resolution = match action.complete {
                Some(path) => Resolution::Complete(read_result(&path)?),
                None => Resolution::Release,
            };
            let store = open_view(&key.file)?;
            resolve(&*store, &key.key()?, resolution, retention, &mut out, json)?
        }
        Command::Expire { key, force } => {
            let live = if force {
                LiveLease::Take
            } else {
                LiveLease::Refuse
            };
            expire(&*open_view(&key.file)?, &key.key()?, live, &mut out, json)?
        }
        Command::Sweep { file, limit, slice } => {
            if slice == 0 {
                bail!("--slice must be at least 1");
            }
            sweep(&*open_view(&file)?, limit, slice, &mut out, json)?
        }
        Command::Check { file } => {
            let report = open(&file)?.verify()?;
            check(&report, &mut out, json)?;
            if !report.is_ok() {
                return Ok(Some(ProblemsFound));
            }
        }
    }
    out.flush()?;
    Ok(None)
}

/// The store at `path` as the commands see it: the live store of the service that serves its
/// admin socket, else the store opened by this tool.
fn open_view(path: &Path) -> Result<Box<dyn View>> {
    if std::fs::symlink_metadata(idemstore::admin::socket_path(path)).is_ok() {
        // A socket left by a service that died refuses the connection: open the file then.
        if let Ok(client) = AdminClient::connect(path) {
            return Ok(Box::new(client));
        }
    }
    Ok(Box::new(open(path)?))
}

/// Opens an existing store; never creates one (a typo must not leave a new empty store).
fn open(path: &Path) -> Result<Store> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            bail!(
                "{} does not exist (this tool never creates a store)",
                path.display()
            )
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        Ok(_) => {}
    }
    Ok(Store::open(path)?)
}

fn read_result(path: &Path) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    if path == Path::new("-") {
        io::stdin()
            .read_to_end(&mut bytes)
            .context("reading the result from stdin")?;
    } else {
        bytes = std::fs::read(path)
            .with_context(|| format!("reading the result from {}", path.display()))?;
    }
    Ok(bytes)
}
