//! The commands: each opens the store (or asks the running service that holds it, see
//! `view.rs`), does its work and prints a table or JSON.

use super::*;

pub(crate) fn run(cli: Cli) -> Result<Option<ProblemsFound>> {
    if cli.etcd.is_some() || cli.etcd_config.is_some() {
        return cluster::run(cli).map(|()| None);
    }
    if cli.postgres.is_some() {
        return database::run(cli).map(|()| None);
    }
    if cli.table.is_some() {
        usage_error("--table names a store's table in PostgreSQL: give --postgres too");
    }
    if cli.prefix.is_some() {
        usage_error("--prefix names a store on an etcd cluster: give --etcd or --etcd-config too");
    }
    let mut out = io::stdout().lock();
    let json = cli.json;
    match cli.command {
        Command::Stats { file, leases } => {
            let store = open_reader(&given(file)?, leases.leases_survive_restart)?;
            stats(&*store, &mut out, json)?
        }
        Command::Get { key, leases, raw } => {
            let (file, key) = key.local()?;
            let store = open_reader(&file, leases.leases_survive_restart)?;
            get(&*store, &key, &mut out, json, raw)?
        }
        Command::List {
            file,
            leases,
            state,
            older_than,
            key_prefix,
            limit,
        } => {
            let filter = scan_filter(state, older_than);
            list(
                &*open_reader(&given(file)?, leases.leases_survive_restart)?,
                &filter,
                key_prefix.as_deref(),
                limit,
                &mut out,
                json,
            )?
        }
        Command::Init {
            file,
            retention,
            mode,
        } => transfer::init(&file, retention, mode, &mut out, json)?,
        Command::Export { file, key_prefix } => {
            let store = open_reader(&file, false)?;
            transfer::export(&*store, key_prefix.as_deref(), &mut out)?
        }
        Command::Import { file, input } => {
            must_exist(&file)?;
            transfer::import(&file, input.as_deref(), &mut out, json)?
        }
        Command::Resolve {
            key,
            leases,
            action,
            retention,
        } => {
            let resolution = match action.complete {
                Some(path) => Resolution::Complete(read_result(&path)?),
                None => Resolution::Release,
            };
            let (file, key) = key.local()?;
            let store = open_view(&file, leases.leases_survive_restart)?;
            resolve(&*store, &key, resolution, retention, &mut out, json)?
        }
        Command::Expire { key, leases, force } => {
            let live = if force {
                LiveLease::Take
            } else {
                LiveLease::Refuse
            };
            let (file, key) = key.local()?;
            let store = open_view(&file, leases.leases_survive_restart)?;
            expire(&*store, &key, live, &mut out, json)?
        }
        Command::Sweep { file, limit, slice } => {
            let slice = usize::try_from(slice).unwrap_or(usize::MAX);
            sweep(&*open_view(&file, false)?, limit, slice, &mut out, json)?
        }
        Command::Check { file } => {
            let store = open_read_only(&file, false)?;
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
        Command::Recover { file, accept_loss } => {
            let mut builder = Store::builder();
            builder
                .sweep_interval(None)
                .preallocate_log(false)
                .accept_log_loss(accept_loss);
            must_exist(&file)?;
            drop(builder.open(&file)?);
            if json {
                writeln!(out, "{:#}", json!({ "path": file, "closed_cleanly": true }))?;
            } else {
                writeln!(out, "{}: opened and closed cleanly", file.display())?;
            }
        }
        Command::Compact { file } => {
            must_exist(&file)?;
            let (before, after) = idemstore::compact(&file)?;
            if json {
                writeln!(
                    out,
                    "{:#}",
                    json!({ "path": file, "bytes_before": before, "bytes_after": after })
                )?;
            } else {
                writeln!(
                    out,
                    "{}: {before} bytes before, {after} after",
                    file.display()
                )?;
            }
        }
    }
    out.flush()?;
    Ok(None)
}

/// The store file, which must be given when no cluster is named; a usage error exits 2.
fn given(file: Option<PathBuf>) -> Result<PathBuf> {
    Ok(file.unwrap_or_else(|| usage_error("give the store file (or --etcd ENDPOINTS)")))
}

/// Reports a usage error as clap does (with the usage line) and exits with status 2.
pub(crate) fn usage_error(message: impl std::fmt::Display) -> ! {
    use clap::CommandFactory;
    Cli::command()
        .error(clap::error::ErrorKind::ArgumentConflict, message)
        .exit()
}

/// Refuses a path that does not exist (only `init` creates a store: a typo must not leave a
/// new empty store).
pub(crate) fn must_exist(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => bail!(
            "{} does not exist (only `idemstore init` creates a store)",
            path.display()
        ),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        Ok(_) => Ok(()),
    }
}

