//! The `idemstore` binary, run as a user would against store files made by the library.
//!
//! The CLI reads the system clock, so fixtures are written through a [`ManualClock`] set in
//! the past: a reservation made "two hours ago" with a one-hour lease is stale now.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime};

use idemstore::redb::ReadableDatabase;
use idemstore::{ManualClock, Reservation, Store};
use serde_json::Value;

use crate::common::{acquire, change_stored, encoded, fp, key, replayed, stored};
use crate::run::ids;

const HOUR: Duration = Duration::from_secs(3600);

/// A store file with one record in each state, in its own temporary directory.
struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    clock: ManualClock,
}

impl Fixture {
    /// - `u1/charge/live`: reserved now, lease 1 h: pending;
    /// - `u1/charge/stale`: reserved 2 h ago: stale for 1 h;
    /// - `u1/charge/review`: reserved 2 h ago, marked for review;
    /// - `u1/charge/done`: completed 30 min ago with `201 created`;
    /// - `u2/refund/old`: completed 48 h ago: expired, not swept.
    fn new() -> Fixture {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("keys.idem");
        // The store's time never runs backward while it is open: the clock starts in the
        // past and moves forward.
        let now = SystemTime::now();
        let fixture = Fixture {
            _dir: dir,
            path,
            clock: ManualClock::starting_at(now - 48 * HOUR),
        };
        let store = fixture.open();
        let old = acquire(&store, &key("u2", "refund", "old"), fp("r"));
        store.complete(&old, b"200 refunded".to_vec()).unwrap();
        fixture.clock.set(now - 2 * HOUR);
        let _stale = acquire(&store, &key("u1", "charge", "stale"), fp("s"));
        let review = acquire(&store, &key("u1", "charge", "review"), fp("v"));
        store
            .mark_needs_review(&review, "gateway timed out")
            .unwrap();
        fixture.clock.set(now - HOUR / 2);
        let done = acquire(&store, &key("u1", "charge", "done"), fp("d"));
        store.complete(&done, b"201 created".to_vec()).unwrap();
        fixture.clock.set(now);
        let _live = acquire(&store, &key("u1", "charge", "live"), fp("l"));
        fixture
    }

    /// The fixture's store, with its clock: lease 1 h, retention 24 h, and leases that
    /// outlast a restart (so the `live` key stays live each time a test opens the file). No
    /// admin socket: here the tool opens the file itself (`tests/live.rs` tests the socket).
    fn open(&self) -> Store {
        // The tests count expired keys: no background sweeper deleting them meanwhile.
        Store::builder()
            .lease(HOUR)
            .leases_survive_restart(true)
            .admin_socket(idemstore::AdminSocket::Off)
            .retention(24 * HOUR)
            .clock(self.clock.clone())
            .sweep_interval(None)
            .open(&self.path)
            .expect("open the fixture store")
    }

    fn file(&self) -> &str {
        self.path.to_str().expect("a UTF-8 temporary path")
    }
}

