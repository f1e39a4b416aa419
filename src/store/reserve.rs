//! Reserving keys: one, many, async, waiting, and the dedup window (`observe`). Existing keys
//! are answered from the overlay, the cache or a read transaction without waiting for writers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::answers::{Reservation, Seen};
use crate::clock::duration_millis;
use crate::commit::{first, CallerDecision, Known};
use crate::decide::answer;
use crate::decide::{decide, Change, Operation};
use crate::decide::{Observe, Reserve, Reserved};
use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::record::{Millis, Record};
use crate::state::Counter;
use crate::state::{wake_at, Signal};
use crate::tree::IndexEntries;

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
    /// [`StorageError::Corruption`](crate::StorageError::Corruption) when the key's stored record is damaged; [`StorageError::Poisoned`](crate::StorageError::Poisoned) after
    /// a failed write; [`Error::Storage`] for I/O failures.
    pub fn reserve(&self, key: &Key, fingerprint: Fingerprint) -> Result<Reservation, Error> {
        match self.read_for_reserve(key, fingerprint)? {
            Read::Answer(answer) => Ok(answer),
            Read::Write { epoch, decided } => {
                self.submit_hook.run();
                let op = Reserve { fingerprint };
                let reserved = self
                    .committer
                    .submit_one_seen(key.clone(), op, epoch, decided)?;
                Ok(self.reservation(key, reserved))
            }
        }
    }

    /// The duplicate path: answers a reserve from the cache or a read transaction when the
    /// answer needs no write; `None` when the writer must decide.
    pub(super) fn answer_without_writing(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
    ) -> Result<Option<Reservation>, Error> {
        Ok(match self.read_for_reserve(key, fingerprint)? {
            Read::Answer(answer) => Some(answer),
            Read::Write { .. } => None,
        })
    }

    /// Reads `key` once and decides the reserve: the answer when it needs no write, or else
    /// the decision and the writer epoch it was read in, for the writer to take without
    /// reading the key again.
    fn read_for_reserve(&self, key: &Key, fingerprint: Fingerprint) -> Result<Read, Error> {
        self.engine.poison.check()?;
        // Before the read: the state is current for the writer while this epoch lasts.
        let epoch = self.engine.overlay.epoch();
        let record = self.read(key)?;
        Ok(
            match self.decide_read(key, Reserve { fingerprint }, record, self.now()) {
                Ok(reserved) => Read::Answer(self.reservation(key, reserved)),
                Err(decided) => Read::Write { epoch, decided },
            },
        )
    }

    /// Decides `op` on `key` against its stored `record` at time `now`: the outcome when it
    /// changes nothing; else `Err` with the decision, which the writer gives the token it
    /// hands out ([`with_token`](crate::decide::with_token)) while the key has not changed
    /// since the read. (A batch reads the clock once: at a million keys per second the clock
    /// read per key was a tenth of the batch's time.)
    fn decide_read<O: Operation>(
        &self,
        key: &Key,
        op: O,
        record: Option<Record>,
        now: Millis,
    ) -> Result<O::Outcome, CallerDecision<O>> {
        let old = record.as_ref().map(IndexEntries::of);
        // The token is a placeholder: a decision that changes nothing hands none out.
        let decision = decide(record, op, now, self.engine.policy.for_key(key), 0);
        match decision.change {
            Change::Keep => Ok(decision.outcome),
            _ => Err(CallerDecision { old, decision }),
        }
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
        let (mut answers, ops, seen) = self.reserve_without_writing(items)?;
        if !ops.is_empty() {
            let decided = self.committer.submit_seen(ops, Some(seen));
            self.answer_decided(items, &mut answers, decided)?;
        }
        Ok(answered(answers))
    }

    /// [`reserve_many`](Store::reserve_many) for async code: duplicates are answered at once,
    /// and the acquisitions wait for their commit without blocking a thread.
    ///
    /// # Backpressure
    /// At most 4,096 async requests wait in the commit queue; a future started when it is full
    /// waits (without queueing anything) until a batch makes room.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the reservations: keys may still be acquired,
    /// and then go stale when their leases run out.
    ///
    /// # Errors
    /// As for [`reserve_many`](Store::reserve_many).
    pub async fn reserve_many_async(
        &self,
        items: &[(Key, Fingerprint)],
    ) -> Result<Vec<Result<Reservation, Error>>, Error> {
        let (mut answers, ops, seen) = self.reserve_without_writing(items)?;
        if !ops.is_empty() {
            let decided = self.committer.submit_async_seen(ops, Some(seen)).await;
            self.answer_decided(items, &mut answers, decided)?;
        }
        Ok(answered(answers))
    }

    /// Duplicates (and mismatches, keys in progress) answered from what is acknowledged,
    /// without the writer; and the operations for the rest, which wait for a commit, with
    /// what was decided of them (so the writer neither reads those keys nor decides again).
    fn reserve_without_writing(
        &self,
        items: &[(Key, Fingerprint)],
    ) -> Result<BatchRead<Reservation, Reserve>, Error> {
        let ops = items.iter().map(|(key, fingerprint)| {
            let op = Reserve {
                fingerprint: *fingerprint,
            };
            (key, op)
        });
        self.decide_without_writing(ops, |key, reserved| self.reservation(key, reserved))
    }

    /// Reads the keys of `ops` (once each, in one pass) and decides each operation against
    /// what was read: an outcome that changes nothing is answered at once (`answer`); the
    /// others are returned with their decisions, for the writer.
    fn decide_without_writing<'k, O: Operation + Copy, A>(
        &self,
        ops: impl ExactSizeIterator<Item = (&'k Key, O)> + Clone,
        answer: impl Fn(&Key, O::Outcome) -> A,
    ) -> Result<BatchRead<A, O>, Error> {
        self.engine.poison.check()?;
        let epoch = self.engine.overlay.epoch();
        let records = self.read_many(ops.clone().map(|(key, _)| key));
        let now = self.now();
        let mut answers = Vec::with_capacity(ops.len());
        let mut writes = Vec::new();
        let mut decided = Vec::new();
        for (record, (key, op)) in records.into_iter().zip(ops) {
            answers.push(match record {
                Err(error) => Some(Err(error)),
                Ok(record) => match self.decide_read(key, op, record, now) {
                    Ok(outcome) => Some(Ok(answer(key, outcome))),
                    Err(decision) => {
                        writes.push((key.clone(), op));
                        decided.push(decision);
                        None
                    }
                },
            });
        }
        Ok((answers, writes, Known { epoch, decided }))
    }

    /// Fills the items the writer decided, in order.
    fn answer_decided(
        &self,
        items: &[(Key, Fingerprint)],
        answers: &mut [Option<Result<Reservation, Error>>],
        decided: Result<Vec<Result<Reserved, Error>>, Error>,
    ) -> Result<(), Error> {
        let mut decided = decided?.into_iter();
        for ((key, _), answer) in items.iter().zip(answers) {
            if answer.is_none() {
                let reserved = decided.next().expect("one outcome per queued item");
                *answer = Some(reserved.map(|reserved| self.reservation(key, reserved)));
            }
        }
        Ok(())
    }

    /// [`reserve`](Store::reserve) for async code: the duplicate path answers at once, and an
    /// acquisition waits for its commit without blocking a thread, on any executor.
    ///
    /// # Backpressure
    /// At most 4,096 async requests wait in the commit queue; a future started when it is full
    /// waits (without queueing anything) until a batch makes room.
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
        let (epoch, decided) = match self.read_for_reserve(key, fingerprint)? {
            Read::Answer(answer) => return Ok(answer),
            Read::Write { epoch, decided } => (epoch, decided),
        };
        let seen = Known {
            epoch,
            decided: vec![decided],
        };
        let answer = self
            .committer
            .submit_async_seen(vec![(key.clone(), Reserve { fingerprint })], Some(seen))
            .await;
        Ok(self.reservation(key, first(answer)?))
    }

    pub(super) fn reservation(&self, key: &Key, reserved: Reserved) -> Reservation {
        let counter = match &reserved {
            Reserved::Acquired { attempt, .. } => {
                if *attempt > 1 {
                    self.engine.counters.add(Counter::Takeovers, 1);
                }
                Counter::Acquired
            }
            Reserved::Completed { .. } => Counter::Replayed,
            Reserved::InProgress { .. } => Counter::InProgress,
            Reserved::Mismatch => Counter::Mismatches,
            Reserved::NeedsReview { .. } => Counter::NeedsReview,
        };
        self.engine.counters.add(counter, 1);
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
            self.engine.overlay.waiters.register(key);
            // The key may have changed between the answer and the registration.
            let again = self.answer_without_writing(key, fingerprint);
            if !matches!(again, Ok(Some(Reservation::InProgress { .. }))) {
                self.engine.overlay.waiters.unregister(key);
                continue;
            }
            // Wake at the latest when the holder's lease runs out (then it can be taken over).
            std::thread::park_timeout((deadline - now).min(retry_after + Duration::from_millis(1)));
            self.engine.overlay.waiters.unregister(key);
        }
    }

    /// [`reserve_or_wait`](Store::reserve_or_wait) for async code, on any executor: the task
    /// (not a thread) waits until a commit changes the key, or at the latest until the
    /// holder's lease runs out or `timeout` passes (kept by one timer thread the process
    /// shares).
    ///
    /// # Cancel safety
    /// As for [`reserve_async`](Store::reserve_async). A dropped wait leaves its registration
    /// until the key next changes and its timer entry until it fires; neither wakes anything.
    ///
    /// # Errors
    /// As for [`reserve`](Store::reserve).
    pub async fn reserve_or_wait_async(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        timeout: Duration,
    ) -> Result<Reservation, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            let answer = self.reserve_async(key, fingerprint).await?;
            let Reservation::InProgress { retry_after, .. } = answer else {
                return Ok(answer);
            };
            let now = Instant::now();
            if now >= deadline {
                return Ok(answer);
            }
            let signal = Arc::new(Signal::default());
            self.engine.overlay.waiters.register_task(key, &signal);
            // The key may have changed between the answer and the registration.
            let again = self.answer_without_writing(key, fingerprint);
            if !matches!(again, Ok(Some(Reservation::InProgress { .. }))) {
                self.engine.overlay.waiters.unregister_task(key, &signal);
                continue;
            }
            // Wake at the latest when the holder's lease runs out (then it can be taken over).
            wake_at(
                now + (deadline - now).min(retry_after + Duration::from_millis(1)),
                &signal,
            );
            signal.fired().await;
            self.engine.overlay.waiters.unregister_task(key, &signal);
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

    /// [`observe`](Store::observe) for async code (the trait's `observe`).
    pub(crate) async fn observe_async(&self, key: &Key, window: Duration) -> Result<Seen, Error> {
        self.observe_many_async(std::slice::from_ref(key), window)
            .await?
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
        let (mut answers, ops, seen) = self.observe_without_writing(keys, window)?;
        if !ops.is_empty() {
            fill_seen(&mut answers, self.committer.submit_seen(ops, Some(seen))?);
        }
        Ok(answered(answers))
    }

    /// [`observe_many`](Store::observe_many) for async code: keys already stored are
    /// answered at once, and new ones wait for their commit without blocking a thread.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the new keys: they may still be recorded.
    ///
    /// # Errors
    /// As for [`observe_many`](Store::observe_many).
    pub async fn observe_many_async(
        &self,
        keys: &[Key],
        window: Duration,
    ) -> Result<Vec<Result<Seen, Error>>, Error> {
        let (mut answers, ops, seen) = self.observe_without_writing(keys, window)?;
        if !ops.is_empty() {
            let decided = self.committer.submit_async_seen(ops, Some(seen)).await;
            fill_seen(&mut answers, decided?);
        }
        Ok(answered(answers))
    }

    /// Keys already stored are duplicates, answered from what is acknowledged without the
    /// writer; the operations for the new keys, which wait for a commit, with what was
    /// decided of them.
    fn observe_without_writing(
        &self,
        keys: &[Key],
        window: Duration,
    ) -> Result<BatchRead<Seen, Observe>, Error> {
        let window = duration_millis(window);
        let ops = keys.iter().map(|key| (key, Observe { window }));
        self.decide_without_writing(ops, |_, new| answer::seen(new))
    }
}

/// What a batch's caller read and decided: one answer slot per item (filled when the decision
/// changes nothing), the operations that write, and their decisions.
type BatchRead<A, O> = (Vec<Option<Result<A, Error>>>, Vec<(Key, O)>, Known<O>);

/// What a reserve's read found.
enum Read {
    /// The answer, which needs no write.
    Answer(Reservation),
    /// A write: the caller's decision, and the epoch the state it decided on was read in.
    Write {
        epoch: u64,
        decided: CallerDecision<Reserve>,
    },
}

/// Fills the keys the writer decided, in order.
fn fill_seen(answers: &mut [Option<Result<Seen, Error>>], decided: Vec<Result<bool, Error>>) {
    let mut decided = decided.into_iter();
    for answer in answers {
        if answer.is_none() {
            let new = decided.next().expect("one outcome per queued item");
            *answer = Some(new.map(answer::seen));
        }
    }
}

/// Every item's answer, once each is filled.
fn answered<T>(answers: Vec<Option<Result<T, Error>>>) -> Vec<Result<T, Error>> {
    answers
        .into_iter()
        .map(|answer| answer.expect("every item answered"))
        .collect()
}
