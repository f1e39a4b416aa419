//! SQLite in WAL mode with `synchronous=FULL` (every commit fsyncs the WAL), one connection per
//! thread: readers run concurrently, writers take turns through `busy_timeout`.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::{context, BenchKey, BenchResult, Engine, Handle};

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS reservations (
    k BLOB PRIMARY KEY,
    fp BLOB NOT NULL,
    state INTEGER NOT NULL,
    result BLOB
) WITHOUT ROWID";

const INSERT: &str =
    "INSERT INTO reservations (k, fp, state) VALUES (?1, ?2, 0) ON CONFLICT (k) DO NOTHING";
const FILL: &str = "INSERT INTO reservations (k, fp, state, result) VALUES (?1, ?2, 1, ?3)
    ON CONFLICT (k) DO NOTHING";
const SELECT: &str = "SELECT fp FROM reservations WHERE k = ?1";
const COMPLETE: &str = "UPDATE reservations SET state = 1, result = ?2 WHERE k = ?1 AND state = 0";

/// How long a writer waits for the write lock before SQLite gives up with `SQLITE_BUSY`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// SQLite (bundled, so every machine runs the same version) in WAL mode.
pub struct Sqlite {
    path: PathBuf,
    /// Kept open for the engine's life, so that a worker closing its connection is never the
    /// last one (the last close checkpoints the WAL, which would land inside a measurement).
    _keeper: Mutex<Connection>,
}

fn connect(path: &Path) -> BenchResult<Connection> {
    let conn = Connection::open(path).map_err(context("sqlite: open"))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(context("sqlite: busy_timeout"))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(context("sqlite: journal_mode"))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!("sqlite: journal_mode is {mode}, not wal").into());
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(context("sqlite: synchronous"))?;
    Ok(conn)
}

impl Engine for Sqlite {
    const NAME: &'static str = "sqlite";
    type Handle = SqliteHandle;

    fn open(dir: &Path) -> BenchResult<Self> {
        let path = dir.join("reservations.sqlite");
        let keeper = connect(&path)?;
        keeper
            .execute(SCHEMA, [])
            .map_err(context("sqlite: create table"))?;
        Ok(Sqlite {
            path,
            _keeper: Mutex::new(keeper),
        })
    }

    fn handle(&self) -> BenchResult<SqliteHandle> {
        Ok(SqliteHandle(connect(&self.path)?))
    }
}

/// A thread's own connection.
pub struct SqliteHandle(Connection);

impl Handle for SqliteHandle {
    type Lease = ();

    fn reserve(&mut self, key: &BenchKey) -> BenchResult<Option<()>> {
        let inserted = self
            .0
            .prepare_cached(INSERT)
            .and_then(|mut insert| insert.execute(params![&key.flat()[..], &key.fingerprint()[..]]))
            .map_err(context("sqlite: insert"))?;
        if inserted == 1 {
            return Ok(Some(()));
        }
        // A duplicate: read the stored fingerprint back, as an idempotency layer must.
        let stored: Option<Vec<u8>> = self
            .0
            .prepare_cached(SELECT)
            .and_then(|mut select| {
                select
                    .query_row(params![&key.flat()[..]], |row| row.get(0))
                    .optional()
            })
            .map_err(context("sqlite: select"))?;
        match stored {
            Some(fp) if fp == key.fingerprint() => Ok(None),
            Some(_) => Err(format!("sqlite: {key} is stored with another fingerprint").into()),
            None => Err(format!("sqlite: {key} conflicted but is not stored").into()),
        }
    }

    fn complete(&mut self, key: &BenchKey, _lease: (), result: &[u8]) -> BenchResult<()> {
        let updated = self
            .0
            .prepare_cached(COMPLETE)
            .and_then(|mut update| update.execute(params![&key.flat()[..], result]))
            .map_err(context("sqlite: update"))?;
        if updated == 1 {
            Ok(())
        } else {
            Err(format!("sqlite: complete of {key} found no pending row").into())
        }
    }

    fn reserve_many(&mut self, keys: &[BenchKey]) -> BenchResult<usize> {
        let txn = self
            .0
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(context("sqlite: begin"))?;
        let mut new = 0;
        {
            let mut insert = txn
                .prepare_cached(INSERT)
                .map_err(context("sqlite: insert"))?;
            for key in keys {
                new += insert
                    .execute(params![&key.flat()[..], &key.fingerprint()[..]])
                    .map_err(context("sqlite: insert"))?;
            }
        }
        txn.commit().map_err(context("sqlite: commit"))?;
        Ok(new)
    }

    fn fill(&mut self, keys: &[BenchKey], result: &[u8]) -> BenchResult<()> {
        let txn = self
            .0
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(context("sqlite: begin"))?;
        {
            let mut insert = txn.prepare_cached(FILL).map_err(context("sqlite: fill"))?;
            for key in keys {
                insert
                    .execute(params![&key.flat()[..], &key.fingerprint()[..], result])
                    .map_err(context("sqlite: fill"))?;
            }
        }
        txn.commit().map_err(context("sqlite: commit"))
    }
}
