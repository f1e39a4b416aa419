//! Bad input gets a clear error naming the limit or the place, and nothing already stored is
//! lost: oversized and empty key parts, oversized results and notes, invalid settings, paths
//! that are not stores (directories, other programs' files, other redb databases), a second
//! open from this process and from another process, and a damaged record.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use idemstore::redb::{self, ReadableDatabase, TableDefinition};
use idemstore::{Builder, Error, Key, KeyPart, OpenError, Reservation, Resolution, Status, Store};

use crate::common::{acquire, change_stored, encoded, fp, key, replayed, Env};

/// Each key part must be 1 to `Key::MAX_PART_LEN` bytes; the error names the part, its
/// length and the limit.
#[test]
fn oversized_and_empty_key_parts_are_refused_naming_the_part_and_limit() {
    let ok = "x";
    let long = vec![b'x'; Key::MAX_PART_LEN + 1];
    let long = long.as_slice();
    let max = vec![b'y'; Key::MAX_PART_LEN];
    let cases = [
        (
            KeyPart::Scope,
            "scope",
            Key::new(long, ok, ok),
            Key::new("", ok, ok),
        ),
        (
            KeyPart::Operation,
            "operation",
            Key::new(ok, long, ok),
            Key::new(ok, "", ok),
        ),
        (
            KeyPart::Id,
            "id",
            Key::new(ok, ok, long),
            Key::new(ok, ok, ""),
        ),
    ];
    for (part, name, oversized, empty) in cases {
        let err = oversized.expect_err(name);
        let message = err.to_string();
        let idemstore::KeyError { part: got, len } = err;
        assert_eq!((got, len), (part, Key::MAX_PART_LEN + 1), "{name}");
        assert!(message.contains(name), "{message}");
        assert!(
            message.contains(&(Key::MAX_PART_LEN + 1).to_string()),
            "{message}"
        );
        assert!(
            message.contains(&Key::MAX_PART_LEN.to_string()),
            "{message}"
        );

        let err = empty.expect_err(name);
        let message = err.to_string();
        let idemstore::KeyError { part: got, len } = err;
        assert_eq!((got, len), (part, 0), "{name}");
        assert!(message.contains(name), "{message}");
        assert!(message.contains("empty"), "{message}");
    }
    let longest = Key::new(&max, &max, &max).expect("parts of exactly the limit are fine");
    assert_eq!(longest.id(), max.as_slice());
}

