//! The one write path: read the keys' rows (or guess them absent), [`decide`], write with a
//! compare on each row's nonce in one multi-row statement per kind of change, and decide again
//! the keys whose row changed meanwhile. Errors after which a statement may have been applied
//! (a connection reset, a server killed) are settled by reading the row again and looking for
//! the write's own nonce, never by guessing.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::schema::Sql;
use crate::clock::{to_millis, Clock};
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
    pub(crate) hints: parking_lot::Mutex<Hints>,
    /// The `reserve_or_wait` callers, woken by notifications (`wait.rs`).
    pub(crate) waiters: Arc<super::wait::Waiters>,
    /// The longest a waiting call sleeps without a notification.
    pub(crate) wait_poll: Duration,
}

/// Most pending rows remembered as hints; the map is emptied when full.
const MAX_HINTS: usize = 65_536;

/// The pending rows this process wrote last, by key (see [`Inner::hints`]). A key is
/// remembered by its 64-bit hash under a key of this map's own (the standard library's
/// randomly keyed hasher), not by its bytes: no copy of the key per hint. Two keys with one
/// hash would only make a wrong guess, which the write's compare on the row's nonce (unique
/// to each write) turns into a read, as for any stale hint.
pub(crate) struct Hints {
    rows: HashMap<u64, Row, BuildHasherDefault<Hashed>>,
    hasher: RandomState,
}

/// The map's hasher: its keys are already hashes.
#[derive(Default)]
pub(crate) struct Hashed(u64);

impl Hasher for Hashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 << 8) | u64::from(*byte);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

impl Hints {
    pub(crate) fn new() -> Hints {
        Hints {
            rows: HashMap::default(),
            hasher: RandomState::new(),
        }
    }

