//! [`EtcdStore::reserve_many`]: many keys per etcd transaction, within `--max-txn-ops` and the
//! request size limit.

use std::collections::HashSet;

use etcd_client::{Txn, TxnOp};

use super::layout::{placeholder, Stored, MAX_SLOTS};
use super::store::EtcdStore;
use super::write::{unchanged, AtRevision, Sent};
use crate::answers::Reservation;
use crate::decide::op::{Reserve, Reserved};
use crate::decide::{decide, Change, Decision};
use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::record::Millis;
use crate::store::answer;

/// Bytes of record values one batch transaction may carry, well under etcd's default
/// `--max-request-bytes` of 1.5 MiB.
const MAX_TXN_BYTES: usize = 1 << 20;

/// One acquisition waiting to be written.
struct Write {
    item: usize,
    current: Option<Stored>,
    ops: Vec<TxnOp>,
    bytes: usize,
}

impl EtcdStore {
    /// Reserves many keys with few round trips: the records are read in one transaction per
    /// `max_txn_ops` keys, duplicates are answered from that read, and the acquisitions are
    /// written together, as many per transaction as etcd's limits allow. Each written key
    /// keeps its own compare: if any changed meanwhile, that transaction's keys are reserved
    /// one by one. A key that appears twice is reserved in a later round, so the second sees
    /// the first's reservation. Returns one result per item, in order.
    ///
    /// # Durability
    /// As for [`reserve`](EtcdStore::reserve): every `Acquired` is acknowledged by a majority.
    ///
    /// # Errors
    /// The outer error is a failure of the cluster ([`Error::Cluster`]); an item's error (a
    /// damaged record) does not fail the others.
    pub async fn reserve_many(
        &self,
        items: &[(Key, Fingerprint)],
    ) -> Result<Vec<Result<Reservation, Error>>, Error> {
        let mut answers: Vec<Option<Result<Reservation, Error>>> =
            items.iter().map(|_| None).collect();
        let mut todo: Vec<usize> = (0..items.len()).collect();
        while !todo.is_empty() {
            let mut seen = HashSet::new();
            let (round, later): (Vec<usize>, Vec<usize>) =
                todo.into_iter().partition(|&i| seen.insert(&items[i].0));
            for chunk in round.chunks(self.inner().max_txn_ops) {
                self.reserve_chunk(items, chunk, &mut answers).await?;
            }
            todo = later;
        }
        Ok(answers
            .into_iter()
            .map(|answer| answer.expect("every item is answered"))
            .collect())
    }

    /// Reserves the distinct keys of `chunk` (at most `max_txn_ops`).
    async fn reserve_chunk(
        &self,
        items: &[(Key, Fingerprint)],
        chunk: &[usize],
        answers: &mut [Option<Result<Reservation, Error>>],
    ) -> Result<(), Error> {
        let inner = self.inner();
        let keys: Vec<Key> = chunk.iter().map(|&i| items[i].0.clone()).collect();
        let found = inner.read_many(&keys).await?;
        let now = inner.now();
        let mut writes = Vec::new();
        for (&item, stored) in chunk.iter().zip(found) {
            let current = match stored {
                Ok(current) => current,
                Err(error) => {
                    answers[item] = Some(Err(error));
                    continue;
                }
            };
            let decision = self.decide_reserve(items, item, current.as_ref(), now, 0);
            if decision.change == Change::Keep {
                answers[item] = Some(Ok(answer::reservation(&items[item].0, decision.outcome)));
                continue;
            }
            let mut ops = Vec::new();
            inner.write_ops(
                &items[item].0,
                current.as_ref(),
                &decision.change,
                inner.nonce(),
                &mut ops,
            );
            let bytes = match &decision.change {
                Change::Put(record) => record.encode().len() + 2 * items[item].0.encoded().len(),
                _ => 0,
            };
            writes.push(Write {
                item,
                current,
                ops,
                bytes,
            });
        }
        // Pack the writes into transactions within the limits.
        let mut group: Vec<Write> = Vec::new();
        let (mut ops, mut bytes) = (0, 0);
        for write in writes {
            let full = ops + write.ops.len() > inner.max_txn_ops
                || bytes + write.bytes > MAX_TXN_BYTES
                || group.len() == MAX_SLOTS;
            if full && !group.is_empty() {
                self.write_group(items, std::mem::take(&mut group), now, answers)
                    .await?;
                (ops, bytes) = (0, 0);
            }
            ops += write.ops.len();
            bytes += write.bytes;
            group.push(write);
        }
        if !group.is_empty() {
            self.write_group(items, group, now, answers).await?;
        }
        Ok(())
    }

    fn decide_reserve(
        &self,
        items: &[(Key, Fingerprint)],
        item: usize,
        current: Option<&Stored>,
        now: Millis,
        slot: usize,
    ) -> Decision<Reserved> {
        let op = Reserve {
            fingerprint: items[item].1,
        };
        let record = current.map(|s| s.record.clone());
        decide(record, op, now, self.inner().policy, placeholder(slot))
    }

    /// Writes one group of acquisitions in one transaction, the `slot`-th under the token of
    /// slot `slot` of the transaction's revision; on a conflict, each key on its own.
    async fn write_group(
        &self,
        items: &[(Key, Fingerprint)],
        group: Vec<Write>,
        now: Millis,
        answers: &mut [Option<Result<Reservation, Error>>],
    ) -> Result<(), Error> {
        let inner = self.inner();
        let nonce = inner.nonce();
        let mut compares = Vec::new();
        let mut ops = Vec::new();
        let mut gets = Vec::new();
        let mut decisions = Vec::new();
        for (slot, write) in group.iter().enumerate() {
            let key = &items[write.item].0;
            let record_key = inner.layout.record(key);
            let decision =
                self.decide_reserve(items, write.item, write.current.as_ref(), now, slot);
            compares.push(unchanged(&record_key, write.current.as_ref()));
            inner.write_ops(
                key,
                write.current.as_ref(),
                &decision.change,
                nonce,
                &mut ops,
            );
            gets.push(TxnOp::get(record_key, None));
            decisions.push(decision);
        }
        let txn = Txn::new().when(compares).and_then(ops).or_else(gets);
        let what = || format!("reserving {} keys in one transaction", group.len());
        let answer = inner.send(txn, what).await?;
        let revision = match answer.sent {
            Sent::Applied { revision } => Some(revision),
            Sent::Refused { responses } if answer.ambiguous => {
                // An earlier copy of this transaction was applied if any key holds its nonce.
                let first = &items[group[0].item].0;
                match inner.stored_in(first, responses.first())? {
                    Some(stored) if stored.nonce == nonce => Some(stored.mod_revision),
                    _ => None,
                }
            }
            Sent::Refused { .. } => None,
        };
        match revision {
            Some(revision) => {
                for (write, decision) in group.iter().zip(decisions) {
                    let reserved = decision.outcome.at_revision(revision);
                    answers[write.item] =
                        Some(Ok(answer::reservation(&items[write.item].0, reserved)));
                }
            }
            None => {
                for write in &group {
                    let (key, fingerprint) = &items[write.item];
                    let op = Reserve {
                        fingerprint: *fingerprint,
                    };
                    answers[write.item] = Some(match inner.apply(key, op, &[]).await {
                        Ok(reserved) => Ok(answer::reservation(key, reserved)),
                        Err(error @ Error::Corruption { .. }) => Err(error),
                        Err(error) => return Err(error),
                    });
                }
            }
        }
        Ok(())
    }
}
