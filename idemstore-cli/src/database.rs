//! The commands against a store in a PostgreSQL table (`--postgres CONFIG`, with `--table`):
//! `stats`, `list` and `get` read in one read-only transaction (`PgStore::snapshot`), `expire`
//! and `resolve` are the store's own operations. The output is the local commands' (the same
//! functions print it), except that `stats` names the database and the table instead of
//! files.

use super::*;

/// Runs a command against the database the arguments name; usage errors exit 2 here.
#[cfg(not(feature = "postgres"))]
pub(crate) fn run(_cli: Cli) -> Result<()> {
    unavailable()
}

/// The usage error of `--postgres` in a build without the `postgres` feature.
#[cfg(not(feature = "postgres"))]
pub(crate) fn unavailable() -> ! {
    usage_error(
        "--postgres needs idemstore built with the postgres feature: \
         `cargo install --path idemstore-cli --features postgres` from a clone (or `cargo build -p idemstore-cli --features postgres`)",
    )
}

#[cfg(feature = "postgres")]
pub(crate) use with_postgres::run;

#[cfg(feature = "postgres")]
mod with_postgres {
    use super::*;

    use idemstore::{FileInfo, PgBuilder, PgSnapshot, PgStore};

    /// Runs a command against the database the arguments name.
    pub(crate) fn run(cli: Cli) -> Result<()> {
        let config = cli.postgres.clone().expect("run only with --postgres");
        let table = cli
            .table
            .clone()
            .unwrap_or_else(|| PgBuilder::DEFAULT_TABLE.to_string());
        if cli.prefix.is_some() {
            usage_error("--prefix names a store on an etcd cluster; with --postgres give --table");
        }
        let json = cli.json;
        // Check the arguments before connecting: a usage error needs no server.
        let command = remote::ready(
            cli.command,
            "--postgres",
            "a PostgreSQL store sweeps with PgStore::spawn_sweeper, and PostgreSQL checks its \
             own data",
        )?;
        let database = Database::connect(&config, &table)?;
        remote::execute(&database, command, json, |mut out| {
            stats(&database, &mut out, json)
        })
    }

    /// The store in the database, with a snapshot taken when connecting for the reads.
    struct Database {
        runtime: tokio::runtime::Runtime,
        store: PgStore,
        snapshot: PgSnapshot,
        table: String,
        place: String,
    }

    impl Database {
        fn connect(config: &str, table: &str) -> Result<Database> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            let place = where_is(config);
            let connected = runtime.block_on(async {
                let store = PgStore::builder()
                    .table(table)
                    .pool_size(2)
                    .connect(config)
                    .await?;
                let snapshot = store.snapshot().await?;
                Ok::<_, Error>((store, snapshot))
            });
            let (store, snapshot) =
                connected.with_context(|| format!("connecting to table `{table}` on {place}"))?;
            Ok(Database {
                runtime,
                store,
                snapshot,
                table: table.to_string(),
                place,
            })
        }
    }

    /// The server and database a connection string names, without its password.
    fn where_is(config: &str) -> String {
        let Ok(config) = config.parse::<idemstore::tokio_postgres::Config>() else {
            return "PostgreSQL".to_string();
        };
        let hosts: Vec<String> = config
            .get_hosts()
            .iter()
            .map(|host| match host {
                idemstore::tokio_postgres::config::Host::Tcp(name) => name.clone(),
                idemstore::tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            })
            .collect();
        let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
        format!(
            "PostgreSQL at {}{} (database {})",
            if hosts.is_empty() {
                "localhost".to_string()
            } else {
                hosts.join(",")
            },
            if ports.is_empty() {
                String::new()
            } else {
                format!(" port {}", ports.join(","))
            },
            config
                .get_dbname()
                .or(config.get_user())
                .unwrap_or("of the user")
        )
    }

    crate::remote::remote_view!(Database, "a store in PostgreSQL");

    /// `stats` on a database: where it was read, then the counts as for a file.
    fn stats(database: &Database, out: &mut impl Write, json: bool) -> Result<()> {
        let counts = database.counts()?;
        let now = SystemTime::now();
        if json {
            let value = json!({
                "postgres": database.place,
                "table": database.table,
                "counts": counts_json(&counts),
                "oldest_pending": oldest_json(database, &counts, now),
            });
            writeln!(out, "{value:#}")?;
            return Ok(());
        }
        let rows = vec![
            row(["database", &database.place]),
            row([
                "table",
                &format!(
                    "{} (every count below is read in one transaction)",
                    database.table
                ),
            ]),
        ];
        table(out, &[], &rows)?;
        writeln!(out)?;
        counts_text(database, &counts, now, out)
    }
}