/// The filter of `list --state S --older-than D`, for a file and for a cluster.
pub(crate) fn scan_filter(state: Option<StateArg>, older_than: Option<Duration>) -> ScanFilter {
    let filter = state.map_or_else(ScanFilter::any, |s| ScanFilter::of(s.into()));
    match older_than {
        Some(age) => filter.older_than(age),
        None => filter,
    }
}

/// The store at `path` for the commands that only read it: the live store of the service that
/// serves its admin socket, else the closed store read by this tool without writing (with
/// `keep`, leases granted before it closed last their time, as in a service with
/// `Builder::leases_survive_restart`).
pub(crate) fn open_reader(path: &Path, keep: bool) -> Result<Box<dyn View>> {
    if let Some(client) = live(path) {
        return Ok(Box::new(client));
    }
    Ok(Box::new(open_read_only(path, keep)?))
}

/// The running service's admin socket for the store at `path`, if one answers.
fn live(path: &Path) -> Option<AdminClient> {
    // A socket left by a service that died refuses the connection: read the file then.
    std::fs::symlink_metadata(idemstore::admin::socket_path(path)).ok()?;
    AdminClient::connect(path).ok()
}

/// Opens a closed store for reading without writing a byte of its files (`ReadOnlyStore`);
/// one that was not closed cleanly is refused with how to recover it.
pub(crate) fn open_read_only(path: &Path, keep: bool) -> Result<ReadOnlyStore> {
    must_exist(path)?;
    let mut builder = Store::builder();
    builder.leases_survive_restart(keep);
    Ok(builder.open_read_only(path)?)
}

/// The store at `path` for the commands that change it: as [`open_reader`], but opened
/// writable by this tool when no service serves it.
pub(crate) fn open_view(path: &Path, keep: bool) -> Result<Box<dyn View>> {
    if let Some(client) = live(path) {
        return Ok(Box::new(client));
    }
    Ok(Box::new(open(path, keep)?))
}

/// Opens an existing store; never creates one (a typo must not leave a new empty store).
/// `keep`: leases granted before this open last their time.
pub(crate) fn open(path: &Path, keep: bool) -> Result<Store> {
    must_exist(path)?;
    // The tool reports and sweeps by itself (`sweep` shows its progress): no background
    // sweeper changing counts under it, and no growing an existing store's log to its
    // preallocated size just to inspect it.
    let mut builder = Store::builder();
    builder
        .sweep_interval(None)
        .preallocate_log(false)
        .leases_survive_restart(keep)
        // The tool holds the file only while it runs: nobody to serve.
        .admin_socket(idemstore::AdminSocket::Off);
    Ok(builder.open(path)?)
}