/// A result over `max_result_len` is refused with the key and the limit; the key stays
/// pending under the same lease and can still be completed with a small result. The same
/// limit holds for `resolve` and `complete_with`.
#[test]
fn oversized_result_is_refused_and_the_key_stays_pending() {
    let env = Env::new();
    let store = env.builder().max_result_len(16).open(&env.path).unwrap();
    let k = key("user-1", "export", "big");
    let lease = acquire(&store, &k, fp("b"));
    let before = store.get(&k).unwrap();

    let err = store.complete(&lease, vec![0u8; 17]).unwrap_err();
    match &err {
        Error::ResultTooLarge {
            key: got,
            len,
            limit,
        } => assert_eq!((got, *len, *limit), (&k, 17, 16)),
        other => panic!("expected ResultTooLarge, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains(&k.to_string()), "{message}");
    assert!(message.contains("16"), "{message}");
    assert!(message.contains("17"), "{message}");

    let ran = std::cell::Cell::new(false);
    let err = store
        .complete_with(&lease, vec![0u8; 17], |_| {
            ran.set(true);
            Ok::<_, redb::Error>(())
        })
        .unwrap_err();
    assert!(
        matches!(err, Error::ResultTooLarge { len: 17, .. }),
        "{err}"
    );
    assert!(!ran.get(), "the closure must not run for a refused result");
    assert_eq!(store.get(&k).unwrap(), before, "still pending, unchanged");
    assert!(matches!(
        store.reserve(&k, fp("b")).unwrap(),
        Reservation::InProgress { attempt: 1, .. }
    ));

    store.complete(&lease, vec![7u8; 16]).unwrap();
    assert_eq!(replayed(&store, &k, fp("b")).result, vec![7u8; 16]);

    // resolve enforces the same limit.
    let review = key("user-1", "export", "review");
    let lease = acquire(&store, &review, fp("b"));
    store.mark_needs_review(&lease, "check").unwrap();
    let err = store
        .resolve(&review, Resolution::Complete(vec![0; 17]))
        .unwrap_err();
    assert!(
        matches!(err, Error::ResultTooLarge { limit: 16, .. }),
        "{err}"
    );
    assert!(matches!(
        store.get(&review).unwrap().unwrap().status(),
        Status::NeedsReview { .. }
    ));
}

/// A review note over `Key::MAX_NOTE_LEN` is refused naming the key and the limit; the key stays
/// pending and a note of exactly the limit is accepted.
#[test]
fn oversized_note_is_refused_and_the_key_stays_pending() {
    let env = Env::new();
    let store = env.open();
    let k = key("user-1", "charge", "n");
    let lease = acquire(&store, &k, fp("b"));
    let before = store.get(&k).unwrap();
    let err = store
        .mark_needs_review(&lease, &"n".repeat(Key::MAX_NOTE_LEN + 1))
        .unwrap_err();
    match &err {
        Error::NoteTooLarge { key: got, len } => {
            assert_eq!((got, *len), (&k, Key::MAX_NOTE_LEN + 1))
        }
        other => panic!("expected NoteTooLarge, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains(&k.to_string()), "{message}");
    assert!(
        message.contains(&Key::MAX_NOTE_LEN.to_string()),
        "{message}"
    );
    assert_eq!(store.get(&k).unwrap(), before);

    let note = "n".repeat(Key::MAX_NOTE_LEN);
    store.mark_needs_review(&lease, &note).unwrap();
    assert_eq!(
        store.reserve(&k, fp("b")).unwrap(),
        Reservation::NeedsReview { note }
    );
}

/// Settings out of range are refused by `open` with the setting's name, and no file is
/// created.
#[test]
fn invalid_builder_settings_are_refused_at_open() {
    let env = Env::new();
    /// Puts one setting out of range.
    type Spoil = fn(&mut Builder);
    let cases: [(&str, Spoil); 4] = [
        ("lease", |b| {
            b.lease(Duration::ZERO);
        }),
        ("lease", |b| {
            b.lease(Duration::from_micros(999));
        }),
        ("retention", |b| {
            b.retention(Duration::ZERO);
        }),
        ("max_result_len", |b| {
            b.max_result_len(Builder::MAX_RESULT_LEN_LIMIT + 1);
        }),
    ];
    for (name, set) in cases {
        let mut builder = env.builder();
        set(&mut builder);
        match builder.open(&env.path) {
            Err(err @ OpenError::InvalidConfig { .. }) => {
                let message = err.to_string();
                let OpenError::InvalidConfig { setting, .. } = err else {
                    unreachable!()
                };
                assert_eq!(setting, name);
                assert!(message.contains(name), "{message}");
            }
            other => panic!("{name}: expected InvalidConfig, got {other:?}"),
        }
        assert!(!env.path.exists(), "{name}: a refused open creates no file");
    }
    // The smallest valid values are accepted.
    env.builder()
        .lease(Duration::from_millis(1))
        .retention(Duration::from_millis(1))
        .max_result_len(Builder::MAX_RESULT_LEN_LIMIT)
        .open(&env.path)
        .expect("the limits themselves are valid");
}

/// Opening a directory is refused with a message naming the path; the directory is left as
/// it was.
#[test]
fn opening_a_directory_is_refused() {
    let env = Env::new();
    let dir = env.dir.path().join("a-directory");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("inside"), b"keep me").unwrap();
    let err = Store::open(&dir).unwrap_err();
    match &err {
        OpenError::NotAStore { path, .. } => assert_eq!(path, &dir),
        other => panic!("expected NotAStore, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains(&dir.display().to_string()), "{message}");
    assert!(message.contains("directory"), "{message}");
    assert!(dir.is_dir());
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["inside"], "nothing was added to the directory");
}

/// Files of other programs (text, binary, empty, too short) are refused with NotAStore naming
/// the path, and their bytes are unchanged afterwards.
#[test]
fn another_programs_file_is_refused_and_left_untouched() {
    let env = Env::new();
    let mut binary: Vec<u8> = b"PK\x03\x04".to_vec();
    binary.extend((0..8192u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    let files: [(&str, Vec<u8>); 4] = [
        ("notes.txt", b"shopping list: eggs, milk\n".repeat(100)),
        ("archive.zip", binary),
        ("empty", Vec::new()),
        ("short", b"redb".to_vec()),
    ];
    for (name, bytes) in files {
        let path = env.dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        match Store::open(&path) {
            Err(err @ OpenError::NotAStore { .. }) => {
                let message = err.to_string();
                assert!(message.contains(&path.display().to_string()), "{message}");
            }
            other => panic!("{name}: expected NotAStore, got {other:?}"),
        }
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name} was modified");
    }
}

const ORDERS: TableDefinition<&str, u64> = TableDefinition::new("orders");

/// A redb database written by another program is refused (it has no idemstore tables), the
/// file is byte for byte unchanged, and its data is still there afterwards.
#[test]
fn a_redb_database_that_is_not_a_store_is_refused_and_kept() {
    let env = Env::new();
    let path = env.dir.path().join("other.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(ORDERS)
            .unwrap()
            .insert("order-1", 1999)
            .unwrap();
        txn.commit().unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    match Store::open(&path) {
        Err(err @ OpenError::NotAStore { .. }) => {
            let message = err.to_string();
            assert!(message.contains(&path.display().to_string()), "{message}");
        }
        other => panic!("expected NotAStore, got {other:?}"),
    }
    assert!(
        std::fs::read(&path).unwrap() == before,
        "the refused file was modified"
    );
    let db = redb::Database::open(&path).unwrap();
    let txn = db.begin_read().unwrap();
    let orders = txn.open_table(ORDERS).unwrap();
    assert_eq!(orders.get("order-1").unwrap().unwrap().value(), 1999);
    let tables: Vec<String> = txn
        .list_tables()
        .unwrap()
        .map(|t| idemstore::redb::TableHandle::name(&t).to_string())
        .collect();
    assert_eq!(tables, ["orders"], "no idemstore table was added");
}

/// A corrupt file (redb's signature, then a damaged header) is refused with an error naming
/// the file (docs/DESIGN.md: "a clear error naming the limit or the place"), and left unchanged.
#[test]
fn a_damaged_redb_header_is_refused_naming_the_file() {
    let env = Env::new();
    let path = env.dir.path().join("damaged.idem");
    let mut bytes = b"redb\x1a\x0a\xa9\x0d\x0a".to_vec();
    bytes.extend((0..20_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    std::fs::write(&path, &bytes).unwrap();
    let err = Store::open(&path).unwrap_err();
    assert!(
        std::fs::read(&path).unwrap() == bytes,
        "the refused file was modified"
    );
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

/// A store path in a directory that does not exist: the error names the path, and nothing is
/// created.
#[test]
fn opening_in_a_missing_directory_names_the_path() {
    let env = Env::new();
    let path = env.dir.path().join("missing").join("store.idem");
    let err = Store::open(&path).unwrap_err();
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    assert!(!path.parent().unwrap().exists());
}

/// A second `Store` on the same file in the same process is refused with AlreadyOpen naming
/// the path, and the first keeps working; once the first is dropped the file opens again.
#[test]
fn second_open_in_the_same_process_is_already_open() {
    let env = Env::new();
    let store = env.open();
    let k = key("s", "op", "k");
    let lease = acquire(&store, &k, fp("b"));
    let err = env.builder().open(&env.path).unwrap_err();
    match &err {
        OpenError::AlreadyOpen { path } => assert_eq!(path, &env.path),
        other => panic!("expected AlreadyOpen, got {other:?}"),
    }
    assert!(
        err.to_string().contains(&env.path.display().to_string()),
        "{err}"
    );
    store.complete(&lease, b"first handle".to_vec()).unwrap();
    drop(store);
    let store = env.open();
    assert_eq!(replayed(&store, &k, fp("b")).result, b"first handle");
}

/// Names the child test below; set to the store path when this binary runs as the child.
const CHILD_ENV: &str = "IDEMSTORE_TEST_CHILD_STORE";
const CHILD_READY: &str = "idemstore child: store open";

/// Not a test of its own: run by `second_open_from_another_process_is_already_open` in a
/// child process (with `CHILD_ENV` set) to hold the store open until its stdin closes. Does
/// nothing in a normal run.
#[test]
fn child_holds_store_open() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    // Without the preallocated log: 33 MiB of zeros for the parent's reopen to read past.
    let store = Store::builder()
        .preallocate_log(false)
        .open(&path)
        .expect("child opens the store");
    println!("{CHILD_READY}");
    std::io::stdout().flush().unwrap();
    let mut rest = Vec::new();
    std::io::stdin().read_to_end(&mut rest).unwrap();
    drop(store);
}

/// Kills the child if the parent test fails half-way.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One process owns a store file: while a child process holds it open, opening it here is
/// refused with AlreadyOpen naming the path. Once the child is gone the file opens again
/// with nothing lost.
#[test]
fn second_open_from_another_process_is_already_open() {
    let env = Env::new();
    {
        let store = env.open();
        let lease = acquire(&store, &key("s", "op", "before"), fp("b"));
        store.complete(&lease, b"kept".to_vec()).unwrap();
    }
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "bad_input::child_holds_store_open",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &env.path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the child process");
    let mut child = KillOnDrop(child);
    let stdout = child.0.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    loop {
        let line = lines
            .next()
            .expect("the child exited before opening the store")
            .unwrap();
        if line.contains(CHILD_READY) {
            break;
        }
    }

    let err = env.builder().open(&env.path).unwrap_err();
    match &err {
        OpenError::AlreadyOpen { path } => assert_eq!(path, &env.path),
        other => panic!("expected AlreadyOpen, got {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains(&env.path.display().to_string()),
        "{message}"
    );

    drop(child.0.stdin.take());
    drop(child);
    let store = env.open();
    assert_eq!(
        replayed(&store, &key("s", "op", "before"), fp("b")).result,
        b"kept"
    );
}

/// A record damaged on disk (one byte of its value flipped, written through redb so the
/// file itself stays valid) is reported by `get` and `reserve` as Corruption naming the key,
/// is never returned as data, and other keys keep working.
#[test]
fn a_corrupt_record_is_reported_with_its_key_and_other_keys_still_work() {
    let env = Env::new();
    let damaged = key("user-1", "charge", "damaged");
    let healthy = key("user-1", "charge", "healthy");
    let pending = key("user-2", "charge", "pending");
    {
        let store = env.open();
        for k in [&damaged, &healthy] {
            let lease = acquire(&store, k, fp("b"));
            store.complete(&lease, format!("result of {k}")).unwrap();
        }
        acquire(&store, &pending, fp("b"));
    }
    {
        let db = idemstore::open_redb(&env.path).unwrap();
        let txn = db.begin_write().unwrap();
        change_stored(&txn, &encoded(&damaged), |value| {
            let middle = value.len() / 2;
            value[middle] ^= 0x40;
        });
        txn.commit().unwrap();
    }

    let store = env.open();
    let check = |err: Error, what: &str| match &err {
        Error::Storage(idemstore::StorageError::Corruption { location, .. }) => {
            assert!(location.contains(&damaged.to_string()), "{what}: {err}");
            assert!(
                err.to_string().contains(&damaged.to_string()),
                "{what}: {err}"
            );
        }
        other => panic!("{what}: expected Corruption, got {other:?}"),
    };
    check(store.get(&damaged).unwrap_err(), "get");
    check(store.reserve(&damaged, fp("b")).unwrap_err(), "reserve");
    check(
        store.resolve(&damaged, Resolution::Release).unwrap_err(),
        "resolve",
    );

    assert_eq!(
        replayed(&store, &healthy, fp("b")).result,
        format!("result of {healthy}").into_bytes()
    );
    // Reserved before the reopen: its lease ended with the earlier owner.
    assert!(matches!(
        store.reserve(&pending, fp("b")).unwrap(),
        Reservation::Acquired(lease) if lease.attempt() == 2
    ));
    let fresh = acquire(&store, &key("user-3", "charge", "new"), fp("b"));
    store.complete(&fresh, b"fine".to_vec()).unwrap();
    // The damaged record is still reported, not silently replaced.
    check(store.get(&damaged).unwrap_err(), "get after other writes");
}
