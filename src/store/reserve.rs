//! Reserving keys: one, many, async, waiting, and the dedup window (`observe`). Existing keys
//! are answered from the overlay, the cache or a read transaction without waiting for writers.

use std::time::{Duration, Instant};

use crate::clock::duration_millis;
use crate::commit::first;
use crate::decide::answer;
use crate::decide::op::{Observe, Reserve, Reserved};
use crate::decide::{decide, Change};
use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::reservation::{Reservation, Seen};
use crate::stats::Counter;

use super::Store;

impl Store {
    /// Reserves `key` for the request with `fingerprint`, or tells why not.
    ///
    /// - absent, or completed and past retention: [`Reservation::Acquired`] with a new token;
    /// - stored with a different fingerprint (in any state): [`Reservation::Mismatch`];
    /// - completed within retention: [`Reservation::Completed`] with the stored result;
    /// - pending with a live lease: [`Reservation::InProgress`] with the time left;
    /// - pending with a lease that ran out (stale): taken over, [`Reservation::Acquired`]
    ///   with a new token and the attempt count increased;
    /// - marked for review: [`Reservation::NeedsReview`](crate::Reservation::NeedsReview).
    ///
    /// Existing keys are answered from a read transaction without waiting for writers; only
    /// an acquisition goes through the commit path.
    ///
    /// # Durability
    /// `Acquired` is returned only after the reservation is durable under the store's
    /// [`Durability`](crate::Durability).
    ///
    /// # Errors
    /// [`Error::Corruption`] when the key's stored record is damaged; [`Error::Poisoned`] after
    /// a failed write; [`Error::Storage`] for I/O failures.
    pub fn reserve(&self, key: &Key, fingerprint: Fingerprint) -> Result<Reservation, Error> {
        if let Some(answer) = self.answer_without_writing(key, fingerprint)? {
            return Ok(answer);
        }
        let reserved = self
            .committer
            .submit_one(key.clone(), Reserve { fingerprint })?;
        Ok(self.reservation(key, reserved))
    }

    /// The duplicate path: answers a reserve from the cache or a read transaction when the
    /// answer needs no write; `None` when the writer must decide.
    pub(super) fn answer_without_writing(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
    ) -> Result<Option<Reservation>, Error> {
        self.poison.check()?;
        let Some(record) = self.read(key)? else {
            return Ok(None);
        };
        // The token is a placeholder: a decision that would use it is discarded and taken
        // again by the writer against the latest state.
        let decision = decide(
            Some(record),
            Reserve { fingerprint },
            self.now(),
            self.policy,
            0,
        );
        Ok((decision.change == Change::Keep).then(|| self.reservation(key, decision.outcome)))
    }

    /// Reserves many keys with one shared commit (one log sync for the whole batch). Returns
    /// one result per item, in order; an item's error (a corrupt record) does not fail the
    /// others.
    ///
    /// ```
    /// use idemstore::{Fingerprint, Key, Reservation, Store};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("batch.idem"))?;
    /// let items: Vec<(Key, Fingerprint)> = (0..100)
    ///     .map(|i| Ok((Key::new("queue", "orders", format!("msg-{i}"))?, Fingerprint::of(b"m"))))
    ///     .collect::<Result<_, idemstore::Error>>()?;
    /// let results = store.reserve_many(&items)?;
    /// assert!(results.iter().all(|r| matches!(r, Ok(Reservation::Acquired(_)))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Durability
    /// As for [`reserve`](Store::reserve): every `Acquired` is durable when this returns.
    ///
    /// # Errors
    /// The outer error is a failure of the batch (a poisoned store, a failed sync). A very
    /// large call (over 64 MiB of log entries) is committed in several consecutive batches;
    /// then the items of earlier ones may have been committed, as for any failed write.
    pub fn reserve_many(
        &self,
        items: &[(Key, Fingerprint)],
    ) -> Result<Vec<Result<Reservation, Error>>, Error> {
        // The whole batch goes to the writer, which answers duplicates from the state it
        // reads anyway: one pass over the keys, no read transaction per item.
        let ops = items
            .iter()
            .map(|(key, fingerprint)| {
                let op = Reserve {
                    fingerprint: *fingerprint,
                };
                (key.clone(), op)
            })
            .collect();
        Ok(self
            .committer
            .submit(ops)?
            .into_iter()
            .zip(items)
            .map(|(reserved, (key, _))| reserved.map(|reserved| self.reservation(key, reserved)))
            .collect())
    }

