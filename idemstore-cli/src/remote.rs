//! What the commands on a store that lives elsewhere share (an etcd cluster, `cluster.rs`; a
//! PostgreSQL table, `database.rs`): which commands they take, their arguments checked before
//! connecting, and running one against the store's [`View`].

use super::*;

/// A command whose arguments were checked.
pub(crate) enum Ready {
    Stats,
    List(ScanFilter, usize),
    Get(Result<Key>, bool),
    Expire(Result<Key>, bool),
    Resolve(Result<Key>, Resolution, Option<Duration>),
}

/// Checks a command's arguments for a store named by `flag` (`--etcd`, `--postgres`), before
/// connecting: a usage error needs no server, and exits 2. `elsewhere` says how that kind of
/// store sweeps and checks itself, for the commands that only work on a file.
pub(crate) fn ready(command: Command, flag: &str, elsewhere: &str) -> Result<Ready> {
    let key = |key: &KeyArgs| {
        key.remote(flag)
            .unwrap_or_else(|message| usage_error(message))
    };
    Ok(match command {
        Command::Stats { file: Some(_) } | Command::List { file: Some(_), .. } => {
            usage_error(format!("with {flag}, give no store file"))
        }
        Command::Get { key: k, raw } => Ready::Get(key(&k), raw),
        Command::Expire { key: k, force } => Ready::Expire(key(&k), force),
        Command::Resolve {
            key: k,
            action,
            retention,
        } => {
            let key = key(&k);
            let resolution = match action.complete {
                Some(path) => Resolution::Complete(read_result(&path)?),
                None => Resolution::Release,
            };
            Ready::Resolve(key, resolution, retention)
        }
        Command::Stats { file: None } => Ready::Stats,
        Command::List {
            file: None,
            state,
            older_than,
            limit,
        } => Ready::List(commands::scan_filter(state, older_than), limit),
        Command::Sweep { .. }
        | Command::Check { .. }
        | Command::Recover { .. }
        | Command::Compact { .. } => usage_error(format!(
            "{flag} works with stats, list, get, expire and resolve; sweep, check, recover and \
             compact work on a store file ({elsewhere})"
        )),
    })
}

/// Runs a checked command on `store`; `stats` prints where the store is, then its counts.
pub(crate) fn execute(
    store: &dyn View,
    command: Ready,
    json: bool,
    stats: impl FnOnce(&mut dyn Write) -> Result<()>,
) -> Result<()> {
    let mut out = io::stdout().lock();
    match command {
        Ready::Stats => stats(&mut out)?,
        Ready::List(filter, limit) => list(store, &filter, limit, &mut out, json)?,
        Ready::Get(key, raw) => get(store, &key?, &mut out, json, raw)?,
        Ready::Expire(key, force) => {
            let live = if force {
                LiveLease::Take
            } else {
                LiveLease::Refuse
            };
            expire(store, &key?, live, &mut out, json)?
        }
        Ready::Resolve(key, resolution, retention) => {
            resolve(store, &key?, resolution, retention, &mut out, json)?
        }
    }
    out.flush()?;
    Ok(())
}
