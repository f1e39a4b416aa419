//! The command line: commands, arguments and their help.

use super::*;

/// Whether this build works on stores that live elsewhere (`--etcd`, `--postgres`): their
/// options are shown, and a command's store file is optional.
pub(crate) const REMOTE: bool = cfg!(any(feature = "etcd", feature = "postgres"));

const EXIT_STATUS: &str = "\
Exit status:
  0  success; also when the reader of the output goes away early (a closed pipe)
  1  error: the store cannot be opened (a service has it open, it is not a store, it is
     damaged, it needs recovery), the key is not stored, the resolve or expire was refused, an
     import line is malformed, or `check` found problems
  2  usage error: unknown command, missing or bad arguments (a key part that is not in the
     printed form, below)

Keys are printed SCOPE/OPERATION/ID with each part percent-escaped: `%`, `/`, whitespace,
control characters and bytes that are not UTF-8 as %XX (a/b is a%2Fb, 100% is 100%25, a
space %20). Every command that takes a key reads it back in that form, as three arguments
or as one SCOPE/OPERATION/ID.

stats, list, get, export and check read a closed store without writing to its files; a
store that was not closed cleanly (its process was killed) is refused until
`idemstore recover FILE` replays its log. expire, resolve, sweep, recover, compact and import
open it for writing, as a service does: one process owns a store file. When a running
service holds the file and serves its admin socket (FILE.admin, Builder::admin_socket),
stats, get, list and export ask the service and see its live state; so do expire, resolve
and sweep with a read-write socket. Otherwise stop the service first. check always needs the
store to itself.

A reservation still pending in a store that no process holds was made by a process that is
gone: its lease ended with it, so it shows as stale and the next reserve takes it over.
A service built with Builder::leases_survive_restart(true) keeps such leases for their
time; give --leases-survive-restart to see its store the same way.";

const ETCD: &str = "

A store on an etcd cluster (EtcdStore): give --etcd ENDPOINTS (or --etcd-config FILE) and
--prefix instead of the store file, then the key, for stats, list, get, expire and resolve,
e.g. `idemstore --etcd 127.0.0.1:2379 --prefix app/ get u1 charge k1`. stats, list and get
read one etcd revision: every count and record shown is as it was at that revision. The
cluster's errors exit 1; --etcd with a store file or another command exits 2.";

const POSTGRES: &str = "

A store in a PostgreSQL database (PgStore): give --postgres CONFIG and --table instead of
the store file, then the key, for the same commands, e.g.
`idemstore --postgres 'host=db user=app dbname=app' --table idemstore get u1 charge k1`.
stats, list and get read in one read-only transaction: every count and record shown is as it
was when it began. The database's errors exit 1; --postgres with a store file or another
command exits 2.";

/// `resolve --retention`'s long help: a store elsewhere holds no retention settings.
const RETENTION_HELP: &str = if REMOTE {
    "How long the stored result is replayed (with --complete; default: the store's retention \
     for the key's operation; with --etcd or --postgres: 24 h, as such a store does not hold \
     its services' retention settings)"
} else {
    "How long the stored result is replayed (with --complete; default: the store's retention \
     for the key's operation)"
};

/// The help's closing text for this build: the stores it works on.
fn after_help() -> String {
    let mut text = EXIT_STATUS.to_string();
    if cfg!(feature = "etcd") {
        text.push_str(ETCD);
    }
    if cfg!(feature = "postgres") {
        text.push_str(POSTGRES);
    }
    text
}

#[derive(Parser)]
#[command(
    name = "idemstore",
    version,
    about = "Inspect and repair an idemstore idempotency-key store",
    after_help = after_help()
)]
pub(crate) struct Cli {
    /// Print JSON instead of tables (errors too, on stderr)
    #[arg(long, global = true)]
    pub(crate) json: bool,

