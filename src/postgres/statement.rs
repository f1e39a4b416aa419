//! Running one statement on a pooled connection, with its timeout, and telling how it
//! failed (nothing applied, refused, or an answer lost); the rows statements read and write:
//! a record's body without its token, the write nonces.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::store::Inner;
use crate::error::Error;
use crate::key::Key;
use crate::record::{Millis, Record};

/// The token a decision is given: the write replaces it with the sequence's next value.
pub(crate) const PLACEHOLDER: u64 = 1 << 63;

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

impl Inner {
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
            .map_err(|reason| crate::StorageError::Corruption {
                location: format!(
                    "PostgreSQL row of key {}",
                    Key::decode(&key).map_or_else(|| format!("{key:02x?}"), |key| key.to_string())
                ),
                reason,
            });
        (key, decoded.map_err(Into::into))
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
pub(crate) fn token_param(record: &Record) -> (bool, i64) {
    if record.token == PLACEHOLDER {
        (true, 0)
    } else {
        (false, record.token.cast_signed())
    }
}

/// The error of a statement PostgreSQL refused for good.
pub(crate) fn refused<K: Borrow<Key>, O>(
    ops: &[(K, O)],
    count: usize,
    error: tokio_postgres::Error,
) -> Error {
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
