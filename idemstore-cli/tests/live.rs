//! The live view: the `idemstore` tool against a store that another process (this test
//! binary, re-run as a child with an environment variable) holds open with its admin socket.
//! The child acknowledges each operation on stdout; the tool must see every acknowledged
//! record at once (also those only in the child's log), and the child keeps working.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use idemstore::{AdminClient, AdminSocket, Error, Key, Reservation, Store};
use serde_json::Value;

use crate::common::fp;
use crate::run::{run, run_json};

/// Set in the child: `<rw|ro> <store path>`.
const CHILD_ENV: &str = "IDEMSTORE_LIVE_CHILD";

fn key(id: &str) -> Key {
    Key::new("u1", "charge", id).expect("valid key")
}

/// The child's side: does nothing unless started by [`Holder::start`].
#[test]
fn holder() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (access, path) = spec.split_once(' ').expect("<access> <path>");
    let access = match access {
        "rw" => AdminSocket::ReadWrite,
        _ => AdminSocket::ReadOnly,
    };
    let store = Store::builder()
        .admin_socket(access)
        .lease(Duration::from_secs(3600))
        .open(path)
        .expect("the holder opens the store");
    let mut leases = HashMap::new();
    let ack = |line: String| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "ACK {line}").unwrap();
        out.flush().unwrap();
    };
    ack("ready".into());
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("a command");
        let (command, id) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        match command {
            "reserve" => match store.reserve(&key(id), fp("body")).expect("reserve") {
                Reservation::Acquired(lease) => {
                    ack(format!("acquired {id} {}", lease.token()));
                    leases.insert(id.to_string(), lease);
                }
                other => ack(format!("not acquired {id} {other:?}")),
            },
            "complete" => match store.complete(&leases[id], format!("done {id}").into_bytes()) {
                Ok(()) => ack(format!("completed {id}")),
                Err(Error::LeaseLost { .. }) => ack(format!("lost {id}")),
                Err(other) => panic!("complete {id}: {other}"),
            },
            _ => break,
        }
    }
}