    /// Use the store on this etcd cluster instead of a file: its client endpoints,
    /// comma-separated (e.g. 127.0.0.1:2379,127.0.0.1:2381). For stats, list, get, expire
    /// and resolve
    #[arg(
        long,
        global = true,
        hide = !cfg!(feature = "etcd"),
        value_name = "ENDPOINTS",
        value_delimiter = ',',
        conflicts_with = "etcd_config"
    )]
    pub(crate) etcd: Option<Vec<String>>,

    /// As --etcd, with the endpoints (and the prefix) read from a JSON file:
    /// {"endpoints": ["127.0.0.1:2379", "127.0.0.1:2381"], "prefix": "app/"}
    #[arg(long, global = true, value_name = "FILE", hide = !cfg!(feature = "etcd"))]
    pub(crate) etcd_config: Option<PathBuf>,

    /// With --etcd: the store's key prefix on the cluster, as the service's
    /// EtcdBuilder::prefix (default: the config file's, else idemstore/)
    #[arg(long, global = true, value_name = "PREFIX", hide = !cfg!(feature = "etcd"))]
    pub(crate) prefix: Option<String>,

    /// With --etcd: how long to wait for an answer from the cluster before giving up
    #[arg(long, global = true, value_parser = humantime::parse_duration,
          value_name = "DURATION", default_value = "5s", hide = !cfg!(feature = "etcd"))]
    pub(crate) etcd_timeout: Duration,

    /// Use the store in this PostgreSQL database instead of a file: a connection string,
    /// "host=db user=app dbname=app" or "postgresql://app@db/app". For stats, list, get,
    /// expire and resolve
    #[arg(long, global = true, value_name = "CONFIG", conflicts_with_all = ["etcd", "etcd_config"],
          hide = !cfg!(feature = "postgres"))]
    pub(crate) postgres: Option<String>,

    /// With --postgres: the store's table, as the service's PgBuilder::table (default
    /// idemstore)
    #[arg(long, global = true, value_name = "TABLE", hide = !cfg!(feature = "postgres"))]
    pub(crate) table: Option<String>,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Records by state, the oldest reservation, file and log sizes, the log position
    Stats {
        /// The store file
        #[arg(required = !REMOTE)]
        file: Option<PathBuf>,
        #[command(flatten)]
        leases: Leases,
    },
    /// One record: its state, attempt, token, times and stored result; a response stored by
    /// the HTTP or gRPC layer is shown as its status, headers and body
    Get {
        #[command(flatten)]
        key: KeyArgs,
        #[command(flatten)]
        leases: Leases,
        /// Write only the stored result's bytes to stdout, exactly as stored (a stored
        /// response in the layer's encoding, not decoded)
        #[arg(long, conflicts_with = "json")]
        raw: bool,
    },
    /// Records in one state, oldest first for reservations and expired records
    List {
        /// The store file
        #[arg(required = !REMOTE)]
        file: Option<PathBuf>,
        #[command(flatten)]
        leases: Leases,
        /// Only records in this state (default: every state)
        #[arg(long, value_enum)]
        state: Option<StateArg>,
        /// Only records that entered their state at least this long ago, e.g. 30s, 5m, 2h, 1d
        /// (for stale: stale for at least this long)
        #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION")]
        older_than: Option<Duration>,
        /// Only keys whose printed form SCOPE/OPERATION/ID starts with this text, e.g.
        /// `user-7/` (one scope) or `user-7/POST%20%2Fcharges/` (one operation of it); reads
        /// every record
        #[arg(long, value_name = "KEY_PREFIX")]
        key_prefix: Option<String>,
        /// Show at most this many records (at least 1)
        #[arg(long, default_value_t = 100, value_name = "N", value_parser = at_least_one)]
        limit: u64,
    },
    /// Create an empty store (refused when FILE exists: no other command creates one)
    Init {
        /// The new store file (its log is FILE.wal)
        file: PathBuf,
        /// How long completed keys are kept, by default: it also fixes the width of the
        /// store's expiry windows (a 32nd of it) for the store's life. A service sets its own
        /// retention when it opens the store (Builder::retention)
        #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION",
              default_value = "24h")]
        retention: Duration,
        /// The files' permission bits, in octal (Builder::file_mode)
        #[arg(long, value_name = "OCTAL", default_value = "600", value_parser = octal_mode)]
        mode: u32,
    },
    /// Write every record that has not expired as JSON lines, one record a line, to stdout
    /// (the fields: docs/3-operating.md, "Export and import")
    Export {
        /// The store file
        file: PathBuf,
        /// Only keys whose printed form SCOPE/OPERATION/ID starts with this text
        #[arg(long, value_name = "KEY_PREFIX")]
        key_prefix: Option<String>,
    },
    /// Write the records of an export into a closed store (keys it already holds keep their
    /// record); a malformed line is refused, naming its number, before anything is written
    Import {
        /// The store file (create it first with `idemstore init`)
        file: PathBuf,
        /// The export to read ("-" or none: stdin)
        #[arg(value_name = "EXPORT")]
        input: Option<PathBuf>,
    },
    /// Settle a stale reservation or a key marked for review
    Resolve {
        #[command(flatten)]
        key: KeyArgs,
        #[command(flatten)]
        leases: Leases,
        #[command(flatten)]
        action: ResolveAction,
        /// How long the stored result is replayed (with --complete; default: the store's
        /// retention for the key's operation)
        #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION",
              requires = "complete", long_help = RETENTION_HELP)]
        retention: Option<Duration>,
    },
    /// Delete a key now: a wrong stored result, a data-deletion request, reprocessing on
    /// purpose; the next request with the key does the work afresh
    Expire {
        #[command(flatten)]
        key: KeyArgs,
        #[command(flatten)]
        leases: Leases,
        /// Also take a key whose lease is live from its holder (its later complete fails),
        /// and delete a key marked for review (which otherwise waits for `resolve`)
        #[arg(long)]
        force: bool,
    },
    /// Delete expired records, earliest expiry first, with a progress bar on a terminal: an
    /// expiry window that has ended goes whole when it fits in a slice, without reading its
    /// records; other expired records one by one
    Sweep {
        /// The store file
        file: PathBuf,
        /// Delete at most this many records (default: every expired record)
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// At most this many records deleted per write transaction (at least 1)
        #[arg(long, default_value_t = 1000, value_name = "N",
              value_parser = clap::value_parser!(u64).range(1..))]
        slice: u64,
    },
    /// Verify every record's checksum, every key, and both indexes, with a progress bar on a
    /// terminal; exit 1 on any problem
    Check {
        /// The store file
        file: PathBuf,
    },
    /// Open the store (replaying its log) and close it cleanly; with --accept-loss, even when
    /// it was not closed cleanly and its log is missing, empty, truncated or another store's
    Recover {
        /// The store file
        file: PathBuf,
        /// Accept losing what the missing log held: the operations acknowledged since the
        /// store's last checkpoint (their keys read as absent, so their work can run again)
        #[arg(long)]
        accept_loss: bool,
    },
    /// Give a closed store's free pages back to the file system: its pages are moved to the
    /// start of the file, which is then shortened (the store must not be open)
    Compact {
        /// The store file
        file: PathBuf,
    },
}

