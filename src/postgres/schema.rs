//! The PostgreSQL data model: the table of records, its indexes, the token sequence and the
//! schema version row, created when a store first connects and checked at every connect.
//! `docs/postgres.md` describes it for operators.
//!
//! For a store named `T` (the builder's [`table`](super::PgBuilder::table)):
//! - `T`: one row per key. `key` is [`Key`](crate::Key)'s own length-prefixed encoding (the
//!   primary key), `token` the fencing token of the acquisition that made the state, `nonce`
//!   a value unique to the write that made the row as it is (every conditional write compares
//!   on it, and after a lost answer it tells a writer whether its write landed),
//!   `sweep_at` where the row sits in the sweep index (milliseconds since the epoch): the
//!   record's expiry rounded up to a whole second (a write raises it to the new record's
//!   rounded expiry when that is later, lowers it to that when it is more than a lease
//!   earlier, and leaves it otherwise: [`lowered`]), `expires_at` when the row reads as absent (not
//!   indexed), `watched` whether a `reserve_or_wait` caller waits for the row to change
//!   (`wait.rs`), `lease_until` the lease end of a pending row
//!   (NULL otherwise), `body` the record in the local store's encoding (`docs/format.md`)
//!   encoded with its token zero, less the token field (`statement::stored_body`): the column is
//!   the token. The 8-byte columns come first, so no padding sits between columns.
//! - `T_sweep`: an index on `sweep_at`, which sweeping walks. It is the only index besides the
//!   primary key, and a completion leaves `sweep_at` as the reserve wrote it (a pending
//!   record's expiry, its lease end plus the retention, is never earlier than the completed
//!   record's), so a completion changes no indexed column: PostgreSQL writes it as a
//!   heap-only (HOT) update on the same page, with no new index entries and no dead ones. The
//!   table's `fillfactor` leaves each page room for that. `stale` reads the table itself,
//!   unless the store was built with [`index_stale`](super::PgBuilder::index_stale):
//! - `T_stale` (only then): the pending rows by `lease_until`. A completion clears
//!   `lease_until`, so with it no completion is a HOT update.
//! - `T_tokens`: the sequence tokens come from, stepping by [`TOKEN_BLOCK`]: each value is a
//!   block of tokens for the rows of one statement (no cache: a later acquisition always gets
//!   a higher token, whichever connection asks).
//! - `T_meta`: `schema_version` = [`SCHEMA_VERSION`].

use crate::error::Error;

/// The schema version this build reads and writes.
pub(crate) const SCHEMA_VERSION: i32 = 3;
/// The table's `fillfactor`: the part of each page inserts fill, the rest kept for the
/// completions' new row versions (BENCHMARKS.md, "PostgreSQL").
const FILLFACTOR: u32 = 95;
/// How many tokens one `nextval` of the token sequence stands for: the sequence steps by this
/// much, and a value `v` gives the tokens `v .. v + TOKEN_BLOCK` to the rows of one statement
/// (`docs/postgres.md`, "Fencing tokens").
const TOKEN_BLOCK: i64 = 1024;
/// `sweep_at` is the record's expiry rounded up to a multiple of this many milliseconds: the
/// rows of one second share one value, which the sweep index stores once with a list of the
/// rows (B-tree deduplication), 6 bytes a row instead of a 16-byte entry
/// (BENCHMARKS.md, "PostgreSQL").
const SWEEP_STEP_MS: i64 = 1000;
/// The answer of a multi-row write: its rows' nonces and tokens as two arrays in one row (one
/// message to send and parse instead of one per row), NULL when no row was written.
const AGGREGATE: &str = "SELECT array_agg(nonce), array_agg(token)";
/// The longest table name accepted: PostgreSQL's identifiers are at most 63 bytes, and the
/// longest derived name adds 8.
pub(crate) const MAX_TABLE_LEN: usize = 55;

