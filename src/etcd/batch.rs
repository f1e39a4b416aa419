//! Many keys per etcd transaction, within `--max-txn-ops` and the request size limit: the one
//! batch path of `reserve_many`, `observe_many`, `complete_many`, `release_if_pending_many`,
//! `extend_many` and `expire_many`. Each is one [`Operation`] per key, decided by the same
//! [`decide`] as a single call.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use etcd_client::{Txn, TxnOp, TxnOpResponse};

use super::layout::{placeholder, Stored, MAX_SLOTS};
use super::store::Inner;
use super::write::{at_revision, landed, unchanged, written, Sent, Start};
use crate::decide::{decide, Change, Decision, Operation};
use crate::error::Error;
use crate::key::Key;
use crate::record::Millis;

/// Bytes of record values one batch transaction may carry, well under etcd's default
/// `--max-request-bytes` of 1.5 MiB.
const MAX_TXN_BYTES: usize = 1 << 20;
/// Operations of a batch transaction kept for its index entry: the entry, and room for a
/// sweep to move and delete entries beside deleting every record of the transaction.
const ENTRY_OPS: usize = 3;
/// Most transactions of one batch in flight at once: the leader groups concurrent proposals
/// into one log append and fsync.
const MAX_IN_FLIGHT: usize = 16;

/// One write waiting to be sent with others.
struct Write {
    item: usize,
    current: Option<Stored>,
    ops: usize,
    bytes: usize,
}

/// One answer slot per item of a batch.
type Answers<T> = Vec<Option<Result<T, Error>>>;

/// What became of one group's transaction, per item: answered, or to decide again on the
/// record its failure branch read.
enum Settled<T> {
    Answered(Result<T, Error>),
    Again(Option<Stored>),
}

impl Inner {
    /// Applies one operation per key with few round trips. Each key starts from what this
    /// process last wrote of it, else absent when `absent_first` (reserves and observes of
    /// mostly new keys), else from a read (one read transaction per `max_txn_ops` keys). The
    /// writes are packed into as few transactions as etcd's limits allow, sent up to
    /// [`MAX_IN_FLIGHT`] at once; each key keeps its own compare, and the keys of a
    /// transaction refused because one changed are decided again on what its failure branch
    /// read. A key that appears twice is applied in a later round, so the second sees the
    /// first. Returns one outcome per item, in order.
    ///
    /// # Errors
    /// The outer error is a failure of the cluster ([`Error::Cluster`]); an item's damaged
    /// record fails that item alone.
    pub(crate) async fn apply_many<O>(
        &self,
        items: &[(Key, O)],
        absent_first: bool,
    ) -> Result<Vec<Result<O::Outcome, Error>>, Error>
    where
        O: Operation + Clone,
    {
        let mut answers: Answers<O::Outcome> = items.iter().map(|_| None).collect();
        let mut starts: Vec<Option<Start>> = items.iter().map(|_| None).collect();
        let mut todo: Vec<usize> = (0..items.len()).collect();
        while !todo.is_empty() {
            let mut seen = HashSet::new();
            let (round, mut later): (Vec<usize>, Vec<usize>) =
                todo.into_iter().partition(|&i| seen.insert(&items[i].0));
            for &i in &round {
                if starts[i].is_none() {
                    starts[i] = Some(self.start(&items[i].0, absent_first));
                }
            }
            let again = self
                .apply_round(items, &round, &mut starts, &mut answers)
                .await?;
            later.extend(again);
            later.sort_unstable();
            todo = later;
        }
        Ok(answers
            .into_iter()
            .map(|answer| answer.expect("every item is answered"))
            .collect())
    }

