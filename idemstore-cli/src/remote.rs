//! What the commands on a store that lives elsewhere share (an etcd cluster, `cluster.rs`; a
//! PostgreSQL table, `database.rs`): which commands they take, their arguments checked before
//! connecting, and running one against the store's [`View`].

use super::*;

/// A command whose arguments were checked.
pub(crate) enum Ready {
    Stats,
    List(ScanFilter, Option<String>, u64),
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
        Command::Stats { file: Some(_), .. } | Command::List { file: Some(_), .. } => {
            usage_error(format!("with {flag}, give no store file"))
        }
        Command::Get { key: k, raw, .. } => Ready::Get(key(&k), raw),
        Command::Expire { key: k, force, .. } => Ready::Expire(key(&k), force),
        Command::Resolve {
            key: k,
            action,
            retention,
            ..
        } => {
            let key = key(&k);
            let resolution = match action.complete {
                Some(path) => Resolution::Complete(read_result(&path)?),
                None => Resolution::Release,
            };
            Ready::Resolve(key, resolution, retention)
        }
        Command::Stats { file: None, .. } => Ready::Stats,
        Command::List {
            file: None,
            state,
            older_than,
            key_prefix,
            limit,
            ..
        } => Ready::List(commands::scan_filter(state, older_than), key_prefix, limit),
        Command::Sweep { .. }
        | Command::Check { .. }
        | Command::Recover { .. }
        | Command::Compact { .. }
        | Command::Init { .. }
        | Command::Export { .. }
        | Command::Import { .. } => usage_error(format!(
            "{flag} works with stats, list, get, expire and resolve; sweep, check, recover, \
             compact, init, export and import work on a store file ({elsewhere})"
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
        Ready::List(filter, prefix, limit) => {
            list(store, &filter, prefix.as_deref(), limit, &mut out, json)?
        }
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

/// A command that needs a store file, refused on a store that has none (`place` names where
/// the store lives). The arguments are checked before, so no command gets here.
pub(crate) fn no_file(what: &'static str, place: &str) -> Error {
    OpenError::InvalidConfig {
        setting: what,
        reason: format!("{place} has no file"),
    }
    .into()
}

/// The [`View`] of a store that lives elsewhere (`$ty` holds its `runtime`, `store` and
/// `snapshot`): reads through the snapshot, writes through the store, and nothing that needs
/// a file (`$place` names where the store lives, for the refusals). Written once for the etcd
/// and PostgreSQL stores, whose snapshots and stores have the same calls.
macro_rules! remote_view {
    ($ty:ty, $place:literal) => {
        impl View for $ty {
            fn file_info(&self) -> idemstore::Result<FileInfo> {
                Err($crate::remote::no_file("file_info", $place))
            }
            fn counts(&self) -> idemstore::Result<StateCounts> {
                self.runtime.block_on(self.snapshot.counts())
            }
            fn get(&self, key: &Key) -> idemstore::Result<Option<Record>> {
                self.runtime.block_on(self.snapshot.get(key))
            }
            fn scan(
                &self,
                filter: &ScanFilter,
                limit: usize,
            ) -> idemstore::Result<Vec<(Key, Record)>> {
                self.runtime.block_on(self.snapshot.scan(filter, limit))
            }
            fn class_of(&self, record: &Record) -> RecordClass {
                self.snapshot.class_of(record)
            }
            fn expire(&self, key: &Key, live: LiveLease) -> idemstore::Result<Option<RecordClass>> {
                self.runtime.block_on(self.store.expire_with(key, live))
            }
            fn resolve(
                &self,
                key: &Key,
                resolution: Resolution,
                retention: Option<Duration>,
            ) -> idemstore::Result<()> {
                self.runtime.block_on(async {
                    match retention {
                        Some(retention) => {
                            self.store
                                .resolve_with_retention(key, resolution, retention)
                                .await
                        }
                        None => self.store.resolve(key, resolution).await,
                    }
                })
            }
            fn sweep(&self, _limit: usize) -> idemstore::Result<usize> {
                Err($crate::remote::no_file("sweep", $place))
            }
            fn checkpoint(&self) -> idemstore::Result<()> {
                Ok(())
            }
            fn socket(&self) -> Option<&Path> {
                None
            }
            fn damage_hint(&self) -> &'static str {
                // Such a store has no file to check; `get` names what is wrong with a key.
                "`get` shows why"
            }
        }
    };
}
pub(crate) use remote_view;
