//! A read-only view of an etcd store at one revision ([`EtcdSnapshot`]): one record, counts by
//! state and filtered listings, for operators and the `idemstore` command line. The first read
//! takes the cluster's current revision; every later read names that revision, so all answers
//! describe the same moment even while writers go on (etcd keeps old revisions until it is
//! compacted).
//!
//! Which etcd keys hold records comes from [`layout`](super::layout); this module only pages
//! through their range.

use std::future::Future;
use std::time::{Duration, Instant};

use etcd_client::{GetOptions, GetResponse, KeyValue};

use super::layout::{self, Layout};
use super::store::{EtcdStore, Inner};
use crate::error::Error;
use crate::key::Key;
use crate::record::{Millis, Record, RecordClass};
use crate::remote::snapshot::{self, Records};
use crate::store::inspect::{ScanFilter, StateCounts};

/// Keys read per range request. A page is halved while the answer is over [`MAX_MESSAGE`]
/// (each record may hold a result of up to 1,400 KiB).
const PAGE: usize = 256;
/// The largest answer read in one gRPC message (the client's default is 4 MiB): room for
/// eleven records with a result of the largest size.
const MAX_MESSAGE: usize = 16 << 20;

/// The store's records as they were at one etcd revision, from [`EtcdStore::snapshot`].
///
/// Every read of a snapshot names the revision its first read saw, so [`counts`] and
/// [`scan`] agree with each other and with [`get`] however many range reads they take and
/// whatever is written meanwhile. Classes ([`RecordClass`]) are judged at one moment too:
/// the time the snapshot was taken, by the store's clock.
///
/// ```no_run
/// use idemstore::{EtcdStore, RecordClass, ScanFilter};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = EtcdStore::connect(&["127.0.0.1:2379"]).await?;
/// let snapshot = store.snapshot().await?;
/// let counts = snapshot.counts().await?;
/// let stale = snapshot.scan(&ScanFilter::of(RecordClass::Stale), 100).await?;
/// assert!(stale.len() as u64 <= counts.stale);
/// println!("at revision {}: {} records", snapshot.revision(), counts.total());
/// # Ok(()) }
/// ```
///
/// A snapshot reads old revisions: if the cluster is compacted past its revision while it is
/// read, the read fails with [`Error::Cluster`] saying so, and a new snapshot is needed.
///
/// [`counts`]: EtcdSnapshot::counts
/// [`scan`]: EtcdSnapshot::scan
/// [`get`]: EtcdSnapshot::get
#[derive(Debug, Clone)]
pub struct EtcdSnapshot {
    store: EtcdStore,
    revision: i64,
    now: Millis,
}

impl EtcdStore {
    /// Takes a snapshot: one read of the store's records (at most one key), whose revision
    /// every read of the snapshot then names. See [`EtcdSnapshot`].
    ///
    /// # Errors
    /// [`Error::Cluster`] when the cluster gives no answer within the operation deadline.
    pub async fn snapshot(&self) -> Result<EtcdSnapshot, Error> {
        let inner = self.inner();
        let now = inner.now();
        let (start, end) = records_range(&inner.layout);
        let what = || "taking a snapshot of the store".to_string();
        let response = range(inner, &start, &end, 1, true, 0, &what).await?;
        let revision = response
            .header()
            .map(|header| header.revision())
            .filter(|revision| *revision > 0)
            .ok_or_else(|| Error::Cluster {
                context: format!("{}: the answer carries no revision", what()),
                source: "no response header".into(),
            })?;
        Ok(EtcdSnapshot {
            store: self.clone(),
            revision,
            now,
        })
    }
}

impl EtcdSnapshot {
    /// The etcd revision every read of this snapshot is made at.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// The [`RecordClass`] of `record` at the moment the snapshot was taken.
    pub fn class_of(&self, record: &Record) -> RecordClass {
        snapshot::class_of(self.now, record)
    }

    /// `key`'s record at the snapshot's revision; `None` when absent or expired (as
    /// [`EtcdStore::get`]).
    ///
    /// # Errors
    /// [`StorageError::Corruption`](crate::StorageError::Corruption) naming the key when its value does not decode;
    /// [`Error::Cluster`].
    pub async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        let inner = self.store.inner();
        let record_key = inner.layout.record(key);
        let mut end = record_key.clone();
        end.push(0);
        let what = || format!("reading key {key}");
        let response = range(inner, &record_key, &end, 1, false, self.revision, &what).await?;
        let Some(kv) = response.kvs().first() else {
            return Ok(None);
        };
        let record = decode(kv).map_err(|reason| crate::StorageError::Corruption {
            location: format!("etcd record of key {key}"),
            reason,
        })?;
        Ok(Some(record).filter(|record| !record.is_expired(self.now)))
    }

    /// Counts the records in each [`RecordClass`] and finds the oldest reservation, as
    /// [`Store::counts`](crate::Store::counts). Reads every record of the store, in pages;
    /// a record whose key or value does not decode is counted as damaged.
    ///
    /// # Errors
    /// [`Error::Cluster`], for a compacted revision too.
    pub async fn counts(&self) -> Result<StateCounts, Error> {
        snapshot::counts(self).await
    }

    /// Up to `limit` records that match `filter`, with their keys, in the order of
    /// [`Store::scan`](crate::Store::scan): reservations (pending or stale) by lease
    /// deadline, oldest first; expired records by expiry; every other filter in key order.
    /// Records that do not decode are skipped ([`counts`](EtcdSnapshot::counts) counts them).
    ///
    /// The etcd layout keeps one index entry per transaction, not per record, and its
    /// entries are rewritten by the sweeper, so a listing by deadline reads every record at
    /// the snapshot's revision and sorts the matches (a listing in key order stops at
    /// `limit`).
    ///
    /// # Errors
    /// [`Error::Cluster`], for a compacted revision too.
    pub async fn scan(
        &self,
        filter: &ScanFilter,
        limit: usize,
    ) -> Result<Vec<(Key, Record)>, Error> {
        snapshot::scan(self, filter, limit).await
    }
}

