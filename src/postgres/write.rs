//! The one write path: read the keys' rows (or guess them absent), [`decide`], write with a
//! compare on each row's nonce in one multi-row statement per kind of change, and decide again
//! the keys whose row changed meanwhile. Errors after which a statement may have been applied
//! (a connection reset, a server killed) are settled by reading the row again and looking for
//! the write's own nonce, never by guessing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::schema::Sql;
use crate::clock::{to_millis, Clock};
use crate::decide::expire::Expired;
use crate::decide::op::{LeaseOutcome, Reserved};
use crate::decide::policy::Policies;
use crate::decide::{decide, Change, Operation};
use crate::error::Error;
use crate::key::Key;
use crate::record::{Millis, Record};

/// The token a decision is given: the write replaces it with the sequence's next value.
pub(crate) const PLACEHOLDER: u64 = 1 << 63;

/// The shared state of a [`PgStore`](super::PgStore) and its clones.
pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) sql: Sql,
    pub(crate) policies: Policies,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) max_result_len: usize,
    /// The lease of new acquisitions (how far past now sweeping looks, `schema.rs`).
    pub(crate) lease: Millis,
    pub(crate) op_deadline: Duration,
    pub(crate) statement_timeout: Duration,
    pub(crate) nonce_base: u64,
    pub(crate) writes: AtomicU64,
    /// Statements sent again after an error that applied nothing or may have applied.
    pub(crate) resends: AtomicU64,
    /// The pending rows this process wrote last, by key: a holder's next write (complete,
    /// extend, release) is decided on it and sent at once under its nonce, with no read; a
    /// wrong guess costs only the compare that matches nothing, then a read.
    pub(crate) hints: parking_lot::Mutex<HashMap<Vec<u8>, Row>>,
    /// The `reserve_or_wait` callers, woken by notifications (`wait.rs`).
    pub(crate) waiters: Arc<super::wait::Waiters>,
    /// The longest a waiting call sleeps without a notification.
    pub(crate) wait_poll: Duration,
}

/// Most pending rows remembered as hints; the map is emptied when full.
const MAX_HINTS: usize = 65_536;

/// Keeps (or drops) the hint of a key: the pending row this process wrote (see
/// [`Inner::note`]).
fn note(hints: &mut HashMap<Vec<u8>, Row>, key: &[u8], row: Option<&Row>) {
    match row.filter(|row| row.record.lease_until().is_some()) {
        Some(row) => {
            if hints.len() >= MAX_HINTS {
                hints.clear();
            }
            hints.insert(key.to_vec(), row.clone());
        }
        None => {
            hints.remove(key);
        }
    }
}

/// Where the token field starts in a record's encoding (after the format version, the state
/// tag and the fingerprint; docs/format.md), and its length. A row's `body` leaves the field
/// out: the `token` column holds the token.
const TOKEN_AT: usize = 2 + crate::Fingerprint::LEN;
const TOKEN_LEN: usize = 8;

/// A record as a row's `body` holds it: its encoding with the token zero (the checksum covers
/// that zero), less the token field.
pub(crate) fn stored_body(record: &Record) -> Vec<u8> {
    let mut zeroed = record.clone();
    zeroed.token = 0;
    let mut bytes = zeroed.encode();
    bytes.drain(TOKEN_AT..TOKEN_AT + TOKEN_LEN);
    bytes
}

/// The record of a row's `body` (its token zero): the token field put back, then decoded and
/// its checksum checked. A body too short to hold the fields before the token is decoded as
/// it is, which reports it.
pub(crate) fn record_of(body: &[u8]) -> Result<Record, String> {
    if body.len() < TOKEN_AT {
        return Record::decode(body);
    }
    let mut bytes = Vec::with_capacity(body.len() + TOKEN_LEN);
    bytes.extend_from_slice(&body[..TOKEN_AT]);
    bytes.extend_from_slice(&[0; TOKEN_LEN]);
    bytes.extend_from_slice(&body[TOKEN_AT..]);
    Record::decode(&bytes)
}