    fn of(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    pub(crate) fn get(&self, key: &[u8]) -> Option<&Row> {
        if self.rows.is_empty() {
            return None;
        }
        self.rows.get(&self.of(key))
    }

    pub(crate) fn remove(&mut self, key: &[u8]) -> Option<Row> {
        if self.rows.is_empty() {
            return None;
        }
        let hash = self.of(key);
        self.rows.remove(&hash)
    }

    /// Keeps (or drops) the hint of a key: the pending row this process wrote (see
    /// [`Inner::note`]).
    pub(crate) fn note(&mut self, key: &[u8], row: Option<&Row>) {
        match row.filter(|row| row.record.lease_until().is_some()) {
            Some(row) => self.keep(key, row.clone()),
            None => {
                self.remove(key);
            }
        }
    }

    /// [`note`](Hints::note) of a row the caller no longer needs: a pending row is moved in.
    pub(crate) fn note_owned(&mut self, key: &[u8], row: Row) {
        if row.record.lease_until().is_some() {
            self.keep(key, row);
        } else {
            self.remove(key);
        }
    }

    fn keep(&mut self, key: &[u8], row: Row) {
        if self.rows.len() >= MAX_HINTS {
            self.rows.clear();
        }
        let hash = self.of(key);
        self.rows.insert(hash, row);
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

/// One item's write, waiting for its statement's answer.
struct Sending<T> {
    /// The item's place in key order ([`Work::order`]).
    rank: usize,
    outcome: T,
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

/// What one call of [`Inner::rounds`] knows, by an item's place in key order (its rank).
struct Work<T> {
    /// The items in key order, a key's occurrences in item order: every statement locks rows
    /// in this one order, and the occurrences of a key are neighbours.
    order: Vec<usize>,
    /// For each rank, the rank of its key's first occurrence: the key's slot in `known`.
    run: Vec<usize>,
    /// By item.
    results: Vec<Option<Result<T, Error>>>,
    /// By a key's first rank: its row (None: absent) and whether it is only a guess.
    known: Vec<Option<(Option<Row>, bool)>>,
    /// By rank.
    unsettled: HashMap<usize, Vec<Unsettled<T>>>,
    /// Ranks to decide again.
    again: Vec<usize>,
    failed: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl<T> Work<T> {
    /// Answers the item of rank `rank`.
    fn answer(&mut self, rank: usize, outcome: Result<T, Error>) {
        self.results[self.order[rank]] = Some(outcome);
        if !self.unsettled.is_empty() {
            self.unsettled.remove(&rank);
        }
    }

    /// Whether an occurrence of the key of rank `rank` comes after it (a round decides the
    /// first occurrence still to do, so the rest come after it).
    fn more_of(&self, rank: usize) -> bool {
        self.run.get(rank + 1) == Some(&self.run[rank])
    }
}

/// How a call of [`Inner::rounds`] begins.
enum Start<T> {
    /// Each row guessed (a hint, or absent when the caller allows), read only when needed.
    Guess,
    /// The single-key path's write did not apply (the row changed, or the key exists) or
    /// failed (`failure`, counted against the operation deadline): read the row first,
    /// settling the write by its nonce when its answer was lost.
    Read {
        unsettled: Option<Unsettled<T>>,
        failure: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl Inner {
    pub(crate) fn now(&self) -> Millis {
        to_millis(self.clock.now())
    }

    /// A nonce no other write of any store uses (a random base per store, then a counter).
    pub(crate) fn nonce(&self) -> i64 {
        self.nonces(1)
    }

    /// The first of `n` nonces in a row (`first .. first + n`, no overflow), which no other
    /// write uses: a statement sends the first and each row adds its place.
    pub(crate) fn nonces(&self, n: usize) -> i64 {
        nonce_range(self.nonce_base, &self.writes, n)
    }

    /// Remembers what this process wrote to `key`: a pending row as a hint, anything else
    /// forgets the key.
    pub(crate) fn note(&self, key: &[u8], row: Option<&Row>) {
        self.hints.lock().note(key, row);
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
        keys: &[&[u8]],
    ) -> Result<HashMap<Vec<u8>, Result<Row, Error>>, Error> {
        let rows = self
            .read_query(&self.sql.read, &[&keys], || {
                format!("reading {} keys", keys.len())
            })
            .await?;
        Ok(rows.iter().map(Inner::decode_row).collect())
    }

    /// Applies `op` to one key, as [`apply_many`](Inner::apply_many) does, with a shorter path
    /// for the common case: the row guessed (this process's own pending row, or absent when
    /// `absent_first`), the decision written in one statement, and the answer given when it
    /// applied. Anything else (the row changed, the key exists, a failure, a decision that
    /// changes nothing or deletes) goes the general way, reading the row.
    pub(crate) async fn apply<O>(
        &self,
        key: &Key,
        op: O,
        absent_first: bool,
    ) -> Result<O::Outcome, Error>
    where
        O: Operation + Clone,
    {
        let started = Instant::now();
        let hint = self.hints.lock().remove(key.encoded());
        let general = |op, start| async move {
            let ops = [(key, op)];
            let mut outcomes = self.rounds(&ops, absent_first, started, start).await?;
            outcomes.pop().expect("one outcome per item")
        };
        if hint.is_none() && !absent_first {
            return general(op, Start::Guess).await;
        }
        let old = hint.as_ref().map(|row| row.nonce);
        let decision = decide(
            hint.as_ref().map(|row| row.record.clone()),
            op.clone(),
            self.now(),
            self.policies.for_key(key),
            PLACEHOLDER,
        );
        let Change::Put(mut record) = decision.change else {
            // Keep (which a guess cannot answer) or delete: the general way, with the hint.
            if let Some(row) = hint {
                self.hints.lock().note_owned(key.encoded(), row);
            }
            return general(op, Start::Guess).await;
        };
        let nonce = self.nonce();
        let (expires, lease) = (
            sql_millis(record.expires_at),
            record.lease_until().map(sql_millis),
        );
        let body = stored_body(&record);
        let k = key.encoded();
        let answer = match old {
            Some(old) => {
                let (fresh, token) = token_param(&record);
                self.query(
                    &self.sql.update_one,
                    &[&k, &old, &fresh, &token, &nonce, &expires, &lease, &body],
                )
                .await
            }
            None if record.token == PLACEHOLDER => {
                self.query(
                    &self.sql.insert_fresh_one,
                    &[&k, &nonce, &expires, &lease, &body],
                )
                .await
            }
            None => {
                let (fresh, token) = token_param(&record);
                self.query(
                    &self.sql.insert_one,
                    &[&k, &fresh, &token, &nonce, &expires, &lease, &body],
                )
                .await
            }
        };
        let failure = match answer {
            Ok(rows) => {
                let Some(row) = rows.first().filter(|row| row.get::<_, i64>(0) == nonce) else {
                    // The row changed, or the key exists: read it and decide again.
                    return general(
                        op,
                        Start::Read {
                            unsettled: None,
                            failure: None,
                        },
                    )
                    .await;
                };
                let token = row.get::<_, i64>(1).cast_unsigned();
                if row.len() > 2 && row.get::<_, bool>(2) {
                    self.wake(&[k]).await;
                }
                record.token = token;
                self.hints.lock().note_owned(k, Row { record, nonce });
                return Ok(O::outcome_with_token(decision.outcome, token));
            }
            Err(Failure::Refused(error)) => {
                return Err(refused(&[(key, ())], 1, error));
            }
            Err(Failure::Retry(error)) => Start::Read {
                unsettled: None,
                failure: Some(error),
            },
            Err(Failure::Unknown(error)) => Start::Read {
                unsettled: Some(Unsettled {
                    outcome: decision.outcome,
                    nonce,
                    delete: false,
                }),
                failure: Some(error),
            },
        };
        self.resends.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(10)).await;
        general(op, failure).await
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
    pub(crate) async fn apply_many<K: Borrow<Key>, O>(
        &self,
        ops: &[(K, O)],
        absent_first: bool,
    ) -> Result<Vec<Result<O::Outcome, Error>>, Error>
    where
        O: Operation + Clone,
    {
        self.rounds(ops, absent_first, Instant::now(), Start::Guess)
            .await
    }

    /// [`apply_many`](Inner::apply_many) from `start`, with the operation deadline counted
    /// from `started`.
    async fn rounds<K: Borrow<Key>, O>(
        &self,
        ops: &[(K, O)],
        absent_first: bool,
        started: Instant,
        start: Start<O::Outcome>,
    ) -> Result<Vec<Result<O::Outcome, Error>>, Error>
    where
        O: Operation + Clone,
    {
        let n = ops.len();
        let key = |item: usize| ops[item].0.borrow().encoded();
        let mut order: Vec<usize> = (0..n).collect();
        // Stable: a key's occurrences stay in item order.
        order.sort_by(|&a, &b| key(a).cmp(key(b)));
        let mut run: Vec<usize> = Vec::with_capacity(n);
        for rank in 0..n {
            let first = if rank > 0 && key(order[rank]) == key(order[rank - 1]) {
                run[rank - 1]
            } else {
                rank
            };
            run.push(first);
        }
        let mut w = Work {
            order,
            run,
            results: (0..n).map(|_| None).collect(),
            known: (0..n).map(|_| None).collect(),
            unsettled: HashMap::new(),
            again: Vec::new(),
            failed: None,
        };
        let mut pause = Duration::from_millis(10);
        let mut todo: Vec<usize> = (0..n).collect();
        let mut last_failure: Option<Box<dyn std::error::Error + Send + Sync>> = None;
        let mut first_round = true;
        if let Start::Read { unsettled, failure } = start {
            first_round = false;
            if failure.is_some() {
                last_failure = failure;
                pause = Duration::from_millis(20);
            }
            if let Some(unsettled) = unsettled {
                w.unsettled.insert(0, vec![unsettled]);
            }
        }
        while !todo.is_empty() {
            if last_failure.is_some() && started.elapsed() + pause > self.op_deadline {
                let landed = if w.unsettled.is_empty() {
                    "nothing was applied"
                } else {
                    "a write whose answer was lost may or may not have been applied"
                };
                return Err(Error::Database {
                    context: format!(
                        "writing {} of {} keys (first: {}); no answer within {:?}, {landed}",
                        todo.len(),
                        n,
                        ops[w.order[todo[0]]].0.borrow(),
                        self.op_deadline
                    ),
                    source: last_failure.take().expect("checked above"),
                });
            }
            // This round: the first occurrence of each key still to do (todo is in key order).
            let mut round = Vec::with_capacity(todo.len());
            w.again = Vec::new();
            for &rank in &todo {
                if round.last().is_some_and(|&last| w.run[last] == w.run[rank]) {
                    w.again.push(rank);
                } else {
                    round.push(rank);
                }
            }
            // What is not known yet: guessed in the first round, read otherwise.
            let mut to_read = Vec::new();
            {
                let hints = first_round.then(|| self.hints.lock());
                for &rank in &round {
                    let slot = w.run[rank];
                    if w.known[slot].is_some() {
                        continue;
                    }
                    if let Some(hints) = &hints {
                        if let Some(row) = hints.get(key(w.order[rank])) {
                            w.known[slot] = Some((Some(row.clone()), true));
                            continue;
                        }
                        if absent_first {
                            w.known[slot] = Some((None, true));
                            continue;
                        }
                    }
                    to_read.push(rank);
                }
            }
            if !to_read.is_empty() {
                let keys: Vec<&[u8]> = to_read.iter().map(|&rank| key(w.order[rank])).collect();
                let mut rows = self.read_rows(&keys).await?;
                for &rank in &to_read {
                    let slot = w.run[rank];
                    match rows.remove(key(w.order[rank])) {
                        None => w.known[slot] = Some((None, false)),
                        Some(Ok(row)) => w.known[slot] = Some((Some(row), false)),
                        // A round names each key once: that item fails alone.
                        Some(Err(error)) => w.answer(rank, Err(error)),
                    }
                }
            }
            first_round = false;
            let now = self.now();
            let mut inserts: Vec<(Sending<O::Outcome>, i64)> = Vec::new();
            let mut updates: Vec<(Sending<O::Outcome>, i64)> = Vec::new();
            let mut deletes: Vec<(Sending<O::Outcome>, i64)> = Vec::new();
            for rank in round {
                let item = w.order[rank];
                if w.results[item].is_some() {
                    continue;
                }
                let (k, op) = &ops[item];
                let k: &Key = k.borrow();
                let slot = w.run[rank];
                let Some((current, guessed)) = &w.known[slot] else {
                    w.again.push(rank);
                    continue;
                };
                let guessed = *guessed;
                // An earlier write of this item whose answer was lost: did it land?
                if let Some(earlier) = w.unsettled.get_mut(&rank) {
                    let landed = earlier.iter().position(|u| match current {
                        Some(row) => !u.delete && row.nonce == u.nonce,
                        None => u.delete,
                    });
                    if let (Some(at), false) = (landed, guessed) {
                        let found = earlier.swap_remove(at);
                        let token = current.as_ref().map_or(0, |row| row.record.token);
                        w.answer(rank, Ok(O::outcome_with_token(found.outcome, token)));
                        continue;
                    }
                }
                let old = current.as_ref().map(|row| row.nonce);
                let decision = decide(
                    current.as_ref().map(|row| row.record.clone()),
                    op.clone(),
                    now,
                    self.policies.for_key(k),
                    PLACEHOLDER,
                );
                let record = match decision.change {
                    Change::Keep if guessed => {
                        w.known[slot] = None;
                        w.again.push(rank);
                        continue;
                    }
                    Change::Keep => {
                        w.answer(rank, Ok(decision.outcome));
                        continue;
                    }
                    Change::Put(record) => Some(record),
                    Change::Delete => None,
                };
                let sending = Sending {
                    rank,
                    outcome: decision.outcome,
                    record,
                };
                match (&sending.record, old) {
                    (Some(_), None) => inserts.push((sending, 0)),
                    (Some(_), Some(old)) => updates.push((sending, old)),
                    (None, old) => deletes.push((sending, old.unwrap_or(0))),
                }
            }
            w.failed = None;
            if !inserts.is_empty() {
                self.send_puts(ops, &mut w, inserts, false).await?;
            }
            if !updates.is_empty() {
                self.send_puts(ops, &mut w, updates, true).await?;
            }
            if !deletes.is_empty() {
                self.send_deletes(ops, &mut w, deletes).await?;
            }
            if let Some(error) = w.failed.take() {
                last_failure = Some(error);
                self.resends.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            todo = std::mem::take(&mut w.again);
            todo.sort_unstable();
        }
        Ok(w.results
            .into_iter()
            .map(|result| result.expect("every item answered"))
            .collect())
    }

    /// Sends the puts of one round (in key order) as one insert (`update` false: the keys were
    /// absent) or one update (each under a compare on the nonce it was decided on). The rows
    /// get the nonces `first ..` in order, and the statement returns each written row's nonce,
    /// which names its item.
    async fn send_puts<K: Borrow<Key>, O: Operation>(
        &self,
        ops: &[(K, O)],
        w: &mut Work<O::Outcome>,
        puts: Vec<(Sending<O::Outcome>, i64)>,
        update: bool,
    ) -> Result<(), Error> {
        let n = puts.len();
        let first = self.nonces(n);
        let (mut keys, mut olds, mut fresh, mut tokens) = (
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
        let mut all_fresh = true;
        for (sending, old) in &puts {
            let record = sending.record.as_ref().expect("a put has a record");
            keys.push(ops[w.order[sending.rank]].0.borrow().encoded());
            olds.push(*old);
            let (is_fresh, token) = token_param(record);
            all_fresh &= is_fresh;
            fresh.push(is_fresh);
            tokens.push(token);
            expires.push(sql_millis(record.expires_at));
            leases.push(record.lease_until().map(sql_millis));
            bodies.push(stored_body(record));
        }
        let sql = &self.sql;
        let answer = match (n, update, all_fresh) {
            (1, true, _) => {
                let params: [&(dyn ToSql + Sync); 8] = [
                    &keys[0],
                    &olds[0],
                    &fresh[0],
                    &tokens[0],
                    &first,
                    &expires[0],
                    &leases[0],
                    &bodies[0],
                ];
                self.query(&sql.update_one, &params).await
            }
            (1, false, true) => {
                let params: [&(dyn ToSql + Sync); 5] =
                    [&keys[0], &first, &expires[0], &leases[0], &bodies[0]];
                self.query(&sql.insert_fresh_one, &params).await
            }
            (1, false, false) => {
                let params: [&(dyn ToSql + Sync); 7] = [
                    &keys[0],
                    &fresh[0],
                    &tokens[0],
                    &first,
                    &expires[0],
                    &leases[0],
                    &bodies[0],
                ];
                self.query(&sql.insert_one, &params).await
            }
            (_, true, _) => {
                let params: [&(dyn ToSql + Sync); 8] = [
                    &keys, &olds, &fresh, &tokens, &first, &expires, &leases, &bodies,
                ];
                self.query(&sql.update, &params).await
            }
            (_, false, true) => {
                let params: [&(dyn ToSql + Sync); 5] = [&keys, &first, &expires, &leases, &bodies];
                self.query(&sql.insert_fresh, &params).await
            }
            (_, false, false) => {
                let params: [&(dyn ToSql + Sync); 7] =
                    [&keys, &fresh, &tokens, &first, &expires, &leases, &bodies];
                self.query(&sql.insert, &params).await
            }
        };
        match answer {
            Ok(rows) => {
                // Each returned row by its nonce's place; an insert makes an unwatched row, an
                // update says whether the row was watched.
                let mut written: Vec<Option<i64>> = vec![None; n];
                let mut watched: Vec<&[u8]> = Vec::new();
                let mut landed = |nonce: i64, token: i64, was_watched: bool| {
                    let at = nonce.wrapping_sub(first) as usize;
                    if let Some(slot) = written.get_mut(at) {
                        *slot = Some(token);
                        if was_watched {
                            watched.push(keys[at]);
                        }
                    }
                };
                if n == 1 {
                    for row in &rows {
                        landed(
                            row.get(0),
                            row.get(1),
                            row.len() > 2 && row.get::<_, bool>(2),
                        );
                    }
                } else if let Some(row) = rows.first() {
                    // The multi-row statements answer with arrays (`schema::AGGREGATE`).
                    let nonces: Vec<i64> = row.get::<_, Option<_>>(0).unwrap_or_default();
                    let tokens: Vec<i64> = row.get::<_, Option<_>>(1).unwrap_or_default();
                    let flags: Vec<bool> = if row.len() > 2 {
                        row.get::<_, Option<_>>(2).unwrap_or_default()
                    } else {
                        Vec::new()
                    };
                    for (i, (&nonce, &token)) in nonces.iter().zip(&tokens).enumerate() {
                        landed(nonce, token, flags.get(i).copied().unwrap_or(false));
                    }
                }
                self.wake(&watched).await;
                // The hints of the whole statement under one lock.
                let mut hints = self.hints.lock();
                for (at, (sending, _)) in puts.into_iter().enumerate() {
                    let rank = sending.rank;
                    let slot = w.run[rank];
                    match written[at] {
                        Some(token) => {
                            let token = token.cast_unsigned();
                            let mut record = sending.record.expect("a put has a record");
                            record.token = token;
                            let row = Row {
                                record,
                                nonce: first + at as i64,
                            };
                            // Kept only for an occurrence of the key still to decide.
                            if w.more_of(rank) {
                                hints.note(keys[at], Some(&row));
                                w.known[slot] = Some((Some(row), false));
                            } else {
                                hints.note_owned(keys[at], row);
                            }
                            w.answer(rank, Ok(O::outcome_with_token(sending.outcome, token)));
                        }
                        None => {
                            // The row changed (or exists) since it was decided on.
                            hints.note(keys[at], None);
                            w.known[slot] = None;
                            w.again.push(rank);
                        }
                    }
                }
                Ok(())
            }
            Err(Failure::Refused(error)) => Err(refused(ops, n, error)),
            Err(Failure::Retry(error)) => {
                w.again.extend(puts.iter().map(|(sending, _)| sending.rank));
                w.failed = Some(error);
                Ok(())
            }
            Err(Failure::Unknown(error)) => {
                let sent = puts
                    .into_iter()
                    .enumerate()
                    .map(|(at, (sending, _))| (sending, first + at as i64));
                self.unsettle(ops, w, sent, false);
                w.failed = Some(error);
                Ok(())
            }
        }
    }

    /// Items whose statement's answer was lost: each may or may not have landed, so its row is
    /// forgotten, the write is kept to be settled by its nonce, and the item goes round again.
    fn unsettle<K: Borrow<Key>, O: Operation>(
        &self,
        ops: &[(K, O)],
        w: &mut Work<O::Outcome>,
        sent: impl Iterator<Item = (Sending<O::Outcome>, i64)>,
        delete: bool,
    ) {
        let mut hints = self.hints.lock();
        for (sending, nonce) in sent {
            let rank = sending.rank;
            hints.remove(ops[w.order[rank]].0.borrow().encoded());
            w.known[w.run[rank]] = None;
            w.unsettled.entry(rank).or_default().push(Unsettled {
                outcome: sending.outcome,
                nonce,
                delete,
            });
            w.again.push(rank);
        }
    }

    /// Sends the deletes of one round (in key order) as one statement, each under a compare on
    /// its nonce.
    async fn send_deletes<K: Borrow<Key>, O: Operation>(
        &self,
        ops: &[(K, O)],
        w: &mut Work<O::Outcome>,
        deletes: Vec<(Sending<O::Outcome>, i64)>,
    ) -> Result<(), Error> {
        let keys: Vec<&[u8]> = deletes
            .iter()
            .map(|(s, _)| ops[w.order[s.rank]].0.borrow().encoded())
            .collect();
        let olds: Vec<i64> = deletes.iter().map(|(_, old)| *old).collect();
        match self.query(&self.sql.delete, &[&keys, &olds]).await {
            Ok(rows) => {
                let gone: std::collections::HashSet<&[u8]> =
                    rows.iter().map(|row| row.get::<_, &[u8]>(0)).collect();
                let watched: Vec<&[u8]> = rows
                    .iter()
                    .filter(|row| row.get::<_, bool>(1))
                    .map(|row| row.get::<_, &[u8]>(0))
                    .collect();
                self.wake(&watched).await;
                let mut hints = self.hints.lock();
                for (at, (sending, _)) in deletes.into_iter().enumerate() {
                    let rank = sending.rank;
                    let slot = w.run[rank];
                    hints.remove(keys[at]);
                    if gone.contains(keys[at]) {
                        w.known[slot] = Some((None, false));
                        w.answer(rank, Ok(sending.outcome));
                    } else {
                        w.known[slot] = None;
                        w.again.push(rank);
                    }
                }
                Ok(())
            }
            Err(Failure::Refused(error)) => Err(refused(ops, deletes.len(), error)),
            Err(Failure::Retry(error)) => {
                w.again
                    .extend(deletes.iter().map(|(sending, _)| sending.rank));
                w.failed = Some(error);
                Ok(())
            }
            Err(Failure::Unknown(error)) => {
                // A delete writes no nonce: it landed if the row is gone.
                let sent = deletes.into_iter().map(|(sending, _)| (sending, 0));
                self.unsettle(ops, w, sent, true);
                w.failed = Some(error);
                Ok(())
            }
        }
    }
}

/// The first of `n` consecutive nonces from `base` and the counter `writes`, skipping a range
/// that would pass the largest bigint (the server would refuse the sum `first + place`).
fn nonce_range(base: u64, writes: &AtomicU64, n: usize) -> i64 {
    let n = n.max(1) as u64;
    loop {
        let first = base
            .wrapping_add(writes.fetch_add(n, Ordering::Relaxed))
            .cast_signed();
        if first.checked_add((n - 1).cast_signed()).is_some() {
            return first;
        }
    }
}

/// A record's token as the statements take it: whether the write is an acquisition (the
/// token comes from the sequence) and otherwise the token it keeps.
fn token_param(record: &Record) -> (bool, i64) {
    if record.token == PLACEHOLDER {
        (true, 0)
    } else {
        (false, record.token.cast_signed())
    }
}

/// The error of a statement PostgreSQL refused for good.
fn refused<K: Borrow<Key>, O>(ops: &[(K, O)], count: usize, error: tokio_postgres::Error) -> Error {
    Error::Database {
        context: format!(
            "writing {count} of {} keys (first: {}); it refused the statement, \
             so that statement applied nothing",
            ops.len(),
            ops.first()
                .map_or_else(String::new, |(key, _)| key.borrow().to_string())
        ),
        source: Box::new(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statements_nonces_never_pass_the_largest_bigint() {
        let base = (i64::MAX - 5).cast_unsigned();
        let writes = AtomicU64::new(0);
        let first = nonce_range(base, &writes, 10);
        assert!(first.checked_add(9).is_some(), "{first}");
        // The range that crossed was skipped, not handed out.
        assert_eq!(writes.load(Ordering::Relaxed), 20);
        // Ranges that fit are consecutive.
        let next = nonce_range(base, &writes, 3);
        assert_eq!(next, first + 10);
    }
}