/// Checks a table name: lower-case ASCII letters, digits and `_`, starting with a letter or
/// `_`, at most [`MAX_TABLE_LEN`] bytes, so it needs no quoting in any statement.
pub(crate) fn check_table(name: &str) -> Result<(), Error> {
    let ok_first = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let ok_rest = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !ok_first || !ok_rest || name.len() > MAX_TABLE_LEN {
        return Err(crate::OpenError::InvalidConfig {
            setting: "table",
            reason: format!(
                "table name `{}` must be 1 to {MAX_TABLE_LEN} bytes of lower-case ASCII letters, \
                 digits and `_`, not starting with a digit",
                name.escape_debug()
            ),
        }
        .into());
    }
    Ok(())
}

/// The statements of one store, with its table name filled in.
#[derive(Debug, Clone)]
pub(crate) struct Sql {
    pub(crate) table: String,
    pub(crate) read: String,
    pub(crate) insert: String,
    pub(crate) insert_fresh: String,
    pub(crate) insert_one: String,
    pub(crate) insert_fresh_one: String,
    pub(crate) update: String,
    pub(crate) update_one: String,
    pub(crate) delete: String,
    pub(crate) read_for_update: String,
    /// `complete_with`'s completion of the row it locked.
    pub(crate) complete_locked: String,
    pub(crate) sweep: String,
    /// How far past now a sweep walks the `sweep_at` index (milliseconds): a row's
    /// `sweep_at` is at most this much after its expiry.
    pub(crate) sweep_ahead: i64,
    pub(crate) stale: String,
    /// The optional index `stale` reads ([`PgBuilder::index_stale`](super::PgBuilder::index_stale)).
    pub(crate) stale_index: String,
    pub(crate) mark: String,
    pub(crate) notify: String,
}

