//! The operations of a lease holder (complete, release, extend, review, recovery points) and
//! of an operator (resolve).

use std::sync::Arc;

use redb::WriteTransaction;

use crate::answers::Lease;
use crate::commit::{first, CommitKind, Committer};
use crate::decide::answer;
use crate::decide::Resolution;
use crate::decide::{Complete, Completion, Extend, MarkNeedsReview, RecordStep, Release, Resolve};
use crate::error::{Error, LeaseLostReason};
use crate::key::Key;
use crate::record::Progress;
use crate::tree::Tables;

use super::many::extended;
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
                let engine = Arc::clone(&writer.engine);
                let mut tables = Tables::open(txn, &engine.windows)?;
                let outcome = match writer.decide_into(&mut tables, &lease.key, op, now, written)? {
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
        extended(lease, self.committer.submit_one(lease.key.clone(), op)?)
    }

    /// [`extend`](Store::extend) for async code; no thread blocks while the renewal is
    /// synced.
    ///
    /// # Backpressure
    /// At most 4,096 async requests wait in the commit queue; a future started when it is full
    /// waits (without queueing anything) until a batch makes room.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the renewal: it may still be committed, and then
    /// the lease runs until the renewed deadline.
    ///
    /// # Errors
    /// As for [`extend`](Store::extend).
    pub async fn extend_async(&self, lease: &Lease) -> Result<Lease, Error> {
        let op = Extend { token: lease.token };
        let outcome = self
            .committer
            .submit_async(vec![(lease.key.clone(), op)])
            .await;
        extended(lease, first(outcome)?)
    }

    /// Parks the lease's key for a person: the outcome of the work is unknown (a payment
    /// gateway timed out, say) and must not be retried blindly. Duplicates get
    /// [`Reservation::NeedsReview`](crate::Reservation::NeedsReview) until [`resolve`](Store::resolve) is called. The key does
    /// not expire while under review.
    ///
    /// # Errors
    /// [`Error::NoteTooLarge`] over [`Key::MAX_NOTE_LEN`](crate::Key::MAX_NOTE_LEN) bytes;
    /// [`Error::LeaseLost`] when the lease no longer owns the key.
    pub fn mark_needs_review(&self, lease: &Lease, note: &str) -> Result<(), Error> {
        let op = mark_op(lease, note)?;
        answer::with_lease(lease, self.committer.submit_one(lease.key.clone(), op)?)
    }

    /// [`mark_needs_review`](Store::mark_needs_review) for async code; no thread blocks while
    /// the mark is synced.
    ///
    /// # Backpressure
    /// At most 4,096 async requests wait in the commit queue; a future started when it is full
    /// waits (without queueing anything) until a batch makes room.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the mark: it may still be committed, and then
    /// the key is under review.
    ///
    /// # Errors
    /// As for [`mark_needs_review`](Store::mark_needs_review).
    pub async fn mark_needs_review_async(&self, lease: &Lease, note: &str) -> Result<(), Error> {
        let op = mark_op(lease, note)?;
        let outcome = self
            .committer
            .submit_async(vec![(lease.key.clone(), op)])
            .await;
        answer::with_lease(lease, first(outcome)?)
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
        let op = self.step_op(lease, step, data)?;
        answer::with_lease(lease, self.committer.submit_one(lease.key.clone(), op)?)
    }

    /// [`record_step`](Store::record_step) for async code; no thread blocks while the
    /// recovery point is synced.
    ///
    /// # Backpressure
    /// At most 4,096 async requests wait in the commit queue; a future started when it is full
    /// waits (without queueing anything) until a batch makes room.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the recovery point: it may still be committed,
    /// and then a takeover finds it in [`Lease::progress`].
    ///
    /// # Errors
    /// As for [`record_step`](Store::record_step).
    pub async fn record_step_async(
        &self,
        lease: &Lease,
        step: u32,
        data: &[u8],
    ) -> Result<(), Error> {
        let op = self.step_op(lease, step, data)?;
        let outcome = self
            .committer
            .submit_async(vec![(lease.key.clone(), op)])
            .await;
        answer::with_lease(lease, first(outcome)?)
    }

    fn step_op(&self, lease: &Lease, step: u32, data: &[u8]) -> Result<RecordStep, Error> {
        self.check_result(lease, data)?;
        Ok(RecordStep {
            token: lease.token,
            progress: Progress {
                step,
                data: data.to_vec(),
            },
        })
    }

    /// Operator action on a key marked for review or a stale reservation: store a result
    /// ([`Resolution::Complete`]) or delete the key ([`Resolution::Release`]).
    ///
    /// There is no `resolve_many` (nor a `_many` form of [`record_step`](Store::record_step)
    /// or [`mark_needs_review`](Store::mark_needs_review)): each of these follows its own
    /// check (at the external service, or of the work's progress), one key at a time, and
    /// concurrent calls already share one commit and one log sync.
    ///
    /// # Errors
    /// [`Error::ResultTooLarge`] over [`Builder::max_result_len`](crate::Builder::max_result_len);
    /// [`Error::NotResolvable`] when the key is absent, completed or held by a live lease.
    pub fn resolve(&self, key: &Key, resolution: Resolution) -> Result<(), Error> {
        self.check_resolution(key, &resolution)?;
        let outcome = self
            .committer
            .submit_one(key.clone(), Resolve(resolution))?;
        answer::resolved(key, outcome)
    }

    /// [`resolve`](Store::resolve) for async code; no thread blocks while the resolution is
    /// synced.
    ///
    /// # Backpressure
    /// At most 4,096 async requests wait in the commit queue; a future started when it is full
    /// waits (without queueing anything) until a batch makes room.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the resolution: it may still be committed.
    ///
    /// # Errors
    /// As for [`resolve`](Store::resolve).
    pub async fn resolve_async(&self, key: &Key, resolution: Resolution) -> Result<(), Error> {
        self.check_resolution(key, &resolution)?;
        let outcome = self
            .committer
            .submit_async(vec![(key.clone(), Resolve(resolution))])
            .await;
        answer::resolved(key, first(outcome)?)
    }

    pub(super) fn check_resolution(&self, key: &Key, resolution: &Resolution) -> Result<(), Error> {
        if let Resolution::Complete(result) = resolution {
            if result.len() > self.max_result_len {
                return Err(Error::ResultTooLarge {
                    key: key.clone(),
                    len: result.len(),
                    limit: self.max_result_len,
                });
            }
        }
        Ok(())
    }
}

/// The operation that marks `lease`'s key for review with `note`, once the note's size is
/// checked.
fn mark_op(lease: &Lease, note: &str) -> Result<MarkNeedsReview, Error> {
    if note.len() > Key::MAX_NOTE_LEN {
        return Err(Error::NoteTooLarge {
            key: lease.key.clone(),
            len: note.len(),
        });
    }
    Ok(MarkNeedsReview {
        token: lease.token,
        note: note.to_string(),
    })
}