/// Runs the tool as the fixture's service would see its store: with leases that outlast a
/// restart, so the fixture's `live` key stays live (by default a key left pending in a file no
/// process holds is stale: see [`a_key_left_pending_by_a_gone_process_is_stale`]).
fn idemstore(args: &[&str]) -> Output {
    let command = args.iter().find(|arg| !arg.starts_with("--"));
    let reads_leases =
        command.is_some_and(|c| ["stats", "list", "get", "expire", "resolve"].contains(c));
    Command::new(env!("CARGO_BIN_EXE_idemstore"))
        .args(args)
        .args(reads_leases.then_some("--leases-survive-restart"))
        .output()
        .expect("run idemstore")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs the command, expects exit status `code`, and returns its stdout.
#[track_caller]
fn run(args: &[&str], code: i32) -> String {
    let output = idemstore(args);
    assert_eq!(
        output.status.code(),
        Some(code),
        "idemstore {args:?}\nstdout:\n{}\nstderr:\n{}",
        stdout(&output),
        stderr(&output)
    );
    stdout(&output)
}

#[track_caller]
fn run_json(args: &[&str], code: i32) -> Value {
    let text = run(args, code);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

#[test]
fn a_key_left_pending_by_a_gone_process_is_stale() {
    let fx = Fixture::new();
    let tool = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_idemstore"))
            .args(args)
            .output()
            .expect("run idemstore");
        assert!(output.status.success(), "{}", stderr(&output));
        stdout(&output)
    };
    let text = tool(&["stats", fx.file()]);
    for line in ["pending (live lease)    0", "stale (lease ended)     2"] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    let text = tool(&["get", fx.file(), "u1", "charge", "live"]);
    assert!(text.contains("stale: its process is gone"), "{text}");
    let listed = tool(&["list", fx.file(), "--state", "stale", "--json"]);
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(ids(&listed["records"]), ["stale", "live"]);
    // The tool's view is the next owner's: the key is taken over by its first reserve.
    let store = Store::open(&fx.path).unwrap();
    match store
        .reserve(&key("u1", "charge", "live"), fp("l"))
        .unwrap()
    {
        Reservation::Acquired(lease) => assert_eq!(lease.attempt(), 2),
        other => panic!("expected a takeover, got {other:?}"),
    }
}

#[test]
fn stats_counts_every_state_and_reports_the_files() {
    let fx = Fixture::new();
    let text = run(&["stats", fx.file()], 0);
    for line in [
        "pending (live lease)    1",
        "stale (lease ended)     1",
        "needs-review            1",
        "completed               1",
        "expired, not yet swept  1",
        "total                   5",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    assert!(text.contains("keys.idem.wal"), "{text}");
    assert!(
        text.contains("oldest pending: u1/charge/stale (stale for 1h00m"),
        "{text}"
    );

    let stats = run_json(&["stats", fx.file(), "--json"], 0);
    let counts = &stats["counts"];
    for (name, n) in [
        ("pending", 1),
        ("stale", 1),
        ("needs_review", 1),
        ("completed", 1),
        ("expired", 1),
        ("damaged", 0),
        ("total", 5),
    ] {
        assert_eq!(counts[name], n, "{name} in {stats:#}");
    }
    assert_eq!(stats["next_token"], 6, "five acquisitions: {stats:#}");
    assert!(stats["wal_seq"].as_u64().unwrap() >= 5, "{stats:#}");
    // The size when the tool looked; redb may write a page or two while the tool closes it.
    let reported = stats["file_bytes"].as_u64().unwrap();
    let now = std::fs::metadata(&fx.path).unwrap().len();
    assert!(
        reported > 0 && reported.abs_diff(now) <= 64 * 1024,
        "{reported} vs {now}"
    );
    assert!(stats["log_path"]
        .as_str()
        .unwrap()
        .ends_with("keys.idem.wal"));
    assert_eq!(stats["oldest_pending"]["id"], "stale");
    assert_eq!(stats["oldest_pending"]["attempt"], 1);
    let stale_for = stats["oldest_pending"]["stale_for_ms"].as_u64().unwrap();
    assert!((3_600_000..3_700_000).contains(&stale_for), "{stale_for}");
}

#[test]
fn get_shows_one_record_its_result_and_refuses_a_missing_key() {
    let fx = Fixture::new();
    let text = run(&["get", fx.file(), "u1", "charge", "done"], 0);
    assert!(
        text.contains("state        completed (completed 30m"),
        "{text}"
    );
    assert!(
        text.contains("result       11 bytes: 201 created"),
        "{text}"
    );

    let record = run_json(&["get", fx.file(), "u1", "charge", "done", "--json"], 0);
    assert_eq!(record["state"], "completed");
    assert_eq!(record["result"], "201 created");
    assert_eq!(record["result_len"], 11);
    assert_eq!(
        (record["attempt"].as_u64(), record["scope"].as_str()),
        (Some(1), Some("u1"))
    );
    assert_eq!(record["fingerprint"].as_str().unwrap().len(), 64);

    let review = run_json(&["--json", "get", fx.file(), "u1", "charge", "review"], 0);
    assert_eq!(
        (review["state"].as_str(), review["note"].as_str()),
        (Some("needs-review"), Some("gateway timed out"))
    );
    assert_eq!(review["expires_at"], Value::Null);

    let raw = idemstore(&["get", fx.file(), "u1", "charge", "done", "--raw"]);
    assert_eq!(raw.stdout, b"201 created");

    let missing = idemstore(&["get", fx.file(), "u1", "charge", "nope"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).contains("no record for key u1/charge/nope"),
        "{}",
        stderr(&missing)
    );
    // An expired record reads as absent, as it does for the library.
    run(&["get", fx.file(), "u2", "refund", "old"], 1);
}

#[test]
fn list_filters_by_state_age_and_limit() {
    let fx = Fixture::new();
    let text = run(&["list", fx.file(), "--state", "stale"], 0);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with("SCOPE  OPERATION  ID"), "{text}");
    assert!(
        lines[1].starts_with("u1     charge     stale  stale  1"),
        "{text}"
    );
    assert!(lines[1].contains("stale for 1h00m"), "{text}");

    let stale = |age: &str| {
        run_json(
            &[
                "list",
                fx.file(),
                "--state",
                "stale",
                "--older-than",
                age,
                "--json",
            ],
            0,
        )
    };
    assert_eq!(ids(&stale("30m")["records"]), ["stale"]);
    assert_eq!(ids(&stale("2h")["records"]), Vec::<&str>::new());

    let all = run_json(&["list", fx.file(), "--json"], 0);
    assert_eq!(all["truncated"], false);
    assert_eq!(ids(&all["records"]).len(), 5);
    let pending = run_json(&["list", fx.file(), "--state", "pending", "--json"], 0);
    assert_eq!(ids(&pending["records"]), ["live"]);
    assert!(pending["records"][0]["lease_left_ms"].as_u64().unwrap() > 3_000_000);
    let review = run_json(&["list", fx.file(), "--state", "needs-review", "--json"], 0);
    assert_eq!(ids(&review["records"]), ["review"]);
    let expired = run_json(&["list", fx.file(), "--state", "expired", "--json"], 0);
    assert_eq!(ids(&expired["records"]), ["old"]);
    let done = run_json(
        &[
            "list",
            fx.file(),
            "--state",
            "completed",
            "--older-than",
            "20m",
            "--json",
        ],
        0,
    );
    assert_eq!(ids(&done["records"]), ["done"]);

    let limited = idemstore(&["list", fx.file(), "--limit", "2", "--json"]);
    let value: Value = serde_json::from_slice(&limited.stdout).unwrap();
    assert_eq!(
        (ids(&value["records"]).len(), &value["truncated"]),
        (2, &Value::Bool(true))
    );
    let limited = idemstore(&["list", fx.file(), "--limit", "2"]);
    assert!(
        stderr(&limited).contains("first 2 shown"),
        "{}",
        stderr(&limited)
    );

    run(&["list", fx.file(), "--state", "bogus"], 2);
    run(&["list", fx.file(), "--older-than", "five minutes"], 2);
}

#[test]
fn resolve_completes_or_releases_stale_and_review_keys_only() {
    let fx = Fixture::new();
    let result = fx.path.with_file_name("answer.bin");
    std::fs::write(&result, b"201 charged after recovery").unwrap();
    let text = run(
        &[
            "resolve",
            fx.file(),
            "u1",
            "charge",
            "stale",
            "--complete",
            result.to_str().unwrap(),
        ],
        0,
    );
    assert!(
        text.contains("resolved u1/charge/stale (was stale): completed with a 26-byte result"),
        "{text}"
    );
    let value = run_json(
        &[
            "resolve",
            fx.file(),
            "u1",
            "charge",
            "review",
            "--release",
            "--json",
        ],
        0,
    );
    assert_eq!(
        (value["was"].as_str(), value["action"].as_str()),
        (Some("needs-review"), Some("release"))
    );

    // A live lease and a completed key are refused, and nothing changes.
    let live = idemstore(&["resolve", fx.file(), "u1", "charge", "live", "--release"]);
    assert_eq!(live.status.code(), Some(1));
    assert!(
        stderr(&live).contains("cannot be resolved: its lease is live"),
        "{}",
        stderr(&live)
    );
    run(
        &["resolve", fx.file(), "u1", "charge", "done", "--release"],
        1,
    );
    run(&["resolve", fx.file(), "u1", "charge", "stale"], 2); // neither --complete nor --release

    let store = fx.open();
    let done = replayed(&store, &key("u1", "charge", "stale"), fp("s"));
    assert_eq!(done.result, b"201 charged after recovery");
    let again = acquire(
        &store,
        &key("u1", "charge", "review"),
        fp("another body is fine now"),
    );
    assert_eq!(again.attempt(), 1, "released keys start afresh");
    assert!(matches!(
        store
            .reserve(&key("u1", "charge", "live"), fp("l"))
            .unwrap(),
        Reservation::InProgress { .. }
    ));
}

/// `expire` deletes a completed key, a key under review and an expired one; a live lease is
/// refused with its end named and a hint for `--force`, which then takes it; everything stays
/// so when the store is opened again.
#[test]
fn expire_deletes_keys_and_needs_force_for_a_live_lease_or_a_key_under_review() {
    let fx = Fixture::new();
    let text = run(&["expire", fx.file(), "u1", "charge", "done"], 0);
    assert!(
        text.contains("expired u1/charge/done (was completed); the next request"),
        "{text}"
    );
    // A key under review waits for `resolve`: refused without --force, and kept.
    let review = idemstore(&["expire", fx.file(), "u1", "charge", "review"]);
    assert_eq!(review.status.code(), Some(1));
    let message = stderr(&review);
    assert!(
        message.contains("u1/charge/review is marked for review")
            && message.contains("hint: settle it with `idemstore resolve"),
        "{message}"
    );
    let review = key("u1", "charge", "review");
    assert!(fx.open().get(&review).unwrap().is_some(), "still stored");
    let value = run_json(
        &[
            "expire",
            fx.file(),
            "u1",
            "charge",
            "review",
            "--force",
            "--json",
        ],
        0,
    );
    assert_eq!(
        (value["expired"].as_bool(), value["was"].as_str()),
        (Some(true), Some("needs-review"))
    );
    let value = run_json(&["expire", fx.file(), "u2", "refund", "old", "--json"], 0);
    assert_eq!(value["was"], "expired", "{value}");
    let text = run(&["expire", fx.file(), "u1", "charge", "never"], 0);
    assert!(
        text.contains("nothing stored for u1/charge/never"),
        "{text}"
    );

    let live = idemstore(&["expire", fx.file(), "u1", "charge", "live"]);
    assert_eq!(live.status.code(), Some(1));
    let message = stderr(&live);
    assert!(message.contains("held by a live lease until"), "{message}");
    assert!(message.contains("hint: add --force"), "{message}");
    assert!(fx
        .open()
        .get(&key("u1", "charge", "live"))
        .unwrap()
        .is_some());
    let value = run_json(
        &[
            "expire",
            fx.file(),
            "u1",
            "charge",
            "live",
            "--force",
            "--json",
        ],
        0,
    );
    assert_eq!(value["was"], "pending", "{value}");

    let store = fx.open();
    for (scope, operation, id) in [
        ("u1", "charge", "done"),
        ("u1", "charge", "review"),
        ("u1", "charge", "live"),
        ("u2", "refund", "old"),
    ] {
        assert_eq!(store.get(&key(scope, operation, id)).unwrap(), None, "{id}");
    }
    assert_eq!(
        store.counts().unwrap().total(),
        1,
        "only the stale reservation is left"
    );
}

#[test]
fn sweep_deletes_expired_records_in_slices_durably() {
    let fx = Fixture::new();
    {
        // Set before the store opens: its time never runs backward while it is open.
        fx.clock.set(SystemTime::now() - 30 * HOUR);
        let store = fx.open();
        for i in 0..24 {
            let lease = acquire(&store, &key("u3", "batch", &format!("k{i}")), fp("b"));
            store.complete(&lease, b"ok".to_vec()).unwrap();
        }
        fx.clock.set(SystemTime::now());
    }
    let value = run_json(
        &[
            "sweep",
            fx.file(),
            "--slice",
            "10",
            "--limit",
            "20",
            "--json",
        ],
        0,
    );
    assert_eq!(
        (value["swept"].as_u64(), value["slices"].as_u64()),
        (Some(20), Some(2))
    );
    assert_eq!(value["remaining_expired"], 5);
    let text = run(&["sweep", fx.file(), "--slice", "10"], 0);
    assert!(
        text.starts_with("swept 5 expired records in 1 slice ("),
        "{text}"
    );
    assert!(text.contains("0 expired records remain"), "{text}");
    // Durable: a new process and the library see them gone, and nothing else went.
    let stats = run_json(&["stats", fx.file(), "--json"], 0);
    assert_eq!(
        (
            stats["counts"]["expired"].as_u64(),
            stats["counts"]["total"].as_u64()
        ),
        (Some(0), Some(4))
    );
    drop(fx.open());
    let db = idemstore::open_redb(&fx.path).unwrap();
    let txn = db.begin_read().unwrap();
    assert!(!stored(&txn, &encoded(&key("u2", "refund", "old"))));
    assert!(stored(&txn, &encoded(&key("u1", "charge", "done"))));
}

/// Flips one byte of a stored record with redb directly (the store must be closed).
fn damage(path: &Path, id: &str) {
    let db = idemstore::open_redb(path).unwrap();
    let txn = db.begin_write().unwrap();
    change_stored(&txn, &encoded(&key("u1", "charge", id)), |bytes| {
        bytes[10] ^= 0x40
    });
    txn.commit().unwrap();
}

#[test]
fn check_reports_a_corrupted_record_by_its_key() {
    let fx = Fixture::new();
    let text = run(&["check", fx.file()], 0);
    assert!(
        text.contains("checked 5 records, 2 lease index entries"),
        "{text}"
    );
    assert!(text.contains("ok: no problems found"), "{text}");

    damage(&fx.path, "done");
    let text = run(&["check", fx.file()], 1);
    assert!(
        text.contains("damaged-record  key u1/charge/done: damaged record: checksum mismatch"),
        "{text}"
    );
    assert!(text.contains("1 problem found"), "{text}");
    let value = run_json(&["check", fx.file(), "--json"], 1);
    assert_eq!(value["ok"], false);
    let problem = &value["problems"][0];
    assert_eq!(
        (problem["kind"].as_str(), problem["id"].as_str()),
        (Some("damaged-record"), Some("done"))
    );
    // The other commands keep working around it, and say so.
    let stats = run_json(&["stats", fx.file(), "--json"], 0);
    assert_eq!(stats["counts"]["damaged"], 1);
    assert!(run(&["stats", fx.file()], 0).contains("damaged (run `idemstore check`)"));
    let get = idemstore(&["get", fx.file(), "u1", "charge", "done"]);
    assert_eq!(get.status.code(), Some(1));
    assert!(
        stderr(&get).contains("corruption detected in record u1/charge/done"),
        "{}",
        stderr(&get)
    );
}

#[test]
fn a_store_open_in_a_service_is_refused_with_a_clear_message() {
    let fx = Fixture::new();
    let service = fx.open();
    let output = idemstore(&["stats", fx.file()]);
    assert_eq!(output.status.code(), Some(1));
    let message = stderr(&output);
    assert!(
        message.contains("is already open in another process"),
        "{message}"
    );
    assert!(
        message.contains("hint: stop the service that has the store open"),
        "{message}"
    );
    assert!(output.stdout.is_empty());
    let json = idemstore(&["stats", fx.file(), "--json"]);
    let error: Value = serde_json::from_slice(&json.stderr).expect("a JSON error on stderr");
    assert!(
        error["error"].as_str().unwrap().contains("already open"),
        "{error}"
    );
    drop(service);
    run(&["stats", fx.file()], 0);
}

#[test]
fn usage_errors_exit_2_and_missing_files_are_not_created() {
    let help = run(&["--help"], 0);
    assert!(
        help.contains("Exit status:") && help.contains("2  usage error"),
        "{help}"
    );
    run(&[], 2);
    run(&["frobnicate"], 2);
    run(&["get", "x.idem", "only-scope"], 2);
    // Bad values are usage errors too, refused before the store is opened.
    for (args, names) in [
        (&["sweep", "x.idem", "--slice", "0"][..], "--slice"),
        (&["list", "x.idem", "--limit", "0"], "--limit"),
    ] {
        let output = idemstore(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(stderr(&output).contains(names), "{}", stderr(&output));
    }
    // A file that is not a store: the same refusal from every command, each cause once.
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.idem");
    std::fs::write(&empty, b"").unwrap();
    for path in [&empty, &dir.path().to_path_buf()] {
        for command in ["stats", "compact"] {
            let output = idemstore(&[command, path.to_str().unwrap()]);
            assert_eq!(
                output.status.code(),
                Some(1),
                "{command} {}",
                path.display()
            );
            let err = stderr(&output);
            assert!(
                err.contains("is not an idemstore store"),
                "{command}: {err}"
            );
            let parts: Vec<&str> = err.lines().next().unwrap().split(": ").collect();
            for pair in parts.windows(2) {
                assert_ne!(pair[0], pair[1], "a cause printed twice: {err}");
            }
        }
    }
    assert_eq!(std::fs::read(&empty).unwrap(), b"", "left untouched");
    let missing = dir.path().join("typo.idem");
    let output = idemstore(&["stats", missing.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("does not exist"),
        "{}",
        stderr(&output)
    );
    assert!(!missing.exists(), "the tool created a store");
}

/// Without the `etcd` feature the cluster options are still known, and say how to get them.
#[cfg(not(feature = "etcd"))]
#[test]
fn etcd_options_need_the_etcd_feature() {
    for args in [
        &["--etcd", "127.0.0.1:2379", "stats"][..],
        &["--etcd-config", "etcd.json", "get", "u1", "charge", "k1"],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_idemstore"))
            .args(args)
            .output()
            .expect("run idemstore");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let err = stderr(&output);
        assert!(
            err.contains("built with the etcd feature")
                && err.contains("`cargo install --path idemstore-cli --features etcd`"),
            "{err}"
        );
    }
}

#[test]
fn a_closed_stdout_is_a_normal_exit() {
    let fx = Fixture::new();
    {
        let store = fx.open();
        let items: Vec<_> = (0..1500)
            .map(|i| (key("u4", "import", &format!("row-{i:05}")), fp("x")))
            .collect();
        for result in store.reserve_many(&items).unwrap() {
            assert!(matches!(result.unwrap(), Reservation::Acquired(_)));
        }
    }
    // Far more than a pipe buffer: the reader goes away after the first few lines.
    for args in [
        vec!["list", fx.file(), "--limit", "100000"],
        vec!["list", fx.file(), "--limit", "100000", "--json"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_idemstore"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut head = [0u8; 200];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut head)
            .unwrap();
        drop(child.stdout.take());
        let mut errors = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut errors)
            .unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{args:?}: {errors}");
        assert!(errors.is_empty(), "{errors}");
    }
    // The store is intact after the early exit.
    assert_eq!(fx.open().counts().unwrap().pending, 1 + 1500);
}

/// `get` shows a pending key's recovery point (`Store::record_step`), as text and JSON, so an
/// operator can see where a dead worker got to before resolving its key.
#[test]
fn get_shows_the_recovery_point_of_a_pending_key() {
    let fx = Fixture::new();
    {
        let store = fx.open();
        let lease = acquire(&store, &key("u3", "checkout", "multi"), fp("m"));
        store.record_step(&lease, 2, b"charged ch_77").unwrap();
    }
    let text = run(&["get", fx.file(), "u3", "checkout", "multi"], 0);
    assert!(text.contains("recovery point"), "{text}");
    assert!(text.contains("step 2: charged ch_77"), "{text}");
    let json = run_json(&["get", fx.file(), "u3", "checkout", "multi", "--json"], 0);
    assert_eq!(json["recovery_step"], 2, "{json:#}");
    assert_eq!(json["recovery_data"], "charged ch_77", "{json:#}");
}

/// Runs `shell_command` under `script`, which gives it a pseudo-terminal as stdout and stderr
/// (as a person at a terminal has); returns everything the terminal showed.
#[cfg(target_os = "linux")]
fn on_a_terminal(shell_command: &str) -> String {
    let output = Command::new("script")
        .args([
            "--quiet",
            "--return",
            "--command",
            shell_command,
            "/dev/null",
        ])
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .output()
        .expect("run script(1), from util-linux");
    let shown = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{shell_command}:\n{shown}");
    shown
}

#[cfg(target_os = "linux")]
#[test]
fn check_and_sweep_show_progress_on_a_terminal_only() {
    let fx = Fixture::new();
    let bin = env!("CARGO_BIN_EXE_idemstore");
    let file = fx.file();
    // The tool's output redirected to a file, or --json: no bar, even with stderr on a terminal.
    let report = fx.path.with_extension("txt");
    let report_path = report.display();
    for quiet in [
        format!("'{bin}' check '{file}' > '{report_path}'"),
        format!("'{bin}' --json check '{file}'"),
        format!("'{bin}' --json sweep '{file}' --limit 0"),
    ] {
        let shown = on_a_terminal(&quiet);
        assert!(!shown.contains("entries ("), "{quiet}: {shown}");
        assert!(!shown.contains("expired records ("), "{quiet}: {shown}");
    }
    let written = std::fs::read_to_string(&report).expect("the redirected report");
    assert!(written.contains("ok: no problems found"), "{written}");
    // A person at a terminal sees the bars, then the report (5 records, 2 lease entries).
    let shown = on_a_terminal(&format!("'{bin}' check '{file}'"));
    assert!(shown.contains("checking"), "{shown}");
    assert!(shown.contains("7/7 entries (100%)"), "{shown}");
    assert!(shown.contains("ok: no problems found"), "{shown}");
    let shown = on_a_terminal(&format!("'{bin}' sweep '{file}'"));
    assert!(shown.contains("1/1 expired records (100%)"), "{shown}");
    assert!(shown.contains("swept 1 expired record"), "{shown}");
    // Without a terminal (this test's pipes), nothing but the report.
    let output = idemstore(&["check", file]);
    assert_eq!(stderr(&output), "");
}

/// `idemstore recover` refuses a store that died without its log, naming `--accept-loss`, and
/// with it opens the store and closes it cleanly; `idemstore compact` reports the file's size before and after.
#[test]
fn recover_accepts_a_lost_log_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let scratch = dir.path().join("scratch.idem");
    let path = dir.path().join("store.idem");
    let store = Store::builder()
        .preallocate_log(false)
        .open(&scratch)
        .unwrap();
    let lease = acquire(&store, &key("u", "charge", "a"), fp("b"));
    store.complete(&lease, b"one".to_vec()).unwrap();
    // The store file as a kill leaves it, without its log.
    std::fs::copy(&scratch, &path).unwrap();
    drop(store);
    let p = path.to_str().unwrap();
    let output = idemstore(&["recover", p]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("--accept-loss"),
        "{}",
        stderr(&output)
    );
    assert!(
        run(&["recover", "--accept-loss", p], 0).contains("closed cleanly"),
        "recover --accept-loss"
    );
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(run(&["compact", p], 0).contains(&format!("{size} bytes before")));
    let compacted = run_json(&["--json", "compact", p], 0);
    assert_eq!(
        compacted["bytes_after"].as_u64(),
        Some(std::fs::metadata(&path).unwrap().len())
    );
    run(&["stats", p], 0);
}

/// The bytes and modification time of each file in `dir`, by name.
fn files_of(dir: &Path) -> Vec<(String, Vec<u8>, SystemTime)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap(), modified)
        })
        .collect();
    files.sort();
    files
}