/// A child process holding a store open.
struct Holder {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Holder {
    fn start(access: &str, path: &Path) -> Holder {
        let mut child = Command::new(std::env::current_exe().expect("test binary path"))
            .args(["--exact", "live::holder", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, format!("{access} {}", path.display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the holder");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut holder = Holder {
            child,
            stdin,
            stdout,
        };
        assert_eq!(holder.ack(), "ready");
        holder
    }

    /// The next acknowledgment (the harness may print its own text before it).
    fn ack(&mut self) -> String {
        loop {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).expect("read the holder");
            assert!(n > 0, "the holder exited");
            if let Some((_, ack)) = line.trim_end().split_once("ACK ") {
                return ack.to_string();
            }
        }
    }

    fn send(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").expect("write to the holder");
        self.stdin.flush().expect("flush");
        self.ack()
    }

    fn quit(mut self) {
        writeln!(self.stdin, "quit").expect("write to the holder");
        let status = self.child.wait().expect("the holder exits");
        assert!(status.success(), "the holder failed: {status}");
    }
}

fn fresh_store() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("live.idem");
    (dir, path)
}

/// stats, get and list read the running holder's store, including a reservation it
/// acknowledged a moment earlier; expire goes through the read-write socket (a live lease is
/// refused unless forced, and the holder then loses it); the holder keeps working
/// throughout; check still needs the store to itself.
#[test]
fn the_tool_reads_and_expires_in_a_store_a_running_process_holds() {
    let (_dir, path) = fresh_store();
    let file = path.to_str().expect("UTF-8 path");
    let mut holder = Holder::start("rw", &path);

    let token = holder.send("reserve a");
    assert!(token.starts_with("acquired a "), "{token}");
    let token: u64 = token["acquired a ".len()..].parse().unwrap();
    let stats = run_json(&["stats", file, "--json"], 0);
    assert_eq!(stats["counts"]["pending"], 1, "{stats}");
    assert_eq!(stats["next_token"].as_u64().unwrap(), token + 1, "{stats}");
    assert!(stats["live_socket"]
        .as_str()
        .unwrap()
        .ends_with("live.idem.admin"));
    let (text, _) = run(&["stats", file], 0);
    assert!(text.contains("the running service"), "{text}");
    let got = run_json(&["get", file, "u1", "charge", "a", "--json"], 0);
    assert_eq!(
        (got["state"].as_str(), got["token"].as_u64()),
        (Some("pending"), Some(token))
    );
    let listed = run_json(&["list", file, "--state", "pending", "--json"], 0);
    assert_eq!(listed["records"][0]["id"], "a", "{listed}");

    // The holder keeps working, and the tool sees each step at once.
    assert_eq!(holder.send("complete a"), "completed a");
    let got = run_json(&["get", file, "u1", "charge", "a", "--json"], 0);
    assert_eq!(got["result"], "done a", "{got}");
    let (text, _) = run(&["expire", file, "u1", "charge", "a"], 0);
    assert!(text.contains("(was completed)"), "{text}");
    run(&["get", file, "u1", "charge", "a"], 1);

    assert!(holder.send("reserve b").starts_with("acquired b "));
    let (_, err) = run(&["expire", file, "u1", "charge", "b"], 1);
    assert!(err.contains("live lease until"), "{err}");
    assert!(err.contains("--force"), "{err}");
    let forced = run_json(
        &["expire", file, "u1", "charge", "b", "--force", "--json"],
        0,
    );
    assert_eq!(forced["was"], "pending", "{forced}");
    assert_eq!(
        holder.send("complete b"),
        "lost b",
        "the holder lost its lease"
    );
    assert!(holder.send("reserve b").starts_with("acquired b "));

    let (_, err) = run(&["check", file], 1);
    assert!(err.contains("already open"), "{err}");
    assert!(err.contains("admin socket"), "{err}");
    let stats = run_json(&["stats", file, "--json"], 0);
    assert_eq!(stats["counts"]["pending"], 1, "{stats}");
    assert_eq!(stats["counts"]["total"], 1, "{stats}");
    // export reads the live store too: one line, the reservation the holder just made.
    let (exported, _) = run(&["export", file], 0);
    let line: Value = serde_json::from_str(exported.trim()).expect("one JSON line");
    assert_eq!(
        (line["id"].as_str(), line["state"].as_str()),
        (Some("b"), Some("pending"))
    );

    holder.quit();
    assert!(
        !idemstore::admin::socket_path(&path).exists(),
        "the socket is removed"
    );
    // Without a holder the tool opens the file itself, and finds what the holder left: a
    // reservation whose lease ended with the holder's process.
    let stats = run_json(&["stats", file, "--json"], 0);
    assert_eq!(stats["live_socket"], Value::Null);
    assert_eq!(stats["counts"]["pending"], 0, "{stats}");
    assert_eq!(stats["counts"]["stale"], 1, "{stats}");
}

/// A read-only socket serves reads and refuses changes with a message naming the setting.
#[test]
fn a_read_only_socket_refuses_changes() {
    let (_dir, path) = fresh_store();
    let file = path.to_str().expect("UTF-8 path");
    let mut holder = Holder::start("ro", &path);
    assert!(holder.send("reserve a").starts_with("acquired a "));
    assert_eq!(
        run_json(&["stats", file, "--json"], 0)["counts"]["pending"],
        1
    );
    for args in [
        &["expire", file, "u1", "charge", "a", "--force"][..],
        &["sweep", file][..],
        &["resolve", file, "u1", "charge", "a", "--release"][..],
    ] {
        let (_, err) = run(args, 1);
        assert!(
            err.contains("read-only (AdminSocket::ReadOnly)"),
            "{args:?}: {err}"
        );
    }
    let client = AdminClient::connect(&path).expect("the socket answers");
    assert!(
        client.get(&key("a")).unwrap().is_some(),
        "nothing was changed"
    );
    holder.quit();
    assert!(
        AdminClient::connect(&path).is_err(),
        "no socket once the holder is gone"
    );
}

/// A socket file left behind by a process that died does not stop the next open, nor the
/// tool, which then opens the file itself.
#[test]
fn a_stale_socket_file_is_replaced_and_ignored() {
    let (_dir, path) = fresh_store();
    let socket = idemstore::admin::socket_path(&path);
    drop(Store::open(&path).unwrap());
    // A bound-then-dropped listener leaves its socket file, like a killed process.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    let file = path.to_str().unwrap();
    assert_eq!(
        run_json(&["stats", file, "--json"], 0)["live_socket"],
        Value::Null
    );
    let store = Store::builder()
        .admin_socket(AdminSocket::ReadOnly)
        .open(&path)
        .unwrap();
    assert_eq!(
        AdminClient::connect(&path)
            .unwrap()
            .counts()
            .unwrap()
            .total(),
        0
    );
    drop(store);
    // Any other file in the way is refused, and left alone.
    std::fs::write(&socket, b"not a socket").unwrap();
    let err = Store::builder()
        .admin_socket(AdminSocket::ReadOnly)
        .open(&path)
        .unwrap_err();
    let text = with_causes(&err);
    assert!(text.contains("not a socket"), "{text}");
    assert_eq!(std::fs::read(&socket).unwrap(), b"not a socket");
}

/// Right after each acknowledgment, before the owner's committer has committed its open
/// transaction (it does every 20 ms), the socket already counts and finds the new
/// reservation: an admin read commits the writer's open transaction first.
#[test]
fn the_socket_sees_each_reservation_as_soon_as_it_is_acknowledged() {
    let (_dir, path) = fresh_store();
    let store = Store::builder()
        .admin_socket(AdminSocket::ReadOnly)
        .open(&path)
        .unwrap();
    let client = AdminClient::connect(&path).unwrap();
    for i in 0..20u64 {
        let k = key(&format!("k{i}"));
        assert!(matches!(
            store.reserve(&k, fp("body")).unwrap(),
            Reservation::Acquired(_)
        ));
        assert_eq!(
            client.counts().unwrap().pending,
            i + 1,
            "after reservation {i}"
        );
        let listed = client
            .scan(
                &idemstore::ScanFilter::of(idemstore::RecordClass::Pending),
                100,
            )
            .unwrap();
        assert_eq!(listed.len() as u64, i + 1, "listed after reservation {i}");
        assert!(
            client.get(&k).unwrap().is_some(),
            "get after reservation {i}"
        );
    }
    // Dropping the store stops the socket and releases the file at once.
    let started = std::time::Instant::now();
    drop(store);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert!(AdminClient::connect(&path).is_err());
    // Reopened, the 20 reservations of the dropped store are stale: their owner is gone.
    let counts = Store::open(&path).unwrap().counts().unwrap();
    assert_eq!((counts.pending, counts.stale), (0, 20));
}

/// A store opened with every default serves a read-only admin socket next to its file, with
/// mode 0600 (only the service's user can connect): it answers reads and refuses every
/// change. `AdminSocket::Off` serves none.
#[test]
fn a_default_store_serves_a_read_only_socket_only_its_user_can_reach() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};

    let (_dir, path) = fresh_store();
    let store = Store::open(&path).unwrap();
    let k = key("a");
    let Reservation::Acquired(lease) = store.reserve(&k, fp("body")).unwrap() else {
        panic!("a fresh key is acquired")
    };
    let socket = idemstore::admin::socket_path(&path);
    assert_eq!(socket.parent(), path.parent(), "next to the store file");
    let meta = std::fs::metadata(&socket).expect("the default store serves a socket");
    assert!(meta.file_type().is_socket());
    let mode = meta.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode {mode:o}");

    let client = AdminClient::connect(&path).unwrap();
    assert_eq!(client.counts().unwrap().pending, 1);
    assert_eq!(
        client.get(&k).unwrap().map(|r| r.token()),
        Some(lease.token())
    );
    for (what, err) in [
        (
            "expire",
            client.expire(&k, idemstore::LiveLease::Take).unwrap_err(),
        ),
        (
            "resolve",
            client
                .resolve(&k, idemstore::Resolution::Release, None)
                .unwrap_err(),
        ),
        ("sweep", client.sweep(10).unwrap_err()),
        ("checkpoint", client.checkpoint().unwrap_err()),
    ] {
        assert!(
            matches!(err, Error::Admin { .. }) && err.to_string().contains("read-only"),
            "{what}: {err}"
        );
    }
    // Nothing was changed through the socket: the holder still owns its key.
    store.complete(&lease, b"done".to_vec()).unwrap();
    drop(store);
    assert!(!socket.exists(), "the socket is removed with the store");

    let store = Store::builder()
        .admin_socket(AdminSocket::Off)
        .open(&path)
        .unwrap();
    assert!(!socket.exists());
    assert!(AdminClient::connect(&path).is_err());
    drop(store);
}

/// A store whose socket path would not fit a Unix socket address fails to open with the
/// default, naming the socket and the limit; with `AdminSocket::Off` it opens.
#[test]
fn a_socket_path_too_long_is_refused_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let deep = dir.path().join("d".repeat(60)).join("e".repeat(60));
    std::fs::create_dir_all(&deep).unwrap();
    let path = deep.join("keys.idem");
    let err = Store::open(&path).unwrap_err();
    let text = with_causes(&err);
    assert!(text.contains("keys.idem.admin"), "{text}");
    assert!(text.contains("at most 107"), "{text}");
    assert!(text.contains("AdminSocket::Off"), "{text}");
    Store::builder()
        .admin_socket(AdminSocket::Off)
        .open(&path)
        .unwrap();
}

/// An error's message and each of its causes, as anyhow's `{:#}` prints them.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        text = format!("{text}: {next}");
        cause = next.source();
    }
    text
}
