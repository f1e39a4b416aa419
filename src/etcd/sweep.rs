//! Expiry on etcd: deleting expired records in bounded slices through the expiry index, the
//! optional background sweeper, and listing stale reservations through the lease index.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::layout::Stored;
use super::store::{EtcdStore, Inner};
use super::write::{unchanged, Sent};
use crate::decide::Change;
use crate::error::Error;
use crate::key::Key;
use crate::record::{Record, State};

impl EtcdStore {
    /// Deletes up to `limit` expired records (oldest expiry first) and returns how many. Each
    /// record is deleted with its index entries, only if it is unchanged since it was read, so
    /// a key reserved again meanwhile is never deleted. Expired records already read as absent.
    ///
    /// # Errors
    /// [`Error::Corruption`] naming a damaged record; [`Error::Cluster`].
    pub async fn sweep(&self, limit: usize) -> Result<usize, Error> {
        if limit == 0 {
            // etcd reads a range limit of 0 as "no limit".
            return Ok(0);
        }
        let inner = self.inner();
        let now = inner.now();
        let (start, end) = inner.layout.expired_range(now);
        let entries = inner
            .index_range(start, end, limit, "reading the expiry index")
            .await?;
        let mut deleted = 0;
        // Reads and compares are one op per key; deletes up to three.
        for chunk in entries.chunks((inner.max_txn_ops / 3).max(1)) {
            let keys: Vec<Key> = chunk.iter().map(|(_, key)| key.clone()).collect();
            let found = inner.read_many(&keys).await?;
            let mut expired = Vec::new();
            for ((entry, key), stored) in chunk.iter().zip(found) {
                match stored? {
                    Some(stored) if stored.record.is_expired(now) => expired.push((key, stored)),
                    Some(_) => {}
                    None => inner.drop_dangling(key, entry.clone()).await?,
                }
            }
            deleted += inner.delete_expired(&expired).await?;
        }
        Ok(deleted)
    }

    /// Up to `limit` reservations whose lease ran out, oldest lease first; see
    /// [`Store::stale`](crate::Store::stale). Expired ones are not listed.
    ///
    /// # Errors
    /// [`Error::Corruption`] naming a damaged record; [`Error::Cluster`].
    pub async fn stale(&self, limit: usize) -> Result<Vec<(Key, Record)>, Error> {
        let inner = self.inner();
        let now = inner.now();
        let (mut start, end) = inner.layout.ran_out_range(now);
        let mut out = Vec::new();
        while out.len() < limit {
            let page = inner.max_txn_ops;
            let entries = inner
                .index_range(start.clone(), end.clone(), page, "reading the lease index")
                .await?;
            let keys: Vec<Key> = entries.iter().map(|(_, key)| key.clone()).collect();
            for (key, stored) in keys.iter().zip(inner.read_many(&keys).await?) {
                let Some(stored) = stored? else { continue };
                let record = stored.record;
                let ran_out = matches!(record.state, State::Pending { lease_until, .. } if lease_until <= now);
                if ran_out && !record.is_expired(now) && out.len() < limit {
                    out.push((key.clone(), record));
                }
            }
            match entries.last() {
                // The next page starts just after the last entry read.
                Some((last, _)) if entries.len() == page => {
                    start = last.clone();
                    start.push(0);
                }
                _ => break,
            }
        }
        Ok(out)
    }

    /// Starts a task on the current tokio runtime that sweeps up to `slice` expired records
    /// every `every`, until the returned handle is dropped. Errors (the cluster unreachable)
    /// are skipped: the next round tries again.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when called outside a tokio runtime or with a zero interval or
    /// slice.
    pub fn spawn_sweeper(&self, every: Duration, slice: usize) -> Result<Sweeper, Error> {
        if every.is_zero() || slice == 0 {
            return Err(Error::InvalidConfig {
                setting: "spawn_sweeper",
                reason: "the interval and the slice must be above zero".into(),
            });
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| Error::InvalidConfig {
            setting: "spawn_sweeper",
            reason: format!("it needs a tokio runtime: {e}"),
        })?;
        let store = self.clone();
        let task = runtime.spawn(async move {
            loop {
                // A full slice means more may be waiting: go on without pausing.
                match store.sweep(slice).await {
                    Ok(n) if n == slice => continue,
                    _ => tokio::time::sleep(every).await,
                }
            }
        });
        Ok(Sweeper { task })
    }
}

/// The background sweeper of [`EtcdStore::spawn_sweeper`]; dropping it stops the task.
#[derive(Debug)]
pub struct Sweeper {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Inner {
    /// Deletes expired records with their index entries in one transaction; when one of them
    /// changed meanwhile, each on its own. Returns how many were deleted.
    async fn delete_expired(&self, expired: &[(&Key, Stored)]) -> Result<usize, Error> {
        if expired.is_empty() {
            return Ok(0);
        }
        let deletes = |items: &[(&Key, Stored)]| {
            let mut compares = Vec::new();
            let mut ops = Vec::new();
            for (key, stored) in items {
                compares.push(unchanged(&self.layout.record(key), Some(stored)));
                let nonce = self.nonce();
                self.write_ops(key, Some(stored), &Change::Delete, nonce, &mut ops);
            }
            Txn::new().when(compares).and_then(ops)
        };
        let what = || format!("sweeping {} expired records", expired.len());
        if let Sent::Applied { .. } = self.send(deletes(expired), what).await?.sent {
            return Ok(expired.len());
        }
        let mut deleted = 0;
        for item in expired {
            let what = || format!("sweeping key {}", item.0);
            let answer = self.send(deletes(std::slice::from_ref(item)), what).await?;
            if let Sent::Applied { .. } = answer.sent {
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// Deletes an index entry whose record is absent. Records and their index entries change
    /// in one transaction, so this only tidies after a hand edit of the cluster's keys.
    async fn drop_dangling(&self, key: &Key, entry: Vec<u8>) -> Result<(), Error> {
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                self.layout.record(key),
                CompareOp::Equal,
                0,
            )])
            .and_then(vec![TxnOp::delete(entry, None)]);
        self.send(txn, || {
            format!("deleting a dangling index entry of key {key}")
        })
        .await?;
        Ok(())
    }
}