/// `stats`, `list`, `get` and `check` on a closed store read it without writing: the store
/// file and its log keep every byte and their modification times, and no file is added.
#[test]
fn reading_commands_never_write_the_store_or_its_log() {
    let fx = Fixture::new();
    let p = fx.file();
    let dir = fx.path.parent().unwrap();
    let before = files_of(dir);
    assert_eq!(before.len(), 2, "the store file and its log");
    let reads: [&[&str]; 8] = [
        &["stats", p],
        &["--json", "stats", p],
        &["list", p],
        &["list", p, "--state", "stale"],
        &["list", p, "--state", "expired"],
        &["get", p, "u1", "charge", "done"],
        &["--json", "get", p, "u1", "charge", "review"],
        &["check", p],
    ];
    for args in reads {
        run(args, 0);
        let after = files_of(dir);
        for (was, is) in before.iter().zip(&after) {
            assert!(was.1 == is.1, "`idemstore {args:?}` changed {}", was.0);
            assert_eq!(was.2, is.2, "`idemstore {args:?}` touched {}", was.0);
        }
        assert_eq!(
            before.len(),
            after.len(),
            "`idemstore {args:?}` added a file"
        );
    }
    // What the read-only view shows is what the file holds: the same as a writable open's.
    let listed = run_json(&["--json", "list", p], 0);
    assert_eq!(ids(&listed["records"]).len(), 5, "{listed:#}");
}

