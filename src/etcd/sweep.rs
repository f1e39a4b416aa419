//! Expiry on etcd: deleting expired records in bounded slices through the index, the
//! optional background sweeper, and listing stale reservations through the index.
//!
//! An index entry (see [`layout`](super::layout)) lists the records one transaction put,
//! each at the revision it was written at. Settling an entry that is due reads them back; the
//! records still at that revision are the entry's to settle (any other was written again,
//! with an entry of its own, or deleted): expired ones are deleted, the others are listed in
//! a new entry when they are next due (a pending record whose lease ran out in `s/`, until it
//! expires), and the entry is deleted, all in one transaction that applies only if every one
//! of those records and the entry itself are unchanged. So no record is ever left without an
//! entry, and none that changed meanwhile is deleted.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

use super::layout::{self, Listed, Stored};
use super::store::{EtcdStore, Inner};
use super::write::{unchanged, Entry, Sent};
use crate::error::Error;
use crate::key::Key;
use crate::record::{Millis, Record, State};

/// Refused settlements of one entry retried before leaving it to the next sweep.
const SETTLE_TRIES: usize = 3;

impl EtcdStore {
    /// Deletes up to `limit` expired records (oldest due index entries first) and returns how
    /// many. Each record is deleted only if it is unchanged since it was read, so a key
    /// reserved again meanwhile is never deleted; spent index entries are deleted on the way.
    /// Expired records already read as absent.
    ///
    /// # Errors
    /// [`StorageError::Corruption`](crate::StorageError::Corruption) naming a damaged record or index entry; [`Error::Cluster`].
    pub async fn sweep(&self, limit: usize) -> Result<usize, Error> {
        if limit == 0 {
            // etcd reads a range limit of 0 as "no limit".
            return Ok(0);
        }
        let inner = self.inner();
        let now = inner.now();
        let page = inner.max_txn_ops;
        let mut deleted = 0;
        loop {
            let mut entries = Vec::new();
            let mut full = false;
            for stale in [false, true] {
                let (start, end) = inner.layout.due_range(now, stale);
                let read = inner
                    .index_entries(start, end, page, "reading the index")
                    .await?;
                full |= read.len() == page;
                entries.extend(read);
            }
            entries.sort_by_key(|entry| entry.due);
            // Every record the page lists, read once.
            let mut keys: Vec<Key> = entries
                .iter()
                .flat_map(|entry| entry.listed.iter().map(|item| item.key.clone()))
                .collect();
            keys.sort_unstable();
            keys.dedup();
            let mut records: HashMap<Key, Stored> = HashMap::new();
            for chunk in keys.chunks(inner.max_txn_ops) {
                for (key, stored) in chunk.iter().zip(inner.read_many(chunk).await?) {
                    if let Some(stored) = stored? {
                        records.insert(key.clone(), stored);
                    }
                }
            }
            let (mut spent, mut due) = (Vec::new(), Vec::new());
            for entry in &entries {
                let mine: Vec<(Listed, Stored)> = entry
                    .listed
                    .iter()
                    .filter_map(|item| {
                        let stored = records.get(&item.key)?;
                        (stored.mod_revision == item.revision)
                            .then(|| (item.clone(), stored.clone()))
                    })
                    .collect();
                if mine.is_empty() {
                    spent.push(entry.name.clone());
                } else {
                    due.push((entry, mine));
                }
            }
            let settled_any = !spent.is_empty();
            inner.delete_spent(spent).await?;
            let mut settled = 0;
            let mut rest = due.as_slice();
            while !rest.is_empty() && deleted < limit {
                let (count, taken) = inner.settle_packed(rest, now, limit - deleted).await?;
                deleted += count;
                settled += taken;
                rest = &rest[taken.max(1)..];
            }
            if deleted >= limit {
                return Ok(deleted);
            }
            // A page whose entries all stayed (refused again and again) is left for later.
            if !full || (settled == 0 && !settled_any) {
                return Ok(deleted);
            }
        }
    }

