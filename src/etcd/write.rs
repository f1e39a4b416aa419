//! The one write path: read the key's record, [`decide`], write with a compare on the record's
//! revision, and retry on conflict. Ambiguous answers are settled by sending the same
//! conditional transaction again and reading what it finds, never by guessing.

use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};

use super::layout::{self, placeholder, resolve_token, Listed, Nonce, Stored};
use super::store::Inner;

use crate::decide::{decide, Change, Operation};
use crate::error::Error;
use crate::key::Key;
use crate::record::Millis;

/// What an operation is first decided on.
pub(crate) enum Start {
    /// The record read from the cluster first (one linearizable read).
    Read,
    /// A guess (what this process last wrote, or absent): the write goes out at once under a
    /// compare on it, and a wrong guess only costs the refused compare, whose failure branch
    /// reads the record.
    Guess(Option<Stored>),
    /// The record as a transaction's failure branch just read it.
    Known(Option<Stored>),
}

/// The record as `change` left it, written at `revision` over `before`: what a read would
/// now return.
pub(crate) fn written(
    before: Option<&Stored>,
    change: &Change,
    nonce: Nonce,
    revision: i64,
) -> Option<Stored> {
    match change {
        Change::Put(record) => {
            let mut record = record.clone();
            record.token = resolve_token(record.token, revision);
            Some(Stored {
                record,
                nonce,
                mod_revision: revision,
                create_revision: before.map_or(revision, |b| b.create_revision),
            })
        }
        Change::Delete | Change::Keep => None,
    }
}

/// An index entry as read: its etcd key, when it is due, and the records it speaks for.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) name: Vec<u8>,
    pub(crate) due: Millis,
    pub(crate) listed: Vec<Listed>,
}

/// What became of a conditional transaction.
pub(crate) enum Sent {
    /// Its compares held and it was applied at this revision.
    Applied { revision: i64 },
    /// A compare failed; the failure branch's responses (the keys' current values).
    Refused { responses: Vec<TxnOpResponse> },
}

/// The answer to a sent transaction, and whether an earlier copy of it may have been applied
/// (a transport error or timeout after it was sent).
pub(crate) struct Answer {
    pub(crate) sent: Sent,
    pub(crate) ambiguous: bool,
}

/// The compare that makes a write conditional on the record being as it was read.
pub(crate) fn unchanged(record_key: &[u8], current: Option<&Stored>) -> Compare {
    match current {
        Some(stored) => {
            Compare::mod_revision(record_key.to_vec(), CompareOp::Equal, stored.mod_revision)
        }
        None => Compare::create_revision(record_key.to_vec(), CompareOp::Equal, 0),
    }
}

