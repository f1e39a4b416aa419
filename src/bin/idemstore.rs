//! `idemstore`: look into and repair an idemstore file from the command line.
//!
//! ```text
//! idemstore stats  keys.idem
//! idemstore list   keys.idem --state stale --older-than 5m
//! idemstore get    keys.idem user-7 charge 4f0c-a1
//! idemstore resolve keys.idem user-7 charge 4f0c-a1 --complete response.bin
//! idemstore sweep  keys.idem
//! idemstore check  keys.idem
//! ```
//!
//! Every command opens the store like a service would ([`Store::open`]: one process owns a
//! file, and opening replays its write-ahead log), so it runs while no service has the store
//! open. Tables by default, `--json` for scripts. A closed output pipe ends the command
//! quietly with status 0.

use std::fmt::Write as _;
use std::io::{self, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use idemstore::{
    Error, Key, Record, RecordClass, Resolution, ScanFilter, Status, Store, Verification,
};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};

const EXIT_STATUS: &str = "\
Exit status:
  0  success; also when the reader of the output goes away early (a closed pipe)
  1  error: the store cannot be opened (a service has it open, it is not a store, it is
     damaged), the key is not stored, the resolve was refused, or `check` found problems
  2  usage error: unknown command, missing or bad arguments

Every command opens the store as a service does: one process owns a store file, so stop the
service first. Opening replays the store's write-ahead log (FILE.wal) into the file.";

#[derive(Parser)]
#[command(
    name = "idemstore",
    version,
    about = "Inspect and repair an idemstore idempotency-key store",
    after_help = EXIT_STATUS
)]
struct Cli {
    /// Print JSON instead of tables (errors too, on stderr)
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Records by state, the oldest reservation, file and log sizes, the log position
    Stats {
        /// The store file
        file: PathBuf,
    },
    /// One record: its state, attempt, token, times and stored result
    Get {
        #[command(flatten)]
        key: KeyArgs,
        /// Write only the stored result's bytes to stdout, exactly as stored
        #[arg(long, conflicts_with = "json")]
        raw: bool,
    },
    /// Records in one state, oldest first for reservations and expired records
    List {
        /// The store file
        file: PathBuf,
        /// Only records in this state (default: every state)
        #[arg(long, value_enum)]
        state: Option<StateArg>,
        /// Only records that entered their state at least this long ago, e.g. 30s, 5m, 2h, 1d
        /// (for stale: stale for at least this long)
        #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION")]
        older_than: Option<Duration>,
        /// Show at most this many records
        #[arg(long, default_value_t = 100, value_name = "N")]
        limit: usize,
    },
    /// Settle a stale reservation or a key marked for review
    Resolve {
        #[command(flatten)]
        key: KeyArgs,
        #[command(flatten)]
        action: ResolveAction,
        /// How long the stored result is replayed (with --complete)
        #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION",
              default_value = "24h", requires = "complete")]
        retention: Duration,
    },
    /// Delete expired records, in slices, with a progress bar on a terminal
    Sweep {
        /// The store file
        file: PathBuf,
        /// Delete at most this many records (default: every expired record)
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Records deleted per write transaction
        #[arg(long, default_value_t = 1000, value_name = "N")]
        slice: usize,
    },
    /// Verify every record's checksum, every key, and both indexes, with a progress bar on a
    /// terminal; exit 1 on any problem
    Check {
        /// The store file
        file: PathBuf,
    },
}

#[derive(Args)]
struct KeyArgs {
    /// The store file
    file: PathBuf,
    /// Who the key belongs to (user, tenant)
    scope: String,
    /// What it guards (route, command)
    operation: String,
    /// The client's idempotency key
    id: String,
}

impl KeyArgs {
    fn key(&self) -> Result<Key> {
        Key::new(&self.scope, &self.operation, &self.id).context("bad key")
    }
}

