//! Stores of format 2 (an expiry and a lease index) open with this build and are converted to
//! format 3 (one deadline index) in one durable transaction: tested on files written by the
//! format-2 code (`tests/fixtures/`, how they were made in its README), closed cleanly or
//! with frames in the log only, and with crashes and power losses during the conversion.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::sim::{Rng, SimDisk};
use idemstore::redb::{ReadableDatabase, TableDefinition, TableHandle};
use idemstore::{Builder, Fingerprint, Key, ManualClock, Record, Reservation, Status, Store};

/// 2026-01-01T00:00:00Z, the fixtures' clock at their first operation.
const T0: u64 = 1_767_225_600_000;
const FIXTURES: [&str; 2] = ["format2-clean.idem", "format2-unclean.idem"];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// One key's answer, as the fixtures' `.expected` files list it (the same format as the
/// program that wrote them).
fn summary(key: &Key, record: Option<&Record>) -> String {
    let name = String::from_utf8_lossy(key.id()).into_owned();
    let Some(r) = record else {
        return format!("{name} absent");
    };
    let ms = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_millis();
    let expires = r
        .expires_at()
        .map_or("never".to_string(), |t| ms(t).to_string());
    let state = match r.status() {
        Status::Pending {
            lease_until,
            progress,
        } => format!(
            "pending lease_until={} progress={:?}",
            ms(lease_until),
            progress.map(|p| (p.step, String::from_utf8_lossy(&p.data).into_owned()))
        ),
        Status::Completed {
            result,
            completed_at,
        } => format!(
            "completed at={} result={}",
            ms(completed_at),
            String::from_utf8_lossy(result)
        ),
        Status::NeedsReview { note, since } => format!("review since={} note={note}", ms(since)),
        other => format!("{other:?}"),
    };
    format!(
        "{name} token={} attempt={} expires={expires} {state}",
        r.token(),
        r.attempt()
    )
}

/// The key a listed line is about (the operation is in its id's prefix).
fn key_of(line: &str) -> Key {
    let id = line.split(' ').next().unwrap();
    let op = match id {
        _ if id.starts_with("expiring") => "short",
        _ if id.starts_with("observed") => "events",
        _ => "pay",
    };
    Key::new("fx", op, id).unwrap()
}

fn expected(name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(fixture(&format!("{name}.expected"))).unwrap();
    text.lines().map(str::to_string).collect()
}

/// What every listed key reads as now.
fn listing(store: &Store, expected: &[String]) -> Vec<String> {
    expected
        .iter()
        .map(|line| {
            let key = key_of(line);
            summary(&key, store.get(&key).unwrap().as_ref())
        })
        .collect()
}

fn builder(clock: &ManualClock) -> Builder {
    let mut builder = Store::builder();
    builder
        .clock(clock.clone())
        .lease(Duration::from_secs(60))
        .retention(Duration::from_secs(365 * 86_400))
        .retention_for("short", Duration::from_secs(600))
        .checkpoint_interval(Duration::from_secs(3600))
        .sweep_interval(None)
        .preallocate_log(false);
    builder
}

/// The fixtures' clock just after their last operation.
fn clock_at_close() -> ManualClock {
    ManualClock::starting_at(UNIX_EPOCH + Duration::from_millis(T0 + 2_000))
}

/// A copy of fixture `name` (store file, and its log when `with_log`) in `dir`.
fn copy(dir: &Path, name: &str, with_log: bool) -> PathBuf {
    let path = dir.join(name);
    std::fs::copy(fixture(name), &path).unwrap();
    if with_log {
        let wal = format!("{name}.wal");
        std::fs::copy(fixture(&wal), dir.join(&wal)).unwrap();
    }
    path
}

const META: TableDefinition<&str, u64> = TableDefinition::new("idemstore.meta");

/// The format marker and the store's tables of the closed store at `path`.
fn format_and_tables(path: &Path) -> (u64, Vec<String>) {
    let db = idemstore::open_redb_read_only(path).unwrap();
    let txn = db.begin_read().unwrap();
    let format = txn
        .open_table(META)
        .unwrap()
        .get("format")
        .unwrap()
        .unwrap()
        .value();
    let mut tables: Vec<String> = txn
        .list_tables()
        .unwrap()
        .map(|t| t.name().to_string())
        .collect();
    tables.sort();
    (format, tables)
}

#[test]
fn a_format_2_store_opens_converted_and_every_key_answers_as_before() {
    for name in FIXTURES {
        let dir = tempfile::tempdir().unwrap();
        let path = copy(dir.path(), name, true);
        let image = SimDisk::from_image(std::fs::read(&path).unwrap());
        assert_eq!(
            idemstore::whitebox::format_version(image).unwrap(),
            Some(2),
            "{name} is a format-2 store"
        );
        let expected = expected(name);
        let clock = clock_at_close();
        let store = builder(&clock).open(&path).unwrap();
        assert_eq!(
            listing(&store, &expected),
            expected,
            "{name} after the upgrade"
        );
        let report = store.verify().unwrap();
        assert!(report.is_ok(), "{name}: {:?}", report.problems);
        let count = |what: &str| expected.iter().filter(|l| l.contains(what)).count() as u64;
        assert_eq!(
            (report.lease_entries, report.expiry_entries),
            (count(" pending "), count(" completed ")),
            "{name}: one entry per pending or completed record, none for the one under review"
        );
        drop(store);
        assert_eq!(
            format_and_tables(&path),
            (
                3,
                vec![
                    "idemstore.deadlines".to_string(),
                    "idemstore.meta".to_string(),
                    "idemstore.records".to_string(),
                ]
            ),
            "{name}: format 3, the two old indexes gone"
        );
        // Opened again, as a format-3 store now.
        let store = builder(&clock).open(&path).unwrap();
        assert_eq!(listing(&store, &expected), expected, "{name} reopened");
    }
}

