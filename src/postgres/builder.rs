//! [`PgBuilder`]: the settings of a [`PgStore`], checked when it connects.

use std::str::FromStr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

use super::schema::{self, Sql};
use super::store::Inner;
use super::store::PgStore;
use crate::error::Error;
use crate::remote::settings::{shared_setters, Settings};
use crate::store::builder::Builder;

/// Largest result this store accepts: a `bytea` can hold 1 GB, but a result is sent in every
/// replay; the local store's limit.
const MAX_PG_RESULT_LEN: usize = Builder::MAX_RESULT_LEN_LIMIT;

/// Settings for [`PgStore::connect`]. Get one from [`PgStore::builder`].
#[derive(Clone)]
pub struct PgBuilder {
    table: String,
    shared: Settings,
    max_result_len: usize,
    pool_size: usize,
    op_deadline: Duration,
    statement_timeout: Duration,
    wait_poll: Duration,
    index_stale: bool,
}

impl Default for PgBuilder {
    fn default() -> Self {
        PgBuilder {
            table: Self::DEFAULT_TABLE.to_string(),
            shared: Settings::default(),
            max_result_len: Builder::DEFAULT_MAX_RESULT_LEN,
            pool_size: Self::DEFAULT_POOL_SIZE,
            op_deadline: Self::DEFAULT_OP_DEADLINE,
            statement_timeout: Self::DEFAULT_STATEMENT_TIMEOUT,
            wait_poll: Self::DEFAULT_WAIT_POLL,
            index_stale: false,
        }
    }
}

impl PgBuilder {
    /// Default table name of a [`PgStore`].
    pub const DEFAULT_TABLE: &str = "idemstore";

    /// Default most connections a [`PgStore`] opens.
    pub const DEFAULT_POOL_SIZE: usize = 32;

    /// Default time an operation keeps retrying while PostgreSQL gives no answer (a restart or a
    /// failover to a standby takes seconds).
    pub const DEFAULT_OP_DEADLINE: Duration = Duration::from_secs(15);