#[derive(Args)]
#[group(required = true, multiple = false)]
struct ResolveAction {
    /// Store the bytes of this file ("-" for stdin) as the key's result: the work happened
    #[arg(long, value_name = "RESULT_FILE")]
    complete: Option<PathBuf>,
    /// Delete the key, so the next request does the work afresh: the work did not happen
    #[arg(long)]
    release: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum StateArg {
    Pending,
    Stale,
    NeedsReview,
    Completed,
    Expired,
}

impl From<StateArg> for RecordClass {
    fn from(state: StateArg) -> RecordClass {
        match state {
            StateArg::Pending => RecordClass::Pending,
            StateArg::Stale => RecordClass::Stale,
            StateArg::NeedsReview => RecordClass::NeedsReview,
            StateArg::Completed => RecordClass::Completed,
            StateArg::Expired => RecordClass::Expired,
        }
    }
}

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
             (the tool opens the store itself to replay its log)",
        ),
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
        Command::Stats { file } => stats(&open(&file, None)?, &mut out, json)?,
        Command::Get { key, raw } => {
            get(&open(&key.file, None)?, &key.key()?, &mut out, json, raw)?
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
            list(&open(&file, None)?, &filter, limit, &mut out, json)?
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
            let store = open(&key.file, Some(retention))?;
            resolve(&store, &key.key()?, resolution, &mut out, json)?
        }
        Command::Sweep { file, limit, slice } => {
            if slice == 0 {
                bail!("--slice must be at least 1");
            }
            sweep(&open(&file, None)?, limit, slice, &mut out, json)?
        }
        Command::Check { file } => {
            let store = open(&file, None)?;
            let bar = progress_bar(
                "checking {bar:40} {pos}/{len} entries ({percent}%), eta {eta}",
                json,
            );
            let report = store.verify_with_progress(|checked, total| {
                bar.set_length(total);
                bar.set_position(checked);
            })?;
            bar.finish_and_clear();
            check(&report, &mut out, json)?;
            if !report.is_ok() {
                return Ok(Some(ProblemsFound));
            }
        }
    }
    out.flush()?;
    Ok(None)
}