    /// Up to `limit` reservations whose lease ran out, oldest lease first; see
    /// [`Store::stale`](crate::Store::stale). Expired ones are not listed. Reads every index
    /// entry that is due and every entry of ran-out leases (their records one transaction per
    /// `max_txn_ops` keys), so it costs in proportion to the leases that ran out and the spent
    /// entries no sweep deleted yet.
    ///
    /// # Errors
    /// [`StorageError::Corruption`](crate::StorageError::Corruption) naming a damaged record or index entry; [`Error::Cluster`].
    pub async fn stale(&self, limit: usize) -> Result<Vec<(Key, Record)>, Error> {
        let inner = self.inner();
        let now = inner.now();
        let mut found: HashMap<Key, Record> = HashMap::new();
        for (start, end) in [
            inner.layout.due_range(now, false),
            inner.layout.stale_range(),
        ] {
            let mut start = start;
            loop {
                let page = inner.max_txn_ops;
                let entries = inner
                    .index_entries(start.clone(), end.clone(), page, "reading the index")
                    .await?;
                let listed: Vec<Listed> = entries
                    .iter()
                    .flat_map(|entry| entry.listed.iter().cloned())
                    .filter(|item| !found.contains_key(&item.key))
                    .collect();
                for (item, stored) in inner.responsible(&listed).await? {
                    let record = stored.record;
                    let ran_out = matches!(record.state, State::Pending { lease_until, .. } if lease_until <= now);
                    if ran_out && !record.is_expired(now) {
                        found.insert(item.key, record);
                    }
                }
                match entries.last() {
                    // The next page starts just after the last entry read.
                    Some(last) if entries.len() == page => {
                        start = last.name.clone();
                        start.push(0);
                    }
                    _ => break,
                }
            }
        }
        let mut out: Vec<(Key, Record)> = found.into_iter().collect();
        out.sort_by_key(|(key, record)| {
            let lease_until = match record.state {
                State::Pending { lease_until, .. } => lease_until,
                _ => Millis::MAX,
            };
            (lease_until, key.clone())
        });
        out.truncate(limit);
        Ok(out)
    }

    /// Starts a task on the current tokio runtime that sweeps up to `slice` expired records
    /// every `every`, until the returned handle is dropped. Errors (the cluster unreachable)
    /// are skipped: the next round tries again.
    ///
    /// # Errors
    /// [`OpenError::InvalidConfig`](crate::OpenError::InvalidConfig) when called outside a tokio runtime or with a zero interval or
    /// slice.
    pub fn spawn_sweeper(&self, every: Duration, slice: usize) -> Result<EtcdSweeper, Error> {
        if every.is_zero() || slice == 0 {
            return Err(crate::OpenError::InvalidConfig {
                setting: "spawn_sweeper",
                reason: "the interval and the slice must be above zero".into(),
            }
            .into());
        }
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|e| crate::OpenError::InvalidConfig {
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
        Ok(EtcdSweeper { task })
    }
}

/// The background sweeper of [`EtcdStore::spawn_sweeper`]; dropping it stops the task.
#[derive(Debug)]
pub struct EtcdSweeper {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EtcdSweeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Inner {
    /// The records of `listed` that are still at the listed revision, read one transaction
    /// per `max_txn_ops` keys.
    async fn responsible(&self, listed: &[Listed]) -> Result<Vec<(Listed, Stored)>, Error> {
        let mut out = Vec::new();
        for chunk in listed.chunks(self.max_txn_ops) {
            let keys: Vec<Key> = chunk.iter().map(|item| item.key.clone()).collect();
            for (item, stored) in chunk.iter().zip(self.read_many(&keys).await?) {
                match stored? {
                    Some(stored) if stored.mod_revision == item.revision => {
                        out.push((item.clone(), stored));
                    }
                    _ => {}
                }
            }
        }
        Ok(out)
    }

    /// Deletes index entries that speak for no record any more. No compare is needed: a
    /// record that moved on from the revision an entry names never comes back to it.
    async fn delete_spent(&self, spent: Vec<Vec<u8>>) -> Result<(), Error> {
        for chunk in spent.chunks(self.max_txn_ops) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|name| TxnOp::delete(name.clone(), None))
                .collect();
            self.send(Txn::new().and_then(ops), || {
                format!("deleting {} spent index entries", chunk.len())
            })
            .await?;
        }
        Ok(())
    }

    /// Settles as many of `due` (entries with the records they still speak for) as fit in
    /// one transaction, deleting at most `budget` expired records. Returns how many records
    /// were deleted and how many entries were taken; when the packed transaction is
    /// refused (a record changed since it was read), the first entry is settled alone, from
    /// a new read.
    async fn settle_packed(
        &self,
        due: &[(&Entry, Vec<(Listed, Stored)>)],
        now: Millis,
        budget: usize,
    ) -> Result<(usize, usize), Error> {
        let mut compares = Vec::new();
        let mut ops = Vec::new();
        let mut deleting = 0;
        let mut taken = 0;
        for (entry, mine) in due {
            // Its records' deletes, up to two new entries, its own delete.
            let needs = mine.len() + 3;
            if taken > 0
                && (ops.len() + needs > self.max_txn_ops
                    || compares.len() + mine.len() + 1 > self.max_txn_ops)
            {
                break;
            }
            if mine.len() + 3 > self.max_txn_ops {
                // Too large to pack: settled alone, in chunks.
                break;
            }
            deleting += self.plan(
                entry,
                mine,
                now,
                budget - deleting,
                true,
                &mut compares,
                &mut ops,
            );
            taken += 1;
        }
        if taken > 0 {
            let txn = Txn::new().when(compares).and_then(ops);
            let answer = self
                .send(txn, || format!("settling {taken} index entries"))
                .await?;
            if let Sent::Applied { .. } = answer.sent {
                return Ok((deleting, taken));
            }
        }
        let count = self.settle(due[0].0, now, budget).await?.unwrap_or(0);
        Ok((count, 1))
    }