impl Sql {
    /// The statements of the store of `table` whose acquisitions' lease is `lease`
    /// (milliseconds).
    pub(crate) fn new(table: &str, lease: i64) -> Sql {
        let t = table;
        // A pending record's `sweep_at` is kept by a completion that expires at most this
        // much earlier (its lease, rounded up to a step as `sweep_at` is); a sweep looks this
        // far and a step past now, so it finds the row by its expiry.
        let kept =
            (lease.saturating_add(SWEEP_STEP_MS - 1) / SWEEP_STEP_MS).saturating_mul(SWEEP_STEP_MS);
        let (up_e, up_5, up_3) = (sweep_at("e"), sweep_at("$5"), sweep_at("$3"));
        let (up_ue, up_6) = (
            lowered(&format!("{t}.sweep_at"), &sweep_at("u.e"), kept),
            lowered("sweep_at", &sweep_at("$6"), kept),
        );
        // Tokens in blocks: the sequence steps by TOKEN_BLOCK, and one `nextval` per block
        // of rows gives each new row `value + its place in the block` (a `nextval` per row
        // cost about 4 µs of server time per row in a batch of 1000).
        let blocks = format!(
            "(SELECT array_agg(nextval('{t}_tokens')) AS v FROM generate_series(1, \
             (cardinality($1::bytea[]) + {TOKEN_BLOCK} - 1) / {TOKEN_BLOCK})) AS blocks"
        );
        Sql {
            table: t.to_string(),
            read: format!("SELECT key, token, nonce, body FROM {t} WHERE key = ANY($1::bytea[])"),
            insert: format!(
                "WITH w AS (INSERT INTO {t} (key, token, nonce, sweep_at, expires_at, lease_until, body) \
                 SELECT k, CASE WHEN nt THEN blocks.v[(o - 1) / {TOKEN_BLOCK} + 1] \
                 + (o - 1) % {TOKEN_BLOCK} ELSE tk END, $4::int8 + o - 1, {up_e}, e, l, b \
                 FROM unnest($1::bytea[], $2::bool[], $3::int8[], $5::int8[], \
                 $6::int8[], $7::bytea[]) WITH ORDINALITY AS u(k, nt, tk, e, l, b, o), \
                 {blocks} ON CONFLICT (key) DO NOTHING RETURNING nonce, token) {AGGREGATE} FROM w"
            ),
            // Every row an acquisition (reserves of new keys): no token or flag arrays.
            insert_fresh: format!(
                "WITH w AS (INSERT INTO {t} (key, token, nonce, sweep_at, expires_at, lease_until, body) \
                 SELECT k, blocks.v[(o - 1) / {TOKEN_BLOCK} + 1] + (o - 1) % {TOKEN_BLOCK}, \
                 $2::int8 + o - 1, {up_e}, e, l, b \
                 FROM unnest($1::bytea[], $3::int8[], $4::int8[], $5::bytea[]) \
                 WITH ORDINALITY AS u(k, e, l, b, o), \
                 {blocks} ON CONFLICT (key) DO NOTHING RETURNING nonce, token) {AGGREGATE} FROM w"
            ),
            // One key: the same inserts with plain parameters (no arrays to build and unnest).
            insert_one: format!(
                "INSERT INTO {t} (key, token, nonce, sweep_at, expires_at, lease_until, body) \
                 VALUES ($1, CASE WHEN $2 THEN nextval('{t}_tokens') ELSE $3 END, $4, {up_5}, $5, $6, \
                 $7) \
                 ON CONFLICT (key) DO NOTHING RETURNING nonce, token"
            ),
            insert_fresh_one: format!(
                "INSERT INTO {t} (key, token, nonce, sweep_at, expires_at, lease_until, body) \
                 VALUES ($1, nextval('{t}_tokens'), $2, {up_3}, $3, $4, $5) \
                 ON CONFLICT (key) DO NOTHING RETURNING nonce, token"
            ),
            // `sweep_at` rises, or falls only to an expiry more than `kept` earlier: a
            // completion leaves it as it was, so it is a HOT update.
            update: format!(
                "WITH w AS (UPDATE {t} SET token = CASE WHEN u.nt THEN nextval('{t}_tokens') ELSE u.tk END, \
                 nonce = $5::int8 + u.i - 1, sweep_at = {up_ue}, \
                 expires_at = u.e, lease_until = u.l, body = u.b \
                 FROM unnest($1::bytea[], $2::int8[], $3::bool[], $4::int8[], \
                 $6::int8[], $7::int8[], $8::bytea[]) WITH ORDINALITY AS u(k, o, nt, tk, e, l, b, i) \
                 WHERE {t}.key = u.k AND {t}.nonce = u.o \
                 RETURNING {t}.nonce, {t}.token, {t}.watched) {AGGREGATE}, array_agg(watched) FROM w"
            ),
            update_one: format!(
                "UPDATE {t} SET token = CASE WHEN $3 THEN nextval('{t}_tokens') ELSE $4 END, \
                 nonce = $5, sweep_at = {up_6}, expires_at = $6, lease_until = $7, \
                 body = $8 \
                 WHERE key = $1 AND nonce = $2 RETURNING nonce, token, watched"
            ),
            delete: format!(
                "DELETE FROM {t} USING unnest($1::bytea[], $2::int8[]) AS u(k, o) \
                 WHERE {t}.key = u.k AND {t}.nonce = u.o RETURNING {t}.key, {t}.watched"
            ),
            read_for_update: format!(
                "SELECT key, token, nonce, body FROM {t} WHERE key = ANY($1::bytea[]) FOR UPDATE"
            ),
            complete_locked: format!(
                "UPDATE {t} SET nonce = $2, sweep_at = {}, expires_at = $3, lease_until = NULL, \
                 body = $4 WHERE key = $1 AND nonce = $5 RETURNING watched",
                lowered("sweep_at", &sweep_at("$3"), kept)
            ),
            // The inner select walks the sweep index up to `$3` (now plus `sweep_ahead`: a
            // completion leaves `sweep_at` at the pending record's expiry, at most `kept`
            // after its own) and keeps the rows that expired; the outer condition is checked
            // again on a row a concurrent write changed meanwhile.
            sweep: format!(
                "DELETE FROM {t} WHERE key IN (SELECT key FROM {t} WHERE sweep_at <= $3 \
                 AND expires_at <= $1 ORDER BY sweep_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 AND expires_at <= $1"
            ),
            stale: format!(
                "SELECT key, token, nonce, body FROM {t} WHERE lease_until <= $1 \
                 AND expires_at > $1 ORDER BY lease_until, key LIMIT $2"
            ),
            // Only the pending rows: what `stale` reads, ordered as it reads them. A
            // completion clears `lease_until`, so with this index it is no HOT update.
            stale_index: format!(
                "CREATE INDEX IF NOT EXISTS {t}_stale ON {t} (lease_until) \
                 WHERE lease_until IS NOT NULL"
            ),
            // A waiter marks a pending row (`wait.rs`); no row: the key changed, ask again.
            mark: format!(
                "UPDATE {t} SET watched = true WHERE key = $1 AND lease_until IS NOT NULL \
                 RETURNING 1"
            ),
            notify: format!(
                "SELECT pg_notify('{}', k) FROM unnest($1::text[]) AS k",
                super::wait::channel(t)
            ),
            sweep_ahead: kept.saturating_add(SWEEP_STEP_MS),
        }
    }

