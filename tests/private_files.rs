//! Files and sockets private to the owning user (DESIGN.md, "Guarantees to hold"): every file a
//! store creates has mode 0600 (or `Builder::file_mode`) whatever the process umask, the admin
//! socket is never reachable at its path with another mode, and a connection from another
//! user is refused by its credentials.
//!
//! A mode given after a file appeared at its name would be there, unseen by a look at the end,
//! for an instant: so a watch on the store's directory (inotify) checks that no mode is ever
//! changed through it, and a watcher thread looks at the socket's path again and again while
//! the store opens and closes.
//!
//! The permissive umask and the other users are set up in child processes (this test binary,
//! started again with an environment variable): the crate forbids `unsafe`, so the tests do
//! not change the umask of their own process, and a connection from another user needs a
//! process running as that user (`setpriv` from util-linux, when the suite runs as root).

use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use crate::common::{acquire, fp, key, Env};
use idemstore::{AdminClient, AdminSocket, OpenError, Store};
use rustix::fs::inotify;

/// The directory a child works in, and what it does there.
const CHILD_ENV: &str = "IDEMSTORE_PRIVATE_FILES_CHILD";
/// How many times the umask child opens and closes a store while watching its socket.
const SOCKET_CYCLES: usize = 20;
/// The user a stranger child runs as (`nobody` on most systems).
const STRANGER_UID: u32 = 65534;

/// The mode bits (permissions, set-id and sticky) of every entry of `dir`, by name, with its
/// kind: `f` a regular file, `s` a socket, `d` a directory, `?` anything else.
fn modes(dir: &Path) -> BTreeMap<String, (char, u32)> {
    std::fs::read_dir(dir)
        .expect("read the store's directory")
        .filter_map(|entry| {
            let entry = entry.ok()?;
            // An entry removed between the listing and this look (a temporary file) is skipped.
            let meta = std::fs::symlink_metadata(entry.path()).ok()?;
            let kind = match meta.file_type() {
                t if t.is_file() => 'f',
                t if t.is_socket() => 's',
                t if t.is_dir() => 'd',
                _ => '?',
            };
            let name = entry.file_name().to_string_lossy().into_owned();
            Some((name, (kind, meta.permissions().mode() & 0o7777)))
        })
        .collect()
}

/// Asserts that every entry of `dir` but those in `except` is a file of mode `file_mode` or a
/// socket of mode 0600, naming `when` and the entries in a failure.
#[track_caller]
fn assert_private(dir: &Path, file_mode: u32, except: &[&str], when: &str) {
    let found = modes(dir);
    for (name, (kind, mode)) in &found {
        if except.contains(&name.as_str()) {
            continue;
        }
        let expected = match kind {
            'f' => file_mode,
            's' => 0o600,
            _ => panic!("{when}: unexpected entry {name} ({kind}, {mode:o}) in {found:?}"),
        };
        assert_eq!(
            *mode, expected,
            "{when}: {name} has mode {mode:o}, not {expected:o} ({found:?})"
        );
    }
}

/// Every change of mode (or owner, or both times) made through a name in one directory:
/// inotify's `IN_ATTRIB` for the directory's entries. A file created with its mode has none; a
/// file or socket given its mode once at its name has one. (A new hard link, or a change
/// through a name in another directory, is not reported here.)
struct AttributeWatch(OwnedFd);

impl AttributeWatch {
    fn new(dir: &Path) -> AttributeWatch {
        let flags = inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC;
        let fd = inotify::init(flags).expect("an inotify instance");
        inotify::add_watch(&fd, dir, inotify::WatchFlags::ATTRIB).expect("watch the directory");
        AttributeWatch(fd)
    }

    /// The names changed since the last call.
    fn changed(&self) -> Vec<String> {
        let mut buf = [MaybeUninit::uninit(); 4096];
        let mut events = inotify::Reader::new(&self.0, &mut buf);
        let mut names = Vec::new();
        loop {
            match events.next() {
                Ok(event) if event.events().contains(inotify::ReadFlags::QUEUE_OVERFLOW) => {
                    names.push("(events lost: the queue overflowed)".to_string())
                }
                Ok(event) => names.push(event.file_name().map_or_else(
                    || "(the directory itself)".to_string(),
                    |name| name.to_string_lossy().into_owned(),
                )),
                Err(rustix::io::Errno::AGAIN) => return names,
                Err(e) => panic!("reading inotify events: {e}"),
            }
        }
    }
}

