//! [`Store`]: the public operations. Reads of existing keys go straight to a redb read
//! transaction; every write goes through the commit path in [`crate::commit`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redb::{Database, ReadableDatabase, WriteTransaction};

use crate::builder::{Builder, Durability};
use crate::cache::{Overlay, RecordCache};
use crate::checkpoint;
use crate::clock::{duration_millis, from_millis, to_millis, Clock};
use crate::commit::{first, CommitKind, Committer, Poison, Schedule, Writer};
use crate::decide::answer;
use crate::decide::op::{
    Complete, Completion, Extend, MarkNeedsReview, Observe, RecordStep, Release, Reserve, Reserved,
    Resolve,
};
use crate::decide::{decide, Change, Policy, Resolution};
use crate::error::{Error, LeaseLostReason};
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::record::{Millis, Record, MAX_NOTE_LEN};
use crate::reservation::{Lease, Progress, Reservation, Seen};
use crate::stats::{Counter, Counters, Stats};
use crate::sweep;
use crate::tables::{decode_record, Tables, LEASES, RECORDS};
use crate::wal::{log_path, LogFile};

/// An open idempotency store: one file, owned by one process.
///
/// `Store` is `Send + Sync`; share it between threads with `&Store` or `Arc<Store>`.
///
/// ```
/// use idemstore::{Fingerprint, Key, Reservation, Store};
///
/// # let dir = tempfile::tempdir()?;
/// let store = Store::open(dir.path().join("keys.idem"))?;
/// let key = Key::new("user-7", "checkout", "b7d1e0")?;
/// let request = Fingerprint::of(b"cart=42&total=1999");
///
/// match store.reserve(&key, request)? {
///     Reservation::Acquired(lease) => {
///         let receipt = b"order 1001 placed"; // do the work here
///         store.complete(&lease, receipt.to_vec())?;
///     }
///     other => panic!("a fresh key is acquired, got {other:?}"),
/// }
///
/// // The retry gets the stored result instead of running the work again.
/// match store.reserve(&key, request)? {
///     Reservation::Completed(done) => assert_eq!(done.result, b"order 1001 placed"),
///     other => panic!("expected the stored result, got {other:?}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Store {
    pub(crate) db: Arc<Database>,
    pub(crate) cache: Arc<RecordCache>,
    pub(crate) overlay: Arc<Overlay>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) committer: Committer,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) policy: Policy,
    pub(crate) max_result_len: usize,
    pub(crate) poison: Arc<Poison>,
    pub(crate) path: PathBuf,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// redb's settings for a store.
fn redb_builder(builder: &Builder) -> redb::Builder {
    let mut redb_builder = redb::Builder::new();
    redb_builder
        .set_cache_size(builder.cache_size)
        .set_check_integrity_on_open(builder.verify_on_open);
    redb_builder
}

/// Runs an open. redb can panic on a damaged file that it trusts; hostile bytes must never
/// panic the caller, so a panic becomes [`Error::NotAStore`] (redb's integrity check on open,
/// [`Builder::verify_on_open`], makes this a backstop).
fn guard_open(path: &Path, open: impl FnOnce() -> Result<Store, Error>) -> Result<Store, Error> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(open)).unwrap_or_else(|_| {
        Err(Error::NotAStore {
            path: path.to_path_buf(),
            reason: "redb panicked while reading it: the file is damaged".into(),
        })
    })
}