    /// The statements that create the schema, in order.
    pub(crate) fn create(&self) -> Vec<String> {
        let t = &self.table;
        vec![
            format!(
                "CREATE SEQUENCE {t}_tokens AS bigint MINVALUE 1 INCREMENT BY {TOKEN_BLOCK} \
                 NO CYCLE CACHE 1"
            ),
            // Columns by alignment: the 8-byte ones first, then the boolean, then the two
            // byte strings (1-byte headers, no alignment), so no padding between columns.
            // fillfactor: room on each page for the completion's new row version (HOT);
            // autovacuum at 2% dead rows rather than 20%, so the space of swept rows is reused
            // within a small part of the retention window.
            format!(
                "CREATE TABLE {t} (token bigint NOT NULL, nonce bigint NOT NULL, \
                 sweep_at bigint NOT NULL, expires_at bigint NOT NULL, lease_until bigint, \
                 watched boolean NOT NULL DEFAULT false, key bytea PRIMARY KEY, \
                 body bytea NOT NULL) WITH (fillfactor = {FILLFACTOR}, \
                 autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.02)"
            ),
            format!("CREATE INDEX {t}_sweep ON {t} (sweep_at)"),
            format!("CREATE TABLE {t}_meta (name text PRIMARY KEY, value text NOT NULL)"),
            format!(
                "INSERT INTO {t}_meta (name, value) VALUES ('schema_version', '{SCHEMA_VERSION}')"
            ),
        ]
    }
}

/// The SQL of `sweep_at` for an expiry `e` (milliseconds): `e` rounded up to a multiple of
/// [`SWEEP_STEP_MS`]. Rounding up keeps `sweep_at` at or after the expiry, and keeps its order:
/// a completion, which expires no later than the pending record, leaves it as it was. An
/// expiry within a step of the largest bigint (never) is kept as it is.
pub(crate) fn sweep_at(e: &str) -> String {
    // "Never" (a record under review: the largest bigint) stays as it is.
    format!(
        "(CASE WHEN {e}::int8 > {} THEN {e}::int8 \
         ELSE ({e}::int8 + {}) / {SWEEP_STEP_MS} * {SWEEP_STEP_MS} END)",
        i64::MAX - SWEEP_STEP_MS,
        SWEEP_STEP_MS - 1
    )
}

