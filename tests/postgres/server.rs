//! A throwaway PostgreSQL server on a loopback port, its data in a temporary directory:
//! `initdb`, then `postgres`, stopped when dropped. The server can be killed (SIGKILL, the
//! postmaster and every process it started) and started again on the same data, which then
//! goes through crash recovery.
//!
//! PostgreSQL refuses to run as root: when the tests run as root, the directory is given to
//! the `postgres` user (which Debian's package creates) and the server runs under its uid.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

const INSTALL: &str = "the PostgreSQL tests need PostgreSQL's server binaries (initdb, postgres, \
    pg_isready): on Debian or Ubuntu `apt-get update && apt-get install -y postgresql` (they land \
    in /usr/lib/postgresql/<version>/bin/, found by a glob), or set $PG_BIN to their directory; \
    `.ci/run postgres` installs them";

/// A running server.
pub struct Server {
    bin: PathBuf,
    dir: TempDir,
    port: u16,
    user: Option<(u32, u32)>,
    child: Option<Child>,
}

/// The directory of the server binaries: `$PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian's layout), else `pg_config --bindir`.
fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return bin;
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").exists() {
            return dir;
        }
    }
    panic!("{INSTALL}");
}

/// The uid and gid of the `postgres` user, when running as root.
fn server_user() -> Option<(u32, u32)> {
    if euid() != 0 {
        return None;
    }
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .expect("run `id`");
        assert!(
            out.status.success(),
            "running as root, the server must run as the `postgres` user, which does not exist: \
             {INSTALL}"
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a numeric id")
    };
    Some((id("-u"), id("-g")))
}

/// The effective uid, from `id -u`.
fn euid() -> u32 {
    let out = Command::new("id").arg("-u").output().expect("run `id -u`");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a numeric uid")
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local address").port()
}

impl Server {
    /// Creates a cluster with `initdb` and starts it; waits until it accepts connections.
    pub fn start() -> Server {
        let bin = bin_dir();
        for tool in ["initdb", "postgres", "pg_isready"] {
            assert!(
                bin.join(tool).exists(),
                "no {tool} in {}: {INSTALL}",
                bin.display()
            );
        }
        let user = server_user();
        let dir = tempfile::tempdir().expect("temporary directory for PostgreSQL");
        if let Some((uid, gid)) = user {
            let status = Command::new("chown")
                .arg(format!("{uid}:{gid}"))
                .arg(dir.path())
                .status()
                .expect("run chown");
            assert!(status.success(), "chown the server's directory");
        }
        let mut server = Server {
            bin,
            dir,
            port: free_port(),
            user,
            child: None,
        };
        let out = server
            .command("initdb")
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(server.data())
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        server.spawn();
        server
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, tool: &str) -> Command {
        let mut command = Command::new(self.bin.join(tool));
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        command.current_dir(self.dir.path());
        command
    }

    /// Starts the server on the data directory and waits until it accepts connections.
    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("server.log")).expect("server log");
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data())
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args([
                "-c",
                &format!("unix_socket_directories={}", self.dir.path().display()),
            ])
            .args(["-c", "max_connections=200"])
            .args(["-c", "shared_buffers=128MB"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start postgres: {e}; {INSTALL}"));
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(60));
    }

    fn wait_ready(&mut self, timeout: Duration) {
        let started = Instant::now();
        loop {
            let ready = self
                .command("pg_isready")
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "postgres exited ({status}) before it accepted connections: {}",
                        self.log()
                    );
                }
            }
            assert!(
                started.elapsed() < timeout,
                "postgres did not accept connections within {timeout:?}: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// The connection string of the server's `postgres` database.
    pub fn config(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    /// Kills the server with SIGKILL: the postmaster, then every process it started (as a
    /// machine or container losing it would), and waits until all are gone.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = child.id();
        let children = children_of(pid);
        signal(pid, "KILL");
        for child_pid in &children {
            signal(*child_pid, "KILL");
        }
        let _ = child.wait();
        let started = Instant::now();
        while children
            .iter()
            .any(|p| Path::new(&format!("/proc/{p}")).exists())
            && started.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the server again on the same data and port (crash recovery runs first).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart a killed server only");
        self.spawn();
    }
}

/// Sends `signal` (a name `kill` knows) to `pid`.
fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// The processes whose parent is `pid`, from /proc.
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(candidate) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so read after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|s| s.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(candidate);
        }
    }
    out
}

impl Drop for Server {
    fn drop(&mut self) {
        // Immediate shutdown (SIGQUIT): the data is thrown away with the directory.
        if let Some(mut child) = self.child.take() {
            signal(child.id(), "QUIT");
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