/// Opens an existing store; never creates one (a typo must not leave a new empty store).
fn open(path: &Path, retention: Option<Duration>) -> Result<Store> {
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
    let mut builder = Store::builder();
    if let Some(retention) = retention {
        builder.retention(retention);
    }
    Ok(builder.open(path)?)
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

fn stats(store: &Store, out: &mut impl Write, json: bool) -> Result<()> {
    let info = store.file_info()?;
    let counts = store.counts()?;
    let now = SystemTime::now();
    if json {
        let oldest = counts
            .oldest_pending
            .as_ref()
            .map(|(key, record)| record_json(store, key, record, now, false));
        let value = json!({
            "path": info.path,
            "file_bytes": info.file_bytes,
            "log_path": info.log_path,
            "log_bytes": info.log_bytes,
            "wal_seq": info.wal_seq,
            "next_token": info.next_token,
            "counts": {
                "pending": counts.pending,
                "stale": counts.stale,
                "needs_review": counts.needs_review,
                "completed": counts.completed,
                "expired": counts.expired,
                "damaged": counts.damaged,
                "total": counts.total(),
            },
            "oldest_pending": oldest,
        });
        writeln!(out, "{value:#}")?;
        return Ok(());
    }
    let rows = vec![
        row([
            "store file",
            &info.path.display().to_string(),
            &bytes(info.file_bytes),
        ]),
        row([
            "log file",
            &info.log_path.display().to_string(),
            &bytes(info.log_bytes),
        ]),
        row([
            "log position",
            &format!("seq {}", info.wal_seq),
            "meta wal_seq",
        ]),
        row(["next token", &info.next_token.to_string(), ""]),
    ];
    table(out, &[], &rows)?;
    writeln!(out)?;
    let mut rows = vec![
        row(["pending (live lease)", &counts.pending.to_string()]),
        row(["stale (lease ran out)", &counts.stale.to_string()]),
        row(["needs-review", &counts.needs_review.to_string()]),
        row(["completed", &counts.completed.to_string()]),
        row(["expired, not yet swept", &counts.expired.to_string()]),
    ];
    if counts.damaged > 0 {
        rows.push(row([
            "damaged (run `idemstore check`)",
            &counts.damaged.to_string(),
        ]));
    }
    rows.push(row(["total", &counts.total().to_string()]));
    table(out, &["STATE", "RECORDS"], &rows)?;
    writeln!(out)?;
    match &counts.oldest_pending {
        None => writeln!(out, "oldest pending: none")?,
        Some((key, record)) => writeln!(
            out,
            "oldest pending: {} ({}, attempt {}, token {})",
            key,
            when(store, record, now),
            record.attempt(),
            record.token()
        )?,
    }
    Ok(())
}

fn get(store: &Store, key: &Key, out: &mut impl Write, json: bool, raw: bool) -> Result<()> {
    let Some(record) = store.get(key)? else {
        bail!("no record for key {key}: never reserved, released, or expired");
    };
    if raw {
        let Status::Completed { result, .. } = record.status() else {
            bail!(
                "key {key} is {} and has no stored result",
                store.class_of(&record)
            );
        };
        out.write_all(result)?;
        return Ok(());
    }
    let now = SystemTime::now();
    if json {
        let value = record_json(store, key, &record, now, true);
        writeln!(out, "{value:#}")?;
        return Ok(());
    }
    let class = store.class_of(&record);
    let mut rows = vec![
        row(["scope", &part(key.scope())]),
        row(["operation", &part(key.operation())]),
        row(["id", &part(key.id())]),
        row(["state", &format!("{class} ({})", when(store, &record, now))]),
        row(["attempt", &record.attempt().to_string()]),
        row(["token", &record.token().to_string()]),
        row(["fingerprint", &hex(record.fingerprint().as_bytes())]),
        row([
            "expires",
            &record
                .expires_at()
                .map_or("never (under review)".into(), |t| at(t, now)),
        ]),
    ];
    match record.status() {
        Status::Pending {
            lease_until,
            progress,
        } => {
            rows.push(row(["lease until", &at(lease_until, now)]));
            if let Some(progress) = progress {
                rows.push(row([
                    "recovery point",
                    &format!("step {}: {}", progress.step, preview(&progress.data, 200)),
                ]));
            }
        }
        Status::Completed {
            result,
            completed_at,
        } => {
            rows.push(row(["completed", &at(completed_at, now)]));
            rows.push(row([
                "result",
                &format!("{} bytes: {}", result.len(), preview(result, 200)),
            ]));
        }
        Status::NeedsReview { note, since } => {
            rows.push(row(["marked", &at(since, now)]));
            rows.push(row(["note", note]));
        }
        _ => {}
    }
    table(out, &[], &rows)?;
    Ok(())
}

fn list(
    store: &Store,
    filter: &ScanFilter,
    limit: usize,
    out: &mut impl Write,
    json: bool,
) -> Result<()> {
    let mut found = store.scan(filter, limit.saturating_add(1))?;
    let truncated = found.len() > limit;
    found.truncate(limit);
    let now = SystemTime::now();
    if json {
        let records: Vec<Value> = found
            .iter()
            .map(|(key, record)| record_json(store, key, record, now, false))
            .collect();
        let value = json!({ "records": records, "truncated": truncated });
        writeln!(out, "{value:#}")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = found
        .iter()
        .map(|(key, record)| {
            let detail = match record.status() {
                Status::Completed { result, .. } => {
                    format!("result {}", bytes(result.len() as u64))
                }
                Status::NeedsReview { note, .. } => preview(note.as_bytes(), 60),
                _ => String::new(),
            };
            vec![
                part(key.scope()),
                part(key.operation()),
                part(key.id()),
                store.class_of(record).to_string(),
                record.attempt().to_string(),
                record.token().to_string(),
                when(store, record, now),
                detail,
            ]
        })
        .collect();
    if rows.is_empty() {
        writeln!(out, "no records")?;
    } else {
        let headers = [
            "SCOPE",
            "OPERATION",
            "ID",
            "STATE",
            "ATTEMPT",
            "TOKEN",
            "WHEN",
            "DETAIL",
        ];
        table(out, &headers, &rows)?;
    }
    if truncated {
        out.flush()?;
        eprintln!("(first {limit} shown; raise --limit for more)");
    }
    Ok(())
}

fn resolve(
    store: &Store,
    key: &Key,
    resolution: Resolution,
    out: &mut impl Write,
    json: bool,
) -> Result<()> {
    let before = store.get(key)?.map(|record| store.class_of(&record));
    let (action, result_len) = match &resolution {
        Resolution::Complete(result) => ("complete", Some(result.len())),
        _ => ("release", None),
    };
    store.resolve(key, resolution)?;
    if json {
        let value = json!({
            "resolved": true,
            "scope": part(key.scope()),
            "operation": part(key.operation()),
            "id": part(key.id()),
            "was": before.map(|c| c.name()),
            "action": action,
            "result_len": result_len,
        });
        writeln!(out, "{value:#}")?;
    } else {
        let was = before.map_or("?", |c| c.name());
        match result_len {
            Some(len) => writeln!(
                out,
                "resolved {key} (was {was}): completed with a {len}-byte result; duplicates now get it"
            )?,
            None => writeln!(
                out,
                "resolved {key} (was {was}): released; the next request does the work afresh"
            )?,
        }
    }
    Ok(())
}

fn sweep(
    store: &Store,
    limit: Option<usize>,
    slice: usize,
    out: &mut impl Write,
    json: bool,
) -> Result<()> {
    let expired = store.counts()?.expired;
    let target = limit.map_or(expired, |l| expired.min(l as u64));
    let bar = progress_bar(
        "sweeping {bar:40} {pos}/{len} expired records ({percent}%), eta {eta}",
        json,
    );
    bar.set_length(target);
    let started = Instant::now();
    let (mut swept, mut slices) = (0u64, 0u64);
    loop {
        let left = limit.map_or(usize::MAX, |l| l.saturating_sub(swept as usize));
        if left == 0 {
            break;
        }
        let deleted = store.sweep(slice.min(left))?;
        if deleted == 0 {
            break;
        }
        slices += 1;
        swept += deleted as u64;
        bar.inc(deleted as u64);
    }
    // A sweep's deletions are not logged; a checkpoint makes them durable before exiting.
    store.checkpoint()?;
    bar.finish_and_clear();
    let remaining = store.counts()?.expired;
    let secs = started.elapsed().as_secs_f64();
    if json {
        let value = json!({
            "swept": swept,
            "slices": slices,
            "seconds": secs,
            "remaining_expired": remaining,
        });
        writeln!(out, "{value:#}")?;
    } else {
        writeln!(
            out,
            "swept {} in {} ({secs:.2} s); {} remain",
            plural(swept, "expired record"),
            plural(slices, "slice"),
            plural(remaining, "expired record"),
        )?;
    }
    Ok(())
}

/// A progress bar on stderr for a command that walks the whole store, drawn only for a person
/// watching: hidden with `--json` or when stdout or stderr is not a terminal (a script, a pipe,
/// a log file).
fn progress_bar(template: &str, json: bool) -> ProgressBar {
    if json || !io::stdout().is_terminal() || !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    bar.set_style(ProgressStyle::with_template(template).expect("a valid template"));
    bar
}

fn check(report: &Verification, out: &mut impl Write, json: bool) -> Result<()> {
    if json {
        let problems: Vec<Value> = report
            .problems
            .iter()
            .map(|p| {
                json!({
                    "kind": p.kind.name(),
                    "scope": p.key.as_ref().map(|k| part(k.scope())),
                    "operation": p.key.as_ref().map(|k| part(k.operation())),
                    "id": p.key.as_ref().map(|k| part(k.id())),
                    "raw_key_hex": hex(&p.raw_key),
                    "detail": p.detail,
                })
            })
            .collect();
        let value = json!({
            "ok": report.is_ok(),
            "records": report.records,
            "expiry_entries": report.expiry_entries,
            "lease_entries": report.lease_entries,
            "problems": problems,
        });
        writeln!(out, "{value:#}")?;
        return Ok(());
    }
    writeln!(
        out,
        "checked {} records, {} expiry index entries, {} lease index entries",
        report.records, report.expiry_entries, report.lease_entries
    )?;
    if report.is_ok() {
        writeln!(out, "ok: no problems found")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = report
        .problems
        .iter()
        .map(|p| vec![p.kind.to_string(), p.to_string()])
        .collect();
    table(out, &["PROBLEM", "WHERE AND WHAT"], &rows)?;
    writeln!(
        out,
        "{} found",
        plural(report.problems.len() as u64, "problem")
    )?;
    Ok(())
}

/// A record for `--json`: key parts, state, numbers, times (RFC 3339, UTC) and, with
/// `with_result`, the stored result (as text when it is UTF-8, else as hex).
fn record_json(
    store: &Store,
    key: &Key,
    record: &Record,
    now: SystemTime,
    with_result: bool,
) -> Value {
    let mut value = json!({
        "scope": part(key.scope()),
        "operation": part(key.operation()),
        "id": part(key.id()),
        "state": store.class_of(record).name(),
        "attempt": record.attempt(),
        "token": record.token(),
        "fingerprint": hex(record.fingerprint().as_bytes()),
        "expires_at": record.expires_at().map(rfc3339),
    });
    let fields = value.as_object_mut().expect("an object");
    match record.status() {
        Status::Pending {
            lease_until,
            progress,
        } => {
            fields.insert("lease_until".into(), rfc3339(lease_until).into());
            if let Some(progress) = progress {
                fields.insert("recovery_step".into(), progress.step.into());
                fields.insert(
                    "recovery_data".into(),
                    String::from_utf8_lossy(&progress.data).into_owned().into(),
                );
            }
            match now.duration_since(lease_until) {
                Ok(stale_for) => fields.insert("stale_for_ms".into(), millis(stale_for).into()),
                Err(left) => fields.insert("lease_left_ms".into(), millis(left.duration()).into()),
            };
        }
        Status::Completed {
            result,
            completed_at,
        } => {
            fields.insert("completed_at".into(), rfc3339(completed_at).into());
            fields.insert("result_len".into(), result.len().into());
            if with_result {
                match std::str::from_utf8(result) {
                    Ok(text) => fields.insert("result".into(), text.into()),
                    Err(_) => fields.insert("result_hex".into(), hex(result).into()),
                };
            }
        }
        Status::NeedsReview { note, since } => {
            fields.insert("marked_at".into(), rfc3339(since).into());
            fields.insert("note".into(), note.into());
        }
        _ => {}
    }
    value
}

/// How a record stands in time, for humans: "lease ends in 40s", "stale for 4m12s", ...
fn when(store: &Store, record: &Record, now: SystemTime) -> String {
    let class = store.class_of(record);
    match (class, record.status()) {
        (RecordClass::Expired, _) => match record.expires_at() {
            Some(t) => format!("expired {} ago", short(since(now, t))),
            None => "expired".into(),
        },
        (RecordClass::Stale, Status::Pending { lease_until, .. }) => {
            format!("stale for {}", short(since(now, lease_until)))
        }
        (_, Status::Pending { lease_until, .. }) => {
            format!("lease ends in {}", short(since(lease_until, now)))
        }
        (_, Status::Completed { completed_at, .. }) => {
            format!("completed {} ago", short(since(now, completed_at)))
        }
        (_, Status::NeedsReview { since: marked, .. }) => {
            format!("marked {} ago", short(since(now, marked)))
        }
        _ => class.to_string(),
    }
}

/// `later - earlier`, or zero.
fn since(later: SystemTime, earlier: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or_default()
}

/// A time with its distance from now: `2026-11-29T12:00:00Z (3m12s ago)`.
fn at(time: SystemTime, now: SystemTime) -> String {
    let distance = match now.duration_since(time) {
        Ok(ago) => format!("{} ago", short(ago)),
        Err(ahead) => format!("in {}", short(ahead.duration())),
    };
    format!("{} ({distance})", humantime::format_rfc3339_seconds(time))
}

fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A duration in its two largest units: `350ms`, `42s`, `4m12s`, `2h05m`, `3d04h`.
fn short(duration: Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        0 => format!("{}ms", duration.as_millis()),
        1..60 => format!("{secs}s"),
        60..3_600 => format!("{}m{:02}s", secs / 60, secs % 60),
        3_600..86_400 => format!("{}h{:02}m", secs / 3_600, secs / 60 % 60),
        _ => format!("{}d{:02}h", secs / 86_400, secs / 3_600 % 24),
    }
}

/// A byte count for humans: `512 B`, `64.0 KiB`, `1.5 MiB`.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A key part as text: itself when it is UTF-8, else with bytes escaped (`\xff`).
fn part(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_string(),
        Err(_) => bytes.escape_ascii().to_string(),
    }
}

/// Stored bytes for a one-line preview: text with control characters escaped, cut at `max`
/// characters.
fn preview(bytes: &[u8], max: usize) -> String {
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text
            .chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect::<String>(),
        Err(_) => bytes.escape_ascii().to_string(),
    };
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// `1 slice`, `2 slices`.
fn plural(n: u64, noun: &str) -> String {
    match n {
        1 => format!("1 {noun}"),
        _ => format!("{n} {noun}s"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

/// Prints aligned columns (headers first, when given); the last column is not padded.
fn table(out: &mut impl Write, headers: &[&str], rows: &[Vec<String>]) -> io::Result<()> {
    let columns = rows
        .iter()
        .map(Vec::len)
        .chain([headers.len()])
        .max()
        .unwrap_or(0);
    let mut widths = vec![0; columns];
    let header_row: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for cells in std::iter::once(&header_row).chain(rows.iter()) {
        for (i, cell) in cells.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let print = |out: &mut dyn Write, cells: &[String]| -> io::Result<()> {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                line.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad + 2));
            }
        }
        writeln!(out, "{}", line.trim_end())
    };
    if !headers.is_empty() {
        print(out, &header_row)?;
    }
    for cells in rows.iter() {
        print(out, cells)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_show_their_two_largest_units() {
        let cases = [
            (Duration::from_millis(350), "350ms"),
            (Duration::from_secs(42), "42s"),
            (Duration::from_secs(4 * 60 + 12), "4m12s"),
            (Duration::from_secs(2 * 3600 + 5 * 60 + 59), "2h05m"),
            (Duration::from_secs(3 * 86_400 + 4 * 3600), "3d04h"),
        ];
        for (duration, text) in cases {
            assert_eq!(short(duration), text);
        }
    }

    #[test]
    fn sizes_previews_and_parts_are_readable() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(64 * 1024), "64.0 KiB");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
        assert_eq!(preview(b"201 {\"a\":1}\n", 100), "201 {\"a\":1}\\n");
        assert_eq!(preview("ありがとう".as_bytes(), 3), "ありが…");
        assert_eq!(preview(b"\xff\x00ok", 10), "\\xff\\x00ok");
        assert_eq!(part("利用者-1".as_bytes()), "利用者-1");
        assert_eq!(part(b"a\xffb"), "a\\xffb");
        assert_eq!(plural(1, "slice"), "1 slice");
        assert_eq!(plural(0, "slice"), "0 slices");
    }
}