pub(crate) fn read_result(path: &Path) -> Result<Vec<u8>> {
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

pub(crate) fn stats(store: &dyn View, out: &mut impl Write, json: bool) -> Result<()> {
    let info = store.file_info()?;
    let counts = store.counts()?;
    let now = SystemTime::now();
    if json {
        let value = json!({
            "path": info.path,
            "file_bytes": info.file_bytes,
            "log_path": info.log_path,
            "log_bytes": info.log_bytes,
            "wal_seq": info.wal_seq,
            "next_token": info.next_token,
            "log_since_checkpoint": info.log_since_checkpoint,
            "checkpoint_room": info.checkpoint_room,
            "counts": counts_json(&counts),
            "oldest_pending": oldest_json(store, &counts, now),
            "live_socket": store.socket(),
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
        row([
            "next checkpoint",
            &format!("{} of log to write", bytes(info.log_since_checkpoint)),
            &format!("needs up to {} free", bytes(info.checkpoint_room)),
        ]),
        match store.socket() {
            Some(socket) => row([
                "read from",
                "the running service",
                &format!("admin socket {}", socket.display()),
            ]),
            None => row(["read from", "the file, read only by this tool", ""]),
        },
    ];
    table(out, &[], &rows)?;
    writeln!(out)?;
    counts_text(store, &counts, now, out)
}

/// The counts of `stats --json`.
pub(crate) fn counts_json(counts: &StateCounts) -> Value {
    json!({
        "pending": counts.pending,
        "stale": counts.stale,
        "needs_review": counts.needs_review,
        "completed": counts.completed,
        "expired": counts.expired,
        "damaged": counts.damaged,
        "total": counts.total(),
    })
}

/// The oldest reservation of `stats --json`.
pub(crate) fn oldest_json(store: &dyn View, counts: &StateCounts, now: SystemTime) -> Value {
    counts
        .oldest_pending
        .as_ref()
        .map_or(Value::Null, |(key, record)| {
            record_json(store, key, record, now, false)
        })
}

/// The counts table of `stats` and its oldest reservation.
pub(crate) fn counts_text(
    store: &dyn View,
    counts: &StateCounts,
    now: SystemTime,
    out: &mut impl Write,
) -> Result<()> {
    let mut rows = vec![
        row(["pending (live lease)", &counts.pending.to_string()]),
        row(["stale (lease ended)", &counts.stale.to_string()]),
        row(["needs-review", &counts.needs_review.to_string()]),
        row(["completed", &counts.completed.to_string()]),
        row(["expired, not yet swept", &counts.expired.to_string()]),
    ];
    if counts.damaged > 0 {
        rows.push(row([
            &format!("damaged ({})", store.damage_hint()),
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
            show(key),
            when(store, record, now),
            record.attempt(),
            record.token()
        )?,
    }
    Ok(())
}

pub(crate) fn get(
    store: &dyn View,
    key: &Key,
    out: &mut impl Write,
    json: bool,
    raw: bool,
) -> Result<()> {
    let Some(record) = store.get(key)? else {
        bail!(
            "no record for key {}: never reserved, released, or expired",
            show(key)
        );
    };
    if raw {
        let Status::Completed { result, .. } = record.status() else {
            bail!(
                "key {} is {} and has no stored result",
                show(key),
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
            match Response::of(result) {
                Some(Response::Stored(response)) => {
                    rows.push(row([
                        "response",
                        &format!(
                            "status {}, {}, a {}-byte body (the HTTP layer's stored form, \
                             {} bytes; --raw prints them)",
                            response.status,
                            plural(response.headers.len() as u64, "header"),
                            response.body.len(),
                            result.len()
                        ),
                    ]));
                    for (name, value) in &response.headers {
                        rows.push(row([&format!("  {name}"), &preview(value, 200)]));
                    }
                    rows.push(row(["body", &preview(&response.body, 200)]));
                }
                Some(Response::NotStored(status)) => rows.push(row([
                    "response",
                    &format!(
                        "status {status}, sent but not stored (streamed, or over the layer's \
                         max_stored_response): duplicates are refused with 410"
                    ),
                ])),
                None => rows.push(row([
                    "result",
                    &format!("{} bytes: {}", result.len(), preview(result, 200)),
                ])),
            }
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

/// The records `filter` matches whose key's printed form starts with `prefix`: every record
/// is read when a prefix is given (the stored order of keys is not their printed order).
pub(crate) fn scan_prefixed(
    store: &dyn View,
    filter: &ScanFilter,
    prefix: Option<&str>,
    limit: usize,
) -> Result<Vec<(Key, Record)>> {
    let Some(prefix) = prefix else {
        return Ok(store.scan(filter, limit)?);
    };
    let mut found = store.scan(filter, usize::MAX)?;
    found.retain(|(key, _)| show(key).starts_with(prefix));
    found.truncate(limit);
    Ok(found)
}

pub(crate) fn list(
    store: &dyn View,
    filter: &ScanFilter,
    prefix: Option<&str>,
    limit: u64,
    out: &mut impl Write,
    json: bool,
) -> Result<()> {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut found = scan_prefixed(store, filter, prefix, limit.saturating_add(1))?;
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

pub(crate) fn resolve(
    store: &dyn View,
    key: &Key,
    resolution: Resolution,
    retention: Option<Duration>,
    out: &mut impl Write,
    json: bool,
) -> Result<()> {
    let before = store.get(key)?.map(|record| store.class_of(&record));
    let (action, result_len) = match &resolution {
        Resolution::Complete(result) => ("complete", Some(result.len())),
        _ => ("release", None),
    };
    store.resolve(key, resolution, retention)?;
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
                "resolved {} (was {was}): completed with a {len}-byte result; duplicates now get it",
                show(key)
            )?,
            None => writeln!(
                out,
                "resolved {} (was {was}): released; the next request does the work afresh",
                show(key)
            )?,
        }
    }
    Ok(())
}

pub(crate) fn expire(
    store: &dyn View,
    key: &Key,
    live: LiveLease,
    out: &mut impl Write,
    json: bool,
) -> Result<()> {
    // A key under review waits for `resolve`: its first request's outcome is unknown, and
    // deleting it lets the next request redo work that may have been done.
    if matches!(live, LiveLease::Refuse) {
        let class = store.get(key)?.map(|record| store.class_of(&record));
        if class == Some(RecordClass::NeedsReview) {
            return Err(UnderReview(show(key)).into());
        }
    }
    let was = store.expire(key, live)?;
    if json {
        let value = json!({
            "expired": was.is_some(),
            "scope": part(key.scope()),
            "operation": part(key.operation()),
            "id": part(key.id()),
            "was": was.map(|c| c.name()),
        });
        writeln!(out, "{value:#}")?;
    } else {
        match was {
            Some(class) => writeln!(
                out,
                "expired {} (was {class}); the next request with it does the work afresh",
                show(key)
            )?,
            None => writeln!(out, "nothing stored for {}; nothing to expire", show(key))?,
        }
    }
    Ok(())
}

/// `expire` without `--force` of a key marked for review.
#[derive(Debug)]
pub(crate) struct UnderReview(String);

impl std::fmt::Display for UnderReview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "key {} is marked for review: its first request's outcome is unknown, so it waits \
             for `idemstore resolve` and does not expire",
            self.0
        )
    }
}

impl std::error::Error for UnderReview {}

pub(crate) fn sweep(
    store: &dyn View,
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

pub(crate) fn check(report: &Verification, out: &mut impl Write, json: bool) -> Result<()> {
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
            "lease_entries": report.lease_entries,
            "problems": problems,
        });
        writeln!(out, "{value:#}")?;
        return Ok(());
    }
    writeln!(
        out,
        "checked {} records, {} lease index entries",
        report.records, report.lease_entries
    )?;
    if report.is_ok() {
        writeln!(out, "ok: no problems found")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = report
        .problems
        .iter()
        .map(|p| {
            let place = match (&p.key, p.kind) {
                (Some(key), kind) if kind != idemstore::ProblemKind::Meta => {
                    format!("key {}: {}", show(key), p.detail)
                }
                _ => p.to_string(),
            };
            vec![p.kind.to_string(), place]
        })
        .collect();
    table(out, &["PROBLEM", "WHERE AND WHAT"], &rows)?;
    writeln!(
        out,
        "{} found",
        plural(report.problems.len() as u64, "problem")
    )?;
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