/// A row as read: the record (its token from the column), and the nonce of the write that
/// made it.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) record: Record,
    pub(crate) nonce: i64,
}

/// How one statement failed.
pub(crate) enum Failure {
    /// Nothing was applied, and sending again may succeed (no connection, a serialization
    /// failure, a deadlock victim, too many connections).
    Retry(Box<dyn std::error::Error + Send + Sync>),
    /// PostgreSQL refused the statement for good; nothing was applied.
    Refused(tokio_postgres::Error),
    /// The answer was lost (connection reset, server gone, timeout): it may have been applied.
    Unknown(Box<dyn std::error::Error + Send + Sync>),
}

/// SQL states after which nothing was applied and a new try may succeed.
fn retryable(state: &SqlState) -> bool {
    [
        SqlState::T_R_SERIALIZATION_FAILURE,
        SqlState::T_R_DEADLOCK_DETECTED,
        SqlState::LOCK_NOT_AVAILABLE,
        SqlState::TOO_MANY_CONNECTIONS,
        SqlState::CANNOT_CONNECT_NOW,
        SqlState::READ_ONLY_SQL_TRANSACTION,
    ]
    .contains(state)
}

/// SQL states that end the session: the statement may have been committed before it ended.
fn session_ended(state: &SqlState) -> bool {
    [
        SqlState::ADMIN_SHUTDOWN,
        SqlState::CRASH_SHUTDOWN,
        SqlState::IDLE_SESSION_TIMEOUT,
    ]
    .contains(state)
        || state.code().starts_with("08")
}

/// Classifies a statement's error.
pub(crate) fn classify(error: tokio_postgres::Error) -> Failure {
    match error.code() {
        Some(state) if retryable(state) => Failure::Retry(Box::new(error)),
        Some(state) if session_ended(state) => Failure::Unknown(Box::new(error)),
        Some(_) => Failure::Refused(error),
        None => Failure::Unknown(Box::new(error)),
    }
}

/// Milliseconds as the `bigint` columns store them (never is `i64::MAX`).
pub(crate) fn sql_millis(millis: Millis) -> i64 {
    i64::try_from(millis).unwrap_or(i64::MAX)
}

/// The outcome types whose answer names the token an acquisition was given.
pub(crate) trait Tokened {
    /// The outcome with the placeholder token replaced by the one the write was given.
    fn with_token(self, token: u64) -> Self;
}

impl Tokened for Reserved {
    fn with_token(self, token: u64) -> Self {
        match self {
            Reserved::Acquired {
                token: PLACEHOLDER,
                attempt,
                lease_until,
                progress,
            } => Reserved::Acquired {
                token,
                attempt,
                lease_until,
                progress,
            },
            other => other,
        }
    }
}

impl<T> Tokened for LeaseOutcome<T> {
    fn with_token(self, _token: u64) -> Self {
        self
    }
}

impl Tokened for Result<(), &'static str> {
    fn with_token(self, _token: u64) -> Self {
        self
    }
}

impl Tokened for Expired {
    fn with_token(self, _token: u64) -> Self {
        self
    }
}

impl Tokened for bool {
    fn with_token(self, _token: u64) -> Self {
        self
    }
}

/// One item's write, waiting for its statement's answer.
struct Sending<T> {
    item: usize,
    outcome: T,
    nonce: i64,
    /// Put: the record written.
    record: Option<Record>,
}

/// An earlier write of an item whose answer was lost: it landed if the row shows its nonce
/// (a put) or is gone (a delete).
struct Unsettled<T> {
    outcome: T,
    nonce: i64,
    delete: bool,
}

impl Inner {
    pub(crate) fn now(&self) -> Millis {
        to_millis(self.clock.now())
    }

    /// A nonce no other write of any store uses (a random base per store, then a counter).
    pub(crate) fn nonce(&self) -> i64 {
        self.nonce_base
            .wrapping_add(self.writes.fetch_add(1, Ordering::Relaxed))
            .cast_signed()
    }

