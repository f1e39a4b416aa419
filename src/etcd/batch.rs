//! Many keys per etcd transaction, within `--max-txn-ops` and the request size limit: the one
//! batch path of `reserve_many`, `observe_many`, `complete_many`, `release_if_pending_many`,
//! `extend_many` and `expire_many`. Each is one [`Operation`] per key, decided by the same
//! [`decide`] as a single call.

use std::collections::HashSet;

use etcd_client::{Txn, TxnOp};

use super::layout::{placeholder, Stored, MAX_SLOTS};
use super::store::Inner;
use super::write::{landed, unchanged, AtRevision, Sent};
use crate::decide::{decide, Change, Decision, Operation};
use crate::error::Error;
use crate::key::Key;
use crate::record::Millis;

/// Bytes of record values one batch transaction may carry, well under etcd's default
/// `--max-request-bytes` of 1.5 MiB.
const MAX_TXN_BYTES: usize = 1 << 20;

/// One write waiting to be sent with others.
struct Write {
    item: usize,
    current: Option<Stored>,
    ops: usize,
    bytes: usize,
}

/// One answer slot per item of a batch.
type Answers<T> = Vec<Option<Result<T, Error>>>;

impl Inner {
    /// Applies one operation per key with few round trips: the records are read in one
    /// transaction per `max_txn_ops` keys, operations that change nothing are answered from
    /// that read, and the writes are sent together, as many per transaction as etcd's limits
    /// allow. Each written key keeps its own compare: if any changed meanwhile, that
    /// transaction's keys are applied one by one. A key that appears twice is applied in a
    /// later round, so the second sees the first. Returns one outcome per item, in order.
    ///
    /// # Errors
    /// The outer error is a failure of the cluster ([`Error::Cluster`]); an item's damaged
    /// record fails that item alone.
    pub(crate) async fn apply_many<O>(
        &self,
        items: &[(Key, O)],
    ) -> Result<Vec<Result<O::Outcome, Error>>, Error>
    where
        O: Operation + Clone,
        O::Outcome: AtRevision,
    {
        let mut answers: Answers<O::Outcome> = items.iter().map(|_| None).collect();
        let mut todo: Vec<usize> = (0..items.len()).collect();
        while !todo.is_empty() {
            let mut seen = HashSet::new();
            let (round, later): (Vec<usize>, Vec<usize>) =
                todo.into_iter().partition(|&i| seen.insert(&items[i].0));
            for chunk in round.chunks(self.max_txn_ops) {
                self.apply_chunk(items, chunk, &mut answers).await?;
            }
            todo = later;
        }
        Ok(answers
            .into_iter()
            .map(|answer| answer.expect("every item is answered"))
            .collect())
    }

    /// Applies the distinct keys of `chunk` (at most `max_txn_ops`).
    async fn apply_chunk<O>(
        &self,
        items: &[(Key, O)],
        chunk: &[usize],
        answers: &mut Answers<O::Outcome>,
    ) -> Result<(), Error>
    where
        O: Operation + Clone,
        O::Outcome: AtRevision,
    {
        let keys: Vec<Key> = chunk.iter().map(|&i| items[i].0.clone()).collect();
        let found = self.read_many(&keys).await?;
        let now = self.now();
        let mut writes = Vec::new();
        for (&item, stored) in chunk.iter().zip(found) {
            let current = match stored {
                Ok(current) => current,
                Err(error) => {
                    answers[item] = Some(Err(error));
                    continue;
                }
            };
            let decision = self.decide_item(items, item, current.as_ref(), now, 0);
            if decision.change == Change::Keep {
                answers[item] = Some(Ok(decision.outcome));
                continue;
            }
            let (ops, bytes) = self.cost(&items[item].0, current.as_ref(), &decision.change);
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
            let full = ops + write.ops > self.max_txn_ops
                || bytes + write.bytes > MAX_TXN_BYTES
                || group.len() == MAX_SLOTS;
            if full && !group.is_empty() {
                self.write_group(items, std::mem::take(&mut group), now, answers)
                    .await?;
                (ops, bytes) = (0, 0);
            }
            ops += write.ops;
            bytes += write.bytes;
            group.push(write);
        }
        if !group.is_empty() {
            self.write_group(items, group, now, answers).await?;
        }
        Ok(())
    }

    /// The operations and value bytes a change of `key` adds to a transaction.
    fn cost(&self, key: &Key, current: Option<&Stored>, change: &Change) -> (usize, usize) {
        let mut ops = Vec::new();
        self.write_ops(key, current, change, super::layout::Nonce::ZERO, &mut ops);
        let bytes = match change {
            Change::Put(record) => record.encode().len() + 3 * key.encoded().len() + 64,
            _ => 3 * key.encoded().len(),
        };
        (ops.len(), bytes)
    }

    fn decide_item<O: Operation + Clone>(
        &self,
        items: &[(Key, O)],
        item: usize,
        current: Option<&Stored>,
        now: Millis,
        slot: usize,
    ) -> Decision<O::Outcome> {
        let (key, op) = &items[item];
        let record = current.map(|s| s.record.clone());
        decide(
            record,
            op.clone(),
            now,
            self.policies.for_key(key),
            placeholder(slot),
        )
    }

    /// Writes one group in one transaction, the `slot`-th item under the token of slot
    /// `slot` of the transaction's revision; on a conflict, each key on its own.
    async fn write_group<O>(
        &self,
        items: &[(Key, O)],
        group: Vec<Write>,
        now: Millis,
        answers: &mut Answers<O::Outcome>,
    ) -> Result<(), Error>
    where
        O: Operation + Clone,
        O::Outcome: AtRevision,
    {
        let nonce = self.nonce();
        let mut compares = Vec::new();
        let mut ops = Vec::new();
        let mut gets = Vec::new();
        let mut decisions = Vec::new();
        for (slot, write) in group.iter().enumerate() {
            let key = &items[write.item].0;
            let record_key = self.layout.record(key);
            let decision = self.decide_item(items, write.item, write.current.as_ref(), now, slot);
            compares.push(unchanged(&record_key, write.current.as_ref()));
            self.write_ops(
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
        let what = || format!("writing {} keys in one transaction", group.len());
        let answer = self.send(txn, what).await?;
        let revision = match answer.sent {
            Sent::Applied { revision } => Some(revision),
            Sent::Refused { responses } if answer.ambiguous => {
                // An earlier copy of this transaction was applied if every key shows it (a put
                // its nonce, a delete its absence): the copy applied all or nothing.
                let mut all = true;
                let mut revision = 0;
                for (i, (write, decision)) in group.iter().zip(&decisions).enumerate() {
                    let key = &items[write.item].0;
                    let found = self.stored_in(key, responses.get(i))?;
                    all &= landed(
                        write.current.as_ref(),
                        found.as_ref(),
                        nonce,
                        &decision.change,
                    );
                    if let Some(found) = found.filter(|s| s.nonce == nonce) {
                        revision = found.mod_revision;
                    }
                }
                all.then_some(revision)
            }
            Sent::Refused { .. } => None,
        };
        match revision {
            Some(revision) => {
                for (write, decision) in group.iter().zip(decisions) {
                    answers[write.item] = Some(Ok(decision.outcome.at_revision(revision)));
                }
            }
            None => {
                for write in &group {
                    let (key, op) = &items[write.item];
                    answers[write.item] = Some(match self.apply(key, op.clone(), &[]).await {
                        Ok(outcome) => Ok(outcome),
                        Err(error @ Error::Corruption { .. }) => Err(error),
                        Err(error) => return Err(error),
                    });
                }
            }
        }
        Ok(())
    }
}