/// A key, after the store file; with --etcd the key alone (its three parts then arrive in the
/// first three fields). Every field is optional for clap, which cannot make them depend on a
/// global option given before the command: `local` and `cluster` check the count.
#[derive(Args)]
pub(crate) struct KeyArgs {
    /// The store file
    #[arg(required = !REMOTE)]
    file: Option<PathBuf>,
    /// Who the key belongs to (user, tenant); or the whole key as SCOPE/OPERATION/ID. Key
    /// parts are read as the tool prints them: `%`, `/`, whitespace, control characters and
    /// bytes that are not UTF-8 written %XX (e.g. `a/b` as a%2Fb, `100%` as 100%25)
    #[arg(required = !REMOTE)]
    scope: Option<String>,
    /// What it guards (route, command); none when SCOPE is the whole key
    operation: Option<String>,
    /// The client's idempotency key
    id: Option<String>,
}

impl KeyArgs {
    /// The store file and the key, for a local store: the key as three parts or as one
    /// `SCOPE/OPERATION/ID` (`keys.rs`); a usage error exits 2.
    pub(crate) fn local(&self) -> Result<(PathBuf, Key)> {
        let key = match (&self.scope, &self.operation, &self.id) {
            (Some(scope), Some(operation), Some(id)) => keys::parse(scope, operation, id),
            (Some(joined), None, None) => keys::parse_joined(joined),
            _ => usage_error(
                "give the store file, then the key: its scope, operation and id, or one \
                 SCOPE/OPERATION/ID",
            ),
        };
        let Some(file) = &self.file else {
            usage_error("give the store file, then the key")
        };
        Ok((
            file.clone(),
            key.unwrap_or_else(|e| usage_error(format!("{e:#}"))),
        ))
    }

