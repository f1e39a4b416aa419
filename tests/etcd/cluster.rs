//! A 3-member etcd cluster on loopback ports, started from the `etcd` binary with its data in
//! a temporary directory, killed when dropped. Members can be killed (SIGKILL) and restarted.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};
use tempfile::TempDir;

const INSTALL: &str = "the etcd tests need the `etcd` binary (etcd 3.4 or later) on PATH or in \
    $ETCD_BIN: on Debian or Ubuntu `apt-get install etcd-server etcd-client`; \
    `.ci/run etcd` installs it";

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// A running 3-member cluster.
pub struct Cluster {
    binary: PathBuf,
    dir: TempDir,
    members: Vec<Member>,
    initial_cluster: String,
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local address").port()
}

fn etcd_binary() -> PathBuf {
    std::env::var_os("ETCD_BIN").map_or_else(|| PathBuf::from("etcd"), PathBuf::from)
}

impl Cluster {
    /// Starts three members from `$ETCD_BIN` or `etcd` on PATH and waits until they are ready.
    pub fn start() -> Cluster {
        Cluster::start_with(etcd_binary())
    }

    /// Starts three members from `binary`.
    pub fn start_with(binary: impl Into<PathBuf>) -> Cluster {
        let dir = tempfile::tempdir().expect("temporary directory for etcd");
        // Hold the listeners until all ports are chosen, so no two are the same.
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let members: Vec<Member> = ports
            .iter()
            .enumerate()
            .map(|(i, &(client_port, peer_port))| Member {
                name: format!("m{i}"),
                client_port,
                peer_port,
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Cluster {
            binary: binary.into(),
            dir,
            members,
            initial_cluster,
        };
        for i in 0..3 {
            cluster.spawn(i);
        }
        cluster.wait_ready(Duration::from_secs(30));
        cluster
    }

    fn spawn(&mut self, i: usize) {
        let member = &self.members[i];
        let data = self.dir.path().join(&member.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", member.name)))
            .expect("etcd log file");
        let client = format!("http://127.0.0.1:{}", member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let child = Command::new(&self.binary)
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(&data)
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
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "idemstore-test"])
            // Fast elections keep the fault test short.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}; {INSTALL}", self.binary.display()));
        self.members[i].child = Some(child);
    }

    /// The client URLs of all members.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// SIGKILLs member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            child.kill().expect("SIGKILL an etcd member");
            child.wait().expect("reap an etcd member");
        }
    }

    /// Restarts member `i` on its data directory and waits until the cluster is whole.
    pub fn restart(&mut self, i: usize) {
        self.spawn(i);
        self.wait_ready(Duration::from_secs(30));
    }

    /// The index of the current leader.
    pub fn leader(&self) -> Option<usize> {
        runtime().block_on(async {
            for (i, endpoint) in self.endpoints().iter().enumerate() {
                if self.members[i].child.is_none() {
                    continue;
                }
                let Ok(mut client) = connect(endpoint).await else {
                    continue;
                };
                if let Ok(status) = client.status().await {
                    let leader = status.leader();
                    if leader != 0 && status.header().map(|h| h.member_id()) == Some(leader) {
                        return Some(i);
                    }
                }
            }
            None
        })
    }

    /// Waits until every running member answers a linearizable read.
    fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        runtime().block_on(async {
            for (i, endpoint) in self.endpoints().iter().enumerate() {
                if self.members[i].child.is_none() {
                    continue;
                }
                loop {
                    let ok = match connect(endpoint).await {
                        Ok(mut client) => client.get("ready-probe", None).await.is_ok(),
                        Err(_) => false,
                    };
                    if ok {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "etcd member {endpoint} not ready after {timeout:?}; its log is in {}",
                        self.dir.path().display()
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
    }
}

async fn connect(endpoint: &str) -> Result<Client, etcd_client::Error> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(500))
        .with_timeout(Duration::from_millis(500));
    Client::connect([endpoint], Some(options)).await
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
