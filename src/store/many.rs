//! The batch forms of the lease operations: one shared commit (one log sync) for many leases,
//! sync and async. Each item is answered on its own; the outer error fails the whole batch.
//!
//! `record_step`, `mark_needs_review` and `resolve` have no batch form: see
//! [`Store::resolve`].

use crate::answers::Lease;
use crate::clock::from_millis;
use crate::commit::Kind;
use crate::decide::answer;
use crate::decide::Operation;
use crate::decide::{Complete, Extend, Release};
use crate::error::Error;
use crate::key::Key;

use super::Store;

/// A batch of one operation per lease: the operations to submit, and the items refused
/// before submitting (a result over the size limit).
struct Batch<'a, O> {
    leases: Vec<&'a Lease>,
    refused: Vec<Option<Error>>,
    ops: Vec<(Key, O)>,
}

impl<'a, O: Operation> Batch<'a, O> {
    fn new(items: impl IntoIterator<Item = (&'a Lease, Result<O, Error>)>) -> Batch<'a, O> {
        let mut batch = Batch {
            leases: Vec::new(),
            refused: Vec::new(),
            ops: Vec::new(),
        };
        for (lease, op) in items {
            batch.leases.push(lease);
            match op {
                Ok(op) => {
                    batch.refused.push(None);
                    batch.ops.push((lease.key.clone(), op));
                }
                Err(error) => batch.refused.push(Some(error)),
            }
        }
        batch
    }

    /// Takes the operations to submit; `None` when every item was refused.
    fn take_ops(&mut self) -> Option<Vec<(Key, O)>> {
        (!self.ops.is_empty()).then(|| std::mem::take(&mut self.ops))
    }

    /// One answer per item, in order.
    fn answer<T>(
        self,
        outcomes: Result<Vec<Result<O::Outcome, Error>>, Error>,
        map: impl Fn(&Lease, O::Outcome) -> Result<T, Error>,
    ) -> Result<Vec<Result<T, Error>>, Error> {
        let mut outcomes = outcomes?.into_iter();
        Ok(self
            .refused
            .into_iter()
            .zip(self.leases)
            .map(|(refused, lease)| match refused {
                Some(error) => Err(error),
                None => {
                    let outcome = outcomes.next().expect("one outcome per queued item");
                    outcome.and_then(|outcome| map(lease, outcome))
                }
            })
            .collect())
    }
}

impl Store {
    fn run_batch<O: Kind, T>(
        &self,
        mut batch: Batch<'_, O>,
        map: impl Fn(&Lease, O::Outcome) -> Result<T, Error>,
    ) -> Result<Vec<Result<T, Error>>, Error> {
        let outcomes = match batch.take_ops() {
            Some(ops) => self.committer.submit(ops),
            None => Ok(Vec::new()),
        };
        batch.answer(outcomes, map)
    }

    async fn run_batch_async<O: Kind + Unpin, T>(
        &self,
        mut batch: Batch<'_, O>,
        map: impl Fn(&Lease, O::Outcome) -> Result<T, Error>,
    ) -> Result<Vec<Result<T, Error>>, Error> {
        let outcomes = match batch.take_ops() {
            Some(ops) => self.committer.submit_async(ops).await,
            None => Ok(Vec::new()),
        };
        batch.answer(outcomes, map)
    }

    fn completions<'a>(&self, items: Vec<(&'a Lease, Vec<u8>)>) -> Batch<'a, Complete> {
        Batch::new(items.into_iter().map(|(lease, result)| {
            let op = self.check_result(lease, &result).map(|()| Complete {
                token: lease.token,
                result,
            });
            (lease, op)
        }))
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
        self.run_batch(self.completions(items), answer::completion)
    }

    /// [`complete_many`](Store::complete_many) for async code; no thread blocks while the
    /// batch is synced.
    ///
    /// # Backpressure
    /// At most 4,096 async requests wait in the commit queue; a future started when it is full
    /// waits (without queueing anything) until a batch makes room.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the completions: they may still be committed.
    ///
    /// # Errors
    /// As for [`complete_many`](Store::complete_many).
    pub async fn complete_many_async(
        &self,
        items: Vec<(&Lease, Vec<u8>)>,
    ) -> Result<Vec<Result<(), Error>>, Error> {
        self.run_batch_async(self.completions(items), answer::completion)
            .await
    }

    /// [`release_if_pending`](Store::release_if_pending) for many leases with one shared
    /// commit (a batch whose work failed as a whole). Returns one result per lease, in order.
    ///
    /// # Errors
    /// The outer error is a failure of the whole batch; an item fails alone with
    /// [`Error::LeaseLost`].
    pub fn release_if_pending_many(
        &self,
        leases: &[&Lease],
    ) -> Result<Vec<Result<bool, Error>>, Error> {
        self.run_batch(releases(leases), answer::with_lease)
    }

    /// [`release_if_pending_many`](Store::release_if_pending_many) for async code; no thread
    /// blocks while the batch is synced.
    ///
    /// # Backpressure
    /// At most 4,096 async requests wait in the commit queue; a future started when it is full
    /// waits (without queueing anything) until a batch makes room.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the releases: they may still be committed.
    ///
    /// # Errors
    /// As for [`release_if_pending_many`](Store::release_if_pending_many).
    pub async fn release_if_pending_many_async(
        &self,
        leases: &[&Lease],
    ) -> Result<Vec<Result<bool, Error>>, Error> {
        self.run_batch_async(releases(leases), answer::with_lease)
            .await
    }

    /// [`extend`](Store::extend) for many leases with one shared commit (a worker that holds
    /// many leases sends one heartbeat). Returns one renewed lease or error per lease, in
    /// order.
    ///
    /// # Errors
    /// The outer error is a failure of the whole batch; an item fails alone with
    /// [`Error::LeaseLost`].
    pub fn extend_many(&self, leases: &[&Lease]) -> Result<Vec<Result<Lease, Error>>, Error> {
        self.run_batch(extensions(leases), extended)
    }

    /// [`extend_many`](Store::extend_many) for async code; no thread blocks while the batch is
    /// synced.
    ///
    /// # Backpressure
    /// At most 4,096 async requests wait in the commit queue; a future started when it is full
    /// waits (without queueing anything) until a batch makes room.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the renewals: they may still be committed.
    ///
    /// # Errors
    /// As for [`extend_many`](Store::extend_many).
    pub async fn extend_many_async(
        &self,
        leases: &[&Lease],
    ) -> Result<Vec<Result<Lease, Error>>, Error> {
        self.run_batch_async(extensions(leases), extended).await
    }
}

fn releases<'a>(leases: &[&'a Lease]) -> Batch<'a, Release> {
    Batch::new(
        leases
            .iter()
            .map(|&lease| (lease, Ok(Release { token: lease.token }))),
    )
}

fn extensions<'a>(leases: &[&'a Lease]) -> Batch<'a, Extend> {
    Batch::new(
        leases
            .iter()
            .map(|&lease| (lease, Ok(Extend { token: lease.token }))),
    )
}

/// An extension's answer: the lease, renewed until the new deadline.
pub(super) fn extended(
    lease: &Lease,
    outcome: crate::decide::LeaseOutcome<crate::record::Millis>,
) -> Result<Lease, Error> {
    let lease_until = answer::with_lease(lease, outcome)?;
    Ok(Lease {
        lease_until: from_millis(lease_until),
        ..lease.clone()
    })
}
