//! [`PgStore`]: the key-reservation operations on PostgreSQL.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::builder::PgBuilder;
use std::sync::atomic::AtomicU64;

use deadpool_postgres::Pool;

use super::hints::Hints;
use super::schema::Sql;
use super::statement::PLACEHOLDER;
use super::statement::{sql_millis, Row};
use crate::answers::{Lease, Reservation};
use crate::clock::Clock;
use crate::decide::answer;
use crate::decide::Policies;
use crate::decide::{decide, Change, Completion};
use crate::error::{Error, LeaseLostReason};
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::record::{Record, RecordClass};
use crate::remote::Backend;

/// The shared state of a [`PgStore`](super::PgStore) and its clones.
pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) sql: Sql,
    pub(crate) policies: Policies,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) max_result_len: usize,
    pub(crate) op_deadline: Duration,
    pub(crate) statement_timeout: Duration,
    pub(crate) nonce_base: u64,
    pub(crate) writes: AtomicU64,
    /// Statements sent again after an error that applied nothing or may have applied.
    pub(crate) resends: AtomicU64,
    /// The pending rows this process wrote last, by key: a holder's next write (complete,
    /// extend, release) is decided on it and sent at once under its nonce, with no read; a
    /// wrong guess costs only the compare that matches nothing, then a read.
    pub(crate) hints: parking_lot::Mutex<Hints>,
    /// The `reserve_or_wait` callers, woken by notifications (`wait.rs`).
    pub(crate) waiters: Arc<super::wait::Waiters>,
    /// The longest a waiting call sleeps without a notification.
    pub(crate) wait_poll: Duration,
}

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
        let op = crate::remote::completion(self.inner(), lease, result)?;
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
        let body = super::statement::stored_body(&record);
        let old = current.as_ref().map_or(0, |row| row.nonce);
        let written = tx
            .query(
                inner.sql.complete_locked.as_str(),
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

    /// Reservations whose lease ran out and that have not expired, oldest lease first, up to
    /// `limit`; see [`Store::stale`](crate::Store::stale). By default it reads the table (an
    /// index on `lease_until`, which a completion changes, would make completions cost more),
    /// so call it at intervals of a lease or more on a large table; a store built with
    /// [`PgBuilder::index_stale`](crate::PgBuilder::index_stale) reads an index of the pending
    /// rows instead.
    ///
    /// # Errors
    /// [`StorageError::Corruption`](crate::StorageError::Corruption) for a damaged row; [`Error::Database`].
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
                (None, Ok(_)) => Some(Err(crate::StorageError::Corruption {
                    location: format!("PostgreSQL row of key bytes {key:02x?}"),
                    reason: "the key column is not a key's encoding".to_string(),
                }
                .into())),
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
                    &now.saturating_add(self.inner.sql.sweep_ahead),
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
}

crate::remote::store_operations!(PgStore {
    failure: "Database",
    durable: "PostgreSQL committed it",
    batch: "statements",
});