impl Store {
    /// Opens the store at `path` with every default, creating it if it does not exist.
    ///
    /// # Errors
    /// See [`Builder::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Store, Error> {
        Builder::new().open(path)
    }

    /// A [`Builder`] to configure retention, leases, limits and the clock.
    pub fn builder() -> Builder {
        Builder::new()
    }

    pub(crate) fn open_with(builder: &Builder, path: &Path) -> Result<Store, Error> {
        guard_open(path, || Store::open_unguarded(builder, path))
    }

    fn open_unguarded(builder: &Builder, path: &Path) -> Result<Store, Error> {
        let redb_builder = redb_builder(builder);
        let db = crate::file::open_or_create(path, &redb_builder)?;
        let log_path = log_path(path);
        let preallocate = builder
            .preallocate_log
            .then_some(builder.checkpoint_bytes + (1 << 20));
        let log = crate::file::open_log(&log_path, preallocate)?;
        Store::from_parts(db, Arc::new(log), log_path, builder, path.to_path_buf())
    }

    /// Opens (creating if empty) a store on simulated disks, for crash and fault tests and the
    /// fuzz targets.
    #[cfg(any(test, fuzzing))]
    pub(crate) fn open_sim(
        builder: &Builder,
        db_disk: &crate::testing::sim::SimDisk,
        log_disk: &crate::testing::sim::SimDisk,
    ) -> Result<Store, Error> {
        let path = PathBuf::from("sim.idem");
        guard_open(&path.clone(), || {
            let db = redb_builder(builder)
                .create_with_backend(db_disk.clone())
                .map_err(|e| Error::storage("opening a simulated store", e))?;
            crate::file::initialize_if_new(&db)?;
            crate::file::check_format(&db, &path)?;
            Store::from_parts(
                db,
                Arc::new(log_disk.clone()),
                log_path(&path),
                builder,
                path,
            )
        })
    }

    pub(crate) fn from_parts(
        db: Database,
        log: Arc<dyn LogFile>,
        log_path: PathBuf,
        builder: &Builder,
        path: PathBuf,
    ) -> Result<Store, Error> {
        let strict = builder.durability == Durability::Immediate;
        let (wal, next_token) = checkpoint::recover(&db, log, log_path, strict)?;
        let db = Arc::new(db);
        let policy = Policy {
            lease: duration_millis(builder.lease),
            retention: duration_millis(builder.retention),
        };
        let poison = Arc::new(Poison::default());
        let cache = Arc::new(RecordCache::new(builder.cache_records));
        let overlay = Arc::new(Overlay::default());
        let counters = Arc::new(Counters::default());
        let writer = Writer::new(
            Arc::clone(&db),
            wal,
            Arc::clone(&builder.clock),
            policy,
            next_token,
            Arc::clone(&poison),
            Arc::clone(&cache),
            Arc::clone(&overlay),
            Arc::clone(&counters),
            Schedule {
                durability: builder.durability,
                checkpoint_bytes: builder.checkpoint_bytes,
                checkpoint_interval: builder.checkpoint_interval,
                sweep_interval: builder.sweep_interval,
            },
        );
        Ok(Store {
            db,
            cache,
            overlay,
            counters,
            committer: Committer::start(writer)?,
            clock: Arc::clone(&builder.clock),
            policy,
            max_result_len: builder.max_result_len,
            poison,
            path,
        })
    }

    /// A redb read transaction on the store's file, to read the caller's own tables (those
    /// written with [`complete_with`](Store::complete_with)) while the store is open. It sees
    /// every durable redb commit; tables named `idemstore.*` belong to the store.
    ///
    /// # Errors
    /// Storage errors.
    pub fn begin_read(&self) -> Result<redb::ReadTransaction, Error> {
        self.poison.check()?;
        self.db
            .begin_read()
            .map_err(|e| Error::storage("starting a read transaction", e))
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Counters of what the store has done since it was opened.
    pub fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    pub(crate) fn now(&self) -> Millis {
        to_millis(self.clock.now())
    }

    /// Reserves `key` for the request with `fingerprint`, or tells why not.
    ///
    /// - absent, or completed and past retention: [`Reservation::Acquired`] with a new token;
    /// - stored with a different fingerprint (in any state): [`Reservation::Mismatch`];
    /// - completed within retention: [`Reservation::Completed`] with the stored result;
    /// - pending with a live lease: [`Reservation::InProgress`] with the time left;
    /// - pending with a lease that ran out (stale): taken over, [`Reservation::Acquired`]
    ///   with a new token and the attempt count increased;
    /// - marked for review: [`Reservation::NeedsReview`].
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
    fn answer_without_writing(
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
    /// The outer error is a failure of the whole batch (a poisoned store, a failed sync).
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

    fn reservation(&self, key: &Key, reserved: Reserved) -> Reservation {
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

    /// Stores `result` for the lease's key: duplicates get it until the retention ends.
    ///
    /// Completing again with the same lease is accepted and keeps the first result, so a
    /// caller that saw an error after its completion may have landed can safely retry.
    ///
    /// # Errors
    /// [`Error::ResultTooLarge`] over [`Builder::max_result_len`];
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
    /// # Errors
    /// The outer error is a failure of the whole batch; an item fails alone with
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

    fn check_result(&self, lease: &Lease, result: &[u8]) -> Result<(), Error> {
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
                        return Ok(f(txn).map_err(|e| Error::Callback { source: e.into() }))
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

    /// Heartbeat for long work: renews the lease for another [`Builder::lease`] from now and
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
    /// [`Reservation::NeedsReview`] until [`resolve`](Store::resolve) is called. The key does
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
    /// [`Error::ResultTooLarge`] when `data` is over [`Builder::max_result_len`];
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

    /// The record stored for `key`, or `None` when it is absent or expired.
    ///
    /// # Errors
    /// [`Error::Corruption`] naming the key when its record is damaged.
    pub fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        self.poison.check()?;
        let now = self.now();
        Ok(self.read(key)?.filter(|record| !record.is_expired(now)))
    }

    /// The stored record, from the cache or a read transaction; expired or not.
    fn read(&self, key: &Key) -> Result<Option<Record>, Error> {
        if let Some(state) = self.overlay.get(key) {
            return Ok(state);
        }
        if let Some(record) = self.cache.get(key) {
            return Ok(Some(record));
        }
        let ctx = "reading a record";
        let txn = self.db.begin_read().map_err(|e| Error::storage(ctx, e))?;
        let table = txn
            .open_table(RECORDS)
            .map_err(|e| Error::storage(ctx, e))?;
        let value = table
            .get(key.encoded())
            .map_err(|e| Error::storage(ctx, e))?;
        value
            .map(|bytes| decode_record(key.encoded(), bytes.value()))
            .transpose()
    }

    /// Deletes up to `limit` expired records and returns how many were deleted. Expired
    /// records already read as absent; sweeping reclaims their space. Run it periodically
    /// with a bound that keeps each call short, since it holds the writer while it runs.
    ///
    /// # Errors
    /// Storage errors; a failed sweep poisons the store like any failed write.
    pub fn sweep(&self, limit: usize) -> Result<usize, Error> {
        self.committer.with_writer(|writer| writer.sweep(limit))
    }

    /// Makes everything acknowledged so far durable in the B-tree file and rewinds the log.
    /// The store does this by itself (see [`Builder::checkpoint_bytes`]); call it before a
    /// backup or to bound the next open's replay.
    ///
    /// # Errors
    /// Storage errors; a failed checkpoint poisons the store like any failed write.
    pub fn checkpoint(&self) -> Result<(), Error> {
        self.committer.with_writer(Writer::checkpoint)
    }

    /// Up to `limit` reservations whose lease ran out without completion, oldest first: work
    /// that may have had side effects and died. Recover each by asking the external system
    /// about the key, then take it over with [`reserve`](Store::reserve) or settle it with
    /// [`resolve`](Store::resolve).
    ///
    /// # Errors
    /// [`Error::Corruption`] naming the key of a damaged record; storage errors.
    pub fn stale(&self, limit: usize) -> Result<Vec<(Key, Record)>, Error> {
        // Commit what the committer holds in its open transaction, so the listing sees every
        // acknowledged operation.
        self.committer.with_writer(|_| Ok(()))?;
        let ctx = "listing stale reservations";
        let txn = self.db.begin_read().map_err(|e| Error::storage(ctx, e))?;
        let records = txn
            .open_table(RECORDS)
            .map_err(|e| Error::storage(ctx, e))?;
        let leases = txn.open_table(LEASES).map_err(|e| Error::storage(ctx, e))?;
        sweep::stale(&records, &leases, self.now(), limit)
    }
}