    /// The key, for a store named by `flag` (`--etcd`, `--postgres`): three parts or one
    /// `SCOPE/OPERATION/ID`, no file. `Err` is a usage error's message.
    #[cfg(any(feature = "etcd", feature = "postgres"))]
    pub(crate) fn remote(&self, flag: &str) -> std::result::Result<Result<Key>, String> {
        let usage = format!(
            "with {flag}, give the key (its scope, operation and id, or one \
             SCOPE/OPERATION/ID), and no store file"
        );
        let Some(first) = &self.file else {
            return Err(usage);
        };
        let Some(first) = first.to_str() else {
            return Err(format!("the scope {} is not UTF-8", first.display()));
        };
        let key = match (&self.scope, &self.operation, &self.id) {
            (Some(operation), Some(id), None) => keys::parse(first, operation, id),
            (None, None, None) => keys::parse_joined(first),
            _ => return Err(usage),
        };
        key.map(Ok).map_err(|e| format!("{e:#}"))
    }
}

/// How the tool reads a closed store's reservations (for the commands that tell a live lease
/// from a stale one).
#[derive(Args)]
pub(crate) struct Leases {
    /// Reservations made before the store was closed keep their lease time, as in a service
    /// built with Builder::leases_survive_restart(true) (default: they are stale, their process
    /// is gone). For a store file the tool opens itself
    #[arg(long)]
    pub(crate) leases_survive_restart: bool,
}

#[derive(Args)]
#[group(required = true, multiple = false)]
pub(crate) struct ResolveAction {
    /// Store the bytes of this file ("-" for stdin) as the key's result: the work happened
    #[arg(long, value_name = "RESULT_FILE")]
    pub(crate) complete: Option<PathBuf>,
    /// Delete the key, so the next request does the work afresh: the work did not happen
    #[arg(long)]
    pub(crate) release: bool,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum StateArg {
    Pending,
    Stale,
    NeedsReview,
    Completed,
    Expired,
}

impl From<StateArg> for RecordClass {
    fn from(state: StateArg) -> RecordClass {
        match state {
            StateArg::Pending => RecordClass::Pending,
            StateArg::Stale => RecordClass::Stale,
            StateArg::NeedsReview => RecordClass::NeedsReview,
            StateArg::Completed => RecordClass::Completed,
            StateArg::Expired => RecordClass::Expired,
        }
    }
}

/// A file mode in octal, at most 0o777.
fn octal_mode(text: &str) -> std::result::Result<u32, String> {
    match u32::from_str_radix(text.trim_start_matches("0o"), 8) {
        Ok(mode) if mode <= 0o777 => Ok(mode),
        _ => Err(format!("{text:?} is not a file mode in octal (000 to 777)")),
    }
}

/// A count of at least 1, refused with what 0 would mean.
fn at_least_one(text: &str) -> std::result::Result<u64, String> {
    match text.parse::<u64>() {
        Ok(0) => Err("0 would show nothing: give at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{e}")),
    }
}
