//! A full disk on a small real filesystem (`ENOSPC` from the kernel, not from the simulated
//! disk of `tests/crash.rs`).
//!
//! The test binary re-runs itself three times over:
//!
//! 1. the test below starts a *scenario* process in its own mount namespace (`unshare
//!    --mount`, inside a user namespace when one is allowed, so no root is needed where
//!    unprivileged user namespaces are on; as root without them, a mount namespace alone).
//!    The namespace ends with the process, so the small filesystem never outlives the test,
//!    even when it fails;
//! 2. the scenario mounts a tmpfs of a few MiB and starts a *worker* process that reserves
//!    and completes fresh keys from several threads, printing every acknowledgment as one
//!    flushed line, until a call fails;
//! 3. the worker prints the failing call's error and a later call's error, and exits.
//!
//! The scenario then checks: the failing call's error is a full disk
//! ([`std::io::ErrorKind::StorageFull`]) naming the store's file and saying how much free
//! space reopening needs; every later call is refused as [`Error::Poisoned`] naming that
//! cause; reopening while the disk is still full (the last free bytes taken by a filler
//! file) fails with a full-disk error naming the file and the room, without a panic and
//! without damage; so does every try while the room is made step by step (the tmpfs
//! remounted larger: 4 KiB free, then 8 times more each time, or twice in the long mode, up
//! to the room the message asked for); at the
//! latest with that room the store reopens and every acknowledged operation answers as
//! acknowledged; with more room, new keys work again with fresh tokens.
//!
//! It needs a mount namespace and a tmpfs: Linux, with unprivileged user namespaces allowed
//! or as root with `CAP_SYS_ADMIN` (in a container: `--cap-add SYS_ADMIN` or
//! `--privileged`). Where neither is possible the test FAILS, saying so; it never skips.
//! `cargo test` (a debug build) runs one filesystem, where the store file's growth meets the
//! full disk (about 8 s); a release build (CI's `release` step) also the one where the log's
//! write meets it (about 2 s for both); `IDEMSTORE_LONG=1` runs two more, with larger
//! checkpoints on a larger filesystem ([`CASES`]).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use idemstore::{Builder, Error, Fingerprint, Key, Reservation, Status, Store};

/// Set in the re-run processes: `scenario <dir> <case>` or `worker <store path> <case>`.
const ROLE_ENV: &str = "IDEMSTORE_ENOSPC_ROLE";
const THREADS: usize = 4;
/// Bytes of every result: large enough that the disk fills in about a second.
const RESULT_LEN: usize = 1024;

/// One filesystem and store configuration.
#[derive(Clone, Copy, Debug)]
struct Case {
    /// Size of the tmpfs, in MiB.
    fs_mib: u64,
    checkpoint_bytes: u64,
    preallocate_log: bool,
    /// The file whose write meets the full disk, as the error names it.
    full: &'static str,
}

const CASES: [Case; 4] = [
    // `cargo test` runs the first two. The log preallocated, so the store file's growth at a
    // checkpoint is what meets the full disk.
    Case {
        fs_mib: 8,
        checkpoint_bytes: 64 * 1024,
        preallocate_log: true,
        full: "store.idem",
    },
    // A log that grows, with checkpoints too large to happen before the disk is full: the
    // log's write is what meets it.
    Case {
        fs_mib: 8,
        checkpoint_bytes: 64 << 20,
        preallocate_log: false,
        full: "store.idem.wal",
    },
    // Long mode: larger checkpoints on a larger filesystem.
    Case {
        fs_mib: 24,
        checkpoint_bytes: 1 << 20,
        preallocate_log: true,
        full: "store.idem",
    },
    Case {
        fs_mib: 24,
        checkpoint_bytes: 1 << 20,
        preallocate_log: false,
        full: "store.idem",
    },
];

use crate::common::long_mode;

fn builder(case: Case) -> Builder {
    let mut builder = Store::builder();
    builder
        .checkpoint_bytes(case.checkpoint_bytes)
        .preallocate_log(case.preallocate_log)
        .lease(Duration::from_secs(3600));
    builder
}

fn fingerprint() -> Fingerprint {
    Fingerprint::of(b"enospc test request")
}

fn key(id: &str) -> Key {
    Key::new("enospc", "op", id).expect("valid key")
}

