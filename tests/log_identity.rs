//! A log belongs to its store (issue 8, finding 1): a store never replays a log that another
//! store wrote, whether the store file was deleted and made again at the same path or another
//! store's log was put next to it.

use std::fs;
use std::path::{Path, PathBuf};

use idemstore::{OpenError, Reservation};

use crate::common::{acquire, fp, key, Env};
use crate::support::sim::SimDisk;

fn log_of(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".wal");
    PathBuf::from(name)
}

/// The log as a killed process leaves it: every acknowledged frame, no checkpoint after it.
/// The store stays open while the copy is taken; what it holds then is what a `kill -9` keeps.
fn log_after_kill(env: &Env, id: &str) -> Vec<u8> {
    let store = env.open();
    let k = key("user-1", "POST /charges", id);
    let lease = acquire(&store, &k, fp("amount=100"));
    store.complete(&lease, b"charged".to_vec()).unwrap();
    let log = fs::read(log_of(&env.path)).unwrap();
    drop(store);
    log
}

/// Reproduction of finding 1: kill the process, delete only the store file, create a new store
/// at the same path. Before the fix the new store answered `Completed` with the old result for
/// a key it never saw (both stores used log salt 0 until their first checkpoint). Now the old
/// log is set aside under a new name (never deleted) and the key is new.
#[test]
fn a_new_store_never_adopts_a_deleted_stores_log() {
    let env = Env::new();
    let log = log_after_kill(&env, "a1");
    fs::remove_file(&env.path).unwrap();
    fs::write(log_of(&env.path), &log).unwrap();

    let store = env.open();
    let k = key("user-1", "POST /charges", "a1");
    match store.reserve(&k, fp("amount=100")).unwrap() {
        Reservation::Acquired(_) => {}
        other => panic!("a new store answered {other:?} for a key it never saw"),
    }
    drop(store);
    let set_aside: Vec<_> = fs::read_dir(env.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("store.idem.wal.") && name.contains("foreign"))
        .collect();
    assert_eq!(set_aside.len(), 1, "the old log is kept: {set_aside:?}");
    let kept = fs::read(env.dir.path().join(&set_aside[0])).unwrap();
    assert_eq!(kept, log, "the old log is set aside unchanged");
}

/// Another store's log next to an existing store is never replayed. The existing store was
/// killed (its file copied while it was open: no clean-close mark, so its next open reads the
/// log): the open refuses, since the store's own log is gone, and leaves the other log as it
/// was; with `accept_log_loss` it opens, sets the other log aside, and the other store's key is
/// new here.
#[test]
fn an_existing_store_never_replays_another_stores_log() {
    let other = Env::new();
    let foreign = log_after_kill(&other, "b1");
    let env = Env::new();
    {
        let store = env.open();
        let image = fs::read(&env.path).unwrap();
        drop(store);
        fs::write(&env.path, image).unwrap();
    }
    assert!(
        !idemstore::whitebox::closed_clean(SimDisk::from_image(fs::read(&env.path).unwrap()))
            .unwrap(),
        "the store is left as a kill leaves it, without the clean-close mark"
    );
    fs::write(log_of(&env.path), &foreign).unwrap();

    match env.builder().open(&env.path) {
        Err(err @ OpenError::LostLog { .. }) => {
            assert!(err.to_string().contains("another store's log"), "{err}");
        }
        Err(other) => panic!("expected LostLog, got {other}"),
        Ok(store) => {
            let got = store.reserve(&key("user-1", "POST /charges", "b1"), fp("amount=100"));
            panic!("opened with another store's log in place of its own; b1 answers {got:?}")
        }
    }
    assert_eq!(
        fs::read(log_of(&env.path)).unwrap(),
        foreign,
        "the refused log is left as it was"
    );

    let mut accepting = env.builder();
    accepting.accept_log_loss(true);
    let store = accepting.open(&env.path).unwrap();
    let k = key("user-1", "POST /charges", "b1");
    match store.reserve(&k, fp("amount=100")).unwrap() {
        Reservation::Acquired(_) => {}
        other => panic!("another store's acknowledged key appeared: {other:?}"),
    }
}

/// A log whose identity block is damaged could be this store's own: opening refuses, naming
/// both files and what to do, and leaves both untouched.
#[test]
fn a_log_with_a_damaged_identity_is_refused_naming_both_files() {
    let env = Env::new();
    drop(env.open());
    let log_path = log_of(&env.path);
    let mut log = fs::read(&log_path).unwrap();
    log[0] ^= 0xff;
    fs::write(&log_path, &log).unwrap();
    let err = env.builder().open(&env.path).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, OpenError::ForeignLog { .. }), "{err:?}");
    assert!(
        message.contains(&env.path.display().to_string()),
        "{message}"
    );
    assert!(
        message.contains(&log_path.display().to_string()),
        "{message}"
    );
    assert_eq!(
        fs::read(&log_path).unwrap(),
        log,
        "the log is left untouched"
    );
}
