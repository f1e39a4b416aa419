//! What the commands read and change: the store opened by this tool, or the live store of a
//! running service through its admin socket.

use std::path::Path;
use std::time::Duration;

use idemstore::{
    AdminClient, FileInfo, Key, LiveLease, Record, RecordClass, Resolution, ScanFilter,
    StateCounts, Store,
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
