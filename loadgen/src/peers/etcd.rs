//! idemstore's `EtcdStore` (feature `etcd`) on a 3-member etcd cluster that the run starts on
//! loopback ports, with the members' data in the run's directory (so on the measured disk) and
//! kills when it ends. `reserve`, `complete` with the lease, and `reserve_many` (as many keys
//! per etcd transaction as `--max-txn-ops`, 128, allows). Needs the `etcd` binary on PATH or
//! in `$ETCD_BIN`.
//!
//! All three members share one disk here, so each write costs three fsyncs on it; on three
//! hosts they run in parallel on three disks, plus network round trips.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idemstore::etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use idemstore::{Error, EtcdStore, Fingerprint, Key, Lease, Reservation};

use super::{context, BenchKey, BenchResult, Engine, Handle};

/// A 3-member cluster on loopback ports, killed when dropped, and the runtime that drives its
/// clients.
struct Cluster {
    members: Vec<Child>,
    endpoints: Vec<String>,
    runtime: Arc<tokio::runtime::Runtime>,
}

/// CPU seconds (user + system) a process used so far, from `/proc/<pid>/stat`.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which is in parentheses and may hold spaces).
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

impl Drop for Cluster {
    /// Prints the CPU time the members used (cluster start included), then kills them.
    fn drop(&mut self) {
        let cpu: f64 = self
            .members
            .iter()
            .filter_map(|m| cpu_seconds(m.id()))
            .sum();
        eprintln!(
            "etcd: {} members used {cpu:.2} s of CPU",
            self.members.len()
        );
        for member in &mut self.members {
            let _ = member.kill();
            let _ = member.wait();
        }
    }
}

/// The cluster, a tokio runtime and one store shared by all threads.
pub struct Etcd {
    cluster: Cluster,
    store: EtcdStore,
}

fn free_port() -> BenchResult<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts the members (three, or `ETCD_MEMBERS`) with their data under `dir`, and a runtime
/// with two workers.
fn start_cluster(dir: &Path) -> BenchResult<Cluster> {
    let binary = std::env::var_os("ETCD_BIN").map_or_else(|| PathBuf::from("etcd"), PathBuf::from);
    // `ETCD_MEMBERS` (default 3) sets the cluster's size, to see how throughput moves with it.
    let members: usize = match std::env::var("ETCD_MEMBERS") {
        Ok(n) => n.parse().map_err(context("etcd: ETCD_MEMBERS"))?,
        Err(_) => 3,
    };
    let ports = (0..members)
        .map(|_| Ok((free_port()?, free_port()?)))
        .collect::<BenchResult<Vec<(u16, u16)>>>()?;
    let initial: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
        .collect();
    let runtime = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?,
    );
    let mut cluster = Cluster {
        members: Vec::new(),
        endpoints: ports
            .iter()
            .map(|(c, _)| format!("127.0.0.1:{c}"))
            .collect(),
        runtime,
    };
    for (i, (client, peer)) in ports.iter().enumerate() {
        let client = format!("http://127.0.0.1:{client}");
        let peer = format!("http://127.0.0.1:{peer}");
        let child = Command::new(&binary)
            .args(["--name", &format!("m{i}")])
            .arg("--data-dir")
            .arg(dir.join(format!("m{i}")))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-state", "new", "--log-level", "error"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "etcd: starting {}: {e} (apt-get install etcd-server, or set ETCD_BIN)",
                    binary.display()
                )
            })?;
        cluster.members.push(child);
    }
    // Every member answers before the run starts (a client sends to any of them).
    for endpoint in cluster.endpoints.clone() {
        until_ready(&cluster.runtime, || async {
            let mut client = etcd_client::Client::connect([endpoint.as_str()], None)
                .await
                .map_err(|e| e.to_string())?;
            client.get("ready", None).await.map_err(|e| e.to_string())?;
            Ok(())
        })?;
    }
    Ok(cluster)
}