/// A store that was not closed cleanly (its process was killed: the file and the log as it
/// left them) is refused by the reading commands, naming the file and how to recover it; after
/// `idemstore recover` they read it.
#[test]
fn reading_commands_refuse_a_store_that_needs_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let (scratch, path) = (dir.path().join("open.idem"), dir.path().join("killed.idem"));
    let store = Store::builder()
        .admin_socket(idemstore::AdminSocket::Off)
        .open(&scratch)
        .unwrap();
    let lease = acquire(&store, &key("u", "charge", "a"), fp("b"));
    store.complete(&lease, b"one".to_vec()).unwrap();
    std::fs::copy(&scratch, &path).unwrap();
    std::fs::copy(
        scratch.with_extension("idem.wal"),
        path.with_extension("idem.wal"),
    )
    .unwrap();
    drop(store);
    let p = path.to_str().unwrap();
    let files = || {
        (
            std::fs::read(&path).unwrap(),
            std::fs::read(path.with_extension("idem.wal")).unwrap(),
        )
    };
    let before = files();
    for args in [
        &["stats", p][..],
        &["list", p],
        &["get", p, "u", "charge", "a"],
        &["check", p],
    ] {
        let output = idemstore(args);
        assert_eq!(
            output.status.code(),
            Some(1),
            "{args:?}: {}",
            stderr(&output)
        );
        let message = stderr(&output);
        assert!(
            message.contains("was not closed cleanly")
                && message.contains(p)
                && message.contains(&format!("idemstore recover {p}")),
            "{args:?}: {message}"
        );
        assert!(files() == before, "{args:?} wrote a file");
    }
    // Nor is one imported into.
    let dump = dir.path().join("empty.jsonl");
    std::fs::write(&dump, "").unwrap();
    let output = idemstore(&["import", p, dump.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("was not closed cleanly"),
        "{}",
        stderr(&output)
    );
    assert!(files() == before, "import wrote a file");
    run(&["recover", p], 0);
    let record = run_json(&["--json", "get", p, "u", "charge", "a"], 0);
    assert_eq!(record["result"], "one");
}