/// What every mode test does to a store: open it with its admin socket, write, checkpoint,
/// close, compact, reopen and close; checking `dir` (files of mode `file_mode`, all but
/// `except`) after each step. Returns the names seen while it was open.
fn exercise(env: &Env, file_mode: u32, except: &[&str]) -> Vec<String> {
    let dir = env.dir.path();
    let watch = AttributeWatch::new(dir);
    let store = env
        .builder()
        .admin_socket(AdminSocket::ReadOnly)
        .open(&env.path)
        .expect("open the store");
    assert_private(dir, file_mode, except, "after open");
    for i in 0..3 {
        let lease = acquire(&store, &key("tenant", "op", &format!("k{i}")), fp("body"));
        store
            .complete(&lease, format!("stored response {i}").into_bytes())
            .expect("complete");
    }
    assert_private(dir, file_mode, except, "after writes");
    store.checkpoint().expect("checkpoint");
    assert_private(dir, file_mode, except, "after a checkpoint");
    let open_names = modes(dir).into_keys().collect();
    drop(store);
    assert_private(dir, file_mode, except, "after close");
    idemstore::compact(&env.path).expect("compact");
    assert_private(dir, file_mode, except, "after compaction");
    drop(env.open());
    assert_private(dir, file_mode, except, "after a reopen and close");
    let changed = watch.changed();
    assert!(
        changed.is_empty(),
        "modes changed after creation: {changed:?}"
    );
    open_names
}

/// Under the default umask (022, which leaves new files readable by everyone), the store file,
/// its log and the admin socket are private to the owner, from open to close and compaction.
#[test]
fn a_stores_files_are_private_to_its_user() {
    let env = Env::new();
    let seen = exercise(&env, 0o600, &[]);
    for name in ["store.idem", "store.idem.wal", "store.idem.admin"] {
        assert!(seen.iter().any(|s| s == name), "{name} in {seen:?}");
    }
}

/// Runs this test binary again as a child: `prefix` (a program and its arguments) runs it,
/// with `spec` in [`CHILD_ENV`]; returns its output once it has exited.
fn run_child(prefix: &[&str], spec: &str) -> Output {
    let exe = std::env::current_exe().expect("test binary path");
    let (program, args) = prefix.split_first().expect("a program");
    Command::new(program)
        .args(args)
        .arg(exe)
        .args(["--exact", "private_files::child", "--nocapture"])
        .args(["--test-threads=1"])
        .env(CHILD_ENV, spec)
        .stdin(Stdio::null())
        .output()
        .expect("start the child")
}

/// The child's side: does nothing unless started by a parent below.
#[test]
fn child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (what, path) = spec.split_once(' ').expect("a child spec");
    let path = PathBuf::from(path);
    match what {
        "umask" => child_with_permissive_umask(),
        "connect" => match AdminClient::connect(&path) {
            Ok(_) => println!("ADMITTED"),
            Err(e) => {
                // The whole chain: an error's message leaves its cause to `source()`.
                let mut text = e.to_string();
                let mut cause = std::error::Error::source(&e);
                while let Some(inner) = cause {
                    text.push_str(&format!(": {inner}"));
                    cause = inner.source();
                }
                println!("REFUSED: {text}");
            }
        },
        other => panic!("unknown child spec {other}"),
    }
}

