//! The operations of a lease holder (complete, release, extend, review, recovery points) and
//! of an operator (resolve).

use redb::WriteTransaction;

use crate::clock::from_millis;
use crate::commit::{first, CommitKind, Committer};
use crate::decide::answer;
use crate::decide::op::{
    Complete, Completion, Extend, MarkNeedsReview, RecordStep, Release, Resolve,
};
use crate::decide::Resolution;
use crate::error::{Error, LeaseLostReason};
use crate::key::Key;
use crate::record::MAX_NOTE_LEN;
use crate::reservation::{Lease, Progress};
use crate::tables::Tables;

use super::Store;

impl Store {
    /// Stores `result` for the lease's key: duplicates get it until the retention ends.
    ///
    /// Completing again with the same lease is accepted and keeps the first result, so a
    /// caller that saw an error after its completion may have landed can safely retry.
    ///
    /// # Errors
    /// [`Error::ResultTooLarge`] over [`Builder::max_result_len`](crate::Builder::max_result_len);
    /// [`Error::LeaseLost`] when the reservation was taken over, released or swept (nothing
    /// is changed); storage errors as for [`reserve`](Store::reserve).
    pub fn complete(&self, lease: &Lease, result: impl Into<Vec<u8>>) -> Result<(), Error> {
        let result = result.into();
        self.check_result(lease, &result)?;
        let op = Complete {
            token: lease.token,
            result,
        };
        answer::completion(lease, self.committer.submit_one(lease.key.clone(), op)?)
    }

    /// [`complete`](Store::complete) for async code; no thread blocks while the commit is
    /// synced.
    ///
    /// # Backpressure
    /// At most 4,096 async requests wait in the commit queue; a future started when it is full
    /// waits (without queueing anything) until a batch makes room.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the completion: it may still be committed.
    ///
    /// # Errors
    /// As for [`complete`](Store::complete).
    pub async fn complete_async(
        &self,
        lease: &Lease,
        result: impl Into<Vec<u8>>,
    ) -> Result<(), Error> {
        let result = result.into();
        self.check_result(lease, &result)?;
        let op = Complete {
            token: lease.token,
            result,
        };
        let answer = self
            .committer
            .submit_async(vec![(lease.key.clone(), op)])
            .await;
        answer::completion(lease, first(answer)?)
    }

    /// Completes many leases with one shared commit. Returns one result per item, in order.
    ///
    /// A call whose results add up to more than one batch takes (64 MiB of log entries) is
    /// committed in several consecutive batches, each durable before this returns.
    ///
    /// # Errors
    /// The outer error is a failure of the batch (a poisoned store, a failed sync); when the
    /// call spanned several batches, the items of earlier ones may have been committed, as for
    /// any failed write. An item fails alone with
    /// [`Error::ResultTooLarge`] or [`Error::LeaseLost`].
    pub fn complete_many(
        &self,
        items: Vec<(&Lease, Vec<u8>)>,
    ) -> Result<Vec<Result<(), Error>>, Error> {
        let mut results: Vec<Option<Result<(), Error>>> = Vec::with_capacity(items.len());
        let mut ops = Vec::new();
        let mut leases = Vec::with_capacity(items.len());
        for (lease, result) in items {
            leases.push(lease);
            match self.check_result(lease, &result) {
                Ok(()) => {
                    results.push(None);
                    ops.push((
                        lease.key.clone(),
                        Complete {
                            token: lease.token,
                            result,
                        },
                    ));
                }
                Err(error) => results.push(Some(Err(error))),
            }
        }
        let mut outcomes = if ops.is_empty() {
            Vec::new()
        } else {
            self.committer.submit(ops)?
        }
        .into_iter();
        Ok(results
            .into_iter()
            .zip(leases)
            .map(|(result, lease)| {
                result.unwrap_or_else(|| {
                    let outcome = outcomes.next().expect("one outcome per queued item");
                    outcome.and_then(|outcome| answer::completion(lease, outcome))
                })
            })
            .collect())
    }

    pub(super) fn check_result(&self, lease: &Lease, result: &[u8]) -> Result<(), Error> {
        if result.len() > self.max_result_len {
            return Err(Error::ResultTooLarge {
                key: lease.key.clone(),
                len: result.len(),
                limit: self.max_result_len,
            });
        }
        Ok(())
    }