/// `get` shows a result stored by the HTTP layer as its status, headers and body (in `--json`
/// too, bytes that are not UTF-8 in hex), the marker of a response sent but not stored as
/// such, and `--raw` prints the stored bytes exactly.
#[test]
fn get_decodes_the_http_layers_stored_responses() {
    use idemstore::guard::StoredResponse;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("http.idem");
    let response = StoredResponse {
        status: 201,
        headers: vec![
            ("location".into(), b"/orders/7".to_vec()),
            ("x-blob".into(), b"\xff\x00".to_vec()),
        ],
        body: b"{\"order\":7}".to_vec(),
    };
    let stored = response.encode();
    {
        let store = Store::builder()
            .admin_socket(idemstore::AdminSocket::Off)
            .open(&path)
            .unwrap();
        let lease = acquire(&store, &key("u", "POST /orders", "k1"), fp("a"));
        store.complete(&lease, stored.clone()).unwrap();
        let lease = acquire(&store, &key("u", "POST /orders", "k2"), fp("b"));
        // The marker the layer stores for a response it sent but did not keep.
        store.complete(&lease, b"\x02\xc8\x00".to_vec()).unwrap();
    }
    let p = path.to_str().unwrap();
    let text = run(&["get", p, "u", "POST /orders", "k1"], 0);
    for shown in [
        "status 201, 2 headers, a 11-byte body",
        "location",
        "/orders/7",
        "\\xff\\x00",
        "{\"order\":7}",
    ] {
        assert!(text.contains(shown), "{shown:?} missing:\n{text}");
    }
    let value = run_json(&["--json", "get", p, "u", "POST /orders", "k1"], 0);
    let json = &value["response"];
    assert_eq!(json["status"], 201, "{value:#}");
    assert_eq!(json["headers"][0]["name"], "location");
    assert_eq!(json["headers"][0]["value"], "/orders/7");
    assert_eq!(json["headers"][1]["value_hex"], "ff00");
    assert_eq!(json["body"], "{\"order\":7}");
    assert_eq!(
        value["result_hex"].as_str().map(str::len),
        Some(2 * stored.len())
    );
    let raw = idemstore(&["get", "--raw", p, "u", "POST /orders", "k1"]);
    assert_eq!(raw.stdout, stored, "--raw prints the stored bytes");
    let text = run(&["get", p, "u", "POST /orders", "k2"], 0);
    assert!(text.contains("status 200, sent but not stored"), "{text}");
    let value = run_json(&["--json", "get", p, "u", "POST /orders", "k2"], 0);
    assert_eq!(value["response"]["stored"], false, "{value:#}");
}

