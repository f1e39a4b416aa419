//! A store that crashed and lost its log refuses to open (issue 18): the log holds every
//! operation acknowledged since the last checkpoint, so opening without it would forget them
//! silently. Each case takes the files as a killed process leaves them (copied while the store
//! is open: the operating system holds every write the process made), then damages the log.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use idemstore::{Builder, OpenError, Reservation};

use crate::common::{acquire, fp, key, replayed, Env};

fn log_of(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".wal");
    PathBuf::from(name)
}

/// A builder whose log is preallocated (small), as a store's log is by default.
fn builder(env: &Env) -> Builder {
    let mut builder = env.builder();
    builder
        .preallocate_log(true)
        .checkpoint_bytes(64 * 1024)
        .checkpoint_interval(Duration::from_secs(3600));
    builder
}

/// Completes `before` and checkpoints, completes `after` (only in the log), and leaves the
/// files as a kill would at `env.path` (the store is then dropped elsewhere).
fn killed(env: &Env, before: &str, after: &str) {
    let scratch = Env::new();
    let store = builder(&scratch).open(&scratch.path).unwrap();
    let k = key("u", "charge", before);
    let lease = acquire(&store, &k, fp("b"));
    store.complete(&lease, b"one".to_vec()).unwrap();
    store.checkpoint().unwrap();
    let k = key("u", "charge", after);
    let lease = acquire(&store, &k, fp("b"));
    store.complete(&lease, b"two".to_vec()).unwrap();
    let image = fs::read(&scratch.path).unwrap();
    fs::write(&env.path, &image).unwrap();
    fs::write(log_of(&env.path), fs::read(log_of(&scratch.path)).unwrap()).unwrap();
    drop(store);
}

/// The refusal, with both files named and what to do.
#[track_caller]
fn refused(env: &Env, what: &str) {
    match builder(env).open(&env.path) {
        Err(err @ OpenError::LostLog { .. }) => {
            let message = err.to_string();
            for needle in [
                env.path.display().to_string(),
                log_of(&env.path).display().to_string(),
                what.to_string(),
                "accept_log_loss".to_string(),
                "idemstore recover --accept-loss".to_string(),
            ] {
                assert!(message.contains(&needle), "{needle:?} not in: {message}");
            }
        }
        Err(other) => panic!("expected LostLog, got {other}"),
        Ok(_) => panic!("a store that lost its log opened ({what})"),
    }
}

/// With the override, the store opens with what its file holds: the key completed before the
/// checkpoint is kept, the one only in the lost log is gone (the documented loss).
fn accepted(env: &Env) {
    let mut accepting = builder(env);
    accepting.accept_log_loss(true);
    let store = accepting.open(&env.path).unwrap();
    assert_eq!(
        replayed(&store, &key("u", "charge", "a"), fp("b")).result,
        b"one"
    );
    assert!(matches!(
        store.reserve(&key("u", "charge", "b"), fp("b")).unwrap(),
        Reservation::Acquired(_)
    ));
    drop(store);
    // Afterwards the store has a log of its own again and opens normally.
    drop(builder(env).open(&env.path).unwrap());
}

#[test]
fn the_logs_own_copy_opens_and_keeps_everything() {
    let env = Env::new();
    killed(&env, "a", "b");
    let store = builder(&env).open(&env.path).unwrap();
    assert_eq!(
        replayed(&store, &key("u", "charge", "b"), fp("b")).result,
        b"two"
    );
}

#[test]
fn a_missing_log_is_refused_and_none_is_created() {
    let env = Env::new();
    killed(&env, "a", "b");
    fs::remove_file(log_of(&env.path)).unwrap();
    refused(&env, "is missing");
    assert!(!log_of(&env.path).exists(), "a log was created");
    // Refusing again gives the same answer: the first refusal changed nothing that matters.
    refused(&env, "is missing");
    accepted(&env);
}

#[test]
fn an_empty_log_is_refused() {
    let env = Env::new();
    killed(&env, "a", "b");
    fs::write(log_of(&env.path), b"").unwrap();
    refused(&env, "is 0 bytes");
    accepted(&env);
}

#[test]
fn a_truncated_log_is_refused() {
    let env = Env::new();
    killed(&env, "a", "b");
    let log = fs::read(log_of(&env.path)).unwrap();
    // Everything after the identity block and part of the first frame: the length the store
    // recorded at open is larger.
    fs::write(log_of(&env.path), &log[..40]).unwrap();
    refused(&env, "truncated");
    accepted(&env);
}

#[test]
fn another_stores_log_is_refused_and_kept_in_place() {
    let env = Env::new();
    let other = Env::new();
    killed(&env, "a", "b");
    killed(&other, "x", "y");
    let foreign = fs::read(log_of(&other.path)).unwrap();
    fs::write(log_of(&env.path), &foreign).unwrap();
    refused(&env, "another store's log");
    assert!(
        fs::read(log_of(&env.path)).unwrap() == foreign,
        "the log was moved or changed"
    );
    accepted(&env);
    let set_aside = fs::read_dir(env.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("foreign"))
        .count();
    assert_eq!(
        set_aside, 1,
        "the other store's log is set aside, not deleted"
    );
}

/// After a clean close the log holds nothing the file does not: a missing log is no loss.
#[test]
fn a_cleanly_closed_store_opens_without_its_log() {
    let env = Env::new();
    let store = builder(&env).open(&env.path).unwrap();
    let lease = acquire(&store, &key("u", "charge", "a"), fp("b"));
    store.complete(&lease, b"one".to_vec()).unwrap();
    drop(store);
    fs::remove_file(log_of(&env.path)).unwrap();
    let store = builder(&env).open(&env.path).unwrap();
    assert_eq!(
        replayed(&store, &key("u", "charge", "a"), fp("b")).result,
        b"one"
    );
}

/// `Store::file_info` (and `idemstore stats`) says how much log the next checkpoint writes
/// into the file and how much free space that needs; a checkpoint brings it back to zero log.
#[test]
fn the_room_the_next_checkpoint_needs_is_reported() {
    let env = Env::new();
    let store = builder(&env).open(&env.path).unwrap();
    let empty = store.file_info().unwrap();
    assert_eq!(empty.log_since_checkpoint, 0);
    for i in 0..20 {
        let lease = acquire(&store, &key("u", "charge", &format!("k{i}")), fp("b"));
        store.complete(&lease, vec![7; 512]).unwrap();
    }
    let info = store.file_info().unwrap();
    assert!(
        info.log_since_checkpoint > 20 * 512,
        "{}",
        info.log_since_checkpoint
    );
    assert!(info.checkpoint_room > info.log_since_checkpoint);
    store.checkpoint().unwrap();
    assert_eq!(store.file_info().unwrap().log_since_checkpoint, 0);
}
