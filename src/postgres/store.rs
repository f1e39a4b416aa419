//! [`PgStore`]: the key-reservation operations on PostgreSQL.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::builder::PgBuilder;
use super::write::{sql_millis, Inner, Row, PLACEHOLDER};
use crate::answers::{Lease, LiveLease, Reservation, Seen};
use crate::clock::{duration_millis, from_millis};
use crate::decide::answer;
use crate::decide::expire::Expire;
use crate::decide::{decide, Change, Resolution};
use crate::decide::{
    Complete, Completion, Extend, LeaseOutcome, MarkNeedsReview, Observe, RecordStep, Release,
    Reserve, Resolve, WithRetention,
};
use crate::error::{Error, LeaseLostReason};
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::record::{Millis, Progress, Record, RecordClass};

/// The caller's own statements for [`PgStore::complete_with`]: run on the completion's
/// transaction, before the completion is written.
pub type PgWork<'t, E> = Pin<Box<dyn Future<Output = Result<(), E>> + Send + 't>>;

/// A key-reservation store on PostgreSQL (feature `postgres`): the operations and answers of
/// [`Store`](crate::Store), shared by every instance of a service that reaches the database.
///
/// Every transition is the same `decide` function as the local store's: the row is read (or,
/// for a reserve or an observe, guessed absent), the decision is made, and the change is
/// written by a statement that applies only if the row still carries the nonce of the write
/// it was decided on (or, for a new key, an `INSERT ... ON CONFLICT DO NOTHING`); a key whose
/// row changed is decided again. An answer is given only after PostgreSQL committed the
/// statement (with `synchronous_commit = on`, after its WAL record was flushed, and on
/// synchronous standbys when the server is set up so). Fencing tokens come from a sequence:
/// they rise with every acquisition and are never handed out twice. The data model is in
/// `docs/postgres.md`.
///
/// ```no_run
/// use idemstore::{Fingerprint, Key, PgStore, Reservation, Reservations};
///
/// # async fn run() -> Result<(), idemstore::Error> {
/// let store = PgStore::connect("host=127.0.0.1 user=app dbname=app").await?;
/// let key = Key::new("user-1", "POST /charges", "a1")?;
/// if let Reservation::Acquired(lease) = store.reserve(&key, Fingerprint::of(b"amount=100")).await? {
///     store.complete(&lease, b"201 created".to_vec()).await?;
/// }
/// # Ok(()) }
/// ```
///
/// Clones share one connection pool.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("table", &self.inner.sql.table)
            .field("policies", &self.inner.policies)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects with the default settings; see [`PgBuilder::connect`].
    ///
    /// # Errors
    /// As for [`PgBuilder::connect`].
    pub async fn connect(config: &str) -> Result<PgStore, Error> {
        PgBuilder::default().connect(config).await
    }

    /// Settings to change before connecting.
    pub fn builder() -> PgBuilder {
        PgBuilder::default()
    }

    pub(crate) fn from_inner(inner: Inner) -> PgStore {
        PgStore {
            inner: Arc::new(inner),
        }
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    /// The table that holds this store's keys.
    pub fn table(&self) -> &str {
        &self.inner.sql.table
    }

    /// How many statements this store (and its clones) sent again because PostgreSQL gave no
    /// definite answer or a passing error (a restart, a reset connection, a serialization
    /// failure). Each was settled by reading the row again, never guessed.
    pub fn resends(&self) -> u64 {
        self.inner.resends.load(Ordering::Relaxed)
    }

    /// Reserves `key`; the answers of [`Store::reserve`](crate::Store::reserve).
    ///
    /// # Durability
    /// `Acquired` is returned only after PostgreSQL committed the row.
    ///
    /// # Errors
    /// [`Error::Corruption`] for a damaged row; [`Error::Database`] when PostgreSQL gave no
    /// definite answer within the operation deadline (saying whether the write may have
    /// landed: an acquisition nobody was told of goes stale when its lease runs out).
    pub async fn reserve(&self, key: &Key, fingerprint: Fingerprint) -> Result<Reservation, Error> {
        let reserved = self.inner.apply(key, Reserve { fingerprint }, true).await?;
        Ok(answer::reservation(key, reserved))
    }

    /// Reserves many keys in few statements (one insert for the new ones); the answers of
    /// [`Store::reserve_many`](crate::Store::reserve_many), one per item, in order. A key that
    /// appears twice is decided again after the first was written.
    ///
    /// # Errors
    /// The outer error is a failure of the database ([`Error::Database`]); an item's error (a
    /// damaged row) does not fail the others.
    pub async fn reserve_many(
        &self,
        items: &[(Key, Fingerprint)],
    ) -> Result<Vec<Result<Reservation, Error>>, Error> {
        let ops: Vec<(&Key, Reserve)> = items
            .iter()
            .map(|(key, fingerprint)| {
                (
                    key,
                    Reserve {
                        fingerprint: *fingerprint,
                    },
                )
            })
            .collect();
        let outcomes = self.inner.apply_many(&ops, true).await?;
        Ok(outcomes
            .into_iter()
            .zip(items)
            .map(|(outcome, (key, _))| outcome.map(|r| answer::reservation(key, r)))
            .collect())
    }

    /// Reserves `key`, waiting while another caller holds it, up to `timeout`; see
    /// [`Store::reserve_or_wait`](crate::Store::reserve_or_wait). A waiter is woken by a
    /// PostgreSQL notification when the key's row changes (completed, released, marked for
    /// review, taken over, expired): it marks the row as watched, and the writer that changes
    /// it sends `NOTIFY` on the store's channel, heard on one listening connection per store.
    /// Without a notification it asks again when the lease ends, or every
    /// [`PgBuilder::wait_poll`] (while the listening connection is down, for instance).
    ///
    /// # Errors
    /// As for [`reserve`](PgStore::reserve).
    pub async fn reserve_or_wait(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        timeout: Duration,
    ) -> Result<Reservation, Error> {
        let started = std::time::Instant::now();
        let inner = &self.inner;
        loop {
            let answer = self.reserve(key, fingerprint).await?;
            let Reservation::InProgress { retry_after, .. } = &answer else {
                return Ok(answer);
            };
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Ok(answer);
            }
            // Register before marking the row, so that no notification is missed.
            let registration = inner.waiters.register(key.encoded());
            let mut notified = std::pin::pin!(registration.notify.notified());
            notified.as_mut().enable();
            let marked = inner
                .read_query(&inner.sql.mark, &[&key.encoded()], || {
                    format!("marking key {key} as waited for")
                })
                .await?;
            if marked.is_empty() {
                // No pending row any more: ask again at once.
                continue;
            }
            let pause = inner.wait_poll.min(*retry_after).min(left);
            // Woken, or the pause is over: ask again either way.
            let _ = tokio::time::timeout(pause.max(Duration::from_millis(1)), notified).await;
        }
    }

    /// Stores the lease's result; see [`Store::complete`](crate::Store::complete).
    ///
    /// # Errors
    /// [`Error::ResultTooLarge`], [`Error::LeaseLost`], [`Error::Database`].
    pub async fn complete(&self, lease: &Lease, result: Vec<u8>) -> Result<(), Error> {
        self.check_result(&lease.key, &result)?;
        let op = Complete {
            token: lease.token,
            result,
        };
        answer::completion(lease, self.inner.apply(&lease.key, op, false).await?)
    }

    /// [`complete`](PgStore::complete), keeping this key's result for `retention` instead of
    /// its operation's retention; see
    /// [`Store::complete_with_retention`](crate::Store::complete_with_retention).
    ///
    /// # Errors
    /// As for [`complete`](PgStore::complete).
    pub async fn complete_with_retention(
        &self,
        lease: &Lease,
        result: Vec<u8>,
        retention: Duration,
    ) -> Result<(), Error> {
        self.check_result(&lease.key, &result)?;
        let op = WithRetention {
            op: Complete {
                token: lease.token,
                result,
            },
            retention: duration_millis(retention),
        };
        answer::completion(lease, self.inner.apply(&lease.key, op, false).await?)
    }

    /// Completes the lease's key and runs the caller's own statements (`work`) in the same
    /// PostgreSQL transaction: both are committed, or neither. The counterpart of
    /// [`Store::complete_with`](crate::Store::complete_with): "work done, key still pending"
    /// cannot survive a crash.
    ///
    /// The transaction locks the key's row (`SELECT ... FOR UPDATE`), checks that the lease
    /// still holds it, runs `work` on the transaction, writes the completion and commits.
    /// `work` gets a [`tokio_postgres::Transaction`]; it must not commit or roll it back.
    ///
    /// ```no_run
    /// use idemstore::{Fingerprint, Key, PgStore, Reservation};
    ///
    /// # async fn run(store: PgStore) -> Result<(), idemstore::Error> {
    /// let key = Key::new("user-7", "checkout", "k1")?;
    /// if let Reservation::Acquired(lease) = store.reserve(&key, Fingerprint::of(b"cart")).await? {
    ///     store
    ///         .complete_with(&lease, b"order 1".to_vec(), |tx| {
    ///             Box::pin(async move {
    ///                 tx.execute("INSERT INTO orders (id, cents) VALUES (1, 1999)", &[]).await?;
    ///                 Ok::<(), idemstore::tokio_postgres::Error>(())
    ///             })
    ///         })
    ///         .await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when the lease no longer owns the key or already completed it
    /// (`work` does not run); [`Error::Callback`] when `work` failed (rolled back, the key
    /// still pending); [`Error::Database`] when PostgreSQL failed: before the commit was sent
    /// nothing was applied, and an unanswered commit says that both may or may not be
    /// committed (read the key: completed means both were). Not retried, since `work` would
    /// have to run again.
    pub async fn complete_with<F, E>(
        &self,
        lease: &Lease,
        result: Vec<u8>,
        work: F,
    ) -> Result<(), Error>
    where
        F: for<'t> FnOnce(&'t tokio_postgres::Transaction<'t>) -> PgWork<'t, E> + Send,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.check_result(&lease.key, &result)?;
        let inner = &self.inner;
        let key = &lease.key;
        let failed =
            |what: &str, source: Box<dyn std::error::Error + Send + Sync>| Error::Database {
                context: format!("{what} for key {key}; nothing was applied"),
                source,
            };
        let mut client = inner
            .pool
            .get()
            .await
            .map_err(|e| failed("getting a connection", Box::new(e)))?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| failed("beginning the transaction", Box::new(e)))?;
        let keys = vec![key.encoded().to_vec()];
        let rows = tx
            .query(inner.sql.read_for_update.as_str(), &[&keys])
            .await
            .map_err(|e| failed("locking the key's row", Box::new(e)))?;
        let current = match rows.first().map(Inner::decode_row) {
            Some((_, row)) => Some(row?),
            None => None,
        };
        let op = Complete {
            token: lease.token,
            result,
        };
        let decision = decide(
            current.as_ref().map(|row| row.record.clone()),
            op,
            inner.now(),
            inner.policies.for_key(key),
            PLACEHOLDER,
        );
        let record = match (decision.change, decision.outcome) {
            (Change::Put(record), Ok(Completion::Stored)) => record,
            // The caller's statements went with the first completion, not this call.
            (_, Ok(_)) => {
                return Err(answer::lease_lost(
                    lease,
                    LeaseLostReason::Completed {
                        by_token: lease.token,
                    },
                ))
            }
            (_, Err(reason)) => return Err(answer::lease_lost(lease, reason)),
        };
        work(&tx).await.map_err(|source| Error::Callback {
            source: source.into(),
        })?;
        let body = super::write::stored_body(&record);
        let old = current.as_ref().map_or(0, |row| row.nonce);
        let written = tx
            .query(
                &format!(
                    "UPDATE {} SET nonce = $2, sweep_at = GREATEST(sweep_at, {}), \
                     expires_at = $3, lease_until = NULL, body = $4 \
                     WHERE key = $1 AND nonce = $5 RETURNING watched",
                    inner.sql.table,
                    super::schema::sweep_at("$3")
                ),
                &[
                    &keys[0],
                    &inner.nonce(),
                    &sql_millis(record.expires_at),
                    &body,
                    &old,
                ],
            )
            .await
            .map_err(|e| failed("writing the completion", Box::new(e)))?;
        if written.len() != 1 {
            return Err(failed(
                "writing the completion",
                "the locked row changed".into(),
            ));
        }
        inner.note(&keys[0], None);
        let watched = written[0].get::<_, bool>(0);
        tx.commit().await.map_err(|source| Error::Database {
            context: format!(
                "committing the completion of key {key} and the caller's statements; \
                 no answer, so both may or may not be committed (read the key: \
                 completed means both were)"
            ),
            source: Box::new(source),
        })?;
        if watched {
            inner.wake(&[key.encoded()]).await;
        }
        Ok(())
    }

    /// Records a recovery point for multi-step work; see
    /// [`Store::record_step`](crate::Store::record_step).
    ///
    /// # Errors
    /// [`Error::ResultTooLarge`], [`Error::LeaseLost`], [`Error::Database`].
    pub async fn record_step(&self, lease: &Lease, step: u32, data: &[u8]) -> Result<(), Error> {
        self.check_result(&lease.key, data)?;
        let op = RecordStep {
            token: lease.token,
            progress: Progress {
                step,
                data: data.to_vec(),
            },
        };
        answer::with_lease(lease, self.inner.apply(&lease.key, op, false).await?)
    }

    /// Deletes the reservation if this lease still holds it pending; see
    /// [`Store::release_if_pending`](crate::Store::release_if_pending).
    ///
    /// # Errors
    /// [`Error::LeaseLost`], [`Error::Database`].
    pub async fn release_if_pending(&self, lease: &Lease) -> Result<bool, Error> {
        let op = Release { token: lease.token };
        answer::with_lease(lease, self.inner.apply(&lease.key, op, false).await?)
    }

    /// Renews the lease; see [`Store::extend`](crate::Store::extend).
    ///
    /// # Errors
    /// [`Error::LeaseLost`], [`Error::Database`].
    pub async fn extend(&self, lease: &Lease) -> Result<Lease, Error> {
        let op = Extend { token: lease.token };
        extended(lease, self.inner.apply(&lease.key, op, false).await?)
    }

    /// Parks the key for a person; see
    /// [`Store::mark_needs_review`](crate::Store::mark_needs_review).
    ///
    /// # Errors
    /// [`Error::NoteTooLarge`], [`Error::LeaseLost`], [`Error::Database`].
    pub async fn mark_needs_review(&self, lease: &Lease, note: &str) -> Result<(), Error> {
        if note.len() > Key::MAX_NOTE_LEN {
            return Err(Error::NoteTooLarge {
                key: lease.key.clone(),
                len: note.len(),
            });
        }
        let op = MarkNeedsReview {
            token: lease.token,
            note: note.to_string(),
        };
        answer::with_lease(lease, self.inner.apply(&lease.key, op, false).await?)
    }

    /// Settles a key under review or a stale reservation; see
    /// [`Store::resolve`](crate::Store::resolve).
    ///
    /// # Errors
    /// [`Error::NotResolvable`], [`Error::ResultTooLarge`], [`Error::Database`].
    pub async fn resolve(&self, key: &Key, resolution: Resolution) -> Result<(), Error> {
        if let Resolution::Complete(result) = &resolution {
            self.check_result(key, result)?;
        }
        let outcome = self.inner.apply(key, Resolve(resolution), false).await?;
        answer::resolved(key, outcome)
    }

    /// [`resolve`](PgStore::resolve), a completed result kept for `retention`; see
    /// [`Store::resolve_with_retention`](crate::Store::resolve_with_retention).
    ///
    /// # Errors
    /// As for [`resolve`](PgStore::resolve).
    pub async fn resolve_with_retention(
        &self,
        key: &Key,
        resolution: Resolution,
        retention: Duration,
    ) -> Result<(), Error> {
        if let Resolution::Complete(result) = &resolution {
            self.check_result(key, result)?;
        }
        let op = WithRetention {
            op: Resolve(resolution),
            retention: duration_millis(retention),
        };
        answer::resolved(key, self.inner.apply(key, op, false).await?)
    }

    /// Deletes whatever is stored for `key` now; see [`Store::expire`](crate::Store::expire).
    /// A row past its expiry that no sweep deleted yet is deleted too (a data-deletion request
    /// removes the bytes). The next reserve acquires the key afresh with a higher token.
    ///
    /// # Errors
    /// [`Error::LeaseLive`] naming the lease's end when a live lease holds the key (nothing
    /// is changed); [`Error::Corruption`]; [`Error::Database`].
    pub async fn expire(&self, key: &Key) -> Result<Option<RecordClass>, Error> {
        self.expire_with(key, LiveLease::Refuse).await
    }

    /// [`expire`](PgStore::expire), also when a live lease holds the key; see
    /// [`Store::expire_forced`](crate::Store::expire_forced): the holder is fenced.
    ///
    /// # Errors
    /// As for [`expire`](PgStore::expire), without [`Error::LeaseLive`].
    pub async fn expire_forced(&self, key: &Key) -> Result<Option<RecordClass>, Error> {
        self.expire_with(key, LiveLease::Take).await
    }

    /// [`expire`](PgStore::expire) or [`expire_forced`](PgStore::expire_forced), as `live`
    /// says.
    ///
    /// # Errors
    /// As for [`expire`](PgStore::expire).
    pub async fn expire_with(
        &self,
        key: &Key,
        live: LiveLease,
    ) -> Result<Option<RecordClass>, Error> {
        let op = Expire {
            force: live == LiveLease::Take,
        };
        answer::expired(key, self.inner.apply(key, op, false).await?)
    }

    /// The dedup window; see [`Store::observe`](crate::Store::observe).
    ///
    /// # Errors
    /// [`Error::Corruption`], [`Error::Database`].
    pub async fn observe(&self, key: &Key, window: Duration) -> Result<Seen, Error> {
        let op = Observe {
            window: duration_millis(window),
        };
        Ok(answer::seen(self.inner.apply(key, op, true).await?))
    }

    /// [`observe`](PgStore::observe) for many keys in few statements; see
    /// [`Store::observe_many`](crate::Store::observe_many).
    ///
    /// # Errors
    /// The outer error fails the whole batch; an item fails alone when its row is damaged.
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
            .inner
            .apply_many(&ops, true)
            .await?
            .into_iter()
            .map(|outcome| outcome.map(answer::seen))
            .collect())
    }

    /// Completes many leases in few statements; see
    /// [`Store::complete_many`](crate::Store::complete_many).
    ///
    /// # Errors
    /// The outer error fails the whole batch; an item fails alone with
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

    /// Releases many leases in few statements; see
    /// [`Store::release_if_pending_many`](crate::Store::release_if_pending_many).
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

    /// Renews many leases in few statements; see
    /// [`Store::extend_many`](crate::Store::extend_many).
    ///
    /// # Errors
    /// The outer error fails the whole batch; an item fails alone with [`Error::LeaseLost`].
    pub async fn extend_many(&self, leases: &[&Lease]) -> Result<Vec<Result<Lease, Error>>, Error> {
        let ops = leases
            .iter()
            .map(|lease| (lease.key.clone(), Ok(Extend { token: lease.token })));
        self.run_many(leases, ops, extended).await
    }

    /// Expires many keys in few statements; see
    /// [`Store::expire_many`](crate::Store::expire_many).
    ///
    /// # Errors
    /// The outer error fails the whole batch; a key refused for its live lease, or with a
    /// damaged row, fails alone.
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
            .inner
            .apply_many(&ops, false)
            .await?
            .into_iter()
            .zip(keys)
            .map(|(outcome, key)| outcome.and_then(|outcome| answer::expired(key, outcome)))
            .collect())
    }

    /// The stored record, `None` when absent or expired.
    ///
    /// # Errors
    /// [`Error::Corruption`], [`Error::Database`].
    pub async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        let now = self.inner.now();
        let mut rows = self.inner.read_rows(&[key.encoded()]).await?;
        match rows.remove(key.encoded()) {
            None => Ok(None),
            Some(row) => Ok(Some(row?.record).filter(|record| !record.is_expired(now))),
        }
    }

    /// Reservations whose lease ran out and that have not expired, oldest lease first, up to
    /// `limit`; see [`Store::stale`](crate::Store::stale). Reads the table (no index on
    /// `lease_until`: a completion changes it, and would then not be a HOT update), so call it
    /// at intervals of a lease or more on a large table.
    ///
    /// # Errors
    /// [`Error::Corruption`] for a damaged row; [`Error::Database`].
    pub async fn stale(&self, limit: usize) -> Result<Vec<(Key, Record)>, Error> {
        let now = self.inner.now();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .inner
            .read_query(&self.inner.sql.stale, &[&sql_millis(now), &limit], || {
                "listing stale reservations".to_string()
            })
            .await?;
        rows.iter()
            .map(Inner::decode_row)
            .filter_map(|(key, row)| match (Key::decode(&key), row) {
                (_, Err(error)) => Some(Err(error)),
                (None, Ok(_)) => Some(Err(Error::Corruption {
                    location: format!("PostgreSQL row of key bytes {key:02x?}"),
                    reason: "the key column is not a key's encoding".to_string(),
                })),
                (Some(key), Ok(Row { record, .. })) => {
                    (record.class(now, self.inner.policies.floor()) == RecordClass::Stale)
                        .then_some(Ok((key, record)))
                }
            })
            .collect()
    }

    /// Deletes up to `limit` expired rows, by `sweep_at` (at most one lease and a second after
    /// a completed row's expiry), in one statement that walks the `sweep_at` index up to now
    /// plus the lease and a second (never the whole table); returns how many. Rows another sweeper
    /// holds are skipped, so several instances may sweep at once.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn sweep(&self, limit: usize) -> Result<usize, Error> {
        if limit == 0 {
            return Ok(0);
        }
        let now = sql_millis(self.inner.now());
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // Deleting expired rows is safe to send again: a second copy finds fewer rows.
        let rows = self
            .inner
            .read_query(
                &format!(
                    "WITH gone AS ({} RETURNING 1) SELECT count(*) FROM gone",
                    self.inner.sql.sweep
                ),
                &[
                    &now,
                    &limit,
                    // `sweep_at` is the expiry rounded up by at most a step.
                    &now.saturating_add(sql_millis(self.inner.lease))
                        .saturating_add(super::schema::SWEEP_STEP_MS),
                ],
                || "sweeping expired keys".to_string(),
            )
            .await?;
        Ok(rows
            .first()
            .map_or(0, |row| usize::try_from(row.get::<_, i64>(0)).unwrap_or(0)))
    }

    /// Sweeps in the background until the returned task is aborted: every `interval`, slices
    /// of up to `slice` expired rows until a slice comes back short. Errors are retried at the
    /// next interval.
    pub fn spawn_sweeper(&self, interval: Duration, slice: usize) -> tokio::task::JoinHandle<()> {
        let store = self.clone();
        tokio::spawn(async move {
            loop {
                while let Ok(swept) = store.sweep(slice).await {
                    if swept < slice {
                        break;
                    }
                }
                tokio::time::sleep(interval).await;
            }
        })
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
        let mut outcomes = self.inner.apply_many(&sent, false).await?.into_iter();
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

    pub(super) fn check_result(&self, key: &Key, result: &[u8]) -> Result<(), Error> {
        if result.len() > self.inner.max_result_len {
            return Err(Error::ResultTooLarge {
                key: key.clone(),
                len: result.len(),
                limit: self.inner.max_result_len,
            });
        }
        Ok(())
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