/// Keys whose parts hold `/`, `%`, spaces and bytes that are not UTF-8 are printed with those
/// escaped (%XX), and what is printed (in a table, in JSON, in a message) is accepted back by
/// every command that takes a key, as three parts or as one SCOPE/OPERATION/ID.
#[test]
fn printed_keys_are_accepted_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.idem");
    let keys = [
        idemstore::Key::new("tenant/7", "POST /charges", "k 1").unwrap(),
        idemstore::Key::new("100%", "op", b"\xff\x00id".as_slice()).unwrap(),
        idemstore::Key::new("利用者", "a%2Fb", "x/y/z").unwrap(),
    ];
    {
        let store = Store::builder()
            .admin_socket(idemstore::AdminSocket::Off)
            .open(&path)
            .unwrap();
        for (i, key) in keys.iter().enumerate() {
            let lease = acquire(&store, key, fp(&i.to_string()));
            store
                .complete(&lease, format!("result {i}").into_bytes())
                .unwrap();
        }
    }
    let p = path.to_str().unwrap();
    let listed = run_json(&["--json", "list", p], 0);
    let records = listed["records"].as_array().unwrap();
    assert_eq!(records.len(), keys.len());
    let table = run(&["list", p], 0);
    for record in records {
        let [scope, operation, id] =
            ["scope", "operation", "id"].map(|f| record[f].as_str().unwrap().to_string());
        let joined = format!("{scope}/{operation}/{id}");
        assert!(
            table.contains(&format!("{scope}  ")) && !scope.contains(['/', ' ']),
            "{joined} in\n{table}"
        );
        let by_parts = run_json(&["--json", "get", p, &scope, &operation, &id], 0);
        let by_joined = run_json(&["--json", "get", p, &joined], 0);
        assert_eq!(by_parts["result"], by_joined["result"], "{joined}");
        assert!(by_parts["result"].as_str().unwrap().starts_with("result "));
        // A message names the key in the same form.
        let expired = run(&["expire", p, &joined], 0);
        assert!(expired.contains(&format!("expired {joined} ")), "{expired}");
    }
    assert_eq!(run_json(&["--json", "stats", p], 0)["counts"]["total"], 0);
    // A `%` that is not an escape, or a key that is not three parts, is a usage error.
    for (args, says) in [
        (&["get", p, "100%", "op", "id"][..], "%25"),
        (&["get", p, "a/b"][..], "SCOPE/OPERATION/ID"),
        (&["expire", p, "a%zz/b/c"][..], "two hex digits"),
    ] {
        let output = idemstore(args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(says),
            "{args:?}: {}",
            stderr(&output)
        );
    }
}

