//! What the commands read and change: the store opened by this tool (read only for `stats`,
//! `list`, `get` and `check`), or the live store of a running service through its admin socket.

use std::path::Path;
use std::time::Duration;

use idemstore::{
    AdminClient, Error, FileInfo, Key, LiveLease, ReadOnlyStore, Record, RecordClass, Resolution,
    ScanFilter, StateCounts, Store,
};

type Result<T> = idemstore::Result<T>;

/// A store as the commands see it.
pub(crate) trait View {
    fn file_info(&self) -> Result<FileInfo>;
    fn counts(&self) -> Result<StateCounts>;
    fn get(&self, key: &Key) -> Result<Option<Record>>;
    fn scan(&self, filter: &ScanFilter, limit: usize) -> Result<Vec<(Key, Record)>>;
    fn class_of(&self, record: &Record) -> RecordClass;
    fn expire(&self, key: &Key, live: LiveLease) -> Result<Option<RecordClass>>;
    /// Resolves with the key's own retention, or `retention`.
    fn resolve(&self, key: &Key, resolution: Resolution, retention: Option<Duration>)
        -> Result<()>;
    fn sweep(&self, limit: usize) -> Result<usize>;
    fn checkpoint(&self) -> Result<()>;
    /// The admin socket, when this is a running service's store.
    fn socket(&self) -> Option<&Path>;
    /// What to do about damaged records, for `stats`.
    fn damage_hint(&self) -> &'static str {
        "run `idemstore check`"
    }
}

impl View for Store {
    fn file_info(&self) -> Result<FileInfo> {
        Store::file_info(self)
    }
    fn counts(&self) -> Result<StateCounts> {
        Store::counts(self)
    }
    fn get(&self, key: &Key) -> Result<Option<Record>> {
        Store::get(self, key)
    }
    fn scan(&self, filter: &ScanFilter, limit: usize) -> Result<Vec<(Key, Record)>> {
        Store::scan(self, filter, limit)
    }
    fn class_of(&self, record: &Record) -> RecordClass {
        Store::class_of(self, record)
    }
    fn expire(&self, key: &Key, live: LiveLease) -> Result<Option<RecordClass>> {
        match live {
            LiveLease::Take => Store::expire_forced(self, key),
            _ => Store::expire(self, key),
        }
    }
    fn resolve(
        &self,
        key: &Key,
        resolution: Resolution,
        retention: Option<Duration>,
    ) -> Result<()> {
        match retention {
            Some(retention) => Store::resolve_with_retention(self, key, resolution, retention),
            None => Store::resolve(self, key, resolution),
        }
    }
    fn sweep(&self, limit: usize) -> Result<usize> {
        Store::sweep(self, limit)
    }
    fn checkpoint(&self) -> Result<()> {
        Store::checkpoint(self)
    }
    fn socket(&self) -> Option<&Path> {
        None
    }
}

impl View for AdminClient {
    fn file_info(&self) -> Result<FileInfo> {
        AdminClient::file_info(self)
    }
    fn counts(&self) -> Result<StateCounts> {
        AdminClient::counts(self)
    }
    fn get(&self, key: &Key) -> Result<Option<Record>> {
        AdminClient::get(self, key)
    }
    fn scan(&self, filter: &ScanFilter, limit: usize) -> Result<Vec<(Key, Record)>> {
        AdminClient::scan(self, filter, limit)
    }
    fn class_of(&self, record: &Record) -> RecordClass {
        AdminClient::class_of(self, record)
    }
    fn expire(&self, key: &Key, live: LiveLease) -> Result<Option<RecordClass>> {
        AdminClient::expire(self, key, live)
    }
    fn resolve(
        &self,
        key: &Key,
        resolution: Resolution,
        retention: Option<Duration>,
    ) -> Result<()> {
        AdminClient::resolve(self, key, resolution, retention)
    }
    fn sweep(&self, limit: usize) -> Result<usize> {
        AdminClient::sweep(self, limit)
    }
    fn checkpoint(&self) -> Result<()> {
        AdminClient::checkpoint(self)
    }
    fn socket(&self) -> Option<&Path> {
        Some(AdminClient::socket(self))
    }
}

/// A closed store read by this tool without writing: the reading commands only.
impl View for ReadOnlyStore {
    fn file_info(&self) -> Result<FileInfo> {
        ReadOnlyStore::file_info(self)
    }
    fn counts(&self) -> Result<StateCounts> {
        ReadOnlyStore::counts(self)
    }
    fn get(&self, key: &Key) -> Result<Option<Record>> {
        ReadOnlyStore::get(self, key)
    }
    fn scan(&self, filter: &ScanFilter, limit: usize) -> Result<Vec<(Key, Record)>> {
        ReadOnlyStore::scan(self, filter, limit)
    }
    fn class_of(&self, record: &Record) -> RecordClass {
        ReadOnlyStore::class_of(self, record)
    }
    fn expire(&self, _key: &Key, _live: LiveLease) -> Result<Option<RecordClass>> {
        Err(read_only("expire"))
    }
    fn resolve(&self, _: &Key, _: Resolution, _: Option<Duration>) -> Result<()> {
        Err(read_only("resolve"))
    }
    fn sweep(&self, _limit: usize) -> Result<usize> {
        Err(read_only("sweep"))
    }
    fn checkpoint(&self) -> Result<()> {
        Err(read_only("checkpoint"))
    }
    fn socket(&self) -> Option<&Path> {
        None
    }
}

/// A write asked of a store opened read only; the commands that write open it writable, so
/// none gets here.
fn read_only(what: &'static str) -> Error {
    idemstore::OpenError::InvalidConfig {
        setting: what,
        reason: "the store was opened read only".to_string(),
    }
    .into()
}