/// Retries `connect` until the cluster answers, up to 30 s.
fn until_ready<T, F: std::future::Future<Output = Result<T, String>>>(
    runtime: &tokio::runtime::Runtime,
    mut connect: impl FnMut() -> F,
) -> BenchResult<T> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match runtime.block_on(connect()) {
            Ok(connected) => return Ok(connected),
            Err(e) if Instant::now() > deadline => {
                return Err(format!("etcd: cluster not ready: {e}").into())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

impl Engine for Etcd {
    const NAME: &'static str = "etcd";
    /// Concurrent batches go to the leader in parallel.
    const FILL_THREADS: usize = 4;
    type Handle = EtcdHandle;

    fn open(dir: &Path) -> BenchResult<Self> {
        let cluster = start_cluster(dir)?;
        let builder = EtcdStore::builder();
        let store = until_ready(&cluster.runtime, || async {
            builder
                .connect(&cluster.endpoints)
                .await
                .map_err(|e| e.to_string())
        })?;
        Ok(Etcd { cluster, store })
    }

    fn handle(&self) -> BenchResult<EtcdHandle> {
        Ok(EtcdHandle {
            runtime: Arc::clone(&self.cluster.runtime),
            store: self.store.clone(),
        })
    }
}

/// A thread's handle: the shared store, driven by blocking on the shared runtime.
pub struct EtcdHandle {
    runtime: Arc<tokio::runtime::Runtime>,
    store: EtcdStore,
}

fn etcd_key(key: &BenchKey) -> BenchResult<Key> {
    Key::new(key.scope(), BenchKey::OPERATION, key.id()).map_err(context("etcd: key"))
}

fn acquired(key: &BenchKey, reservation: Result<Reservation, Error>) -> BenchResult<Option<Lease>> {
    match reservation.map_err(context("etcd: reserve"))? {
        Reservation::Acquired(lease) => Ok(Some(lease)),
        Reservation::Completed(_) | Reservation::InProgress { .. } => Ok(None),
        other => Err(format!("etcd: reserve of {key} answered {other:?}").into()),
    }
}

impl Handle for EtcdHandle {
    type Lease = Lease;

    fn reserve(&mut self, key: &BenchKey) -> BenchResult<Option<Lease>> {
        let fingerprint = Fingerprint::of(key.body());
        let key_ = etcd_key(key)?;
        acquired(
            key,
            self.runtime
                .block_on(self.store.reserve(&key_, fingerprint)),
        )
    }

    fn complete(&mut self, _key: &BenchKey, lease: Lease, result: &[u8]) -> BenchResult<()> {
        self.runtime
            .block_on(self.store.complete(&lease, result.to_vec()))
            .map_err(context("etcd: complete"))
    }

    fn reserve_many(&mut self, keys: &[BenchKey]) -> BenchResult<usize> {
        let items = keys
            .iter()
            .map(|key| Ok((etcd_key(key)?, Fingerprint::of(key.body()))))
            .collect::<BenchResult<Vec<_>>>()?;
        let results = self
            .runtime
            .block_on(self.store.reserve_many(&items))
            .map_err(context("etcd: reserve_many"))?;
        let mut new = 0;
        for (result, key) in results.into_iter().zip(keys) {
            new += usize::from(acquired(key, result)?.is_some());
        }
        Ok(new)
    }
}

/// The bare etcd loop that `EtcdStore` is measured against: the same client crate, the same
/// runtime, the same cluster setup, and nothing of the store. A reserve is one insert-if-absent
/// transaction (`create_revision == 0` compare, put of the request's body; else a get of the
/// stored body, compared as the store compares fingerprints); a completion is one put under a
/// compare on the revision the reserve wrote; a batch is one such transaction per
/// `--max-txn-ops` (128) keys, all of a batch's transactions in flight at once.
pub struct EtcdBare {
    cluster: Cluster,
    client: etcd_client::Client,
}

/// Most operations of one etcd transaction, the cluster's default `--max-txn-ops`.
const MAX_TXN_OPS: usize = 128;

impl Engine for EtcdBare {
    const NAME: &'static str = "etcd-bare";
    const FILL_THREADS: usize = 4;
    type Handle = BareHandle;

    fn open(dir: &Path) -> BenchResult<Self> {
        let cluster = start_cluster(dir)?;
        let client = until_ready(&cluster.runtime, || async {
            let mut client = etcd_client::Client::connect(&cluster.endpoints, None)
                .await
                .map_err(|e| e.to_string())?;
            client.get("ready", None).await.map_err(|e| e.to_string())?;
            Ok(client)
        })?;
        Ok(EtcdBare { cluster, client })
    }

    fn handle(&self) -> BenchResult<BareHandle> {
        Ok(BareHandle {
            runtime: Arc::clone(&self.cluster.runtime),
            client: self.client.clone(),
        })
    }
}

/// A thread's handle on the bare loop.
pub struct BareHandle {
    runtime: Arc<tokio::runtime::Runtime>,
    client: etcd_client::Client,
}

fn bare_key(key: &BenchKey) -> Vec<u8> {
    let mut out = b"bare/".to_vec();
    out.extend_from_slice(key.scope());
    out.push(b'/');
    out.extend_from_slice(key.id());
    out
}

/// The insert-if-absent transaction of `keys`: all applied, or the stored values.
fn insert_if_absent(keys: &[&BenchKey]) -> Txn {
    let compares = keys
        .iter()
        .map(|key| Compare::create_revision(bare_key(key), CompareOp::Equal, 0))
        .collect::<Vec<_>>();
    let puts = keys
        .iter()
        .map(|key| TxnOp::put(bare_key(key), key.body().to_vec(), None))
        .collect::<Vec<_>>();
    let gets = keys
        .iter()
        .map(|key| TxnOp::get(bare_key(key), None))
        .collect::<Vec<_>>();
    Txn::new().when(compares).and_then(puts).or_else(gets)
}

async fn bare_reserve(client: &etcd_client::Client, key: &BenchKey) -> BenchResult<Option<i64>> {
    let mut kv = client.kv_client();
    let response = kv
        .txn(insert_if_absent(&[key]))
        .await
        .map_err(context("etcd-bare: reserve"))?;
    if response.succeeded() {
        return Ok(Some(response.header().map_or(0, |h| h.revision())));
    }
    // A duplicate: the stored request must be the same one.
    match response.op_responses().first() {
        Some(TxnOpResponse::Get(get))
            if get.kvs().first().map(|kv| kv.value()) == Some(&key.body()[..]) =>
        {
            Ok(None)
        }
        _ => Err(format!("etcd-bare: {key} holds another request").into()),
    }
}

impl Handle for BareHandle {
    type Lease = i64;

    fn reserve(&mut self, key: &BenchKey) -> BenchResult<Option<i64>> {
        self.runtime.block_on(bare_reserve(&self.client, key))
    }

    fn complete(&mut self, key: &BenchKey, revision: i64, result: &[u8]) -> BenchResult<()> {
        let k = bare_key(key);
        let mut value = key.body().to_vec();
        value.extend_from_slice(result);
        let txn = Txn::new()
            .when(vec![Compare::mod_revision(
                k.clone(),
                CompareOp::Equal,
                revision,
            )])
            .and_then(vec![TxnOp::put(k, value, None)]);
        let mut kv = self.client.kv_client();
        let response = self
            .runtime
            .block_on(kv.txn(txn))
            .map_err(context("etcd-bare: complete"))?;
        if !response.succeeded() {
            return Err(format!("etcd-bare: {key} changed before its completion").into());
        }
        Ok(())
    }

    fn reserve_many(&mut self, keys: &[BenchKey]) -> BenchResult<usize> {
        let client = &self.client;
        self.runtime.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for chunk in keys.chunks(MAX_TXN_OPS) {
                let refs: Vec<&BenchKey> = chunk.iter().collect();
                let txn = insert_if_absent(&refs);
                let mut kv = client.kv_client();
                set.spawn(async move { kv.txn(txn).await });
            }
            let mut new = 0;
            let mut conflicted = false;
            let mut sizes = keys.chunks(MAX_TXN_OPS).map(<[BenchKey]>::len);
            while let Some(done) = set.join_next().await {
                let response = done
                    .map_err(context("etcd-bare: batch task"))?
                    .map_err(context("etcd-bare: batch"))?;
                if response.succeeded() {
                    new += sizes.next().unwrap_or(0);
                } else {
                    conflicted = true;
                }
            }
            if conflicted {
                // Some key was stored: settle the batch key by key (not measured by new-key
                // batches, where no transaction conflicts).
                new = 0;
                for key in keys {
                    new += usize::from(bare_reserve(client, key).await?.is_some());
                }
            }
            Ok(new)
        })
    }
}