/// The unclean fixture's second half is in its log only: without the log it is missing, so
/// the test above shows those frames replayed into the converted store.
#[test]
fn the_unclean_fixture_holds_changes_in_its_log_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy(dir.path(), "format2-unclean.idem", false);
    let clock = clock_at_close();
    let store = builder(&clock).accept_log_loss(true).open(&path).unwrap();
    let key = Key::new("fx", "pay", "done-1-0").unwrap();
    assert_eq!(store.get(&key).unwrap(), None);
    let key = Key::new("fx", "pay", "done-0-0").unwrap();
    assert!(store.get(&key).unwrap().is_some());
}

/// On a converted store, sweeping, the stale listing and takeovers work from the one index.
#[test]
fn a_converted_store_sweeps_lists_stale_reservations_and_takes_them_over() {
    for name in FIXTURES {
        let dir = tempfile::tempdir().unwrap();
        let path = copy(dir.path(), name, true);
        let expected = expected(name);
        let clock = clock_at_close();
        clock.advance(Duration::from_secs(3600));
        let store = builder(&clock).open(&path).unwrap();
        // The short-lived keys and the observed ones (10 minutes) expired; nothing else did.
        let expired = expected
            .iter()
            .filter(|l| l.starts_with("expiring") || l.starts_with("observed"))
            .count();
        assert_eq!(expired, 10);
        assert_eq!(store.sweep(1000).unwrap(), expired, "{name}");
        assert_eq!(store.sweep(1000).unwrap(), 0, "{name}");
        let mut stale: Vec<String> = store
            .stale(100)
            .unwrap()
            .into_iter()
            .map(|(k, _)| String::from_utf8_lossy(k.id()).into_owned())
            .collect();
        stale.sort();
        let mut pending: Vec<String> = expected
            .iter()
            .filter(|l| l.contains(" pending "))
            .map(|l| l.split(' ').next().unwrap().to_string())
            .collect();
        pending.sort();
        assert_eq!(stale, pending, "{name}");
        let key = Key::new("fx", "pay", "pending-0-1").unwrap();
        match store.reserve(&key, Fingerprint::of(key.id())).unwrap() {
            Reservation::Acquired(lease) => {
                assert_eq!(lease.attempt(), 2);
                assert_eq!(lease.progress().map(|p| p.step), Some(7));
            }
            other => panic!("{name}: {other:?}"),
        }
        let key = Key::new("fx", "pay", "done-1-3").unwrap();
        match store.reserve(&key, Fingerprint::of(key.id())).unwrap() {
            Reservation::Completed(done) => assert!(done.result.ends_with(b"result 1 3")),
            other => panic!("{name}: {other:?}"),
        }
        assert!(store.verify().unwrap().is_ok());
    }
}

/// A crash or a power loss at any write or sync of the opening that converts the store leaves
/// a store that opens (at format 2 or 3) with every key answering as before.
#[test]
fn a_crash_during_the_conversion_leaves_a_store_that_opens() {
    let mut rng = Rng(0x5eed_f00d);
    for name in FIXTURES {
        let image = std::fs::read(fixture(name)).unwrap();
        let log_image = std::fs::read(fixture(&format!("{name}.wal"))).unwrap();
        let expected = expected(name);
        let clock = clock_at_close();
        let mut seen = [false; 2];
        for n in 1.. {
            let (db, log) = (
                SimDisk::from_image(image.clone()),
                SimDisk::from_image(log_image.clone()),
            );
            db.fail_after(n);
            let opened = builder(&clock).open_with_storage(db.clone(), log.clone());
            let done = opened.is_ok();
            db.freeze();
            log.freeze();
            drop(opened);
            for (db, log) in [
                (db.after_process_crash(), log.after_process_crash()),
                (
                    db.after_power_loss(&mut rng),
                    log.after_power_loss(&mut rng),
                ),
            ] {
                let format = idemstore::whitebox::format_version(db.clone()).unwrap();
                match format {
                    Some(2) => seen[0] = true,
                    Some(3) => seen[1] = true,
                    other => panic!("{name}, crash at write {n}: format {other:?}"),
                }
                let store = builder(&clock)
                    .open_with_storage(db, log)
                    .unwrap_or_else(|e| panic!("{name}, crash at write {n}: {e}"));
                assert_eq!(
                    listing(&store, &expected),
                    expected,
                    "{name}, crash at write {n} (format {format:?})"
                );
                let report = store.verify().unwrap();
                assert!(
                    report.is_ok(),
                    "{name}, crash at write {n} (format {format:?}): {:?}",
                    report.problems
                );
            }
            if done {
                break;
            }
        }
        assert_eq!(
            seen,
            [true, true],
            "{name}: crashes before and after the commit"
        );
    }
}

/// `idemstore::upgrade` (`idemstore upgrade PATH`) converts a closed format-2 store without
/// opening it as a store, once.
#[test]
fn the_upgrade_function_converts_a_closed_format_2_store() {
    for name in FIXTURES {
        let dir = tempfile::tempdir().unwrap();
        let path = copy(dir.path(), name, true);
        assert!(idemstore::upgrade(&path).unwrap(), "{name} converted");
        assert_eq!(format_and_tables(&path).0, 3, "{name}");
        assert!(
            !idemstore::upgrade(&path).unwrap(),
            "{name} already current"
        );
        let expected = expected(name);
        let store = builder(&clock_at_close()).open(&path).unwrap();
        assert_eq!(listing(&store, &expected), expected, "{name}");
        assert!(store.verify().unwrap().is_ok());
    }
}