    /// Completes the lease's key and runs `f` in the same redb write transaction, so the
    /// caller's own writes (to its own tables in the store's file) and the completion commit
    /// together: "work done but key still pending" cannot survive a crash.
    ///
    /// `f` runs only if the lease still owns the key. If `f` returns an error, nothing is
    /// written and the key stays pending. Tables named `idemstore.*` belong to the store.
    /// `f` runs while the store's writer is held: reads of the store work inside it, but a
    /// call that needs the writer (a write, `checkpoint`, `sweep`, `stale`, inspection) fails
    /// with [`Error::Reentrant`].
    ///
    /// ```
    /// use idemstore::{redb::TableDefinition, Fingerprint, Key, Reservation, Store};
    ///
    /// const ORDERS: TableDefinition<&str, u64> = TableDefinition::new("orders");
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("shop.idem"))?;
    /// let key = Key::new("user-7", "checkout", "k1")?;
    /// if let Reservation::Acquired(lease) = store.reserve(&key, Fingerprint::of(b"cart"))? {
    ///     store.complete_with(&lease, b"order 1".to_vec(), |txn| {
    ///         txn.open_table(ORDERS)?.insert("order 1", 1999)?;
    ///         Ok::<_, idemstore::redb::Error>(())
    ///     })?;
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Durability
    /// The completion and the caller's writes are durable together when this returns.
    ///
    /// # Errors
    /// [`Error::Callback`] with `f`'s error (rolled back); [`Error::LeaseLost`] when the lease
    /// no longer owns the key, or already completed it (`f` does not run); otherwise as for
    /// [`complete`](Store::complete).
    pub fn complete_with<T, E>(
        &self,
        lease: &Lease,
        result: impl Into<Vec<u8>>,
        f: impl FnOnce(&WriteTransaction) -> Result<T, E>,
    ) -> Result<T, Error>
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let result = result.into();
        self.check_result(lease, &result)?;
        let op = Complete {
            token: lease.token,
            result,
        };
        self.committer.with_writer(|writer| {
            writer.transact(CommitKind::Durable, |writer, txn, now, written| {
                let mut tables = Tables::open(txn)?;
                let outcome = match writer.apply(&mut tables, &lease.key, op, now, written)? {
                    Ok(outcome) => outcome,
                    Err(corrupt) => return Ok(Err(corrupt)),
                };
                drop(tables);
                let reason = match outcome {
                    Ok(Completion::Stored) => {
                        let result = Committer::in_callback(|| f(txn));
                        return Ok(result.map_err(|e| Error::Callback { source: e.into() }));
                    }
                    // The caller's writes were committed with the first completion.
                    Ok(Completion::AlreadyCompleted) => LeaseLostReason::Completed {
                        by_token: lease.token,
                    },
                    Err(reason) => reason,
                };
                Ok(Err(answer::lease_lost(lease, reason)))
            })
        })
    }

    /// Deletes the lease's reservation if it is still pending under this lease, so the next
    /// request acquires the key afresh (the failure is not cached). Returns whether it did.
    ///
    /// Never deletes a completed key: `Ok(false)` when the key is completed (the completion
    /// may have landed even though the caller saw an error) or no longer stored.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when another lease took the key over or it is marked for review.
    pub fn release_if_pending(&self, lease: &Lease) -> Result<bool, Error> {
        let op = Release { token: lease.token };
        answer::with_lease(lease, self.committer.submit_one(lease.key.clone(), op)?)
    }

    /// [`release_if_pending`](Store::release_if_pending) for async code; no thread blocks
    /// while the release is synced.
    ///
    /// # Backpressure
    /// At most 4,096 async requests wait in the commit queue; a future started when it is full
    /// waits (without queueing anything) until a batch makes room.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the release: it may still be committed.
    ///
    /// # Errors
    /// As for [`release_if_pending`](Store::release_if_pending).
    pub async fn release_if_pending_async(&self, lease: &Lease) -> Result<bool, Error> {
        let op = Release { token: lease.token };
        let outcome = self
            .committer
            .submit_async(vec![(lease.key.clone(), op)])
            .await;
        answer::with_lease(lease, first(outcome)?)
    }

    /// Heartbeat for long work: renews the lease for another [`Builder::lease`](crate::Builder::lease) from now and
    /// returns the renewed lease.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when the reservation was taken over, completed or released.
    pub fn extend(&self, lease: &Lease) -> Result<Lease, Error> {
        let op = Extend { token: lease.token };
        let lease_until =
            answer::with_lease(lease, self.committer.submit_one(lease.key.clone(), op)?)?;
        Ok(Lease {
            lease_until: from_millis(lease_until),
            ..lease.clone()
        })
    }

    /// Parks the lease's key for a person: the outcome of the work is unknown (a payment
    /// gateway timed out, say) and must not be retried blindly. Duplicates get
    /// [`Reservation::NeedsReview`](crate::Reservation::NeedsReview) until [`resolve`](Store::resolve) is called. The key does
    /// not expire while under review.
    ///
    /// # Errors
    /// [`Error::NoteTooLarge`] over [`MAX_NOTE_LEN`](crate::MAX_NOTE_LEN) bytes;
    /// [`Error::LeaseLost`] when the lease no longer owns the key.
    pub fn mark_needs_review(&self, lease: &Lease, note: &str) -> Result<(), Error> {
        if note.len() > MAX_NOTE_LEN {
            return Err(Error::NoteTooLarge {
                key: lease.key.clone(),
                len: note.len(),
            });
        }
        let op = MarkNeedsReview {
            token: lease.token,
            note: note.to_string(),
        };
        answer::with_lease(lease, self.committer.submit_one(lease.key.clone(), op)?)
    }

    /// Records a recovery point for multi-step work: step `step` is done, with `data` (what
    /// is needed to resume after it, an external id say). It is durable when this returns. If
    /// this holder dies, the caller that takes the stale reservation over finds it in
    /// [`Lease::progress`] and resumes after that step instead of starting again.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idemstore::{Fingerprint, Key, ManualClock, Reservation, Store};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let clock = ManualClock::new();
    /// let store = Store::builder().clock(clock.clone()).lease(Duration::from_secs(30))
    ///     .open(dir.path().join("steps.idem"))?;
    /// let key = Key::new("user-7", "checkout", "k1")?;
    /// let fp = Fingerprint::of(b"cart");
    /// let Reservation::Acquired(first) = store.reserve(&key, fp)? else { unreachable!() };
    /// store.record_step(&first, 1, b"charge ch_42")?; // step 1: card charged
    /// // ... the process dies here; the lease runs out ...
    /// clock.advance(Duration::from_secs(31));
    /// let Reservation::Acquired(second) = store.reserve(&key, fp)? else { unreachable!() };
    /// let resume = second.progress().expect("recovery point kept");
    /// assert_eq!((resume.step, resume.data.as_slice()), (1, &b"charge ch_42"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::ResultTooLarge`] when `data` is over [`Builder::max_result_len`](crate::Builder::max_result_len);
    /// [`Error::LeaseLost`] when the lease no longer owns the key.
    pub fn record_step(&self, lease: &Lease, step: u32, data: &[u8]) -> Result<(), Error> {
        self.check_result(lease, data)?;
        let op = RecordStep {
            token: lease.token,
            progress: Progress {
                step,
                data: data.to_vec(),
            },
        };
        answer::with_lease(lease, self.committer.submit_one(lease.key.clone(), op)?)
    }

    /// Operator action on a key marked for review or a stale reservation: store a result
    /// ([`Resolution::Complete`]) or delete the key ([`Resolution::Release`]).
    ///
    /// # Errors
    /// [`Error::NotResolvable`] when the key is absent, completed or held by a live lease.
    pub fn resolve(&self, key: &Key, resolution: Resolution) -> Result<(), Error> {
        if let Resolution::Complete(result) = &resolution {
            if result.len() > self.max_result_len {
                return Err(Error::ResultTooLarge {
                    key: key.clone(),
                    len: result.len(),
                    limit: self.max_result_len,
                });
            }
        }
        let outcome = self
            .committer
            .submit_one(key.clone(), Resolve(resolution))?;
        answer::resolved(key, outcome)
    }
}