/// In a process whose umask is 000 (a file created with `File::create` gets mode 0666): the
/// store's files are private all the same, and the socket at its final path never has
/// another mode than 0600 at any moment a watcher sees, over many opens and closes.
fn child_with_permissive_umask() {
    let probe_dir = tempfile::tempdir().expect("a directory for the probe");
    let probe = probe_dir.path().join("probe");
    std::fs::File::create(&probe).expect("create the probe file");
    let probe_mode = probe.metadata().unwrap().permissions().mode() & 0o777;
    assert_eq!(probe_mode, 0o666, "the child runs with umask 000");
    let env = Env::new();
    exercise(&env, 0o600, &[]);

    let socket = idemstore::admin::socket_path(&env.path);
    let watch = AttributeWatch::new(env.dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    // The directory the socket is bound in before it is linked to its path (`.NAME.a`).
    let private = env.dir.path().join(".store.idem.a");
    let watcher = thread::spawn({
        let (stop, socket, private) = (Arc::clone(&stop), socket.clone(), private.clone());
        move || {
            // What was seen wrong, with how many times.
            let (mut looks, mut seen, mut wrong) = ([0u64; 2], [0u64; 2], BTreeMap::new());
            while !stop.load(Ordering::Relaxed) {
                for (i, (path, what, allowed)) in [
                    (&socket, "the socket at its path", 0o600),
                    (&private, "the private directory", 0o700),
                ]
                .into_iter()
                .enumerate()
                {
                    looks[i] += 1;
                    if let Ok(meta) = std::fs::symlink_metadata(path) {
                        seen[i] += 1;
                        let mode = meta.permissions().mode() & 0o7777;
                        if mode != allowed {
                            *wrong
                                .entry(format!("{what} with mode {mode:o}"))
                                .or_insert(0) += 1;
                        }
                    }
                }
            }
            (looks, seen, wrong)
        }
    });
    for _ in 0..SOCKET_CYCLES {
        drop(
            env.builder()
                .admin_socket(AdminSocket::ReadOnly)
                .open(&env.path)
                .expect("open the store"),
        );
    }
    stop.store(true, Ordering::Relaxed);
    let (looks, seen, wrong) = watcher.join().expect("the watcher");
    println!("watched {looks:?} times, the socket and its private directory seen {seen:?} times");
    assert!(seen[0] > 0, "the watcher saw the socket at least once");
    assert!(wrong.is_empty(), "seen: {wrong:?}");
    let changed = watch.changed();
    assert!(
        changed.is_empty(),
        "modes changed after creation: {changed:?}"
    );
    assert!(!socket.exists(), "the socket is removed at close");
}

#[track_caller]
fn assert_child_passed(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "the child failed ({}): {stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("1 passed"),
        "the child ran its test: {stdout}"
    );
    stdout
}

/// Under umask 000, set in a child process before it starts: the same checks as
/// [`a_stores_files_are_private_to_its_user`], plus a watcher of the admin socket's path while
/// the store opens and closes again and again.
#[test]
fn a_stores_files_are_private_under_a_permissive_umask() {
    let output = run_child(&["sh", "-c", "umask 000 && exec \"$@\"", "sh"], "umask -");
    let stdout = assert_child_passed(&output);
    assert!(stdout.contains("watched"), "{stdout}");
}