/// The SQL of a write's new `sweep_at`, from the row's `old` one and the new record's `new`
/// one: the later of the two, so that a completion (which expires no later than the pending
/// record) changes no indexed column; but `new` when it is more than `kept` earlier than
/// `old` (a completion or a resolve kept for less than its operation's retention, a key
/// under review settled), which a sweep walking `kept` past now would otherwise reach late.
fn lowered(old: &str, new: &str, kept: i64) -> String {
    format!("(CASE WHEN {old} - {kept} > {new} THEN {new} ELSE GREATEST({old}, {new}) END)")
}

/// The advisory lock key that serializes schema creation among stores connecting at once.
pub(crate) fn lock_key(table: &str) -> i64 {
    // FNV-1a: stable across builds and processes, unlike the standard library's hasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in b"idemstore:".iter().chain(table.as_bytes()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash as i64
}

/// Connects the schema: creates it when neither the table nor its version row exists, checks
/// the version otherwise.
///
/// # Errors
/// [`OpenError::InvalidConfig`](crate::OpenError::InvalidConfig) naming the table and both versions when it holds another schema
/// version, or when a table of that name exists without idemstore's version row;
/// [`Error::Database`] when PostgreSQL refuses.
pub(crate) async fn connect_schema(
    client: &mut tokio_postgres::Client,
    sql: &Sql,
    index_stale: bool,
) -> Result<(), Error> {
    let t = &sql.table;
    let failed = |what: &str, source| failed(what, t, source);
    let tx = client
        .transaction()
        .await
        .map_err(|e| failed("checking the schema", e))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock_key(t)])
        .await
        .map_err(|e| failed("locking the schema", e))?;
    let exists = |name: String| {
        let tx = &tx;
        async move {
            tx.query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
                .await
                .map(|row| row.get::<_, bool>(0))
        }
    };
    let has_meta = exists(format!("{t}_meta"))
        .await
        .map_err(|e| failed("checking the schema", e))?;
    let has_table = exists(t.to_string())
        .await
        .map_err(|e| failed("checking the schema", e))?;
    if !has_meta {
        if has_table {
            return Err(crate::OpenError::InvalidConfig {
                setting: "table",
                reason: format!(
                    "a table `{t}` exists without idemstore's `{t}_meta` version row: it was \
                     not made by idemstore; choose another table name"
                ),
            }
            .into());
        }
        for statement in sql.create() {
            tx.batch_execute(&statement)
                .await
                .map_err(|e| failed("creating the schema", e))?;
        }
    } else {
        check_version(&tx, t).await?;
    }
    if index_stale {
        tx.batch_execute(&sql.stale_index)
            .await
            .map_err(|e| failed("creating the index of pending rows", e))?;
    }
    tx.commit()
        .await
        .map_err(|e| failed("checking the schema", e))
}

/// PostgreSQL's failure while doing `what` to table `t`'s schema.
fn failed(what: &str, t: &str, source: tokio_postgres::Error) -> Error {
    Error::Database {
        context: format!("{what} of table `{t}`"),
        source: Box::new(source),
    }
}

/// Refuses a table of another schema version, naming both.
async fn check_version(tx: &tokio_postgres::Transaction<'_>, t: &str) -> Result<(), Error> {
    let found: Option<String> = tx
        .query_opt(
            &format!("SELECT value FROM {t}_meta WHERE name = 'schema_version'"),
            &[],
        )
        .await
        .map_err(|e| failed("reading the schema version", t, e))?
        .map(|row| row.get(0));
    match found {
        Some(version) if version == SCHEMA_VERSION.to_string() => Ok(()),
        found => Err(crate::OpenError::InvalidConfig {
            setting: "table",
            reason: format!(
                "table `{t}` holds idemstore's PostgreSQL schema version {}; this build reads \
                 and writes version {SCHEMA_VERSION}: drain the keys with the build that wrote \
                 them, then drop the table (docs/postgres.md, \"Schema versions\"), or use \
                 another table name",
                found.as_deref().unwrap_or("(none)")
            ),
        }
        .into()),
    }
}