impl Records for EtcdSnapshot {
    fn taken(&self) -> Millis {
        self.now
    }

    /// Calls `visit` with every record of the store in key order (the key `None` when it
    /// does not decode), page by page, until it returns `false`.
    async fn each_record(
        &self,
        mut visit: impl FnMut(Option<Key>, Option<Record>) -> bool,
    ) -> Result<(), Error> {
        let inner = self.store.inner();
        let (mut start, end) = records_range(&inner.layout);
        let records = start.len();
        let what = || format!("reading the records at revision {}", self.revision);
        loop {
            let page = range(inner, &start, &end, PAGE, false, self.revision, &what).await?;
            for kv in page.kvs() {
                let key = kv.key().get(records..).and_then(Key::decode);
                if !visit(key, decode(kv).ok()) {
                    return Ok(());
                }
            }
            match page.kvs().last() {
                Some(last) if page.more() => start = after(last.key()),
                _ => return Ok(()),
            }
        }
    }
}

/// A record read from etcd, its token resolved.
fn decode(kv: &KeyValue) -> Result<Record, String> {
    layout::decode(kv.value(), kv.mod_revision(), kv.create_revision()).map(|stored| stored.record)
}

/// The range `[start, end)` of every record's etcd key: the layout's record key of any key,
/// without the key.
fn records_range(layout: &Layout) -> (Vec<u8>, Vec<u8>) {
    (layout.records(), layout.records_end())
}

/// The first etcd key after `key`.
fn after(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}

/// What a failed read means.
enum Failure {
    /// The answer was over [`MAX_MESSAGE`]: read fewer keys.
    TooLarge,
    /// The revision was compacted: this snapshot cannot be read any more.
    Compacted,
    /// Refused for good (a bad request, no permission): resending cannot help.
    Refused,
    /// No definite answer (a member down, an election, a timeout): try again.
    Transient,
}

fn failure(error: &etcd_client::Error) -> Failure {
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            let message = status.message();
            if message.contains("length too large") {
                Failure::TooLarge
            } else if message.contains("compacted") {
                Failure::Compacted
            } else if matches!(status.code() as i32, 3 | 5 | 6 | 7 | 9 | 11 | 12 | 16) {
                // gRPC codes: invalid argument, not found, already exists, permission
                // denied, failed precondition, out of range, unimplemented, unauthenticated.
                Failure::Refused
            } else {
                Failure::Transient
            }
        }
        etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_) => Failure::Refused,
        _ => Failure::Transient,
    }
}

/// Up to `limit` keys in `[start, end)` at `revision` (0: the newest), with their values
/// unless `keys_only` (fewer when they are too large for one answer).
async fn range(
    inner: &Inner,
    start: &[u8],
    end: &[u8],
    limit: usize,
    keys_only: bool,
    revision: i64,
    what: &dyn Fn() -> String,
) -> Result<GetResponse, Error> {
    retried(inner, revision, what, limit, |limit| {
        let mut options = GetOptions::new()
            .with_range(end.to_vec())
            .with_limit(i64::try_from(limit).unwrap_or(i64::MAX))
            .with_revision(revision);
        if keys_only {
            options = options.with_keys_only();
        }
        let mut kv = inner
            .client
            .kv_client()
            .max_decoding_message_size(MAX_MESSAGE);
        let start = start.to_vec();
        async move { kv.get(start, Some(options)).await }
    })
    .await
}

/// Runs the read `attempt(n)` for `n` keys, from `most` down: halved while the answer is too
/// large for one message, and retried while the cluster gives no definite answer, up to the
/// store's operation deadline (a read changes nothing, so resending is always safe).
async fn retried<T, F, Fut>(
    inner: &Inner,
    revision: i64,
    what: &dyn Fn() -> String,
    most: usize,
    mut attempt: F,
) -> Result<T, Error>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let started = Instant::now();
    let mut pause = Duration::from_millis(20);
    let mut n = most.max(1);
    loop {
        let error = match attempt(n).await {
            Ok(answer) => return Ok(answer),
            Err(error) => error,
        };
        let context = match failure(&error) {
            Failure::TooLarge if n > 1 => {
                n /= 2;
                continue;
            }
            Failure::Compacted => format!(
                "{}: the cluster was compacted past revision {revision} meanwhile; run it again",
                what()
            ),
            Failure::TooLarge | Failure::Refused => {
                format!("{}; the cluster refused the request", what())
            }
            Failure::Transient if started.elapsed() + pause <= inner.op_deadline => {
                tokio::time::sleep(pause).await;
                inner
                    .resends
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                pause = (pause * 2).min(Duration::from_millis(500));
                continue;
            }
            Failure::Transient => format!("{}; no answer within {:?}", what(), inner.op_deadline),
        };
        return Err(Error::Cluster {
            context,
            source: Box::new(error),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_records_range_covers_exactly_the_record_keys() {
        let layout = Layout::new(b"app/");
        let (start, end) = records_range(&layout);
        assert_eq!(
            (start.as_slice(), end.as_slice()),
            (&b"app/r/"[..], &b"app/r0"[..])
        );
        let key = Key::new("user-1", "charge", "k1").unwrap();
        let record = layout.record(&key);
        assert!(start <= record && record < end);
        assert!(after(&record) > record && after(&record) < end);
    }
}