    /// Adds to a settlement the compares and operations that settle `entry`, whose records
    /// still at the listed revision are `mine` (see the module's documentation): deletes of
    /// the expired ones (at most `budget`; the others are listed again, due now), new entries
    /// for the rest, and, when `last`, the entry's own delete. Returns how many records it
    /// deletes.
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &self,
        entry: &Entry,
        mine: &[(Listed, Stored)],
        now: Millis,
        budget: usize,
        last: bool,
        compares: &mut Vec<Compare>,
        ops: &mut Vec<TxnOp>,
    ) -> usize {
        compares.push(Compare::version(entry.name.clone(), CompareOp::Greater, 0));
        let (mut again, mut ran_out) = (Vec::new(), Vec::new());
        let mut deleting = 0;
        for (item, stored) in mine {
            compares.push(unchanged(&self.layout.record(&item.key), Some(stored)));
            let record = &stored.record;
            let listed = Listed {
                key: item.key.clone(),
                revision: stored.mod_revision,
            };
            if record.is_expired(now) && deleting < budget {
                ops.push(TxnOp::delete(self.layout.record(&item.key), None));
                deleting += 1;
            } else if record.is_expired(now) {
                again.push((listed, record.expires_at));
            } else if let State::Pending { lease_until, .. } = record.state {
                if lease_until <= now {
                    ran_out.push((listed, record.expires_at));
                } else {
                    again.push((listed, lease_until));
                }
            } else if let Some(due) = layout::due(record) {
                again.push((listed, due));
            }
        }
        for (list, stale) in [(again, false), (ran_out, true)] {
            if let Some(due) = list.iter().map(|(_, due)| *due).min() {
                let listed: Vec<Listed> = list.into_iter().map(|(l, _)| l).collect();
                ops.push(TxnOp::put(
                    self.layout.entry(due, self.nonce(), stale),
                    layout::encode_entry(&listed),
                    None,
                ));
            }
        }
        if last {
            ops.push(TxnOp::delete(entry.name.clone(), None));
        }
        deleting
    }

    /// Settles one due index entry alone, from a new read of its records, in chunks that fit
    /// a transaction, deleting at most `budget` expired records. Returns how many records
    /// were deleted, or `None` when the settlement was refused every time (the entry stays
    /// for a later sweep).
    async fn settle(
        &self,
        entry: &Entry,
        now: Millis,
        budget: usize,
    ) -> Result<Option<usize>, Error> {
        for _ in 0..SETTLE_TRIES {
            let mine = self.responsible(&entry.listed).await?;
            let chunk_len = self.max_txn_ops.saturating_sub(3).max(1);
            let chunks: Vec<&[(Listed, Stored)]> = if mine.is_empty() {
                vec![&[]]
            } else {
                mine.chunks(chunk_len).collect()
            };
            let mut deleted = 0;
            let mut refused = false;
            for (i, chunk) in chunks.iter().enumerate() {
                let (mut compares, mut ops) = (Vec::new(), Vec::new());
                let last = i + 1 == chunks.len();
                let deleting = self.plan(
                    entry,
                    chunk,
                    now,
                    budget - deleted,
                    last,
                    &mut compares,
                    &mut ops,
                );
                let txn = Txn::new()
                    .when(compares)
                    .and_then(ops)
                    .or_else(vec![TxnOp::get(entry.name.clone(), None)]);
                let answer = self
                    .send(txn, || {
                        format!("settling an index entry of {} keys", chunk.len())
                    })
                    .await?;
                match answer.sent {
                    Sent::Applied { .. } => deleted += deleting,
                    Sent::Refused { responses } => {
                        let gone = matches!(
                            responses.first(),
                            Some(TxnOpResponse::Get(get)) if get.kvs().is_empty()
                        );
                        if gone {
                            // Another sweep settled it.
                            return Ok(Some(deleted));
                        }
                        refused = true;
                        break;
                    }
                }
            }
            if !refused {
                return Ok(Some(deleted));
            }
        }
        Ok(None)
    }
}