/// `init` makes an empty store; `export` writes one JSON line per record that has not
/// expired; `import` into the new store writes them back exactly, so its export is the same
/// lines; a malformed line is refused by its number before anything is written.
#[test]
fn export_then_import_into_a_new_store_gives_the_same_lines() {
    let fx = Fixture::new();
    {
        // A recovery point and a result that is not UTF-8, beside the fixture's states.
        let store = fx.open();
        let lease = acquire(&store, &key("u3", "a/b", "p 1"), fp("p"));
        store.record_step(&lease, 2, b"ext-9\xff").unwrap();
        let lease = acquire(&store, &key("u3", "bin", "%"), fp("q"));
        store.complete(&lease, b"\x00\xff".to_vec()).unwrap();
    }
    let p = fx.file();
    let exported = run(&["export", p], 0);
    let lines: Vec<&str> = exported.lines().collect();
    assert_eq!(
        lines.len(),
        6,
        "every record but the expired one:\n{exported}"
    );
    for line in &lines {
        let value: Value = serde_json::from_str(line).unwrap();
        assert!(
            value["state"].is_string() && value["token"].is_u64(),
            "{line}"
        );
    }
    let dir = fx.path.parent().unwrap();
    let copy = dir.join("copy.idem");
    let c = copy.to_str().unwrap();
    let dump = dir.join("dump.jsonl");
    std::fs::write(&dump, &exported).unwrap();
    run(&["init", c, "--retention", "24h"], 0);
    // init never overwrites.
    assert_eq!(idemstore(&["init", c]).status.code(), Some(1));
    let done = run_json(&["--json", "import", c, dump.to_str().unwrap()], 0);
    assert_eq!(
        (done["imported"].as_u64(), done["already_stored"].as_u64()),
        (Some(6), Some(0))
    );
    assert_eq!(run(&["export", c], 0), exported, "the same lines back");
    // Again: every key is already stored, and kept.
    let again = run_json(&["--json", "import", c, dump.to_str().unwrap()], 0);
    assert_eq!(again["already_stored"], 6);
    // The imported store answers as the original: same class, token and result.
    let original = run_json(&["--json", "get", p, "u1", "charge", "done"], 0);
    let imported = run_json(&["--json", "get", c, "u1", "charge", "done"], 0);
    assert_eq!(original, imported);

    // A malformed line: refused by its number, nothing written.
    let fresh = dir.join("fresh.idem");
    let f = fresh.to_str().unwrap();
    run(&["init", f], 0);
    let bad_lines = [
        ("{\"scope\": \"u\"", "not a JSON object"),
        (
            &lines[1].replace("\"state\":\"", "\"state\":\"x"),
            "field `state`",
        ),
        (
            &lines[1].replace("\"token\":", "\"tokn\":"),
            "field `token`",
        ),
        (
            &lines[1].replace("\"fingerprint\":\"", "\"fingerprint\":\"zz"),
            "fingerprint",
        ),
    ];
    for (bad, says) in bad_lines {
        let input = format!("{}\n{bad}\n", lines[0]);
        std::fs::write(&dump, input).unwrap();
        let output = idemstore(&["import", f, dump.to_str().unwrap()]);
        assert_eq!(output.status.code(), Some(1), "{bad}");
        let message = stderr(&output);
        assert!(
            message.contains("line 2") && message.contains(says),
            "{bad}: {message}"
        );
        assert_eq!(run(&["export", f], 0), "", "nothing imported from {bad}");
    }
    // Import needs an existing store.
    let missing = dir.join("missing.idem");
    let output = idemstore(&["import", missing.to_str().unwrap(), dump.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("idemstore init"),
        "{}",
        stderr(&output)
    );
    assert!(!missing.exists());
}

/// `list --key-prefix` keeps the keys whose printed form starts with the prefix, before the
/// limit is applied.
#[test]
fn list_by_key_prefix() {
    let fx = Fixture::new();
    let p = fx.file();
    let listed = run_json(&["--json", "list", p, "--key-prefix", "u1/charge/"], 0);
    let mut found = ids(&listed["records"]);
    found.sort();
    assert_eq!(found, ["done", "live", "review", "stale"], "{listed:#}");
    let listed = run_json(
        &["--json", "list", p, "--key-prefix", "u1/", "--limit", "1"],
        0,
    );
    assert_eq!(ids(&listed["records"]).len(), 1);
    assert_eq!(listed["truncated"], true);
    let listed = run_json(
        &[
            "--json",
            "list",
            p,
            "--key-prefix",
            "u2/",
            "--state",
            "expired",
        ],
        0,
    );
    assert_eq!(ids(&listed["records"]), ["old"]);
    assert_eq!(
        run(&["list", p, "--key-prefix", "nobody/"], 0).trim(),
        "no records"
    );
}

/// Each command's help fits the build and itself: `--etcd` and `--postgres` only in builds
/// with their feature; each argument written the same way (`<FILE>` or `[FILE]`) in the usage
/// line and the list of arguments; `--leases-survive-restart` only on the commands that tell a
/// live lease from a stale one; `sweep` speaking of windows; `list --limit 0` refused with
/// what it would mean.
#[test]
fn help_texts_fit_the_build() {
    let commands = [
        "stats", "get", "list", "resolve", "expire", "sweep", "check", "recover", "compact",
        "init", "export", "import",
    ];
    let help = |args: &[&str]| run(args, 0);
    let top = help(&["--help"]);
    for (flag, built) in [
        ("--etcd", cfg!(feature = "etcd")),
        ("--postgres", cfg!(feature = "postgres")),
    ] {
        assert_eq!(top.contains(flag), built, "{flag} in --help:\n{top}");
    }
    for command in commands {
        let text = help(&[command, "--help"]);
        for (flag, built) in [
            ("--etcd", cfg!(feature = "etcd")),
            ("--postgres", cfg!(feature = "postgres")),
        ] {
            assert_eq!(
                text.contains(flag),
                built,
                "{flag} in {command} --help:\n{text}"
            );
        }
        let usage = text
            .lines()
            .find(|line| line.starts_with("Usage:"))
            .unwrap_or_else(|| panic!("{command}: no usage line"));
        let arguments = text
            .split("Arguments:\n")
            .nth(1)
            .map(|rest| rest.split("\n\n").next().unwrap_or(""))
            .unwrap_or("");
        let names = arguments
            .lines()
            .filter_map(|line| line.split_whitespace().next())
            .filter(|word| word.starts_with(['<', '[']));
        for name in names {
            assert!(
                usage.contains(name),
                "{command}: {name} is written otherwise in the usage line {usage:?}"
            );
        }
        let leases = ["stats", "get", "list", "resolve", "expire"].contains(&command);
        assert_eq!(
            text.contains("--leases-survive-restart"),
            leases,
            "{command} --help:\n{text}"
        );
    }
    assert!(help(&["sweep", "--help"]).contains("window"));
    let fx = Fixture::new();
    let output = idemstore(&["list", fx.file(), "--limit", "0"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("0 would show nothing"),
        "{}",
        stderr(&output)
    );
}