fn result_for(id: &str, token: u64) -> Vec<u8> {
    let mut result = format!("{id} completed by token {token}|").into_bytes();
    result.resize(RESULT_LEN, b'.');
    result
}

fn case_from(text: &str) -> Case {
    let index: usize = text.parse().expect("case index");
    CASES[index]
}

/// The roles of the re-run processes; does nothing in a plain `cargo test` run.
#[test]
fn role() {
    let Ok(spec) = std::env::var(ROLE_ENV) else {
        return;
    };
    let mut parts = spec.splitn(3, ' ');
    let (role, path, case) = (
        parts.next().expect("role"),
        PathBuf::from(parts.next().expect("path")),
        parts.next().expect("case"),
    );
    match role {
        "scenario" => scenario(&path, case.parse().expect("case index")),
        "worker" => worker(&path, case_from(case)),
        other => panic!("unknown role {other}"),
    }
}

/// Re-runs this test binary as `role`.
fn this_binary(role: &str, path: &Path, case: usize) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("test binary path"));
    command
        .args(["--exact", "enospc::role", "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, format!("{role} {} {case}", path.display()));
    command
}

// ---------------------------------------------------------------------------------------
// The worker: fills the disk.

/// Starts every line the worker reports (the test harness may print before it).
const MARK: &str = "ENOSPC-WORKER ";

fn print_line(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{MARK}{line}").expect("stdout");
    out.flush().expect("flush stdout");
}

/// An error on one line, with its I/O error kind.
fn describe(error: &Error) -> String {
    format!("{:?} {}", error.io_kind(), error).replace('\n', " ")
}

/// Reserves and completes fresh keys from several threads until a call fails; prints every
/// acknowledgment (`A id token`, `C id token`), each thread's first error (`ERR ...`) and
/// the error of a call made after it (`LATER ...`), then drops the store.
fn worker(path: &Path, case: Case) {
    let store = Arc::new(
        builder(case)
            .open(path)
            .expect("the worker opens the store"),
    );
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = Arc::clone(&store);
            thread::spawn(move || {
                for i in 0u64.. {
                    let id = format!("t{t}-{i}");
                    let lease = match store.reserve(&key(&id), fingerprint()) {
                        Ok(Reservation::Acquired(lease)) => lease,
                        Ok(other) => panic!("a fresh key is acquired, got {other:?}"),
                        Err(e) => {
                            print_line(format_args!("ERR {}", describe(&e)));
                            break;
                        }
                    };
                    print_line(format_args!("A {id} {}", lease.token()));
                    match store.complete(&lease, result_for(&id, lease.token())) {
                        Ok(_) => print_line(format_args!("C {id} {}", lease.token())),
                        Err(e) => {
                            print_line(format_args!("ERR {}", describe(&e)));
                            break;
                        }
                    }
                }
                let later = store.reserve(&key(&format!("t{t}-later")), fingerprint());
                match later {
                    Ok(answer) => panic!("a call after the failure was answered: {answer:?}"),
                    Err(e) => print_line(format_args!("LATER {}", describe(&e))),
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("a worker thread panicked");
    }
    match store.checkpoint() {
        Ok(()) => panic!("a checkpoint after the failure succeeded"),
        Err(e) => print_line(format_args!("LATER {}", describe(&e))),
    }
    drop(store);
    print_line(format_args!("DROPPED"));
}

// ---------------------------------------------------------------------------------------
// The scenario, inside its own mount namespace.

/// Runs a command; panics naming it and its output unless it succeeds.
fn run(command: &mut Command, what: &str) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{what}: {command:?} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    output
}

/// How long the worker may take to fill the disk (about a second in a debug build): a hang
/// on a full disk fails the test instead of stalling CI.
const WORKER_DEADLINE: Duration = Duration::from_secs(120);

/// Runs the worker; returns its standard output. Panics, with its standard error, if it fails
/// or is not done by [`WORKER_DEADLINE`] (then it is killed).
fn run_worker(mut command: Command) -> Vec<u8> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the worker");
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        thread::spawn(move || {
            let mut bytes = Vec::new();
            pipe.read_to_end(&mut bytes)
                .expect("read the worker's output");
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the worker") {
            break Some(status);
        }
        if started.elapsed() > WORKER_DEADLINE {
            child.kill().expect("kill the worker");
            child.wait().expect("reap the worker");
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (
        stdout.join().expect("stdout reader"),
        stderr.join().expect("stderr reader"),
    );
    let stderr = String::from_utf8_lossy(&stderr);
    match status {
        None => panic!(
            "the worker filling the disk was not done after {WORKER_DEADLINE:?} (a hang on a full disk?): {}",
            stderr.trim()
        ),
        Some(status) => assert!(
            status.success(),
            "the worker filling the disk failed ({status}): {}",
            stderr.trim()
        ),
    }
    stdout
}

/// Bytes used and free on the filesystem at `dir`, as `df` counts them.
fn used_and_free(dir: &Path) -> (u64, u64) {
    let output = run(
        Command::new("df")
            .args(["-B1", "--output=used,avail"])
            .arg(dir),
        "measuring the small filesystem",
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let numbers: Vec<u64> = text
        .lines()
        .nth(1)
        .expect("df prints a header and one line")
        .split_whitespace()
        .map(|n| n.parse().expect("df prints numbers"))
        .collect();
    (numbers[0], numbers[1])
}

/// Mounts (or resizes) the tmpfs at `dir` to `bytes`.
fn mount_tmpfs(dir: &Path, bytes: u64, remount: bool) {
    let mut command = Command::new("mount");
    command.args(["-t", "tmpfs"]);
    if remount {
        command.args(["-o", &format!("remount,size={bytes}")]);
    } else {
        command.args(["-o", &format!("size={bytes},mode=0700")]);
    }
    command.arg("idemstore-enospc").arg(dir);
    run(
        &mut command,
        &format!("mounting a {bytes}-byte tmpfs for the full-disk test (it needs CAP_SYS_ADMIN in a mount namespace)"),
    );
}

/// What the worker acknowledged and reported.
#[derive(Default)]
struct Report {
    acquired: HashMap<String, u64>,
    completed: HashMap<String, u64>,
    errors: Vec<String>,
    later: Vec<String>,
    dropped: bool,
}

fn read_report(stdout: &[u8]) -> Report {
    let mut report = Report::default();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("utf-8 lines");
        let Some((_, line)) = line.split_once(MARK) else {
            continue;
        };
        let mut words = line.splitn(3, ' ');
        match words.next() {
            Some(tag @ ("A" | "C")) => {
                let id = words.next().expect("id").to_string();
                let token: u64 = words.next().expect("token").parse().expect("token");
                let map = if tag == "A" {
                    &mut report.acquired
                } else {
                    &mut report.completed
                };
                map.insert(id, token);
            }
            Some("ERR") => report.errors.push(line[4..].to_string()),
            Some("LATER") => report.later.push(line[6..].to_string()),
            Some("DROPPED") => report.dropped = true,
            _ => {}
        }
    }
    report
}

/// The free space a message asks for: the number after "free at least ".
fn room_asked(message: &str) -> Option<u64> {
    message
        .split("free at least ")
        .nth(1)?
        .split(' ')
        .next()?
        .parse()
        .ok()
}

/// Every acknowledged operation answers as acknowledged: a completion with its result, an
/// acquisition pending under its token or completed with that token's result (the
/// completion may have landed unacknowledged). Returns the highest token seen.
fn verify(store: &Store, report: &Report) -> u64 {
    let mut max_token = 0;
    for (id, &token) in &report.acquired {
        let record = store
            .get(&key(id))
            .unwrap_or_else(|e| panic!("acknowledged key {id} does not read: {e}"))
            .unwrap_or_else(|| panic!("acknowledged key {id} (token {token}) is gone"));
        assert_eq!(record.token(), token, "{id}");
        max_token = max_token.max(token);
        match record.status() {
            Status::Completed { result, .. } => {
                assert_eq!(result, result_for(id, token).as_slice(), "{id}")
            }
            Status::Pending { .. } => assert!(
                !report.completed.contains_key(id),
                "{id}: the completion was acknowledged but the key is pending"
            ),
            other => panic!("{id}: acknowledged, then found {other:?}"),
        }
    }
    max_token
}

/// Fills the last free bytes of the filesystem at `dir` with a file; returns its path.
fn fill_the_rest(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).expect("create the filler file");
    let block = vec![0xa5u8; 4096];
    loop {
        match file.write(&block) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
            Err(e) => panic!("filling the disk: {e}"),
        }
    }
    let _ = file.sync_all();
    path
}

fn scenario(dir: &Path, index: usize) {
    let case = CASES[index];
    let started = Instant::now();
    mount_tmpfs(dir, case.fs_mib << 20, false);
    let path = dir.join("store.idem");

    // Fill the disk.
    let stdout = run_worker(this_binary("worker", &path, index));
    let report = read_report(&stdout);
    assert!(report.dropped, "the worker did not finish");
    let (_, free_when_full) = used_and_free(dir);
    eprintln!(
        "case {case:?}: {} acquisitions and {} completions acknowledged before the disk filled ({free_when_full} bytes left free)",
        report.acquired.len(),
        report.completed.len()
    );
    assert!(
        report.completed.len() >= 100,
        "only {} completions fit on {} MiB",
        report.completed.len(),
        case.fs_mib
    );

    // The failing calls (every caller of the batch that met the full disk): a full disk,
    // naming the file and the room reopening needs.
    assert!(!report.errors.is_empty(), "no call failed");
    // The room asked for replays the log the store held when it failed, the same in every
    // message (crash::a_full_disk_says_how_much_room_reopening_needs_and_that_is_enough
    // reopens with exactly that room).
    let needed = room_asked(&report.errors[0]).unwrap_or_else(|| {
        panic!(
            "the error does not say how much room reopening needs: {}",
            report.errors[0]
        )
    });
    for error in &report.errors {
        assert!(
            error.starts_with("Some(StorageFull) "),
            "a failing call does not name the full disk, by its kind: {error}"
        );
        assert!(
            error.contains(case.full),
            "{} is not named: {error}",
            case.full
        );
        let asked = room_asked(error).unwrap_or_else(|| {
            panic!("the error does not say how much room reopening needs: {error}")
        });
        assert_eq!(asked, needed, "{error}");
    }
    eprintln!("the failing call: {}", report.errors[0]);
    // Later calls: refused as poisoned, naming the cause.
    assert_eq!(report.later.len(), THREADS + 1);
    for later in &report.later {
        assert!(
            later.starts_with("Some(StorageFull) store is poisoned")
                && later.contains("store.idem")
                && room_asked(later) == Some(needed),
            "a later call is not refused as poisoned by the full disk: {later}"
        );
    }
    eprintln!("a later call: {}", report.later[0]);

    // Reopening while the disk is still full.
    let filler = fill_the_rest(dir);
    let (used, free) = used_and_free(dir);
    assert!(free < 4096, "{free} bytes still free");
    // An open replays at most the log's file (and two regions' worth, each a checkpoint's
    // worth and its last frame with the frame's spare copy: with the default frame limit,
    // more than any log here).
    let log_len = std::fs::metadata(dir.join("store.idem.wal"))
        .expect("the log is there")
        .len();
    let needed = idemstore::whitebox::reopen_room(log_len);
    let reopened = builder(case).open(&path);
    let full_reopen = match reopened {
        Ok(store) => {
            // Nothing needed room: then it must answer correctly right away.
            verify(&store, &report);
            drop(store);
            "opened".to_string()
        }
        Err(e) => {
            let text = describe(&e.into());
            assert!(
                text.starts_with("Some(StorageFull) ")
                    && text.contains("store.idem")
                    && room_asked(&text) == Some(needed),
                "reopening on a full disk fails, but not as a full disk naming the file and the room it needs: {text}"
            );
            text
        }
    };
    eprintln!("reopening on the full disk ({used} bytes used): {full_reopen}");

    // Making room step by step, from 4 KiB up to the room the message asked for:
    // every try with too little fails as a full disk and leaves everything in place, and the
    // room asked for is enough.
    std::fs::remove_file(&filler).expect("remove the filler");
    let mut room = 4096;
    let step = if long_mode() { 2 } else { 8 };
    let mut failures = 0;
    let max_token = loop {
        let (used, _) = used_and_free(dir);
        mount_tmpfs(dir, used + room, true);
        let (_, free) = used_and_free(dir);
        match builder(case).open(&path) {
            Ok(store) => {
                let max_token = verify(&store, &report);
                drop(store);
                eprintln!(
                    "reopened with {free} bytes free (asked: {needed}), after {failures} clean failures with less: every acknowledged operation is there ({} keys)",
                    report.acquired.len()
                );
                break max_token;
            }
            Err(e) => {
                let text = describe(&e.into());
                assert!(
                    room < needed,
                    "reopening with {free} bytes free (asked: {needed}) failed: {text}"
                );
                assert!(
                    text.starts_with("Some(StorageFull) ") && room_asked(&text) == Some(needed),
                    "reopening with {free} bytes free fails, but not as a full disk saying the room it needs: {text}"
                );
                failures += 1;
                room = (room * step).min(needed);
            }
        }
    };

    // With more room, the store works again.
    let (used, _) = used_and_free(dir);
    mount_tmpfs(dir, used + (case.fs_mib << 20), true);
    let store = builder(case).open(&path).expect("reopen with room");
    verify(&store, &report);
    let stale = store.stale(usize::MAX).expect("list stale reservations");
    for (key, _) in &stale {
        let Reservation::Acquired(lease) = store.reserve(key, fingerprint()).expect("reserve")
        else {
            panic!("{key} was left pending by the worker; its first reserve takes it over");
        };
        assert!(lease.token() > max_token, "a token was reused");
    }
    let Reservation::Acquired(lease) = store.reserve(&key("fresh"), fingerprint()).unwrap() else {
        panic!("a fresh key is acquired");
    };
    assert!(lease.token() > max_token, "a token was reused");
    store
        .complete(&lease, b"done".to_vec())
        .expect("complete with room");
    drop(store);
    eprintln!(
        "with room: {} stale keys taken over, a fresh key completed ({:.1} s)",
        stale.len(),
        started.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------------------
// The test: starts each scenario in a mount namespace of its own.

/// How this machine can give a process a mount namespace, or why it cannot.
fn namespace() -> Result<&'static [&'static str], String> {
    let mut tried = Vec::new();
    let options: [&[&str]; 2] = [
        // Unprivileged where user namespaces are allowed, and as root.
        &[
            "--user",
            "--map-root-user",
            "--mount",
            "--propagation",
            "private",
        ],
        // Root where user namespaces are not allowed.
        &["--mount", "--propagation", "private"],
    ];
    for args in options {
        match Command::new("unshare")
            .args(args)
            .arg("true")
            .stdout(Stdio::null())
            .output()
        {
            Ok(out) if out.status.success() => return Ok(args),
            Ok(out) => tried.push(format!(
                "`unshare {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => tried.push(format!("`unshare` could not run: {e}")),
        }
    }
    Err(tried.join("; "))
}

#[test]
fn a_full_real_disk_fails_clearly_poisons_and_reopens_with_everything_acknowledged() {
    if std::env::var_os(ROLE_ENV).is_some() {
        return;
    }
    let args = namespace().unwrap_or_else(|why| {
        panic!(
            "the full-disk test needs a small real filesystem: a tmpfs mounted in a mount \
             namespace of its own, which needs Linux with unprivileged user namespaces \
             allowed (sysctl kernel.unprivileged_userns_clone=1, \
             kernel.apparmor_restrict_unprivileged_userns=0) or root with CAP_SYS_ADMIN (in a \
             container: --cap-add SYS_ADMIN, or --privileged), and `unshare` and `mount` \
             from util-linux. Here: {why}"
        )
    });
    let cases = crate::common::by_mode(1, 2, CASES.len());
    for (index, case) in CASES.iter().enumerate().take(cases) {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let mountpoint = dir.path().join("small-fs");
        std::fs::create_dir(&mountpoint).expect("create the mount point");
        let inner = this_binary("scenario", &mountpoint, index);
        let output = Command::new("unshare")
            .args(args)
            .arg(inner.get_program())
            .args(inner.get_args())
            .envs(inner.get_envs().filter_map(|(k, v)| Some((k, v?))))
            .output()
            .expect("run unshare");
        let stderr = String::from_utf8_lossy(&output.stderr);
        eprint!("{stderr}");
        assert!(
            output.status.success(),
            "the full-disk scenario {case:?} failed ({}): {}",
            output.status,
            stderr.trim()
        );
    }
}
