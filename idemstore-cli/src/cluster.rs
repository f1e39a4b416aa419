//! The commands against a store on an etcd cluster (`--etcd ENDPOINTS` or `--etcd-config
//! FILE`, with `--prefix`): `stats`, `list` and `get` read one etcd revision
//! (`EtcdStore::snapshot`), `expire` and `resolve` are the store's own operations. The output
//! is the local commands' (the same functions print it), except that `stats` names the
//! cluster, the prefix and the revision instead of files.

use super::*;

/// Runs a command against the cluster the arguments name; usage errors exit 2 here.
#[cfg(not(feature = "etcd"))]
pub(crate) fn run(_cli: Cli) -> Result<()> {
    unavailable()
}

/// The usage error of `--etcd` in a build without the `etcd` feature.
#[cfg(not(feature = "etcd"))]
pub(crate) fn unavailable() -> ! {
    usage_error(
        "--etcd and --etcd-config need idemstore built with the etcd feature: \
         `cargo install --path idemstore-cli --features etcd` from a clone (or `cargo build -p idemstore-cli --features etcd`)",
    )
}

#[cfg(feature = "etcd")]
pub(crate) use with_etcd::run;

#[cfg(feature = "etcd")]
mod with_etcd {
    use super::*;

    use idemstore::{EtcdBuilder, EtcdSnapshot, EtcdStore, FileInfo};

    /// What `--etcd-config` holds.
    const CONFIG_EXAMPLE: &str =
        r#"{"endpoints": ["127.0.0.1:2379", "127.0.0.1:2381"], "prefix": "app/"}"#;

    /// Runs a command against the cluster the arguments name.
    pub(crate) fn run(cli: Cli) -> Result<()> {
        let (endpoints, prefix) = target(&cli)?;
        let json = cli.json;
        // Check the arguments before connecting: a usage error needs no cluster.
        let command = remote::ready(
            cli.command,
            "--etcd",
            "a cluster sweeps with EtcdStore::spawn_sweeper, and etcd checks its own data",
        )?;
        let cluster = Cluster::connect(&endpoints, &prefix, cli.etcd_timeout)?;
        remote::execute(&cluster, command, json, |mut out| {
            stats(&cluster, &mut out, json)
        })
    }

    /// The endpoints and the prefix, from the flags or the config file.
    fn target(cli: &Cli) -> Result<(Vec<String>, String)> {
        let (endpoints, config_prefix) = match (&cli.etcd, &cli.etcd_config) {
            (Some(endpoints), _) => (endpoints.clone(), None),
            (None, Some(path)) => read_config(path)?,
            (None, None) => usage_error("give --etcd ENDPOINTS or --etcd-config FILE"),
        };
        let endpoints: Vec<String> = endpoints
            .iter()
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty())
            .collect();
        if endpoints.is_empty() {
            usage_error("--etcd needs at least one endpoint, such as 127.0.0.1:2379");
        }
        let prefix = cli
            .prefix
            .clone()
            .or(config_prefix)
            .unwrap_or_else(|| EtcdBuilder::DEFAULT_PREFIX.to_string());
        Ok((endpoints, prefix))
    }

    /// Reads `--etcd-config`: a JSON object with `endpoints` (strings) and an optional `prefix`.
    fn read_config(path: &Path) -> Result<(Vec<String>, Option<String>)> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the etcd config {}", path.display()))?;
        let bad = |what: String| {
            anyhow::anyhow!(
                "the etcd config {}: {what}; expected {CONFIG_EXAMPLE}",
                path.display()
            )
        };
        let value: Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not JSON ({e})")))?;
        let Value::Object(fields) = value else {
            return Err(bad("not a JSON object".into()));
        };
        let (mut endpoints, mut prefix) = (None, None);
        for (name, value) in fields {
            match (name.as_str(), value) {
                ("endpoints", Value::Array(items)) => {
                    let items: Option<Vec<String>> = items
                        .into_iter()
                        .map(|item| item.as_str().map(str::to_string))
                        .collect();
                    endpoints =
                        Some(items.ok_or_else(|| bad("an endpoint is not a string".into()))?);
                }
                ("prefix", Value::String(text)) => prefix = Some(text),
                ("endpoints" | "prefix", _) => {
                    return Err(bad(format!("\"{name}\" has the wrong type")))
                }
                _ => return Err(bad(format!("unknown field \"{name}\""))),
            }
        }
        let endpoints = endpoints.ok_or_else(|| bad("no \"endpoints\"".into()))?;
        Ok((endpoints, prefix))
    }

    /// The store on the cluster, with a snapshot taken when connecting for the reads.
    struct Cluster {
        runtime: tokio::runtime::Runtime,
        store: EtcdStore,
        snapshot: EtcdSnapshot,
        endpoints: Vec<String>,
        prefix: String,
    }

    impl Cluster {
        fn connect(endpoints: &[String], prefix: &str, timeout: Duration) -> Result<Cluster> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            let connected = runtime.block_on(async {
                let store = EtcdStore::builder()
                    .prefix(prefix)
                    .op_deadline(timeout)
                    .request_timeout(timeout.min(Duration::from_secs(2)))
                    .connect(endpoints)
                    .await?;
                let snapshot = store.snapshot().await?;
                Ok::<_, Error>((store, snapshot))
            });
            let cluster = format!(
                "the etcd cluster at {} (prefix {prefix:?})",
                endpoints.join(",")
            );
            let (store, snapshot) = match connected {
                Ok(connected) => connected,
                // The client's own message repeats itself through its sources: name the
                // endpoints and the deadline, then the first cause.
                Err(Error::Cluster { source, .. }) => {
                    let mut cause: &dyn std::error::Error = &*source;
                    while let Some(next) = cause.source() {
                        cause = next;
                    }
                    bail!(
                        "no answer from {cluster} within {} (--etcd-timeout): {cause}",
                        humantime::format_duration(timeout)
                    )
                }
                Err(error) => return Err(error).context(format!("connecting to {cluster}")),
            };
            Ok(Cluster {
                runtime,
                store,
                snapshot,
                endpoints: endpoints.to_vec(),
                prefix: prefix.to_string(),
            })
        }
    }

    crate::remote::remote_view!(Cluster, "a store on an etcd cluster");

    /// `stats` on a cluster: where it was read, then the counts as for a file.
    fn stats(cluster: &Cluster, out: &mut impl Write, json: bool) -> Result<()> {
        let counts = cluster.counts()?;
        let now = SystemTime::now();
        let revision = cluster.snapshot.revision();
        if json {
            let value = json!({
                "endpoints": cluster.endpoints,
                "prefix": cluster.prefix,
                "revision": revision,
                "counts": counts_json(&counts),
                "oldest_pending": oldest_json(cluster, &counts, now),
            });
            writeln!(out, "{value:#}")?;
            return Ok(());
        }
        let rows = vec![
            row(["etcd cluster", &cluster.endpoints.join(",")]),
            row(["prefix", &cluster.prefix]),
            row([
                "revision",
                &format!("{revision} (every count below is read at this revision)"),
            ]),
        ];
        table(out, &[], &rows)?;
        writeln!(out)?;
        counts_text(cluster, &counts, now, out)
    }
}