    /// One round over distinct keys: reads what must be read, decides, writes. Returns the
    /// items to decide again (their start set).
    async fn apply_round<O>(
        &self,
        items: &[(Key, O)],
        round: &[usize],
        starts: &mut [Option<Start>],
        answers: &mut Answers<O::Outcome>,
    ) -> Result<Vec<usize>, Error>
    where
        O: Operation + Clone,
    {
        // Reads, one transaction per `max_txn_ops` keys, all at once.
        let to_read: Vec<usize> = round
            .iter()
            .copied()
            .filter(|&i| matches!(starts[i], Some(Start::Read)))
            .collect();
        let reads = to_read.chunks(self.max_txn_ops).map(|chunk| {
            let keys: Vec<Key> = chunk.iter().map(|&i| items[i].0.clone()).collect();
            async move { self.read_many(&keys).await }
        });
        let mut read = Vec::new();
        for chunk in join_all(reads.collect()).await {
            read.extend(chunk?);
        }
        for (&i, found) in to_read.iter().zip(read) {
            match found {
                Ok(found) => starts[i] = Some(Start::Known(found)),
                Err(error) => {
                    starts[i] = None;
                    answers[i] = Some(Err(error));
                }
            }
        }
        let now = self.now();
        let mut again = Vec::new();
        let mut writes = Vec::new();
        for &item in round {
            let (current, guessed) = match starts[item].take() {
                Some(Start::Guess(stored)) => (stored, true),
                Some(Start::Known(stored)) => (stored, false),
                Some(Start::Read) | None => continue,
            };
            let decision = self.decide_item(items, item, current.as_ref(), now, 0);
            if decision.change == Change::Keep {
                if guessed {
                    // Answer only from what the cluster holds.
                    starts[item] = Some(Start::Read);
                    again.push(item);
                } else {
                    answers[item] = Some(Ok(decision.outcome));
                }
                continue;
            }
            let (ops, bytes) = self.cost(&items[item].0, &decision.change);
            writes.push(Write {
                item,
                current,
                ops,
                bytes,
            });
        }
        // Pack the writes into transactions within the limits.
        // Each transaction keeps [`ENTRY_OPS`] operations for its index entry.
        let mut groups: Vec<Vec<Write>> = Vec::new();
        let mut group: Vec<Write> = Vec::new();
        let (mut ops, mut bytes) = (ENTRY_OPS, 0);
        for write in writes {
            let full = ops + write.ops > self.max_txn_ops
                || bytes + write.bytes > MAX_TXN_BYTES
                || group.len() == MAX_SLOTS;
            if full && !group.is_empty() {
                groups.push(std::mem::take(&mut group));
                (ops, bytes) = (ENTRY_OPS, 0);
            }
            ops += write.ops;
            bytes += write.bytes;
            group.push(write);
        }
        if !group.is_empty() {
            groups.push(group);
        }
        for wave in groups.chunks(MAX_IN_FLIGHT) {
            let sent = wave
                .iter()
                .map(|group| self.write_group(items, group, now))
                .collect();
            for (group, settled) in wave.iter().zip(join_all(sent).await) {
                for (write, settled) in group.iter().zip(settled?) {
                    match settled {
                        Settled::Answered(answer) => answers[write.item] = Some(answer),
                        Settled::Again(found) => {
                            starts[write.item] = Some(Start::Known(found));
                            again.push(write.item);
                        }
                    }
                }
            }
        }
        Ok(again)
    }