    /// Remembers what this process wrote to `key`: a pending row as a hint, anything else
    /// forgets the key.
    pub(crate) fn note(&self, key: &[u8], row: Option<&Row>) {
        note(&mut self.hints.lock(), key, row);
    }

    /// Notifies the waiters of keys (encoded) whose watched rows a committed write changed
    /// (`wait.rs`). A failure is not reported: the waiters ask again at their poll interval.
    pub(crate) async fn wake(&self, keys: &[&[u8]]) {
        if keys.is_empty() {
            return;
        }
        let payloads: Vec<String> = keys.iter().map(|key| super::wait::hex(key)).collect();
        let _ = self.query(&self.sql.notify, &[&payloads]).await;
    }

    /// Runs one statement once, on a pooled connection.
    pub(crate) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, Failure> {
        let client = match tokio::time::timeout(self.statement_timeout, self.pool.get()).await {
            Ok(Ok(client)) => client,
            Ok(Err(error)) => return Err(Failure::Retry(Box::new(error))),
            Err(elapsed) => return Err(Failure::Retry(Box::new(elapsed))),
        };
        let statement = match client.prepare_cached(sql).await {
            Ok(statement) => statement,
            Err(error) => {
                return Err(match classify(error) {
                    // Preparing applies nothing.
                    Failure::Unknown(error) => Failure::Retry(error),
                    other => other,
                });
            }
        };
        match tokio::time::timeout(self.statement_timeout, client.query(&statement, params)).await {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(error)) => Err(classify(error)),
            Err(elapsed) => Err(Failure::Unknown(Box::new(elapsed))),
        }
    }

    /// Runs a statement that changes nothing, again while it fails for a passing reason, up
    /// to the operation deadline.
    pub(crate) async fn read_query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        what: impl Fn() -> String,
    ) -> Result<Vec<tokio_postgres::Row>, Error> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(10);
        loop {
            let source = match self.query(sql, params).await {
                Ok(rows) => return Ok(rows),
                Err(Failure::Refused(error)) => {
                    return Err(Error::Database {
                        context: format!("{}; it refused the statement", what()),
                        source: Box::new(error),
                    })
                }
                Err(Failure::Retry(error) | Failure::Unknown(error)) => error,
            };
            if started.elapsed() + pause > self.op_deadline {
                return Err(Error::Database {
                    context: format!("{}; no answer within {:?}", what(), self.op_deadline),
                    source,
                });
            }
            self.resends.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// Decodes a row of `key, token, nonce, body`.
    pub(crate) fn decode_row(row: &tokio_postgres::Row) -> (Vec<u8>, Result<Row, Error>) {
        let key: Vec<u8> = row.get(0);
        let token: i64 = row.get(1);
        let nonce: i64 = row.get(2);
        let body: &[u8] = row.get(3);
        let decoded = record_of(body)
            .map(|mut record| {
                record.token = token.cast_unsigned();
                Row { record, nonce }
            })
            .map_err(|reason| Error::Corruption {
                location: format!(
                    "PostgreSQL row of key {}",
                    Key::decode(&key).map_or_else(|| format!("{key:02x?}"), |key| key.to_string())
                ),
                reason,
            });
        (key, decoded)
    }

    /// The rows of `keys` (encoded), read in one statement; absent keys are missing.
    pub(crate) async fn read_rows(
        &self,
        keys: &[Vec<u8>],
    ) -> Result<HashMap<Vec<u8>, Result<Row, Error>>, Error> {
        let keys = keys.to_vec();
        let rows = self
            .read_query(&self.sql.read, &[&keys], || {
                format!("reading {} keys", keys.len())
            })
            .await?;
        Ok(rows.iter().map(Inner::decode_row).collect())
    }

    /// Applies `op` to one key; see [`apply_many`](Inner::apply_many).
    pub(crate) async fn apply<O>(
        &self,
        key: &Key,
        op: O,
        absent_first: bool,
    ) -> Result<O::Outcome, Error>
    where
        O: Operation + Clone,
        O::Outcome: Tokened,
    {
        let mut outcomes = self.apply_many(&[(key.clone(), op)], absent_first).await?;
        outcomes.pop().expect("one outcome per item")
    }

    /// Applies each `(key, op)` through [`decide`], in few statements: the rows are read in one
    /// (or, when `absent_first`, guessed absent: most keys reserved or observed are new, and a
    /// wrong guess only costs an insert that finds the key), each key is decided, and the
    /// changes are written in at most one insert, one update and one delete statement, each
    /// row under a compare on the nonce it was decided on. Keys whose row changed meanwhile
    /// are read and decided again; a key named twice is decided again after its first
    /// occurrence was written, so the second sees the first. A decision that changes nothing
    /// is answered only from a row read from PostgreSQL, never from a guess.
    ///
    /// # Errors
    /// The outer error when PostgreSQL refused a statement, or gave no answer within the
    /// operation deadline (saying whether a write may have been applied); an item's error
    /// (a damaged row) fails that item alone.
    pub(crate) async fn apply_many<O>(
        &self,
        ops: &[(Key, O)],
        absent_first: bool,
    ) -> Result<Vec<Result<O::Outcome, Error>>, Error>
    where
        O: Operation + Clone,
        O::Outcome: Tokened,
    {
        let started = Instant::now();
        let mut pause = Duration::from_millis(10);
        let mut results: Vec<Option<Result<O::Outcome, Error>>> =
            (0..ops.len()).map(|_| None).collect();
        let mut unsettled: HashMap<usize, Vec<Unsettled<O::Outcome>>> = HashMap::new();
        // What is known of each key: the row (None: absent) and whether it is only a guess.
        let mut known: HashMap<Vec<u8>, (Option<Row>, bool)> = HashMap::new();
        let mut todo: Vec<usize> = (0..ops.len()).collect();
        let mut last_failure: Option<Box<dyn std::error::Error + Send + Sync>> = None;
        let mut first_round = true;
        while !todo.is_empty() {
            if last_failure.is_some() && started.elapsed() + pause > self.op_deadline {
                let landed = if unsettled.is_empty() {
                    "nothing was applied"
                } else {
                    "a write whose answer was lost may or may not have been applied"
                };
                return Err(Error::Database {
                    context: format!(
                        "writing {} of {} keys (first: {}); no answer within {:?}, {landed}",
                        todo.len(),
                        ops.len(),
                        ops[todo[0]].0,
                        self.op_deadline
                    ),
                    source: last_failure.take().expect("checked above"),
                });
            }
            // This round: the first occurrence of each key still to do.
            let mut round = Vec::new();
            let mut later = Vec::new();
            {
                let mut in_round = std::collections::HashSet::new();
                for &item in &todo {
                    if in_round.insert(ops[item].0.encoded()) {
                        round.push(item);
                    } else {
                        later.push(item);
                    }
                }
            }
            let to_read: Vec<Vec<u8>> = round
                .iter()
                .map(|&item| ops[item].0.encoded().to_vec())
                .filter(|key| !known.contains_key(key))
                .collect();
            let to_read: Vec<Vec<u8>> = if first_round {
                let hints = self.hints.lock();
                to_read
                    .into_iter()
                    .filter(|key| match hints.get(key) {
                        Some(row) => {
                            known.insert(key.clone(), (Some(row.clone()), true));
                            false
                        }
                        None if absent_first => {
                            known.insert(key.clone(), (None, true));
                            false
                        }
                        None => true,
                    })
                    .collect()
            } else {
                to_read
            };
            if !to_read.is_empty() {
                let mut rows = self.read_rows(&to_read).await?;
                for key in to_read {
                    match rows.remove(&key) {
                        None => {
                            known.insert(key, (None, false));
                        }
                        Some(Ok(row)) => {
                            known.insert(key, (Some(row), false));
                        }
                        Some(Err(error)) => {
                            // A round names each key once: that item fails alone.
                            if let Some(&item) =
                                round.iter().find(|&&item| ops[item].0.encoded() == key)
                            {
                                results[item] = Some(Err(error));
                            }
                        }
                    }
                }
            }
            first_round = false;
            let now = self.now();
            let mut again = later;
            let mut inserts: Vec<Sending<O::Outcome>> = Vec::new();
            let mut updates: Vec<(Sending<O::Outcome>, i64)> = Vec::new();
            let mut deletes: Vec<(Sending<O::Outcome>, i64)> = Vec::new();
            for item in round {
                if results[item].is_some() {
                    continue;
                }
                let (key, op) = &ops[item];
                let Some((current, guessed)) = known.get(key.encoded()).cloned() else {
                    again.push(item);
                    continue;
                };
                // An earlier write of this item whose answer was lost: did it land?
                if let Some(earlier) = unsettled.get_mut(&item) {
                    let landed = earlier.iter().position(|u| match &current {
                        Some(row) => !u.delete && row.nonce == u.nonce,
                        None => u.delete,
                    });
                    if let (Some(at), false) = (landed, guessed) {
                        let found = earlier.swap_remove(at);
                        let token = current.as_ref().map_or(0, |row| row.record.token);
                        results[item] = Some(Ok(found.outcome.with_token(token)));
                        unsettled.remove(&item);
                        continue;
                    }
                }
                let decision = decide(
                    current.as_ref().map(|row| row.record.clone()),
                    op.clone(),
                    now,
                    self.policies.for_key(key),
                    PLACEHOLDER,
                );
                let nonce = self.nonce();
                match decision.change {
                    Change::Keep if guessed => {
                        known.remove(key.encoded());
                        again.push(item);
                    }
                    Change::Keep => {
                        results[item] = Some(Ok(decision.outcome));
                        unsettled.remove(&item);
                    }
                    Change::Put(record) => {
                        let sending = Sending {
                            item,
                            outcome: decision.outcome,
                            nonce,
                            record: Some(record),
                        };
                        match &current {
                            None => inserts.push(sending),
                            Some(row) => updates.push((sending, row.nonce)),
                        }
                    }
                    Change::Delete => {
                        let old = current.as_ref().map_or(0, |row| row.nonce);
                        let sending = Sending {
                            item,
                            outcome: decision.outcome,
                            nonce,
                            record: None,
                        };
                        deletes.push((sending, old));
                    }
                }
            }
            let mut failed = None;
            if !inserts.is_empty() {
                let sent = inserts.into_iter().map(|s| (s, 0)).collect();
                self.send_puts(
                    ops,
                    sent,
                    false,
                    &mut results,
                    &mut known,
                    &mut unsettled,
                    &mut again,
                    &mut failed,
                )
                .await?;
            }
            if !updates.is_empty() {
                self.send_puts(
                    ops,
                    updates,
                    true,
                    &mut results,
                    &mut known,
                    &mut unsettled,
                    &mut again,
                    &mut failed,
                )
                .await?;
            }
            if !deletes.is_empty() {
                self.send_deletes(
                    ops,
                    deletes,
                    &mut results,
                    &mut known,
                    &mut unsettled,
                    &mut again,
                    &mut failed,
                )
                .await?;
            }
            if let Some(error) = failed {
                last_failure = Some(error);
                self.resends.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            again.sort_unstable();
            todo = again;
        }
        Ok(results
            .into_iter()
            .map(|result| result.expect("every item answered"))
            .collect())
    }

    /// Sends the puts of one round as one insert (`update` false: the keys were absent) or
    /// one update (each under a compare on the nonce it was decided on).
    #[allow(clippy::too_many_arguments)]
    async fn send_puts<O: Operation>(
        &self,
        ops: &[(Key, O)],
        mut puts: Vec<(Sending<O::Outcome>, i64)>,
        update: bool,
        results: &mut [Option<Result<O::Outcome, Error>>],
        known: &mut HashMap<Vec<u8>, (Option<Row>, bool)>,
        unsettled: &mut HashMap<usize, Vec<Unsettled<O::Outcome>>>,
        again: &mut Vec<usize>,
        failed: &mut Option<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Result<(), Error>
    where
        O::Outcome: Tokened,
    {
        // One order for every statement, so concurrent batches lock rows alike.
        puts.sort_by(|a, b| ops[a.0.item].0.encoded().cmp(ops[b.0.item].0.encoded()));
        let n = puts.len();
        let (mut keys, mut olds, mut fresh, mut tokens, mut nonces) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut expires, mut leases, mut bodies) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for (sending, old) in &puts {
            let record = sending.record.as_ref().expect("a put has a record");
            keys.push(ops[sending.item].0.encoded().to_vec());
            olds.push(*old);
            fresh.push(record.token == PLACEHOLDER);
            tokens.push(if record.token == PLACEHOLDER {
                0
            } else {
                record.token.cast_signed()
            });
            nonces.push(sending.nonce);
            expires.push(sql_millis(record.expires_at));
            leases.push(record.lease_until().map(sql_millis));
            bodies.push(stored_body(record));
        }
        let answer = if n == 1 && update {
            self.query(
                &self.sql.update_one,
                &[
                    &keys[0],
                    &olds[0],
                    &fresh[0],
                    &tokens[0],
                    &nonces[0],
                    &expires[0],
                    &leases[0],
                    &bodies[0],
                ],
            )
            .await
        } else if n == 1 {
            self.query(
                &self.sql.insert_one,
                &[
                    &keys[0],
                    &fresh[0],
                    &tokens[0],
                    &nonces[0],
                    &expires[0],
                    &leases[0],
                    &bodies[0],
                ],
            )
            .await
        } else if update {
            self.query(
                &self.sql.update,
                &[
                    &keys, &olds, &fresh, &tokens, &nonces, &expires, &leases, &bodies,
                ],
            )
            .await
        } else {
            self.query(
                &self.sql.insert,
                &[&keys, &fresh, &tokens, &nonces, &expires, &leases, &bodies],
            )
            .await
        };
        match answer {
            Ok(rows) => {
                let written: HashMap<&[u8], i64> = rows
                    .iter()
                    .map(|row| (row.get::<_, &[u8]>(0), row.get::<_, i64>(1)))
                    .collect();
                // An insert makes an unwatched row; an update says whether the row was.
                let watched: Vec<&[u8]> = rows
                    .iter()
                    .filter(|row| row.len() > 2 && row.get::<_, bool>(2))
                    .map(|row| row.get::<_, &[u8]>(0))
                    .collect();
                self.wake(&watched).await;
                // The hints of the whole statement under one lock.
                let mut hints = self.hints.lock();
                for (sending, _) in puts {
                    let key = ops[sending.item].0.encoded().to_vec();
                    match written.get(key.as_slice()) {
                        Some(&token) => {
                            let token = token.cast_unsigned();
                            let mut record = sending.record.expect("a put has a record");
                            record.token = token;
                            let row = Row {
                                record,
                                nonce: sending.nonce,
                            };
                            note(&mut hints, &key, Some(&row));
                            known.insert(key, (Some(row), false));
                            results[sending.item] = Some(Ok(sending.outcome.with_token(token)));
                            unsettled.remove(&sending.item);
                        }
                        None => {
                            // The row changed (or exists) since it was decided on.
                            note(&mut hints, &key, None);
                            known.remove(&key);
                            again.push(sending.item);
                        }
                    }
                }
                Ok(())
            }
            Err(Failure::Refused(error)) => Err(refused(ops, puts.len(), error)),
            Err(Failure::Retry(error)) => {
                again.extend(puts.iter().map(|(sending, _)| sending.item));
                *failed = Some(error);
                Ok(())
            }
            Err(Failure::Unknown(error)) => {
                let sent = puts.into_iter().map(|(sending, _)| sending);
                self.unsettle(ops, sent, false, known, unsettled, again);
                *failed = Some(error);
                Ok(())
            }
        }
    }

    /// Items whose statement's answer was lost: each may or may not have landed, so its row is
    /// forgotten, the write is kept to be settled by its nonce, and the item goes round again.
    fn unsettle<O: Operation>(
        &self,
        ops: &[(Key, O)],
        sent: impl Iterator<Item = Sending<O::Outcome>>,
        delete: bool,
        known: &mut HashMap<Vec<u8>, (Option<Row>, bool)>,
        unsettled: &mut HashMap<usize, Vec<Unsettled<O::Outcome>>>,
        again: &mut Vec<usize>,
    ) {
        for sending in sent {
            self.note(ops[sending.item].0.encoded(), None);
            known.remove(ops[sending.item].0.encoded());
            unsettled.entry(sending.item).or_default().push(Unsettled {
                outcome: sending.outcome,
                nonce: sending.nonce,
                delete,
            });
            again.push(sending.item);
        }
    }

    /// Sends the deletes of one round as one statement, each under a compare on its nonce.
    #[allow(clippy::too_many_arguments)]
    async fn send_deletes<O: Operation>(
        &self,
        ops: &[(Key, O)],
        mut deletes: Vec<(Sending<O::Outcome>, i64)>,
        results: &mut [Option<Result<O::Outcome, Error>>],
        known: &mut HashMap<Vec<u8>, (Option<Row>, bool)>,
        unsettled: &mut HashMap<usize, Vec<Unsettled<O::Outcome>>>,
        again: &mut Vec<usize>,
        failed: &mut Option<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Result<(), Error>
    where
        O::Outcome: Tokened,
    {
        deletes.sort_by(|a, b| ops[a.0.item].0.encoded().cmp(ops[b.0.item].0.encoded()));
        let keys: Vec<Vec<u8>> = deletes
            .iter()
            .map(|(s, _)| ops[s.item].0.encoded().to_vec())
            .collect();
        let olds: Vec<i64> = deletes.iter().map(|(_, old)| *old).collect();
        match self.query(&self.sql.delete, &[&keys, &olds]).await {
            Ok(rows) => {
                let gone: std::collections::HashSet<Vec<u8>> =
                    rows.iter().map(|row| row.get::<_, Vec<u8>>(0)).collect();
                let watched: Vec<&[u8]> = rows
                    .iter()
                    .filter(|row| row.get::<_, bool>(1))
                    .map(|row| row.get::<_, &[u8]>(0))
                    .collect();
                self.wake(&watched).await;
                for (sending, _) in deletes {
                    let key = ops[sending.item].0.encoded().to_vec();
                    self.note(&key, None);
                    if gone.contains(&key) {
                        known.insert(key, (None, false));
                        results[sending.item] = Some(Ok(sending.outcome));
                        unsettled.remove(&sending.item);
                    } else {
                        known.remove(&key);
                        again.push(sending.item);
                    }
                }
                Ok(())
            }
            Err(Failure::Refused(error)) => Err(refused(ops, deletes.len(), error)),
            Err(Failure::Retry(error)) => {
                again.extend(deletes.iter().map(|(sending, _)| sending.item));
                *failed = Some(error);
                Ok(())
            }
            Err(Failure::Unknown(error)) => {
                let sent = deletes.into_iter().map(|(sending, _)| sending);
                self.unsettle(ops, sent, true, known, unsettled, again);
                *failed = Some(error);
                Ok(())
            }
        }
    }
}

/// The error of a statement PostgreSQL refused for good.
fn refused<O>(ops: &[(Key, O)], count: usize, error: tokio_postgres::Error) -> Error {
    Error::Database {
        context: format!(
            "writing {count} of {} keys (first: {}); it refused the statement, \
             so that statement applied nothing",
            ops.len(),
            ops.first()
                .map_or_else(String::new, |(key, _)| key.to_string())
        ),
        source: Box::new(error),
    }
}
