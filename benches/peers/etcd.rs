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

use idemstore::{Error, EtcdStore, Fingerprint, Key, Lease, Reservation};

use super::{context, BenchKey, BenchResult, Engine, Handle};

/// The cluster, a tokio runtime and one store shared by all threads.
pub struct Etcd {
    members: Vec<Child>,
    runtime: Arc<tokio::runtime::Runtime>,
    store: EtcdStore,
}

fn free_port() -> BenchResult<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Engine for Etcd {
    const NAME: &'static str = "etcd";
    /// Concurrent batches go to the leader in parallel.
    const FILL_THREADS: usize = 4;
    type Handle = EtcdHandle;

    fn open(dir: &Path) -> BenchResult<Self> {
        let binary =
            std::env::var_os("ETCD_BIN").map_or_else(|| PathBuf::from("etcd"), PathBuf::from);
        let ports = (0..3)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<BenchResult<Vec<(u16, u16)>>>()?;
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect();
        let mut members = Vec::new();
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
            members.push(child);
        }
        let runtime = Arc::new(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?,
        );
        let endpoints: Vec<String> = ports
            .iter()
            .map(|(c, _)| format!("127.0.0.1:{c}"))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        let builder = EtcdStore::builder();
        let store = loop {
            match runtime.block_on(builder.connect(&endpoints)) {
                Ok(store) => break store,
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("etcd: cluster not ready: {e}").into())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        Ok(Etcd {
            members,
            runtime,
            store,
        })
    }

    fn handle(&self) -> BenchResult<EtcdHandle> {
        Ok(EtcdHandle {
            runtime: Arc::clone(&self.runtime),
            store: self.store.clone(),
        })
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for member in &mut self.members {
            let _ = member.kill();
            let _ = member.wait();
        }
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