impl Inner {
    /// A nonce no other write of any store uses.
    pub(crate) fn nonce(&self) -> Nonce {
        Nonce {
            store: self.store_id,
            write: self
                .writes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// The write that turns the record into `change` for `key` (a put or a delete), and when
    /// the new record is due (see [`layout::due`]): the transaction's index entry must list
    /// it ([`index_op`](Inner::index_op)). A delete needs no entry: older entries that name
    /// the key are spent, and sweeping deletes them.
    pub(crate) fn write_ops(
        &self,
        key: &Key,
        change: &Change,
        nonce: Nonce,
        ops: &mut Vec<TxnOp>,
    ) -> Option<Millis> {
        let record_key = self.layout.record(key);
        match change {
            Change::Keep => None,
            Change::Put(record) => {
                ops.push(TxnOp::put(record_key, layout::encode(record, nonce), None));
                layout::due(record)
            }
            Change::Delete => {
                ops.push(TxnOp::delete(record_key, None));
                None
            }
        }
    }

    /// The one index entry of a transaction that puts the records `listed` (with when each
    /// is due), due at the earliest of them; `None` when none is due ever.
    pub(crate) fn index_op(&self, listed: &[(Key, Millis)], nonce: Nonce) -> Option<TxnOp> {
        let due = listed.iter().map(|(_, due)| *due).min()?;
        let keys: Vec<Listed> = listed
            .iter()
            .map(|(key, _)| Listed {
                key: key.clone(),
                revision: 0,
            })
            .collect();
        Some(TxnOp::put(
            self.layout.entry(due, nonce, false),
            layout::encode_entry(&keys),
            None,
        ))
    }

    /// Sends `txn`, again and again while the cluster gives no definite answer, up to the
    /// store's operation deadline. Resending is safe: every write carries compares that fail
    /// once an earlier copy was applied.
    pub(crate) async fn send(&self, txn: Txn, what: impl Fn() -> String) -> Result<Answer, Error> {
        let started = Instant::now();
        let mut ambiguous = false;
        let mut pause = Duration::from_millis(20);
        loop {
            let mut kv = self.client.kv_client();
            match kv.txn(txn.clone()).await {
                Ok(response) => {
                    return Ok(Answer {
                        sent: sent(response),
                        ambiguous,
                    })
                }
                Err(error) if refused(&error) => {
                    let landed = if ambiguous {
                        "an earlier copy may or may not have been applied"
                    } else {
                        "nothing was applied"
                    };
                    return Err(Error::Cluster {
                        context: format!("{}; the cluster refused the request, {landed}", what()),
                        source: Box::new(error),
                    });
                }
                Err(error) => {
                    ambiguous = true;
                    if started.elapsed() + pause > self.op_deadline {
                        return Err(Error::Cluster {
                            context: format!(
                                "{}; no answer within {:?}, so the write may or may not have been applied",
                                what(),
                                self.op_deadline
                            ),
                            source: Box::new(error),
                        });
                    }
                    tokio::time::sleep(pause).await;
                    self.resends
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        }
    }

    /// A linearizable read of `key`'s record, expired or not, retried like a write.
    pub(crate) async fn read(&self, key: &Key) -> Result<Option<Stored>, Error> {
        let txn = Txn::new().and_then(vec![TxnOp::get(self.layout.record(key), None)]);
        let answer = self.send(txn, || format!("reading key {key}")).await?;
        let responses = match answer.sent {
            Sent::Applied { .. } => return Err(no_response(key)),
            Sent::Refused { responses } => responses,
        };
        self.stored_in(key, responses.first())
    }

    /// The record in a get response, decoded.
    pub(crate) fn stored_in(
        &self,
        key: &Key,
        response: Option<&TxnOpResponse>,
    ) -> Result<Option<Stored>, Error> {
        let Some(TxnOpResponse::Get(get)) = response else {
            return Err(no_response(key));
        };
        get.kvs()
            .first()
            .map(|kv| {
                layout::decode(kv.value(), kv.mod_revision(), kv.create_revision()).map_err(
                    |reason| crate::StorageError::Corruption {
                        location: format!("etcd record of key {key}"),
                        reason,
                    },
                )
            })
            .transpose()
            .map_err(Into::into)
    }

    /// After an ambiguous answer whose put did not show its nonce: whether an earlier copy
    /// landed and was overwritten since (a takeover during a long election). Walks the key's
    /// older versions back from `found` (etcd keeps them until compaction), up to 8, while
    /// they are newer than what the write compared on; `Some(revision)` of the version that
    /// holds `nonce`.
    pub(crate) async fn landed_before(
        &self,
        key: &Key,
        before: Option<&Stored>,
        found: &Stored,
        nonce: Nonce,
    ) -> Result<Option<i64>, Error> {
        let floor = before.map_or(0, |b| b.mod_revision);
        let mut at = found.mod_revision;
        for _ in 0..8 {
            if at - 1 <= floor {
                return Ok(None);
            }
            let options = GetOptions::new().with_revision(at - 1);
            let txn = Txn::new().and_then(vec![TxnOp::get(self.layout.record(key), Some(options))]);
            let answer = self
                .send(txn, || format!("reading an earlier version of key {key}"))
                .await?;
            let Sent::Refused { responses } = answer.sent else {
                return Ok(None);
            };
            let Some(older) = self.stored_in(key, responses.first())? else {
                return Ok(None);
            };
            if older.mod_revision <= floor {
                return Ok(None);
            }
            if older.nonce == nonce {
                return Ok(Some(older.mod_revision));
            }
            at = older.mod_revision;
        }
        Ok(None)
    }

    /// Where an operation on `key` starts: what this process last wrote of it (a pending
    /// record it holds), else absent when `absent_first` (a reserve, an observe: most keys
    /// asked for are new), else a read.
    pub(crate) fn start(&self, key: &Key, absent_first: bool) -> Start {
        match self.hints.get(key) {
            Some(stored) => Start::Guess(Some(stored)),
            None if absent_first => Start::Guess(None),
            None => Start::Read,
        }
    }

    /// Applies `op` to `key` through [`decide`], starting from what this process last wrote
    /// of the key, else from a read; see [`apply_from`](Inner::apply_from).
    pub(crate) async fn apply<O>(
        &self,
        key: &Key,
        op: O,
        extra: &[TxnOp],
    ) -> Result<O::Outcome, Error>
    where
        O: Operation + Clone,
    {
        self.apply_from(key, op, extra, self.start(key, false))
            .await
    }

    /// Applies `op` to `key` through [`decide`]: decide on the record as `start` has it,
    /// write if the record is unchanged, else decide again on what the write's failure branch
    /// read. A decision that changes nothing is answered only from a record read from the
    /// cluster, never from a guess. `extra` joins the caller's own operations to a write (for
    /// `complete_with`); they are not sent when nothing changes.
    pub(crate) async fn apply_from<O>(
        &self,
        key: &Key,
        op: O,
        extra: &[TxnOp],
        start: Start,
    ) -> Result<O::Outcome, Error>
    where
        O: Operation + Clone,
    {
        let record_key = self.layout.record(key);
        let (mut current, mut guessed) = match start {
            Start::Read => (self.read(key).await?, false),
            Start::Guess(stored) => (stored, true),
            Start::Known(stored) => (stored, false),
        };
        loop {
            let decision = decide(
                current.as_ref().map(|s| s.record.clone()),
                op.clone(),
                self.now(),
                self.policies.for_key(key),
                placeholder(0),
            );
            if decision.change == Change::Keep {
                if guessed {
                    current = self.read(key).await?;
                    guessed = false;
                    continue;
                }
                return Ok(decision.outcome);
            }
            let nonce = self.nonce();
            let mut ops = extra.to_vec();
            let due = self.write_ops(key, &decision.change, nonce, &mut ops);
            if let Some(due) = due {
                ops.extend(self.index_op(&[(key.clone(), due)], nonce));
            }
            let txn = Txn::new()
                .when(vec![unchanged(&record_key, current.as_ref())])
                .and_then(ops)
                .or_else(vec![TxnOp::get(record_key.clone(), None)]);
            let answer = self.send(txn, || format!("writing key {key}")).await?;
            match answer.sent {
                Sent::Applied { revision } => {
                    let written = written(current.as_ref(), &decision.change, nonce, revision);
                    self.hints.note(key, written.as_ref());
                    return Ok(at_revision::<O>(
                        &decision.change,
                        decision.outcome,
                        revision,
                    ));
                }
                Sent::Refused { responses } => {
                    let found = self.stored_in(key, responses.first())?;
                    self.hints.note(key, found.as_ref());
                    if answer.ambiguous
                        && landed(current.as_ref(), found.as_ref(), nonce, &decision.change)
                    {
                        // An earlier copy of this very write was applied.
                        let revision = found.as_ref().map_or(0, |s| s.mod_revision);
                        return Ok(at_revision::<O>(
                            &decision.change,
                            decision.outcome,
                            revision,
                        ));
                    }
                    if let (true, Change::Put(_), Some(now)) =
                        (answer.ambiguous, &decision.change, found.as_ref())
                    {
                        // Applied, then overwritten (taken over) before the answer came back.
                        if let Some(revision) = self
                            .landed_before(key, current.as_ref(), now, nonce)
                            .await?
                        {
                            return Ok(at_revision::<O>(
                                &decision.change,
                                decision.outcome,
                                revision,
                            ));
                        }
                    }
                    current = found;
                    guessed = false;
                }
            }
        }
    }

    /// Up to `limit` index entries in `[start, end)`, in index order, decoded, each listed
    /// revision 0 replaced by the entry's own revision.
    ///
    /// # Errors
    /// [`StorageError::Corruption`](crate::StorageError::Corruption) naming a damaged entry; [`Error::Cluster`].
    pub(crate) async fn index_entries(
        &self,
        start: Vec<u8>,
        end: Vec<u8>,
        limit: usize,
        what: &str,
    ) -> Result<Vec<Entry>, Error> {
        let options = GetOptions::new()
            .with_range(end)
            .with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
        let txn = Txn::new().and_then(vec![TxnOp::get(start, Some(options))]);
        let answer = self.send(txn, || what.to_string()).await?;
        let Sent::Refused { responses } = answer.sent else {
            return Ok(Vec::new());
        };
        let Some(TxnOpResponse::Get(get)) = responses.first() else {
            return Ok(Vec::new());
        };
        get.kvs()
            .iter()
            .map(|kv| {
                let damaged = |reason: String| crate::StorageError::Corruption {
                    location: format!(
                        "etcd index entry {}",
                        String::from_utf8_lossy(kv.key()).escape_debug()
                    ),
                    reason,
                };
                let due = self
                    .layout
                    .due_of(kv.key())
                    .ok_or_else(|| damaged("its name holds no time".into()))?;
                let mut listed = layout::decode_entry(kv.value()).map_err(damaged)?;
                for item in &mut listed {
                    if item.revision == 0 {
                        item.revision = kv.create_revision();
                    }
                }
                Ok(Entry {
                    name: kv.key().to_vec(),
                    due,
                    listed,
                })
            })
            .collect()
    }

    /// Checks the prefix's layout version, and writes it on a prefix without records.
    ///
    /// # Errors
    /// [`OpenError::InvalidConfig`](crate::OpenError::InvalidConfig) naming the prefix and both versions when the prefix holds
    /// another layout version (records without a version key are version 1);
    /// [`Error::Cluster`].
    pub(crate) async fn check_layout(&self) -> Result<(), Error> {
        let version_key = self.layout.version();
        let (records, records_end) = (self.layout.records(), self.layout.records_end());
        let one = || {
            GetOptions::new()
                .with_range(records_end.clone())
                .with_keys_only()
                .with_limit(1)
        };
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                version_key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then(vec![TxnOp::get(records.clone(), Some(one()))])
            .or_else(vec![TxnOp::get(version_key.clone(), None)]);
        let answer = self
            .send(txn, || "checking the prefix's layout version".to_string())
            .await?;
        let Sent::Refused { responses } = answer.sent else {
            return Err(no_response_for("the prefix's layout version"));
        };
        let Some(TxnOpResponse::Get(get)) = responses.first() else {
            return Err(no_response_for("the prefix's layout version"));
        };
        let found = match get.kvs().first() {
            // The success branch read the records: there are some, and no version key.
            Some(kv) if kv.key() != version_key.as_slice() => Some(1),
            Some(kv) => Some(kv.value().first().copied().unwrap_or(0)),
            None => None,
        };
        match found {
            Some(version) if version == layout::LAYOUT_VERSION => Ok(()),
            Some(version) => Err(crate::OpenError::InvalidConfig {
                setting: "prefix",
                reason: format!(
                    "prefix `{}` holds idemstore's etcd layout version {version}; this build \
                     reads and writes version {}: drain the keys with the build that wrote \
                     them, then delete the prefix (`etcdctl del --prefix`), or use another \
                     prefix (docs/etcd.md, \"Layout versions\")",
                    String::from_utf8_lossy(self.layout.prefix()).escape_debug(),
                    layout::LAYOUT_VERSION
                ),
            }
            .into()),
            None => {
                // An empty prefix: this store writes it in the current layout.
                let txn = Txn::new()
                    .when(vec![Compare::create_revision(
                        version_key.clone(),
                        CompareOp::Equal,
                        0,
                    )])
                    .and_then(vec![TxnOp::put(
                        version_key,
                        vec![layout::LAYOUT_VERSION],
                        None,
                    )]);
                self.send(txn, || "writing the prefix's layout version".to_string())
                    .await?;
                Ok(())
            }
        }
    }

    /// The records of `keys` read in one transaction (at one revision).
    pub(crate) async fn read_many(
        &self,
        keys: &[Key],
    ) -> Result<Vec<Result<Option<Stored>, Error>>, Error> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let ops = keys
            .iter()
            .map(|key| TxnOp::get(self.layout.record(key), None))
            .collect::<Vec<_>>();
        let answer = self
            .send(Txn::new().and_then(ops), || {
                format!("reading {} keys", keys.len())
            })
            .await?;
        let responses = match answer.sent {
            Sent::Refused { responses } => responses,
            Sent::Applied { .. } => Vec::new(),
        };
        Ok(keys
            .iter()
            .enumerate()
            .map(|(i, key)| self.stored_in(key, responses.get(i)))
            .collect())
    }
}

/// Whether the cluster refused the request for good (an invalid or oversized request, no
/// permission): resending cannot help. Every other error (unavailable, timed out, leader
/// changed, too many requests) is retried.
fn refused(error: &etcd_client::Error) -> bool {
    // gRPC codes: 3 invalid argument, 5 not found, 6 already exists, 7 permission denied,
    // 9 failed precondition, 11 out of range, 12 unimplemented, 16 unauthenticated.
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            matches!(status.code() as i32, 3 | 5 | 6 | 7 | 9 | 11 | 12 | 16)
        }
        etcd_client::Error::InvalidArgs(_) => true,
        _ => false,
    }
}

/// A read-only transaction (no compares) "succeeds" with its reads in the success branch; a
/// write's compares decide. Both are turned into [`Sent`]: reads come back as `Refused` with
/// their responses, so callers look in one place.
fn sent(response: TxnResponse) -> Sent {
    let revision = response.header().map_or(0, |h| h.revision());
    let responses = response.op_responses();
    let is_write = responses
        .iter()
        .any(|r| !matches!(r, TxnOpResponse::Get(_)));
    if response.succeeded() && is_write {
        Sent::Applied { revision }
    } else {
        Sent::Refused { responses }
    }
}

/// Whether an ambiguous earlier copy of a write was applied: a put left its nonce in the key;
/// a delete left the key absent or re-created after the revision it compared on.
pub(crate) fn landed(
    before: Option<&Stored>,
    found: Option<&Stored>,
    nonce: Nonce,
    change: &Change,
) -> bool {
    match change {
        Change::Keep => false,
        Change::Put(_) => found.is_some_and(|s| s.nonce == nonce),
        Change::Delete => match (before, found) {
            (Some(_), None) => true,
            (Some(before), Some(found)) => found.create_revision > before.mod_revision,
            (None, _) => false,
        },
    }
}

/// An outcome as it is answered once its write landed at `revision`: an acquisition's
/// placeholder token (the one its record was written with) becomes its real token (see
/// [`resolve_token`]). Every other outcome is answered as decided.
pub(crate) fn at_revision<O: Operation>(
    change: &Change,
    outcome: O::Outcome,
    revision: i64,
) -> O::Outcome {
    match change {
        Change::Put(record) => {
            O::outcome_with_token(outcome, resolve_token(record.token, revision))
        }
        Change::Delete | Change::Keep => outcome,
    }
}

fn no_response_for(what: &str) -> Error {
    Error::Cluster {
        context: format!("reading {what}"),
        source: "the cluster's answer held no read response".into(),
    }
}

fn no_response(key: &Key) -> Error {
    Error::Cluster {
        context: format!("reading key {key}"),
        source: "the cluster's answer held no read response".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::Reserved;
    use crate::fingerprint::Fingerprint;
    use crate::record::{Record, State};

    fn stored(nonce: Nonce, mod_revision: i64, create_revision: i64) -> Stored {
        Stored {
            record: Record {
                fingerprint: Fingerprint::of(b"b"),
                token: 1,
                attempt: 1,
                expires_at: 10,
                state: State::Pending {
                    lease_until: 5,
                    progress: None,
                },
            },
            nonce,
            mod_revision,
            create_revision,
        }
    }

    const OURS: Nonce = Nonce { store: 1, write: 7 };
    const THEIRS: Nonce = Nonce { store: 2, write: 7 };

    #[test]
    fn a_put_landed_only_if_its_nonce_is_there() {
        let put = Change::Put(stored(OURS, 0, 0).record);
        assert!(landed(None, Some(&stored(OURS, 9, 9)), OURS, &put));
        assert!(!landed(None, Some(&stored(THEIRS, 9, 9)), OURS, &put));
        assert!(!landed(None, None, OURS, &put));
        assert!(!landed(
            None,
            Some(&stored(OURS, 9, 9)),
            OURS,
            &Change::Keep
        ));
    }

    #[test]
    fn a_delete_landed_if_the_key_is_gone_or_was_created_again_since() {
        let before = stored(THEIRS, 5, 3);
        assert!(landed(Some(&before), None, OURS, &Change::Delete));
        assert!(landed(
            Some(&before),
            Some(&stored(THEIRS, 8, 8)),
            OURS,
            &Change::Delete
        ));
        // Changed but never deleted: the compare failed for another reason.
        assert!(!landed(
            Some(&before),
            Some(&stored(THEIRS, 8, 3)),
            OURS,
            &Change::Delete
        ));
        assert!(!landed(None, None, OURS, &Change::Delete));
    }

    #[test]
    fn tokens_are_given_only_to_acquisitions() {
        use crate::decide::{Completion, Reserve};
        let reserve = Reserve {
            fingerprint: Fingerprint::of(b"b"),
        };
        let policy = crate::decide::Policy {
            lease: 5,
            retention: 10,
            floor: crate::record::TokenFloor::NONE,
        };
        let acquired = decide(None, reserve, 0, policy, placeholder(2));
        match at_revision::<Reserve>(&acquired.change, acquired.outcome, 40) {
            Reserved::Acquired { token, .. } => assert_eq!(token, (40 << 10) | 2),
            other => panic!("{other:?}"),
        }
        let replay = Reserved::InProgress {
            retry_after: Duration::from_millis(5),
            attempt: 1,
        };
        assert_eq!(
            at_revision::<Reserve>(&Change::Keep, replay.clone(), 40),
            replay
        );
        assert_eq!(
            at_revision::<crate::decide::Complete>(&Change::Delete, Ok(Completion::Stored), 40),
            Ok(Completion::Stored)
        );
    }
}
