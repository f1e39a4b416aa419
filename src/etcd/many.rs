//! The batch operations of [`EtcdStore`]: `reserve_many`, `observe_many`, `complete_many`,
//! `release_if_pending_many`, `extend_many` and `expire_many`, each one [`Inner::apply_many`]
//! (few transactions for many keys) with the answers of the local store's method of the same
//! name.
//!
//! [`Inner::apply_many`]: super::store::Inner::apply_many

use std::time::Duration;

use super::store::EtcdStore;
use crate::answers::LiveLease;
use crate::answers::{Lease, Reservation, Seen};
use crate::clock::{duration_millis, from_millis};
use crate::decide::answer;
use crate::decide::expire::Expire;
use crate::decide::{Complete, Extend, LeaseOutcome, Observe, Release, Reserve};
use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::record::Millis;
use crate::record::RecordClass;

impl EtcdStore {
    /// Reserves many keys with few round trips; the answers of
    /// [`Store::reserve_many`](crate::Store::reserve_many). The records are read in one
    /// transaction per `max_txn_ops` keys, duplicates are answered from that read, and the
    /// acquisitions are written together, as many per transaction as etcd's limits allow
    /// (each new key costs 1 operation, each transaction 3 more for its index entry). Each
    /// written key keeps its own compare: if any changed meanwhile, that transaction's keys
    /// are decided again on what it read. A key that appears twice is reserved in a later
    /// round, so the second sees the first's reservation.
    /// Returns one result per item, in order.
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
        let ops: Vec<(Key, Reserve)> = items
            .iter()
            .map(|(key, fingerprint)| {
                let op = Reserve {
                    fingerprint: *fingerprint,
                };
                (key.clone(), op)
            })
            .collect();
        let outcomes = self.inner().apply_many(&ops, true).await?;
        let mut answers = Vec::with_capacity(items.len());
        for (outcome, (key, fingerprint)) in outcomes.into_iter().zip(items) {
            answers.push(match outcome {
                Ok(reserved) => self
                    .inner()
                    .fresh_lease(key, *fingerprint, reserved)
                    .await
                    .map(|reserved| answer::reservation(key, reserved)),
                Err(error) => Err(error),
            });
        }
        Ok(answers)
    }

    /// The dedup window for queue consumers; see [`Store::observe`](crate::Store::observe):
    /// records `key` as seen for `window` if nothing is stored for it, and says whether it
    /// was new. Every instance sharing the prefix sees the same window, so a message
    /// redelivered to another consumer host within it is a [`Seen::Duplicate`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use idemstore::{EtcdStore, Key, Seen};
    ///
    /// # async fn run(store: EtcdStore) -> Result<(), idemstore::Error> {
    /// let event = Key::new("orders-queue", "consume", "msg-81f2")?;
    /// if store.observe(&event, Duration::from_secs(5 * 60)).await? == Seen::New {
    ///     // handle the message
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Durability
    /// `New` is answered once a majority of members wrote the key.
    ///
    /// # Errors
    /// [`Error::Corruption`] for a damaged record; [`Error::Cluster`].
    pub async fn observe(&self, key: &Key, window: Duration) -> Result<Seen, Error> {
        let op = Observe {
            window: duration_millis(window),
        };
        let start = self.inner().start(key, true);
        Ok(answer::seen(
            self.inner().apply_from(key, op, &[], start).await?,
        ))
    }

    /// [`observe`](EtcdStore::observe) for a polled batch of messages, in few transactions;
    /// see [`Store::observe_many`](crate::Store::observe_many).
    ///
    /// # Errors
    /// The outer error fails the whole batch ([`Error::Cluster`]); an item fails alone when
    /// its record is damaged.
    pub async fn observe_many(
        &self,
        keys: &[Key],
        window: Duration,
    ) -> Result<Vec<Result<Seen, Error>>, Error> {
        let window = duration_millis(window);
        let ops: Vec<(Key, Observe)> = keys
            .iter()
            .map(|key| (key.clone(), Observe { window }))
            .collect();
        Ok(self
            .inner()
            .apply_many(&ops, true)
            .await?
            .into_iter()
            .map(|outcome| outcome.map(answer::seen))
            .collect())
    }

    /// Completes many leases in few transactions; see
    /// [`Store::complete_many`](crate::Store::complete_many). Returns one result per item, in
    /// order.
    ///
    /// # Durability
    /// Every item answered `Ok` is on a majority's disks.
    ///
    /// # Errors
    /// The outer error fails the whole batch ([`Error::Cluster`]); an item fails alone with
    /// [`Error::ResultTooLarge`] or [`Error::LeaseLost`].
    pub async fn complete_many(
        &self,
        items: Vec<(&Lease, Vec<u8>)>,
    ) -> Result<Vec<Result<(), Error>>, Error> {
        let leases: Vec<&Lease> = items.iter().map(|(lease, _)| *lease).collect();
        let ops = items.into_iter().map(|(lease, result)| {
            let op = self.check_result(&lease.key, &result).map(|()| Complete {
                token: lease.token,
                result,
            });
            (lease.key.clone(), op)
        });
        self.run_many(&leases, ops, answer::completion).await
    }

    /// [`release_if_pending`](EtcdStore::release_if_pending) for many leases in few
    /// transactions; see [`Store::release_if_pending_many`](crate::Store::release_if_pending_many).
    ///
    /// # Errors
    /// The outer error fails the whole batch; an item fails alone with [`Error::LeaseLost`].
    pub async fn release_if_pending_many(
        &self,
        leases: &[&Lease],
    ) -> Result<Vec<Result<bool, Error>>, Error> {
        let ops = leases
            .iter()
            .map(|lease| (lease.key.clone(), Ok(Release { token: lease.token })));
        self.run_many(leases, ops, answer::with_lease).await
    }

    /// [`extend`](EtcdStore::extend) for many leases in few transactions (one heartbeat for a
    /// worker that holds many); see [`Store::extend_many`](crate::Store::extend_many).
    ///
    /// # Errors
    /// The outer error fails the whole batch; an item fails alone with [`Error::LeaseLost`].
    pub async fn extend_many(&self, leases: &[&Lease]) -> Result<Vec<Result<Lease, Error>>, Error> {
        let ops = leases
            .iter()
            .map(|lease| (lease.key.clone(), Ok(Extend { token: lease.token })));
        self.run_many(leases, ops, extended).await
    }

    /// Expires many keys in few transactions; see
    /// [`Store::expire_many`](crate::Store::expire_many). A key refused for its live lease
    /// ([`LiveLease::Refuse`]) or with a damaged record fails alone.
    ///
    /// # Durability
    /// Every key answered `Ok` is deleted on a majority's disks.
    ///
    /// # Errors
    /// The outer error fails the whole batch ([`Error::Cluster`]).
    pub async fn expire_many(
        &self,
        keys: &[Key],
        live: LiveLease,
    ) -> Result<Vec<Result<Option<RecordClass>, Error>>, Error> {
        let force = live == LiveLease::Take;
        let ops: Vec<(Key, Expire)> = keys
            .iter()
            .map(|key| (key.clone(), Expire { force }))
            .collect();
        Ok(self
            .inner()
            .apply_many(&ops, false)
            .await?
            .into_iter()
            .zip(keys)
            .map(|(outcome, key)| outcome.and_then(|outcome| answer::expired(key, outcome)))
            .collect())
    }

    /// One operation per lease, the items refused before sending (a result over the limit)
    /// answered with their error; the rest applied together and mapped by `map`.
    async fn run_many<O, T>(
        &self,
        leases: &[&Lease],
        ops: impl IntoIterator<Item = (Key, Result<O, Error>)>,
        map: impl Fn(&Lease, O::Outcome) -> Result<T, Error>,
    ) -> Result<Vec<Result<T, Error>>, Error>
    where
        O: crate::decide::Operation + Clone,
    {
        let mut refused = Vec::new();
        let mut sent = Vec::new();
        for (key, op) in ops {
            match op {
                Ok(op) => {
                    refused.push(None);
                    sent.push((key, op));
                }
                Err(error) => refused.push(Some(error)),
            }
        }
        let mut outcomes = self.inner().apply_many(&sent, false).await?.into_iter();
        Ok(refused
            .into_iter()
            .zip(leases)
            .map(|(refused, lease)| match refused {
                Some(error) => Err(error),
                None => outcomes
                    .next()
                    .expect("one outcome per sent item")
                    .and_then(|outcome| map(lease, outcome)),
            })
            .collect())
    }
}

/// An extension's answer: the lease, renewed until the new deadline.
fn extended(lease: &Lease, outcome: LeaseOutcome<Millis>) -> Result<Lease, Error> {
    let lease_until = answer::with_lease(lease, outcome)?;
    Ok(Lease {
        lease_until: from_millis(lease_until),
        ..lease.clone()
    })
}