    /// [`reserve`](Store::reserve) for async code: the duplicate path answers at once, and an
    /// acquisition waits for its commit without blocking a thread, on any executor.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the reservation: it may still be acquired, and
    /// then goes stale when its lease runs out.
    ///
    /// # Errors
    /// As for [`reserve`](Store::reserve).
    pub async fn reserve_async(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
    ) -> Result<Reservation, Error> {
        if let Some(answer) = self.answer_without_writing(key, fingerprint)? {
            return Ok(answer);
        }
        let answer = self
            .committer
            .submit_async(vec![(key.clone(), Reserve { fingerprint })])
            .await;
        Ok(self.reservation(key, first(answer)?))
    }

    pub(super) fn reservation(&self, key: &Key, reserved: Reserved) -> Reservation {
        let counter = match &reserved {
            Reserved::Acquired { attempt, .. } => {
                if *attempt > 1 {
                    self.counters.add(Counter::Takeovers, 1);
                }
                Counter::Acquired
            }
            Reserved::Completed { .. } => Counter::Replayed,
            Reserved::InProgress { .. } => Counter::InProgress,
            Reserved::Mismatch => Counter::Mismatches,
            Reserved::NeedsReview { .. } => Counter::NeedsReview,
        };
        self.counters.add(counter, 1);
        answer::reservation(key, reserved)
    }

    /// Like [`reserve`](Store::reserve), but when another caller in this process holds the key,
    /// waits (without polling) until it completes, releases or goes stale, up to `timeout`.
    /// Returns the stored result, an acquisition, or `InProgress` when the timeout passed.
    ///
    /// # Errors
    /// As for [`reserve`](Store::reserve).
    pub fn reserve_or_wait(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        timeout: Duration,
    ) -> Result<Reservation, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            let answer = self.reserve(key, fingerprint)?;
            let Reservation::InProgress { retry_after, .. } = answer else {
                return Ok(answer);
            };
            let now = Instant::now();
            if now >= deadline {
                return Ok(answer);
            }
            self.overlay.waiters.register(key);
            // The key may have changed between the answer and the registration.
            let again = self.answer_without_writing(key, fingerprint);
            if !matches!(again, Ok(Some(Reservation::InProgress { .. }))) {
                self.overlay.waiters.unregister(key);
                continue;
            }
            // Wake at the latest when the holder's lease runs out (then it can be taken over).
            std::thread::park_timeout((deadline - now).min(retry_after + Duration::from_millis(1)));
            self.overlay.waiters.unregister(key);
        }
    }

    /// Dedup window mode for queue consumers: records `key` as seen for `window` if it is not
    /// stored, and says whether it was new. Redelivered messages within the window are
    /// [`Seen::Duplicate`]. Durable when it returns `New`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idemstore::{Key, Seen, Store};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("events.idem"))?;
    /// let event = Key::new("orders-queue", "consume", "msg-81f2")?;
    /// let window = Duration::from_secs(5 * 60); // like SQS FIFO
    /// assert_eq!(store.observe(&event, window)?, Seen::New);
    /// assert_eq!(store.observe(&event, window)?, Seen::Duplicate);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As for [`reserve`](Store::reserve).
    pub fn observe(&self, key: &Key, window: Duration) -> Result<Seen, Error> {
        self.observe_many(std::slice::from_ref(key), window)?
            .remove(0)
    }

    /// [`observe`](Store::observe) for a polled batch of messages, with one shared commit.
    ///
    /// # Errors
    /// The outer error fails the whole batch; an item fails alone when its record is corrupt.
    pub fn observe_many(
        &self,
        keys: &[Key],
        window: Duration,
    ) -> Result<Vec<Result<Seen, Error>>, Error> {
        let window = duration_millis(window);
        let ops = keys
            .iter()
            .map(|key| (key.clone(), Observe { window }))
            .collect();
        Ok(self
            .committer
            .submit(ops)?
            .into_iter()
            .map(|new| new.map(answer::seen))
            .collect())
    }
}
