//! A read-only view of a PostgreSQL store at one moment ([`PgSnapshot`]): one record, counts
//! by state and filtered listings, for operators and the `idemstore` command line. It holds a
//! connection of its own with a `REPEATABLE READ READ ONLY` transaction open, so every read
//! sees the rows as the first one did, whatever is written meanwhile.

use super::store::{Inner, PgStore};
use crate::error::Error;
use crate::key::Key;
use crate::record::{Millis, Record, RecordClass};
use crate::remote::snapshot::{self, Records};
use crate::remote::Backend;
use crate::store::inspect::{ScanFilter, StateCounts};

/// Rows read per statement while counting or listing.
const PAGE: i64 = 512;

/// The store's records as they were when [`PgStore::snapshot`] was taken.
///
/// A snapshot keeps one connection (outside the store's pool) with a read-only transaction
/// at PostgreSQL's `REPEATABLE READ` level: [`counts`] and [`scan`] agree with each other and
/// with [`get`] however many statements they take. Classes ([`RecordClass`]) are judged at one
/// moment too: the time the snapshot was taken, by the store's clock. Dropping the snapshot
/// closes its connection, which ends the transaction.
///
/// ```no_run
/// use idemstore::{PgStore, RecordClass, ScanFilter};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = PgStore::connect("host=127.0.0.1 user=app dbname=app").await?;
/// let snapshot = store.snapshot().await?;
/// let counts = snapshot.counts().await?;
/// let stale = snapshot.scan(&ScanFilter::of(RecordClass::Stale), 100).await?;
/// assert!(stale.len() as u64 <= counts.stale);
/// println!("{} records", counts.total());
/// # Ok(()) }
/// ```
///
/// [`counts`]: PgSnapshot::counts
/// [`scan`]: PgSnapshot::scan
/// [`get`]: PgSnapshot::get
pub struct PgSnapshot {
    client: deadpool_postgres::ClientWrapper,
    table: String,
    now: Millis,
}

impl std::fmt::Debug for PgSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSnapshot")
            .field("table", &self.table)
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Takes a snapshot: a connection of its own, out of the pool, with a read-only
    /// `REPEATABLE READ` transaction that every read of the snapshot runs in. See
    /// [`PgSnapshot`].
    ///
    /// # Errors
    /// [`Error::Database`] when PostgreSQL cannot be reached within the statement timeout.
    pub async fn snapshot(&self) -> Result<PgSnapshot, Error> {
        let inner = self.inner();
        let failed = |source: Box<dyn std::error::Error + Send + Sync>| Error::Database {
            context: format!("taking a snapshot of table `{}`", inner.sql.table),
            source,
        };
        let client = match tokio::time::timeout(inner.statement_timeout, inner.pool.get()).await {
            Ok(Ok(client)) => deadpool_postgres::Object::take(client),
            Ok(Err(error)) => return Err(failed(Box::new(error))),
            Err(elapsed) => return Err(failed(Box::new(elapsed))),
        };
        client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await
            .map_err(|error| failed(Box::new(error)))?;
        Ok(PgSnapshot {
            client,
            table: inner.sql.table.clone(),
            now: inner.now(),
        })
    }
}

impl PgSnapshot {
    /// The [`RecordClass`] of `record` at the moment the snapshot was taken.
    pub fn class_of(&self, record: &Record) -> RecordClass {
        snapshot::class_of(self.now, record)
    }

    /// `key`'s record in the snapshot; `None` when absent or expired (as [`PgStore::get`]).
    ///
    /// # Errors
    /// [`StorageError::Corruption`](crate::StorageError::Corruption) naming the key when its row does not decode; [`Error::Database`].
    pub async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        let statement = format!(
            "SELECT key, token, nonce, body FROM {} WHERE key = $1",
            self.table
        );
        let rows = self
            .client
            .query(&statement, &[&key.encoded()])
            .await
            .map_err(|error| self.failed(format!("reading key {key}"), error))?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let record = Inner::decode_row(row).1?.record;
        Ok(Some(record).filter(|record| !record.is_expired(self.now)))
    }

    /// Counts the records in each [`RecordClass`] and finds the oldest reservation, as
    /// [`Store::counts`](crate::Store::counts). Reads every row of the table, in pages of
    /// 512 in key order; a row whose key or body does not decode is counted as damaged.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn counts(&self) -> Result<StateCounts, Error> {
        snapshot::counts(self).await
    }

    /// Up to `limit` records that match `filter`, with their keys, in the order of
    /// [`Store::scan`](crate::Store::scan): reservations (pending or stale) by lease
    /// deadline, oldest first; expired records by expiry; every other filter in key order
    /// (which stops reading at `limit`). Rows that do not decode are skipped
    /// ([`counts`](PgSnapshot::counts) counts them).
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn scan(
        &self,
        filter: &ScanFilter,
        limit: usize,
    ) -> Result<Vec<(Key, Record)>, Error> {
        snapshot::scan(self, filter, limit).await
    }

    fn failed(&self, what: String, error: tokio_postgres::Error) -> Error {
        Error::Database {
            context: format!(
                "{what} of table `{}` in a snapshot; it changes nothing",
                self.table
            ),
            source: Box::new(error),
        }
    }
}

impl Records for PgSnapshot {
    fn taken(&self) -> Millis {
        self.now
    }

    /// Calls `visit` with every row in key order (the key `None` when it does not decode),
    /// page by page, until it returns `false`.
    async fn each_record(
        &self,
        mut visit: impl FnMut(Option<Key>, Option<Record>) -> bool,
    ) -> Result<(), Error> {
        let statement = format!(
            "SELECT key, token, nonce, body FROM {} WHERE key > $1 ORDER BY key LIMIT $2",
            self.table
        );
        let mut after: Vec<u8> = Vec::new();
        loop {
            let rows = self
                .client
                .query(&statement, &[&after, &PAGE])
                .await
                .map_err(|error| self.failed("reading the rows".to_string(), error))?;
            for row in &rows {
                let (key, record) = Inner::decode_row(row);
                let keep_on = visit(Key::decode(&key), record.ok().map(|row| row.record));
                after = key;
                if !keep_on {
                    return Ok(());
                }
            }
            if rows.len() < PAGE as usize {
                return Ok(());
            }
        }
    }
}