    /// Default time one statement (or waiting for a pooled connection) may take before it counts
    /// as unanswered.
    pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);

    /// Default longest time a [`PgStore::reserve_or_wait`] caller sleeps without a
    /// notification before asking again.
    pub const DEFAULT_WAIT_POLL: Duration = Duration::from_secs(5);

    /// The table that holds this store's keys (also the prefix of its index, sequence and
    /// version table names); stores with different tables share nothing. Lower-case ASCII
    /// letters, digits and `_`, at most 55 bytes; it may name a schema's search path table
    /// only (no `schema.` part). Default = [`PgBuilder::DEFAULT_TABLE`].
    pub fn table(&mut self, table: impl Into<String>) -> &mut Self {
        self.table = table.into();
        self
    }

    shared_setters!("table");

    /// The largest result accepted, in bytes, at most the local store's limit. Default =
    /// 1 MiB.
    pub fn max_result_len(&mut self, bytes: usize) -> &mut Self {
        self.max_result_len = bytes;
        self
    }

    /// The most connections this store opens (1 to 1024). Default = [`PgBuilder::DEFAULT_POOL_SIZE`].
    pub fn pool_size(&mut self, connections: usize) -> &mut Self {
        self.pool_size = connections;
        self
    }

    /// How long an operation keeps retrying while PostgreSQL gives no definite answer (down,
    /// restarting, failing over) before it returns [`Error::Database`]. Default =
    /// [`PgBuilder::DEFAULT_OP_DEADLINE`].
    pub fn op_deadline(&mut self, deadline: Duration) -> &mut Self {
        self.op_deadline = deadline;
        self
    }

    /// How long one statement, or the wait for a pooled connection, may take before it counts
    /// as unanswered (also the server's `statement_timeout` on the store's connections).
    /// Default = [`PgBuilder::DEFAULT_STATEMENT_TIMEOUT`].
    pub fn statement_timeout(&mut self, timeout: Duration) -> &mut Self {
        self.statement_timeout = timeout;
        self
    }

    /// The longest a [`PgStore::reserve_or_wait`] caller sleeps before asking again when no
    /// notification wakes it: waiters are woken by PostgreSQL notifications when the key
    /// changes, and ask again at this interval only while the store's listening connection is
    /// down or a notification was lost (at least 1 ms). Default =
    /// [`PgBuilder::DEFAULT_WAIT_POLL`].
    pub fn wait_poll(&mut self, interval: Duration) -> &mut Self {
        self.wait_poll = interval;
        self
    }

    /// Keeps an index of the pending rows (`T_stale`, on `lease_until`), so that
    /// [`PgStore::stale`] reads the reservations whose lease ended rather than the whole
    /// table. Off by default: the index makes every completion write index entries instead of
    /// a heap-only (HOT) update on the row's page, which costs the hot path
    /// (`docs/postgres.md`, "Listing stale reservations", has the measured cost). Turned on
    /// for a table that exists, the next connect builds the index, blocking writes while it
    /// does; build it first with `CREATE INDEX CONCURRENTLY T_stale ON T (lease_until) WHERE
    /// lease_until IS NOT NULL` to avoid that. Turning it off again leaves the index: drop it
    /// with `DROP INDEX T_stale`.
    ///
    /// ```no_run
    /// use idemstore::PgStore;
    ///
    /// # async fn run() -> Result<(), idemstore::Error> {
    /// let store = PgStore::builder()
    ///     .index_stale(true)
    ///     .connect("host=127.0.0.1 user=app dbname=app")
    ///     .await?;
    /// let stale = store.stale(100).await?; // an index scan, however big the table
    /// # Ok(()) }
    /// ```
    pub fn index_stale(&mut self, index: bool) -> &mut Self {
        self.index_stale = index;
        self
    }

    fn check(&self) -> Result<(), Error> {
        let invalid = |setting, reason: String| {
            Err(crate::OpenError::InvalidConfig { setting, reason }.into())
        };
        schema::check_table(&self.table)?;
        self.shared.check()?;
        if self.max_result_len > MAX_PG_RESULT_LEN {
            return invalid(
                "max_result_len",
                format!(
                    "{} bytes is over the limit of {MAX_PG_RESULT_LEN}",
                    self.max_result_len
                ),
            );
        }
        if !(1..=1024).contains(&self.pool_size) {
            return invalid(
                "pool_size",
                format!("{} connections is outside 1..=1024", self.pool_size),
            );
        }
        if self.wait_poll < Duration::from_millis(1) {
            return invalid("wait_poll", "it must be at least 1 ms".into());
        }
        if self.op_deadline.is_zero() || self.statement_timeout < Duration::from_millis(1) {
            return invalid(
                "op_deadline",
                "the deadline and the statement timeout must be at least 1 ms".into(),
            );
        }
        Ok(())
    }

    /// Connects to PostgreSQL at `config`, a connection string in libpq's key=value form
    /// (`"host=127.0.0.1 port=5432 user=app dbname=app"`) or a URL
    /// (`"postgresql://app@127.0.0.1/app"`), creating the store's table on first use and
    /// checking its schema version otherwise.
    ///
    /// # Errors
    /// [`OpenError::InvalidConfig`](crate::OpenError::InvalidConfig) for a setting out of range, a connection string that does not
    /// parse, or a table of another schema version (naming both); [`Error::Database`] when
    /// PostgreSQL cannot be reached.
    pub async fn connect(&self, config: &str) -> Result<PgStore, Error> {
        let config = tokio_postgres::Config::from_str(config).map_err(|error| {
            crate::OpenError::InvalidConfig {
                setting: "config",
                reason: format!("the connection string does not parse: {error}"),
            }
        })?;
        self.connect_with(config).await
    }

    /// [`connect`](PgBuilder::connect) with a parsed `tokio_postgres::Config`.
    ///
    /// # Errors
    /// As for [`connect`](PgBuilder::connect).
    pub async fn connect_with(&self, mut config: tokio_postgres::Config) -> Result<PgStore, Error> {
        self.check()?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(self.statement_timeout);
        }
        let millis = self.statement_timeout.as_millis();
        let options = match config.get_options() {
            Some(options) => format!("{options} -c statement_timeout={millis}"),
            None => format!("-c statement_timeout={millis}"),
        };
        config.options(&options);
        if config.get_application_name().is_none() {
            config.application_name("idemstore");
        }
        let lease = super::statement::sql_millis(crate::clock::duration_millis(self.shared.lease));
        let sql = Sql::new(&self.table, lease);
        // One connection of its own for the schema, so that a wrong address or a refused
        // version fails here rather than at the first reserve.
        let (mut client, connection) =
            config
                .connect(NoTls)
                .await
                .map_err(|source| Error::Database {
                    context: "connecting to PostgreSQL".to_string(),
                    source: Box::new(source),
                })?;
        let driver = tokio::spawn(connection);
        let checked = schema::connect_schema(&mut client, &sql, self.index_stale).await;
        drop(client);
        let _ = driver.await;
        checked?;
        let waiters = Arc::new(super::wait::Waiters::new(&self.table, config.clone()));
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(self.pool_size)
            .build()
            .map_err(|error| crate::OpenError::InvalidConfig {
                setting: "pool_size",
                reason: error.to_string(),
            })?;
        Ok(PgStore::from_inner(Inner {
            pool,
            sql,
            policies: self.shared.policies(),
            clock: self.shared.clock.clone(),
            max_result_len: self.max_result_len,
            op_deadline: self.op_deadline,
            statement_timeout: self.statement_timeout,
            nonce_base: random_id(),
            writes: AtomicU64::new(0),
            resends: AtomicU64::new(0),
            hints: parking_lot::Mutex::new(super::hints::Hints::new()),
            waiters,
            wait_poll: self.wait_poll,
        }))
    }
}

/// A random 64-bit base for this store handle's write nonces: the standard library's randomly
/// keyed hasher, fed the time and the process id.
fn random_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}