    /// The operations and value bytes a change of `key` adds to a transaction: its record,
    /// and its line in the transaction's index entry.
    fn cost(&self, key: &Key, change: &Change) -> (usize, usize) {
        let bytes = match change {
            Change::Put(record) => record.encode().len() + 2 * key.encoded().len() + 64,
            _ => key.encoded().len() + 16,
        };
        (1, bytes)
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
    /// `slot` of the transaction's revision. Refused: each item is decided again on what the
    /// failure branch read.
    async fn write_group<O>(
        &self,
        items: &[(Key, O)],
        group: &[Write],
        now: Millis,
    ) -> Result<Vec<Settled<O::Outcome>>, Error>
    where
        O: Operation + Clone,
    {
        let nonce = self.nonce();
        let mut compares = Vec::new();
        let mut ops = Vec::new();
        let mut gets = Vec::new();
        let mut decisions = Vec::new();
        let mut listed = Vec::new();
        for (slot, write) in group.iter().enumerate() {
            let key = &items[write.item].0;
            let record_key = self.layout.record(key);
            let decision = self.decide_item(items, write.item, write.current.as_ref(), now, slot);
            compares.push(unchanged(&record_key, write.current.as_ref()));
            if let Some(due) = self.write_ops(key, &decision.change, nonce, &mut ops) {
                listed.push((key.clone(), due));
            }
            gets.push(TxnOp::get(record_key, None));
            decisions.push(decision);
        }
        ops.extend(self.index_op(&listed, nonce));
        let txn = Txn::new().when(compares).and_then(ops).or_else(gets);
        let what = || format!("writing {} keys in one transaction", group.len());
        let answer = self.send(txn, what).await?;
        let (revision, responses) = match answer.sent {
            Sent::Applied { revision } => (Some(revision), Vec::new()),
            Sent::Refused { responses } if answer.ambiguous => {
                let mut revision = self.landed_at(items, group, &decisions, &responses, nonce);
                if revision.is_none() {
                    // Applied, then overwritten before the answer came back: the first put's
                    // older versions show it (the transaction applied all or nothing).
                    let first_put = group
                        .iter()
                        .zip(&decisions)
                        .enumerate()
                        .find(|(_, (_, d))| matches!(d.change, Change::Put(_)));
                    if let Some((i, (write, _))) = first_put {
                        let key = &items[write.item].0;
                        if let Ok(Some(now)) = self.stored_in(key, responses.get(i)) {
                            revision = self
                                .landed_before(key, write.current.as_ref(), &now, nonce)
                                .await?;
                        }
                    }
                }
                (revision, responses)
            }
            Sent::Refused { responses } => (None, responses),
        };
        if let Some(revision) = revision {
            return Ok(group
                .iter()
                .zip(decisions)
                .map(|(write, decision)| {
                    let key = &items[write.item].0;
                    let now = written(write.current.as_ref(), &decision.change, nonce, revision);
                    self.hints.note(key, now.as_ref());
                    Settled::Answered(Ok(at_revision::<O>(
                        &decision.change,
                        decision.outcome,
                        revision,
                    )))
                })
                .collect());
        }
        Ok(group
            .iter()
            .enumerate()
            .map(|(i, write)| {
                let key = &items[write.item].0;
                match self.stored_in(key, responses.get(i)) {
                    Ok(found) => {
                        self.hints.note(key, found.as_ref());
                        Settled::Again(found)
                    }
                    Err(error) => Settled::Answered(Err(error)),
                }
            })
            .collect())
    }

    /// After an ambiguous answer, the revision at which an earlier copy of a group's
    /// transaction was applied, if it was: a put of it holds its nonce (nonces are unique);
    /// a group of deletes only, if every key shows its delete.
    fn landed_at<O: Operation>(
        &self,
        items: &[(Key, O)],
        group: &[Write],
        decisions: &[Decision<O::Outcome>],
        responses: &[TxnOpResponse],
        nonce: super::layout::Nonce,
    ) -> Option<i64> {
        let mut all = true;
        for (i, (write, decision)) in group.iter().zip(decisions).enumerate() {
            let found = self
                .stored_in(&items[write.item].0, responses.get(i))
                .ok()?;
            if let Some(found) = found.as_ref().filter(|s| s.nonce == nonce) {
                return Some(found.mod_revision);
            }
            all &= landed(
                write.current.as_ref(),
                found.as_ref(),
                nonce,
                &decision.change,
            );
        }
        all.then_some(0)
    }
}

/// Runs `futures` concurrently on the calling task and returns their outputs in order.
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(done) => *output = Some(done),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|output| output.expect("every future finished"))
        .collect()
}