/// Whether this process may start children as another user: it runs as root and `setpriv`
/// (util-linux) works.
fn can_switch_users() -> bool {
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid() == 0
    });
    root && Command::new("setpriv")
        .args(["--reuid", &STRANGER_UID.to_string(), "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Another user cannot reach the admin socket: without privileges the socket's mode refuses
/// the connection, and a process of another user that may bypass file modes
/// (`CAP_DAC_OVERRIDE`) is refused by its credentials, with a message naming its user, and
/// the refusal is counted. Skipped (saying so) unless the suite runs as root with `setpriv`.
#[test]
fn another_users_connection_is_refused() {
    if !can_switch_users() {
        eprintln!("skipped: needs root and setpriv to connect as another user");
        return;
    }
    let env = Env::new();
    // The directory lets everyone through, so that the socket's own mode is what refuses.
    std::fs::set_permissions(env.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let store = env
        .builder()
        .admin_socket(AdminSocket::ReadOnly)
        .open(&env.path)
        .expect("open the store");
    let lease = acquire(&store, &key("tenant", "op", "k"), fp("body"));
    store.complete(&lease, b"private".to_vec()).unwrap();
    let spec = format!("connect {}", env.path.display());
    let uid = STRANGER_UID.to_string();
    let stranger = [
        "setpriv",
        "--reuid",
        &uid,
        "--regid",
        &uid,
        "--clear-groups",
    ];

    let plain = assert_child_passed(&run_child(&stranger, &spec));
    assert!(plain.contains("REFUSED"), "{plain}");
    assert!(plain.contains("ermission denied"), "{plain}");

    let refused_before = idemstore::admin::refused_connections();
    let caps = ["--inh-caps=+dac_override", "--ambient-caps=+dac_override"];
    let privileged = assert_child_passed(&run_child(&[&stranger[..], &caps[..]].concat(), &spec));
    assert!(privileged.contains("REFUSED"), "{privileged}");
    assert!(
        privileged.contains(&format!("uid {STRANGER_UID}")),
        "the refusal names the user: {privileged}"
    );
    assert!(idemstore::admin::refused_connections() > refused_before);

    // The owner's own connection is served as before.
    let admin = AdminClient::connect(&env.path).expect("the owner connects");
    assert_eq!(admin.counts().unwrap().completed, 1);
    drop(store);
    drop(Store::open(&env.path).unwrap());
}

/// `Builder::file_mode` chooses another mode for the files a store creates (group read here),
/// under the default umask; files that exist keep theirs; a mode without the owner's read and
/// write, or with bits beyond the permissions, is refused by `open` naming the setting.
#[test]
fn file_mode_chooses_the_mode_of_new_files_only() {
    let env = Env::new();
    let mut builder = env.builder();
    builder.file_mode(0o640).admin_socket(AdminSocket::ReadOnly);
    let store = builder.open(&env.path).expect("open the store");
    let lease = acquire(&store, &key("tenant", "op", "k"), fp("body"));
    store.complete(&lease, b"stored".to_vec()).unwrap();
    store.checkpoint().unwrap();
    // The socket stays 0600 whatever the files' mode.
    assert_private(env.dir.path(), 0o640, &[], "with file_mode(0o640)");
    drop(store);

    // A store made with the default keeps 0600 when opened with another mode, and the reverse.
    let other = Env::new();
    drop(other.open());
    drop(other.builder().file_mode(0o640).open(&other.path).unwrap());
    assert_private(other.dir.path(), 0o600, &[], "a 0600 store reopened");
    drop(env.open());
    assert_private(env.dir.path(), 0o640, &[], "a 0640 store reopened");

    for mode in [0o400, 0o200, 0o000, 0o1600, 0o4600, 0o2640, 0o10600] {
        let err = env
            .builder()
            .file_mode(mode)
            .open(&env.path)
            .expect_err("an invalid mode is refused");
        assert!(
            matches!(
                err,
                OpenError::InvalidConfig {
                    setting: "file_mode",
                    ..
                }
            ),
            "{mode:o}: {err:?}"
        );
        assert!(err.to_string().contains(&format!("{mode:#o}")), "{err}");
    }
}

/// A directory left by a process that died while binding its admin socket (with the socket in
/// it) does not stop the next open, and is gone after it; anything else at that name is
/// refused and left untouched.
#[test]
fn a_left_binding_directory_is_cleared_and_anything_else_refused() {
    let env = Env::new();
    let private = env.dir.path().join(".store.idem.a");
    std::fs::create_dir(&private).unwrap();
    drop(std::os::unix::net::UnixListener::bind(private.join("s")).unwrap());
    let store = env
        .builder()
        .admin_socket(AdminSocket::ReadOnly)
        .open(&env.path)
        .expect("the left directory is cleared");
    assert!(!private.exists());
    assert_eq!(
        AdminClient::connect(&env.path)
            .unwrap()
            .counts()
            .unwrap()
            .pending,
        0
    );
    drop(store);

    std::fs::write(&private, b"someone's file").unwrap();
    let err = env
        .builder()
        .admin_socket(AdminSocket::ReadOnly)
        .open(&env.path)
        .expect_err("a file in the way is refused");
    assert!(err.to_string().contains(".store.idem.a"), "{err}");
    assert_eq!(std::fs::read(&private).unwrap(), b"someone's file");
}
